"""The soak stage (memory growth, errors, hangs, restarts, communication errors in the log) and capacity.soak
judged again on the nodes' per-GPU memory series (judge_soak_gpu_memory)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ...core.findings import Finding, Status
from ...load.engine import Record
from ...load.stats import summarize
from ...parsers.startup_log import scan_startup_log
from ...runtime.metrics import Instance, delta
from . import rules
from .run import LoadRun
from .steps import hung_requests


def proc_start_time(pid: int | None) -> float | None:
    """Start time of a local process (clock ticks since boot, /proc/PID/stat field 22)."""
    if not pid:
        return None
    try:
        return float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def log_size(path: str | None) -> int:
    try:
        return Path(path).stat().st_size if path else 0
    except OSError:
        return 0


def stage_soak(run: LoadRun, concurrency: int) -> Finding:
    """Fixed and varied samples alternating at the (limited) contracted concurrency: memory growth,
    errors, hangs, restarts (process start time), preemptions and communication errors in the log."""
    cfg = run.cfg
    before = run.snapshot()
    pid_start, log_from = proc_start_time(cfg.server_pid), log_size(cfg.server_log)
    deadline = time.time() + cfg.soak_s
    records: list[Record] = []
    start = time.time()
    batch = 0
    while time.time() < deadline and not run.crashed:
        seed = 7 if batch % 2 == 0 else 5000 + batch  # fixed sample, then a varied one
        specs = [run.build(cfg.prompt_tokens, cfg.output_tokens, seed + i, "soak") for i in range(concurrency)]
        got, _, _ = run.send("soak", specs, concurrency)
        records += got
        batch += 1
    end = time.time()
    after = run.snapshot()
    restarts = []
    first, last = (Instance.of(before), Instance.of(after)) if before and after else (None, None)
    # Without a start time (several API servers) only a request counter that fell is sure: a scraped counter may
    # lag the answers just received, so "rose by less than the answers" is not used here (the cache probe, which
    # waits for its scrape, uses it).
    if first is not None and last is not None and last.restarted_since(first):
        restarts.append(f"{first.describe()} -> {last.describe()}")
    pid_now = proc_start_time(cfg.server_pid)
    if pid_start is not None and pid_now is not None and pid_start != pid_now:
        restarts.append(f"/proc/{cfg.server_pid}/stat start time {pid_start} -> {pid_now}")
    new_log = _read_from(cfg.server_log, log_from)
    scan = scan_startup_log(new_log) if new_log.strip() else None
    comm = [f"{x.number}: {x.text[:300]}" for x in (scan.nccl_errors + scan.dmabuf_errors)] if scan else []
    mem = run.sampler.memory_window(start, end)
    s = summarize(records)
    obs = {"seconds": round(end - start, 1), "concurrency": concurrency, "requests": s["count"],
           "errors": s["errors"] + s["timeouts"], **hung_requests(records),
           "memory_growth_pct": memory_growth_pct(mem), "memory_samples": len(mem),
           "preemptions": delta(before, after, "vllm:num_preemptions") if before and after else None,
           "restarts": restarts, "start_times_seen": bool(
               (first is not None and last is not None and last.restarted_since(first) is not None)
               or pid_start is not None),
           "log_observed": bool(new_log.strip()), "comm_errors": comm}
    ev = [run.store.write_json("soak.json", obs)] + [p for p in ("records/soak.jsonl", "memory.jsonl")
                                                    if run.store.path(p).exists()]
    return rules.judge_soak(obs, cfg.memory_growth_pct, cfg.max_preemptions, evidence=ev,
                            configuration={"window": {"start": start, "end": end}, "concurrency": concurrency,
                                           "max_growth_pct": cfg.memory_growth_pct},
                            request_timeout_s=cfg.request_timeout_s)


def _read_from(path: str | None, offset: int) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def memory_growth_pct(series: list[int] | list[float]) -> float | None:
    """Mean of the last quarter against the first quarter of a memory series; None under 4 samples."""
    if len(series) < 4:
        return None
    q = max(1, len(series) // 4)
    first, last = sum(series[:q]) / q, sum(series[-q:]) / q
    return (last - first) / first * 100 if first else None


def judge_soak_gpu_memory(finding: Finding, rows: list[dict[str, Any]]) -> Finding:
    """capacity.soak judged on the per-GPU series sampled on the nodes over the soak window, the worst
    GPU deciding: it decides a soak left inconclusive for want of process memory (a container, an
    attached or remote server), and it can fail one that passed on the server process's memory alone
    (host RSS stays flat while GPU memory leaks). A failed soak stays failed."""
    window = (finding.configuration or {}).get("window") or {}
    limit = (finding.configuration or {}).get("max_growth_pct")
    if finding.status not in (Status.INCONCLUSIVE, Status.PASS) or not window or limit is None:
        return finding
    by_series: dict[str, list[int]] = {}
    for row in rows:
        if window["start"] <= row["t"] <= window["end"]:
            by_series.setdefault(row["series"], []).append(row["bytes"])
    growth = {name: memory_growth_pct(values) for name, values in by_series.items()}
    known = {k: v for k, v in growth.items() if v is not None}
    if not known:
        return finding
    worst = max(known, key=lambda k: known[k])
    finding.observed = {**(finding.observed or {}), "gpu_memory_growth_pct": known, "worst_gpu": worst}
    others = [u for u in (finding.observed.get("not_observed") or []) if not u.startswith("memory growth")]
    if known[worst] <= limit and others:
        return finding  # memory is now known, the rest still is not: never a pass
    finding.status = Status.PASS if known[worst] <= limit else Status.FAIL
    finding.reason = "" if finding.status == Status.PASS else f"GPU memory rises {known[worst]:.1f}% on {worst}"
    return finding
