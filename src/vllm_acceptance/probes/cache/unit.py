"""The cache probe as a unit of the probe registry (probes/registry.py): its settings from the profile and
the overrides, and its run."""

from __future__ import annotations

from typing import Any

from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...runtime.client import OpenAIClient
from ..options import ProbeOptions, metrics_source_of, setting
from ..registry import register
from .probe import CacheProbeConfig, run_cache_probe


def config(opts: ProbeOptions, scenario: dict[str, Any]) -> CacheProbeConfig:
    """The cache probe's settings from the profile and the overrides."""
    return CacheProbeConfig(
        model=opts.model, scenario=scenario, sessions=int(setting(opts, "cache.sessions")),
        hybrid=bool(setting(opts, "model.hybrid_cache")),
        relies_on_reuse=bool(setting(opts, "cache.capacity_relies_on_reuse")),
        tolerance_blocks=int(setting(opts, "thresholds.cache_hit_tolerance_blocks")),
        min_prefill_drop=float(setting(opts, "cache.min_prefill_drop")),
        server_pid=opts.server_pid, server_log=opts.server_log,
        retention_interval=setting(opts, "cache.retention_interval"),
        rounds=int(setting(opts, "cache.rounds")), restart_command=opts.restart_command,
        restart_timeout_s=float(setting(opts, "launch.ready_timeout_s")))


def run(opts: ProbeOptions, client: OpenAIClient, store: EvidenceStore,
        scenario: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    return run_cache_probe(client, metrics_source_of(opts), config(opts, scenario), store)


PROBE = register("cache", config_type=CacheProbeConfig, config=config, run=run)
