"""The load probe as a unit of the probe registry (probes/registry.py): its settings from the profile and
the overrides, and its run (the relaunch at a proposed limit is limit.py, a later call)."""

from __future__ import annotations

from typing import Any

from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...runtime.client import OpenAIClient
from ..options import ProbeOptions, metrics_source_of
from ..registry import register
from .config import LoadProbeConfig
from .probe import run_load_probe


def config(opts: ProbeOptions, scenario: dict[str, Any] | None = None) -> LoadProbeConfig:
    """The load probe's settings from the profile and the overrides (the scenario pack is not used)."""
    return LoadProbeConfig.from_profile(opts.profile, opts.overrides, model=opts.model, api_key=opts.api_key,
                                        server_pid=opts.server_pid, server_log=opts.server_log,
                                        agent_hosts=list(opts.loadgen_hosts), agent_endpoints=list(opts.loadgen_agents),
                                        agent_token=opts.loadgen_token)


def run(opts: ProbeOptions, client: OpenAIClient, store: EvidenceStore,
        scenario: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    return run_load_probe(opts.base_url, metrics_source_of(opts), config(opts), store, relaunch=opts.relaunch)


PROBE = register("load", config_type=LoadProbeConfig, config=config, run=run)
