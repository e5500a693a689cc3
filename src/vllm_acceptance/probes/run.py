"""One entry for every probe, shared by the CLI and the `acceptance_probe` Ansible module."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.evidence import EvidenceStore
from ..core.findings import Consequence, Finding
from ..core.profile import ConfigError, Profile, load_profile
from ..core.reference import check_reference_url, url_secrets
from ..rules.registry import missing
from ..runtime.client import OpenAIClient, ServerUnreachable
from ..runtime.metrics import metrics_source
from ..scenarios import load_scenario
from .result import overall_status, write_result

PROBES = ("cache", "agent", "load")
FAMILY = {"cache": "cache", "agent": "agent", "load": "capacity"}
CONSEQUENCE = {"cache": Consequence.REBUILD, "agent": Consequence.BLOCK_AGENT, "load": Consequence.EXPAND}
DEFAULT_PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "cpu-lab.yml"


@dataclass
class ProbeOptions:
    kind: str
    base_url: str
    model: str
    out_dir: Path
    profile: Profile | None = None
    metrics_url: str | None = None
    prometheus_url: str | None = None
    prometheus_instance: str | None = None
    prometheus_selector: str | None = None   # label matchers naming the server's scrape target
    direct_url: str | None = None
    api_key: str | None = None
    server_pid: int | None = None
    server_log: str | None = None
    restart_command: str | None = None
    relaunch: bool = False   # load: the caller relaunches the server at each proposed limit (run_load_limit)
    # load: the loadgen hosts (besides the controller) whose agents send the ramp, mixed and soak steps
    loadgen_hosts: list[str] = field(default_factory=list)
    loadgen_agents: list[dict[str, Any]] = field(default_factory=list)
    loadgen_token: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    # agent: a reference endpoint for agent.reference_agreement (its key from the environment, never argv)
    reference_url: str | None = None
    reference_model: str | None = None
    reference_api_key: str | None = None
    under_load: int = 0  # agent: the case set sent again while this many other requests are in flight


def probe_secrets(opts: ProbeOptions) -> list[str]:
    """What never reaches evidence: the API keys, and credentials written in the reference URL (core/reference.py)."""
    return [k for k in (opts.api_key, opts.reference_api_key, *url_secrets(opts.reference_url)) if k]


def resolve_profile(path: str | None) -> Profile | None:
    if path:
        return load_profile(path)
    return load_profile(DEFAULT_PROFILE) if DEFAULT_PROFILE.is_file() else None


def _get(opts: ProbeOptions, dotted: str, default: Any) -> Any:
    if dotted in opts.overrides:
        return opts.overrides[dotted]
    return opts.profile.get(dotted, default) if opts.profile else default


def request_timeout_s(opts: ProbeOptions) -> float:
    """Per-request timeout of the cache and agent probes: `<kind>.request_timeout_s`, else the load
    probe's `load.request_timeout_s`, else 120 s. A request past it is reported by name, never a pass."""
    return float(_get(opts, f"{opts.kind}.request_timeout_s", _get(opts, "load.request_timeout_s", 120)))


def run_probe(opts: ProbeOptions, *, write_result_json: bool = True) -> tuple[str, list[Finding], dict[str, Any]]:
    """Run one probe; write OUT/result.json (the CLI's contract; a run's stage files instead, see
    probes/stage.py); return (status, findings, details).

    Raises ConfigError on bad input and client.ServerUnreachable when the base URL does not answer.
    """
    if opts.kind not in PROBES:
        raise ConfigError(f"probe {opts.kind!r}: unknown (choose one of {', '.join(PROBES)})")
    check_reference_url(opts.reference_url, "reference URL (--reference-url, inventory agent_reference_url)",
                        opts.reference_api_key)
    secrets = probe_secrets(opts)
    store = EvidenceStore(opts.out_dir, secrets=secrets)
    client = OpenAIClient(opts.base_url, api_key=opts.api_key, timeout_s=request_timeout_s(opts))
    try:
        client.models()  # fail early (exit 2) when the URL is wrong, before any evidence is judged
        try:
            findings, details = _dispatch(opts, client, store)
        except (ConfigError, ServerUnreachable):
            raise
        except Exception as exc:  # noqa: BLE001 - a probe that breaks is a missing stage, never a pass
            ev = store.write_text("probe-error.txt", traceback.format_exc())
            findings = [missing(f"{FAMILY[opts.kind]}.probe", None,
                                f"the {opts.kind} probe stopped: {type(exc).__name__}: {exc}",
                                CONSEQUENCE[opts.kind], evidence=[ev])]
            details = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        client.close()
    if write_result_json:
        return write_result(opts.out_dir, opts.kind, findings, details, secrets), findings, details
    return overall_status(findings), findings, details


def cache_config(opts: ProbeOptions, scenario: dict[str, Any]) -> Any:
    """The cache probe's settings from the profile and the overrides (probes/cache.py CacheProbeConfig)."""
    from .cache import CacheProbeConfig

    return CacheProbeConfig(
        model=opts.model, scenario=scenario, sessions=int(_get(opts, "cache.sessions", 3)),
        hybrid=bool(_get(opts, "model.hybrid_cache", False)),
        relies_on_reuse=bool(_get(opts, "cache.capacity_relies_on_reuse", True)),
        tolerance_blocks=int(_get(opts, "thresholds.cache_hit_tolerance_blocks", 1)),
        min_prefill_drop=float(_get(opts, "cache.min_prefill_drop", 0.0)),
        server_pid=opts.server_pid, server_log=opts.server_log,
        retention_interval=_get(opts, "cache.retention_interval", None),
        rounds=int(_get(opts, "cache.rounds", 3)), restart_command=opts.restart_command,
        restart_timeout_s=float(_get(opts, "launch.ready_timeout_s", 600)))


def run_cache_restart_probe(opts: ProbeOptions, details: dict[str, Any], restart_error: str | None,
                            restart_log: str | None) -> tuple[Any, dict[str, Any] | None]:
    """The cache protocol's request after a restart made between two probe calls (probes/stage.py)."""
    from .cache import run_cache_restart

    store = EvidenceStore(opts.out_dir, secrets=[opts.api_key] if opts.api_key else [])
    client = OpenAIClient(opts.base_url, api_key=opts.api_key, timeout_s=request_timeout_s(opts))
    try:
        source = metrics_source(opts.metrics_url, opts.prometheus_url, opts.prometheus_instance, opts.base_url,
                            opts.prometheus_selector)
        scenario = load_scenario(str(_get(opts, "agent.scenario", "ops-agent")))
        return run_cache_restart(client, source, cache_config(opts, scenario), store, details, restart_error,
                                 restart_log)
    finally:
        client.close()


def _dispatch(opts: ProbeOptions, client: OpenAIClient, store: EvidenceStore
              ) -> tuple[list[Finding], dict[str, Any]]:
    scenario = load_scenario(str(_get(opts, "agent.scenario", "ops-agent")))
    if opts.kind == "cache":
        from .cache import run_cache_probe

        source = metrics_source(opts.metrics_url, opts.prometheus_url, opts.prometheus_instance, opts.base_url,
                            opts.prometheus_selector)
        return run_cache_probe(client, source, cache_config(opts, scenario), store)
    if opts.kind == "agent":
        from .agent import AgentProbe

        cfg_a = agent_config(opts, scenario)
        direct = OpenAIClient(opts.direct_url, api_key=opts.api_key, timeout_s=client.timeout_s) \
            if opts.direct_url else None
        reference = OpenAIClient(opts.reference_url, api_key=opts.reference_api_key, timeout_s=client.timeout_s) \
            if opts.reference_url else None
        cfg_a.reference_model = opts.reference_model or opts.model
        cfg_a.under_load = int(opts.under_load or cfg_a.under_load)
        try:
            return AgentProbe(client, cfg_a, store, direct, reference).run()
        finally:
            for extra in (direct, reference):
                if extra:
                    extra.close()
    from .load.probe import run_load_probe

    source = metrics_source(opts.metrics_url, opts.prometheus_url, opts.prometheus_instance, opts.base_url,
                            opts.prometheus_selector)
    return run_load_probe(opts.base_url, source, load_config(opts), store, relaunch=opts.relaunch)


def agent_config(opts: ProbeOptions, scenario: dict[str, Any]) -> Any:
    """The agent probe's settings from the profile and the overrides (probes/agent/common.py AgentProbeConfig)."""
    from .agent import AgentProbeConfig

    return AgentProbeConfig(
        model=opts.model, scenario=scenario, repeats=int(_get(opts, "agent.repeats", 3)),
        temperature=float(_get(opts, "agent.temperature", 0.0)),
        max_tokens=int(_get(opts, "agent.max_tokens", 256)),
        format_error_threshold=float(_get(opts, "thresholds.tool_format_error_rate", 0.01)),
        schema_accuracy_min=float(_get(opts, "thresholds.schema_accuracy_min", 0.99)),
        turn_budget=int(_get(opts, "agent.turn_budget", 1000)),
        concurrency=int(_get(opts, "agent.concurrency", 8)),
        retry_attempts=int(_get(opts, "agent.retry_attempts", 1)),
        reasoning_parser=_get(opts, "model.reasoning_parser", None) or None,
        images=bool(_get(opts, "agent.images", False)),
        image_tokens=_get(opts, "agent.image_tokens", None),
        cases=int(_get(opts, "agent.cases", 300)), other_cases=int(_get(opts, "agent.other_cases", 60)),
        case_seed=int(_get(opts, "agent.case_seed", 0)),
        seed=None if _get(opts, "agent.seed", None) is None else int(_get(opts, "agent.seed", None)),
        case_tools=str(_get(opts, "agent.case_tools", "sample")),
        consistency_cases=int(_get(opts, "agent.consistency_cases", 10)),
        under_load=int(_get(opts, "agent.under_load", 0) or 0),
        abstain_min=float(_get(opts, "thresholds.tool_abstain_min", 0.9)),
        reference_min=float(_get(opts, "thresholds.reference_agreement_min", 0.80)))


def load_config(opts: ProbeOptions) -> Any:
    """The load probe's settings from the profile and the overrides (probes/load/config.py LoadProbeConfig)."""
    from .load.config import LoadProbeConfig

    return LoadProbeConfig.from_profile(opts.profile, opts.overrides, model=opts.model, api_key=opts.api_key,
                                        server_pid=opts.server_pid, server_log=opts.server_log,
                                        agent_hosts=list(opts.loadgen_hosts), agent_endpoints=list(opts.loadgen_agents),
                                        agent_token=opts.loadgen_token)


def run_load_limit_probe(opts: ProbeOptions, details: dict[str, Any], prior: list[Finding],
                         relaunch_error: str | None, relaunch_log: str | None) -> tuple[list[Finding], dict[str, Any]]:
    """The load stage's next proposed limit, on the server relaunched with its flags between two probe
    calls (probes/stage.py)."""
    from .load.limit import run_load_limit

    store = EvidenceStore(opts.out_dir, secrets=[opts.api_key] if opts.api_key else [])
    source = metrics_source(opts.metrics_url, opts.prometheus_url, opts.prometheus_instance, opts.base_url,
                            opts.prometheus_selector)
    return run_load_limit(opts.base_url, source, load_config(opts), store, details, prior,
                          relaunch_error=relaunch_error, relaunch_log=relaunch_log)
