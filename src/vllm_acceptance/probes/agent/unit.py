"""The agent probe as a unit of the probe registry (probes/registry.py): its settings from the profile and
the overrides, and its run (with the direct server and the reference endpoint when given)."""

from __future__ import annotations

from typing import Any

from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...runtime.client import OpenAIClient
from ..options import ProbeOptions, setting
from ..registry import register
from .common import AgentProbeConfig
from .probe import AgentProbe


def config(opts: ProbeOptions, scenario: dict[str, Any]) -> AgentProbeConfig:
    """The agent probe's settings from the profile and the overrides."""
    seed = setting(opts, "agent.seed")
    return AgentProbeConfig(
        model=opts.model, scenario=scenario, repeats=int(setting(opts, "agent.repeats")),
        temperature=float(setting(opts, "agent.temperature")),
        max_tokens=int(setting(opts, "agent.max_tokens")),
        format_error_threshold=float(setting(opts, "thresholds.tool_format_error_rate")),
        schema_accuracy_min=float(setting(opts, "thresholds.schema_accuracy_min")),
        turn_budget=int(setting(opts, "agent.turn_budget")),
        concurrency=int(setting(opts, "agent.concurrency")),
        retry_attempts=int(setting(opts, "agent.retry_attempts")),
        reasoning_parser=setting(opts, "model.reasoning_parser") or None,
        images=bool(setting(opts, "agent.images")),
        image_tokens=setting(opts, "agent.image_tokens"),
        cases=int(setting(opts, "agent.cases")), other_cases=int(setting(opts, "agent.other_cases")),
        case_seed=int(setting(opts, "agent.case_seed")),
        seed=None if seed is None else int(seed),
        case_tools=str(setting(opts, "agent.case_tools")),
        consistency_cases=int(setting(opts, "agent.consistency_cases")),
        under_load=int(setting(opts, "agent.under_load") or 0),
        stream_cases=None if setting(opts, "agent.stream_cases") is None else int(setting(opts, "agent.stream_cases")),
        case_pack=setting(opts, "agent.case_pack") or None,
        abstain_min=float(setting(opts, "thresholds.tool_abstain_min")),
        reference_min=float(setting(opts, "thresholds.reference_agreement_min")),
        wrong_tool_rate=float(setting(opts, "thresholds.wrong_tool_rate")),
        wrong_write_tool_rate=float(setting(opts, "thresholds.wrong_write_tool_rate")),
        reference_min_cases=int(setting(opts, "thresholds.reference_min_cases")),
        reference_argument_min=float(setting(opts, "thresholds.reference_argument_min")))


def run(opts: ProbeOptions, client: OpenAIClient, store: EvidenceStore,
        scenario: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    cfg = config(opts, scenario)
    direct = OpenAIClient(opts.direct_url, api_key=opts.api_key, timeout_s=client.timeout_s) \
        if opts.direct_url else None
    reference = OpenAIClient(opts.reference_url, api_key=opts.reference_api_key, timeout_s=client.timeout_s) \
        if opts.reference_url else None
    cfg.reference_model = opts.reference_model or opts.model
    cfg.under_load = int(opts.under_load or cfg.under_load)
    try:
        return AgentProbe(client, cfg, store, direct, reference).run()
    finally:
        for extra in (direct, reference):
            if extra:
                extra.close()


PROBE = register("agent", config_type=AgentProbeConfig, config=config, run=run)
