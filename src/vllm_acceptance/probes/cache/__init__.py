"""The cache probe (docs/acceptance.md "Prefix-cache reuse"): probe.py sends and measures the protocol
(cold, hot A, hot B, control; the request after a restart), unit.py registers it (probes/registry.py).
The judging rules are probes/cache/rules.py."""

from __future__ import annotations

from . import unit
from .probe import (
    KINDS,
    REQUIRED_FAMILIES,
    CacheProbe,
    CacheProbeConfig,
    Measurement,
    ServerLost,
    build_messages,
    common_prefix,
    expected_hits,
    judge_restart,
    judge_reuse,
    judge_rounds,
    one_instance,
    repeat_rounds,
    restart_hot,
    run_cache_probe,
    run_cache_restart,
    server_lost,
)

__all__ = ["KINDS", "REQUIRED_FAMILIES", "CacheProbe", "CacheProbeConfig", "Measurement", "ServerLost",
           "build_messages", "common_prefix", "expected_hits", "judge_restart", "judge_reuse", "judge_rounds",
           "one_instance", "repeat_rounds", "restart_hot", "run_cache_probe", "run_cache_restart", "server_lost",
           "unit"]
