"""The cache probe's own plan: its requests and upper bound (core/bounds.py) from the settings it runs with
(unit.py config) and the protocol of probe.py; `plan` adds it up (docs/plan.md "How each bound is computed")."""

from __future__ import annotations

from ...core.bounds import StageBound, request_bound_s
from ...scenarios import load_scenario
from ..options import ProbeOptions, request_timeout_s, setting
from .probe import KINDS
from .unit import config


def cache_plan(opts: ProbeOptions, engines: int = 1, restart: bool = False) -> list[StageBound]:
    """run_cache_probe: on each data-parallel engine (each session pinned to one), `cache.sessions` sessions of
    the four kinds then `cache.rounds` repeats of hot A, one request at a time, after one warm-up request per
    engine where there are several; each request waits for an idle server (idle_wait_s) and is tried up to
    max_attempts times. `restart`: the server is restarted (restart_timeout_s) and hot A sent once more."""
    cfg = config(opts, load_scenario(str(setting(opts, "agent.scenario"))))
    slo = dict(setting(opts, "contract.slo") or {})
    one_s, how = request_bound_s(slo, cfg.max_tokens, request_timeout_s(opts))
    warm_s, _ = request_bound_s(slo, 1, request_timeout_s(opts))
    try_s = cfg.idle_wait_s + one_s
    each_s = cfg.max_attempts * try_s
    per_engine = cfg.sessions * len(KINDS) + cfg.rounds
    warm = engines if engines > 1 else 0
    requests = engines * per_engine + warm
    protocol = (f"cache.sessions {cfg.sessions} x {len(KINDS)} kinds + cache.rounds {cfg.rounds}, each at most "
                f"{cfg.max_attempts} tries x (idle wait {cfg.idle_wait_s:g} s + {one_s:g} s: {how})")
    basis = protocol if engines == 1 else (f"({protocol}) on each of {engines} data-parallel engines, + one "
                                           f"warm-up request each ({warm_s:g} s)")
    out = [StageBound("cache", "prefix-cache protocol, one request at a time", requests,
                      engines * per_engine * each_s + warm * warm_s, basis)]
    if restart:
        out.append(StageBound("cache_restart", "restart the launched server, hot A again", 1,
                              cfg.restart_timeout_s + each_s,
                              f"launch.ready_timeout_s {cfg.restart_timeout_s:g} s + 1 request ({each_s:g} s)"))
    return out
