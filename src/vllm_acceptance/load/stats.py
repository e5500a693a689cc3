"""Pure analysis for the load engine: arrival schedules, percentiles, stage summaries.

Kept apart from :mod:`vllm_acceptance.load.engine` (the network side) so it can be unit-tested and used
on records read back from JSONL without importing aiohttp.

Every latency is measured from a record's ``scheduled`` time, not from when the request actually
left: in an open loop a client that falls behind its schedule must not hide that lag from the
figures (coordinated omission). In a closed loop ``scheduled`` is the moment a worker took the
request, so the two coincide.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

Arrival = Literal["constant", "poisson"]
PERCENTILES = (50, 95, 99)


def arrival_offsets(n: int, rate: float, arrival: Arrival = "constant", seed: int = 0) -> list[float]:
    """Send times in seconds after the stage start for `n` requests at `rate` requests/s.

    ``constant``: evenly spaced, the first at 0. ``poisson``: exponential gaps drawn from a seeded
    generator (the same seed gives the same schedule), the first at 0.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if not rate > 0 or math.isinf(rate):
        raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
    if arrival == "constant":
        return [i / rate for i in range(n)]
    if arrival == "poisson":
        rng = random.Random(seed)
        out: list[float] = []
        t = 0.0
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(rate)
        return out
    raise ValueError(f"arrival must be 'constant' or 'poisson', got {arrival!r}")


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Percentile with linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    if not 0 <= pct <= 100:
        raise ValueError("pct must be within [0, 100]")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    if lo == hi:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p95/p99, mean, max and count of a sample (None where the sample is empty)."""
    out: dict[str, float | int | None] = {f"p{p}": percentile(values, p) for p in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    out["max"] = max(values) if values else None
    out["count"] = len(values)
    return out


def _get(rec: Any, name: str) -> Any:
    """Read a field from a Record or from its dict form (records read back from JSONL)."""
    if isinstance(rec, Mapping):
        return rec.get(name)
    return getattr(rec, name, None)


def summarize(records: Iterable[Any]) -> dict[str, Any]:
    """Stage summary of load records (``Record`` objects or their dicts), in seconds.

    Counts: ``count``, ``ok``, ``errors``, ``timeouts``, ``error_rate`` (errors and timeouts over
    count). Latencies use ``ok`` records only: ``ttft_s`` (first token - scheduled), ``e2e_s``
    (end - scheduled), ``tpot_s`` ((end - first token) / (completion tokens - 1), from ``usage``),
    ``itl_s`` (all gaps between successive token chunks, pooled), ``send_lag_s`` (sent -
    scheduled: how far the client fell behind its schedule). Throughput over ``duration_s`` (first
    scheduled to last end): ``requests_per_s`` (ok), ``output_tokens_per_s`` (usage completion
    tokens of ok records; records without usage are counted in ``usage_missing`` and never
    estimated from chunk counts), ``chunks_per_s``.
    """
    recs = list(records)
    ok = [r for r in recs if _get(r, "status") == "ok"]
    timeouts = sum(1 for r in recs if _get(r, "status") == "timeout")
    errors = len(recs) - len(ok) - timeouts
    starts = [_get(r, "scheduled") for r in recs if _get(r, "scheduled") is not None]
    ends = [_get(r, "end") for r in recs if _get(r, "end") is not None]
    duration = (max(ends) - min(starts)) if starts and ends else 0.0

    ttft, e2e, tpot, itl, lag = [], [], [], [], []
    out_tokens = 0
    usage_missing = 0
    chunks = 0
    for r in ok:
        sched, first, end = _get(r, "scheduled"), _get(r, "first_token"), _get(r, "end")
        comp = _get(r, "completion_tokens")
        if first is not None:
            ttft.append(first - sched)
        if end is not None:
            e2e.append(end - sched)
        if comp is None:
            usage_missing += 1
        else:
            out_tokens += comp
            if comp > 1 and first is not None and end is not None:
                tpot.append((end - first) / (comp - 1))
        itl.extend(_get(r, "itl_s") or [])
        chunks += _get(r, "chunks") or 0
    for r in recs:
        sent, sched = _get(r, "sent"), _get(r, "scheduled")
        if sent is not None and sched is not None:
            lag.append(sent - sched)

    def per_s(x: float) -> float | None:
        return x / duration if duration > 0 else None

    return {
        "count": len(recs),
        "ok": len(ok),
        "errors": errors,
        "timeouts": timeouts,
        "error_rate": (errors + timeouts) / len(recs) if recs else None,
        "usage_missing": usage_missing,
        "duration_s": duration,
        "requests_per_s": per_s(len(ok)),
        "output_tokens": out_tokens,
        "output_tokens_per_s": per_s(out_tokens),
        "chunks": chunks,
        "chunks_per_s": per_s(chunks),
        "ttft_s": distribution(ttft),
        "itl_s": distribution(itl),
        "tpot_s": distribution(tpot),
        "e2e_s": distribution(e2e),
        "send_lag_s": distribution(lag),
    }


def client_summary(processes: Sequence[Mapping[str, Any]], records: Iterable[Any]) -> dict[str, Any]:
    """The load generator's self-check for one step: per worker process (CPU, event-loop lag, read
    cost, from :mod:`vllm_acceptance.load.engine`) and the step's send lag (sent - scheduled).

    ``cpu_pct`` is of one core: a Python worker process runs its event loop on one core at a time
    (the GIL), so 100% is its ceiling whatever the host has.
    """
    procs = [dict(p) for p in processes]
    lag = []
    for r in records:
        sent, sched = _get(r, "sent"), _get(r, "scheduled")
        if sent is not None and sched is not None:
            lag.append(sent - sched)
    cpu = [p["cpu_pct"] for p in procs if p.get("cpu_pct") is not None]
    loop_p99 = [p["loop_lag_s"]["p99"] for p in procs if (p.get("loop_lag_s") or {}).get("p99") is not None]
    busy = sum(p.get("read_busy_s") or 0.0 for p in procs)
    chunks = sum(p.get("chunks") or 0 for p in procs)
    return {"processes": procs, "workers": len(procs), "send_lag_s": distribution(lag),
            "max_cpu_pct": max(cpu) if cpu else None, "max_loop_lag_p99_s": max(loop_p99) if loop_p99 else None,
            "chunk_us": busy / chunks * 1e6 if chunks else None}
