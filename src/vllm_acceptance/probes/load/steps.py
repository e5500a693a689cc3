"""One step's figures and what they lack (step_row, missing_samples, hung_requests), the SLO and the knee
over steps, and how a step spreads the contract's share."""

from __future__ import annotations

import math
from typing import Any

from ...load.engine import Record
from ...load.stats import summarize
from ...runtime.metrics import Snapshot
from . import rules
from .config import LoadProbeConfig
from .sampler import engine_peaks


def hung_requests(records: list[Record], limit: int = 20) -> dict[str, Any]:
    """How many requests got no complete answer within the request timeout (or the stage deadline),
    and which: their request ids, as in records/<stage>.jsonl (the first `limit`)."""
    ids = [r.request_id for r in records if r.status == "timeout"]
    return {"timeouts": len(ids), "timed_out": ids[:limit]}


def step_row(concurrency: int, records: list[Record], samples: list[dict[str, Any]],
             preempt: float | None, cfg: LoadProbeConfig, **measured: Any) -> dict[str, Any]:
    """One step's figures; ``measured`` adds what the probe read around it (queue_p95, memory, ...)."""
    s = summarize(records)

    def pct(key: str, p: str) -> float | None:
        return s[key][p]

    row = {"concurrency": concurrency, "requests": s["count"], "ok": s["ok"],
           "errors": s["errors"] + s["timeouts"], "error_rate": s["error_rate"], **hung_requests(records)}
    for metric, key in (("ttft", "ttft_s"), ("itl", "itl_s"), ("e2e", "e2e_s"), ("tpot", "tpot_s")):
        for p in ("p50", "p95", "p99"):
            row[f"{metric}_{p}"] = pct(key, p)
    row["output_tokens_per_s"] = s["output_tokens_per_s"]
    row["max_running"] = max((x["running"] or 0) for x in samples) if samples else None
    row["max_waiting"] = max((x["waiting"] or 0) for x in samples) if samples else None
    row["max_kv_usage"] = max((x["kv_usage"] or 0) for x in samples) if samples else None
    row["kv_usage_by_engine"] = engine_peaks(samples)
    row["preemptions"] = preempt
    row.update(measured)
    row["breaches"] = rules.breaches(row, cfg.slo, cfg.max_preemptions)
    row["inconclusive"] = bool(row.get("missing_samples"))
    row["meets_slo"] = not row["breaches"] and not row["inconclusive"]
    return row


def meets_slo(row: dict[str, Any], cfg: LoadProbeConfig) -> bool:
    """A step meets the SLO when it breaks no limit (probes/load/rules.py breaches); a row without a queue
    figure (merged loadgen hosts) is not judged on the queue."""
    return not rules.breaches(row, cfg.slo, cfg.max_preemptions)


def knee_of(steps: list[dict[str, Any]]) -> int | None:
    return rules.knee_of(steps)


def contract_shaped(i: int, share: float) -> bool:
    """Spread the contract's share evenly over a step: request i is at the contracted context."""
    return math.floor((i + 1) * share) > math.floor(i * share)


def missing_samples(before: Snapshot | None, after: Snapshot | None, failed: int,
                    samples: list[dict[str, Any]], crashed: bool) -> list[str]:
    """What a step lacks because a metrics scrape failed (the server answering): the figures read from the
    scrape around it, or every sample of its window. The step is then inconclusive, never a breach or a pass
    (a server that died is judged as a crash, not here)."""
    if crashed:
        return []
    lacks = []
    for when, snap in (("before", before), ("after", after)):
        if snap is None:
            lacks.append(f"the metrics scrape {when} the step failed: no preemption count, no queue time "
                         "(preemptions, queue_p95)")
    if failed and not samples:
        lacks.append(f"every metrics sample of the step's window failed ({failed}): no KV usage, running or "
                     "waiting reading (kv_usage)")
    return lacks


def snapshot_preemptions(snap: Snapshot) -> float | None:
    return snap.value("vllm:num_preemptions")
