"""The limit relaunch (run_load_limit): the next proposed limit on the server the caller relaunched with its
flags, the first call's progress restored from its details."""

from __future__ import annotations

import json
import time
from typing import Any

from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...rules import registry
from ...runtime.metrics import MetricsSource
from . import rules
from .conclude import Progress, conclude
from .config import LoadProbeConfig
from .probe import agents, judge_limit, pending_limit, stage_at_limit
from .run import LoadRun
from .stages import verify_one

EARLY = ("capacity.long_prompt", "capacity.context_contract")


def run_load_limit(base_url: str, source: MetricsSource, cfg: LoadProbeConfig, store: EvidenceStore,
                   details: dict[str, Any], prior: list[Finding], *, relaunch_error: str | None = None,
                   relaunch_log: str | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """The next proposed limit, on the server the caller relaunched with its flags (or could not): one
    step at the limit's shape. The first that holds is the verified limit, and the mixed stream and the
    soak run there; when none is left, the stage concludes as run_load_probe would have."""
    point = details.get("relaunch_point") or {}
    settings = point.get("settings") or []
    index = int(point.get("next", 0))
    if index >= len(settings):
        raise ValueError("the load stage has no proposed limit left to verify (no relaunch_point)")
    run = LoadRun(base_url, source, cfg, store)
    with agents(run):
        return _run_load_limit(run, details, prior, relaunch_error, relaunch_log)


def _run_load_limit(run: LoadRun, details: dict[str, Any], prior: list[Finding], relaunch_error: str | None,
                    relaunch_log: str | None) -> tuple[list[Finding], dict[str, Any]]:
    store = run.store
    point = details["relaunch_point"]
    settings, index = point["settings"], int(point.get("next", 0))
    setting = {k: v for k, v in settings[index].items() if k != "flags"}
    progress = restore(run, details, prior)
    mode = f"server relaunched with {' '.join(settings[index]['flags'])}"
    if relaunch_log or relaunch_error:
        store.append_jsonl("relaunch.jsonl", {"flags": settings[index]["flags"], "log": relaunch_log,
                                              "error": relaunch_error})
    run.healthy_at_start = not relaunch_error and run.healthy()
    t0 = time.time()
    late: list[Finding] = []
    limit: dict[str, Any] = {}
    run.sampler.start()
    try:
        if relaunch_error or not run.healthy_at_start:
            progress.attempts.append({"setting": setting, "stage": None, "held": False, "breaches": [],
                                      "mode": mode, "relaunch_error": relaunch_error or "the relaunched server "
                                      "does not answer /health"})
        else:   # judged against the KV cache of the deployment as launched (the first call's readout)
            progress.attempts.append(verify_one(run, setting, mode))
        held = progress.attempts[-1]["held"]
        if not held and index + 1 < len(settings) and not run.crashed:
            progress.seconds_before += time.time() - t0
            return pending_limit(run, progress)
        verified, limit = judge_limit(run, progress)
        if not progress.attempts[-1].get("relaunch_error"):
            # No limit held: the server now runs the last refuted limit's flags, so the mixed stream and the
            # soak are measured at that setting (the contract's shape would hit the flags, not the deployment).
            late = stage_at_limit(run, limit or progress.attempts[-1]["setting"])
    finally:
        run.sampler.stop()
    progress.seconds_before += time.time() - t0
    if not late:  # the relaunched server never answered: nothing more to measure on it
        late = [registry.get(c).missing(None, f"not run: {progress.attempts[-1]['relaunch_error']}")
                for c in ("capacity.mixed", "capacity.soak")]
    return conclude(run, progress, verified, limit, late)


def restore(run: LoadRun, details: dict[str, Any], prior: list[Finding]) -> Progress:
    """The first call's progress from its stage details and findings (evidence relative to the probe)."""
    run.readout = rules.KvReadout(**(details.get("kv_readout") or {}))
    run.client_checks = list((details.get("client") or {}).items())
    run.bounds = list(details.get("stage_bounds") or [])
    return Progress(early=[f for f in prior if f.check in EARLY], steps=list(details.get("steps") or []),
                    summary=dict(details.get("ramp_summary") or {}),
                    proposed=list(details.get("proposed_limits") or []),
                    attempts=list(details.get("limit_attempts") or []),
                    initial_preemptions=details.get("initial_preemptions"),
                    seconds_before=float(details.get("seconds") or 0.0),
                    memory=list(details.get("memory_timeline") or []),
                    metrics=list(details.get("metrics_timeline") or []),
                    workload=_read_workload(run.store))


def _read_workload(store: EvidenceStore) -> list[dict[str, Any]]:
    try:
        return list(json.loads(store.path("workload.json").read_text()).get("requests") or [])
    except (OSError, ValueError, AttributeError):
        return []
