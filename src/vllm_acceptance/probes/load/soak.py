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
    host = host_memory(run.sampler.memory_series(start, end))
    s = summarize(records)
    obs = {"seconds": round(end - start, 1), "concurrency": concurrency, "requests": s["count"],
           "errors": s["errors"] + s["timeouts"], **hung_requests(records), **host,
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


def host_memory(series: dict[str, list[int]]) -> dict[str, Any]:
    """The server's own memory over the soak, each series judged alone (a local pid's RSS, the RSS from its
    /metrics), the worst deciding: ``memory_growth_pct`` (None: no series with 4 samples), ``memory_series``
    the growth of each, ``memory_samples`` the samples of the deciding series."""
    growth = {name: memory_growth_pct(values) for name, values in series.items()}
    known = {name: value for name, value in growth.items() if value is not None}
    worst = max(known, key=lambda name: known[name]) if known else None
    return {"memory_growth_pct": known[worst] if worst else None,
            "memory_samples": len(series[worst]) if worst else max((len(v) for v in series.values()), default=0),
            "memory_series": {name: {"growth_pct": growth[name], "samples": len(values)}
                              for name, values in series.items()},
            "memory_source": worst}


def memory_growth_pct(series: list[int] | list[float]) -> float | None:
    """Mean of the last quarter against the first quarter of a memory series; None under 4 samples."""
    if len(series) < 4:
        return None
    q = max(1, len(series) // 4)
    first, last = sum(series[:q]) / q, sum(series[-q:]) / q
    return (last - first) / first * 100 if first else None


CONTAINER_SERIES = "cgroup:"   # a container's memory.current sampled on its node (the server's own host memory)


def judge_soak_gpu_memory(finding: Finding, rows: list[dict[str, Any]]) -> Finding:
    """capacity.soak judged on the series sampled on the nodes over the soak window: per-GPU memory and, where
    the run read it, the server's container memory (``cgroup:<host>`` rows), the worst series deciding. Any of
    them rising past the limit fails the soak (GPU memory leaking while host RSS stays flat, or host memory
    leaking while vLLM's preallocated GPU memory stays flat). Flat GPU memory alone never passes it: the
    server's own memory (a local pid's RSS, the RSS in its /metrics, its container's cgroup) must have been
    observed too, or the memory part stays not observed. A failed soak stays failed."""
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
    gpus = {k: v for k, v in known.items() if not k.startswith(CONTAINER_SERIES)}
    containers = {k: v for k, v in known.items() if k.startswith(CONTAINER_SERIES)}
    worst = max(known, key=lambda k: known[k])
    obs = dict(finding.observed or {})
    if gpus:
        obs.update(gpu_memory_growth_pct=gpus, worst_gpu=max(gpus, key=lambda k: gpus[k]))
    if containers:
        obs.update(container_memory_growth_pct=containers)
    host_seen = obs.get("memory_growth_pct") is not None or bool(containers)
    unseen = list(obs.get("not_observed") or [])
    if host_seen:
        unseen = [u for u in unseen if not u.startswith("memory growth")]
    elif not any(u.startswith("memory growth") for u in unseen):
        unseen.append(rules.MEMORY_UNSEEN)
    obs["not_observed"] = unseen
    finding.observed = obs
    if known[worst] > limit:
        what = "container memory" if worst.startswith(CONTAINER_SERIES) else "GPU memory"
        finding.status, finding.reason = Status.FAIL, f"{what} rises {known[worst]:.1f}% on {worst}"
        return finding
    if unseen:   # memory is known where it was sampled, the rest still is not: never a pass
        finding.status, finding.reason = Status.INCONCLUSIVE, "not observed: " + "; ".join(unseen)
        return finding
    finding.status, finding.reason = Status.PASS, ""
    return finding
