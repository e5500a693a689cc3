"""What one probe call is given (ProbeOptions), and how a probe reads a setting: the override, else the
profile's field, else the probe's own default."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.profile import Profile
from ..core.profile_model import setting_of
from ..core.reference import url_secrets


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
    # A deployment of several pools (P/D): pool name (`prefill`, `decode`) -> its instances, each
    # {"base_url": ..., "metrics_url": ...}; `base_url` above is the entry point users call (the router).
    # Set by the serve stage's record (docs/profiles.md); empty for one engine.
    pools: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def probe_secrets(opts: ProbeOptions) -> list[str]:
    """What never reaches evidence: the API keys, and credentials written in the reference URL (core/reference.py)."""
    return [k for k in (opts.api_key, opts.reference_api_key, *url_secrets(opts.reference_url)) if k]


def setting(opts: ProbeOptions, dotted: str) -> Any:
    """A probe setting: `--set`/overrides first, then the profile's field (the model's default when the
    profile leaves it out; core/profile_model.py), then, without a profile, the model's default."""
    return setting_of(opts.profile.model if opts.profile else None, dotted, opts.overrides)


def request_timeout_s(opts: ProbeOptions) -> float:
    """Per-request timeout of the cache and agent probes: `<kind>.request_timeout_s`, else the load
    probe's `load.request_timeout_s`. A request past it is reported by name, never a pass."""
    own = setting(opts, f"{opts.kind}.request_timeout_s")
    return float(own if own is not None else setting(opts, "load.request_timeout_s"))


def metrics_source_of(opts: ProbeOptions) -> Any:
    """Where the probe reads the server's metrics: /metrics, or the user's Prometheus."""
    from ..runtime.metrics import metrics_source

    return metrics_source(opts.metrics_url, opts.prometheus_url, opts.prometheus_instance, opts.base_url,
                          opts.prometheus_selector)
