"""Merge the records of several load generator hosts into one judged step (``capacity.distributed``).

Input: ``<dir>/<host>.jsonl`` (records, :class:`vllm_acceptance.load.engine.records.RecordSink`) and
``<dir>/<host>.meta.json`` (:mod:`vllm_acceptance.load.worker`) for every host of the group
``loadgen``, fetched by playbooks/loadgen.yml.

Raw records merge exactly: every latency (TTFT, ITL, end-to-end) is a difference of two times
on one host's clock, so pooling records of several hosts is correct whatever their clocks say.
Only the merged window (throughput, "the hosts loaded the server together") depends on the
clocks agreeing; :func:`clock_check` bounds that: each host's first request must fall within
``tolerance_s`` of the shared ``start_at`` and every record inside the controller's window
``[start_at, window_end]``. A host off by more than the tolerance makes the finding
inconclusive, never a pass. Each host's client self-check (from its meta) is kept and judged
(``rules/loadgen.py``): one saturated host makes the merged step inconclusive, since its client
time is in the pooled latencies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.findings import Consequence, Finding, Status, write_findings
from ..core.rundir import RunDir
from ..load.engine.records import Record, read_records
from ..load.stats import client_summary, summarize
from ..rules import loadgen as loadgen_rules
from .load.config import LoadProbeConfig
from .load.steps import meets_slo, step_row

CHECK = "capacity.distributed"
DEFAULT_TOLERANCE_S = 2.0


@dataclass
class HostRun:
    host: str
    records: list[Record]
    meta: dict[str, Any] | None
    evidence: list[str] = field(default_factory=list)  # relative to the run dir


def read_host_runs(directory: Path, run_dir: Path) -> list[HostRun]:
    """Every ``<host>.jsonl`` in `directory` with its meta (None when the sidecar is missing or bad)."""
    runs = []
    for path in sorted(directory.glob("*.jsonl")):
        meta_file = path.with_name(path.stem + ".meta.json")
        meta: dict[str, Any] | None = None
        evidence = [str(path.relative_to(run_dir))]
        try:
            loaded = json.loads(meta_file.read_text())
            meta = loaded if isinstance(loaded, dict) else None
            evidence.append(str(meta_file.relative_to(run_dir)))
        except (OSError, ValueError):
            meta = None
        runs.append(HostRun(host=path.stem, records=read_records(path), meta=meta, evidence=evidence))
    return runs


def clock_check(runs: list[HostRun], start_at: float | None, window_end: float | None,
                tolerance_s: float = DEFAULT_TOLERANCE_S) -> dict[str, Any]:
    """Did the hosts start together, on clocks that agree with the controller's?

    Per host: ``start_lag_s`` (first scheduled - start_at), records outside the controller's window
    ``[start_at - tol, window_end + tol]``. ``ok`` is None when start_at is unknown (cannot tell).
    """
    hosts: dict[str, Any] = {}
    problems: list[str] = []
    firsts = []
    for run in runs:
        sched = [r.scheduled for r in run.records]
        ends = [r.end for r in run.records if r.end is not None]
        if not sched:
            hosts[run.host] = {"first_scheduled": None, "last_end": None, "start_lag_s": None, "outside": 0}
            continue
        first = min(sched)
        firsts.append(first)
        lag = None if start_at is None else first - start_at
        outside = 0
        if start_at is not None:
            lo, hi = start_at - tolerance_s, (window_end + tolerance_s) if window_end is not None else None
            outside = sum(1 for s in sched if s < lo) + sum(1 for e in ends if hi is not None and e > hi)
        hosts[run.host] = {"first_scheduled": first, "last_end": max(ends) if ends else None,
                           "start_lag_s": lag, "outside": outside}
        if lag is not None and abs(lag) > tolerance_s:
            problems.append(f"{run.host} started {lag:+.3f} s from start_at (tolerance {tolerance_s:g} s)")
        if outside:
            problems.append(f"{run.host}: {outside} record times outside the controller's window")
    spread = (max(firsts) - min(firsts)) if firsts else None
    if spread is not None and spread > tolerance_s:
        problems.append(f"first requests spread over {spread:.3f} s (tolerance {tolerance_s:g} s)")
    ok = None if start_at is None else not problems
    return {"ok": ok, "tolerance_s": tolerance_s, "start_at": start_at, "window_end": window_end,
            "start_spread_s": spread, "hosts": hosts, "problems": problems}


def merge_summary(runs: list[HostRun]) -> dict[str, Any]:
    """Overall summary of the pooled records and one per host."""
    pooled = [r for run in runs for r in run.records]
    return {"overall": summarize(pooled), "per_host": {run.host: summarize(run.records) for run in runs}}


def expected_shortfall(runs: list[HostRun]) -> list[str]:
    """Hosts that recorded fewer requests than they were asked to send (deadline, crash)."""
    out = []
    for run in runs:
        asked = (run.meta or {}).get("requests")
        if asked is not None and len(run.records) < int(asked):
            out.append(f"{run.host} recorded {len(run.records)} of {asked} requests")
    return out


def host_clients(runs: list[HostRun], cfg: LoadProbeConfig) -> dict[str, dict[str, Any]]:
    """Each host's judged client self-check (worker processes from its meta, send lag from its records)."""
    return {run.host: loadgen_rules.judge_client(client_summary((run.meta or {}).get("selfcheck") or [], run.records),
                                                 cfg.client, cfg.slo) for run in runs}


def below_contract_shape(runs: list[HostRun], cfg: LoadProbeConfig) -> list[str]:
    """What the hosts sent below the profile's shape (issue 28, item 8): fewer concurrent sessions or requests in
    all than the contract and load.requests_per_step, or a host's prompts or outputs shorter than the profile's
    load section. The loadgen_* inventory variables set these; a step below the contract proves nothing about it,
    so it never passes. Totals count over the hosts (the default splits the contract's concurrency over them)."""
    out = []
    for name, want, var in (("concurrency", cfg.contract_concurrency, "loadgen_concurrency x hosts: the contract's "
                                                                      "concurrent sessions"),
                            ("requests", cfg.requests_per_step, "loadgen_requests x hosts: load.requests_per_step")):
        total = sum(int((run.meta or {}).get(name) or 0) for run in runs)
        if runs and total < want:
            out.append(f"{total} {name} in all, below {want} ({var})")
    for name, want, var in (("prompt_tokens", cfg.prompt_tokens, "loadgen_prompt_tokens"),
                            ("output_tokens", cfg.output_tokens, "loadgen_output_tokens")):
        low = sorted(f"{run.host} {(run.meta or {}).get(name)}" for run in runs
                     if isinstance((run.meta or {}).get(name), int) and int((run.meta or {})[name]) < want)
        if low:
            out.append(f"{name} below the profile's {want} ({var}): {', '.join(low)}")
    return out


def judge(runs: list[HostRun], expected_hosts: list[str], clock: dict[str, Any], row: dict[str, Any],
          evidence: list[str], cfg: LoadProbeConfig) -> Finding:
    """The finding ``capacity.distributed`` from the merged step row and the checks around it."""
    common = dict(check=CHECK, consequence=Consequence.EXPAND, evidence=evidence,
                  expected=f"{row['concurrency']} concurrent sessions over {len(expected_hosts)} hosts meet the SLO",
                  rule="merged records of every loadgen host meet the profile SLO (load.meets_slo), "
                       "hosts started together within the clock tolerance")
    observed = {k: row.get(k) for k in ("concurrency", "requests", "ok", "errors", "ttft_p95", "itl_p95",
                                        "e2e_p95", "output_tokens_per_s", "preemptions", "meets_slo")}
    observed["hosts"] = {run.host: len(run.records) for run in runs}
    observed["start_spread_s"] = clock.get("start_spread_s")
    common["observed"] = observed
    absent = [h for h in expected_hosts if h not in {run.host for run in runs}]
    silent = [run.host for run in runs if not run.records]
    if absent or silent:
        return Finding(status=Status.MISSING, reason="no records from: " + ", ".join(absent + silent),
                       action="make every loadgen host reach the server and re-run playbooks/loadgen.yml",
                       **common)
    if clock["ok"] is not True:
        why = "; ".join(clock["problems"]) or "the shared start time is unknown"
        return Finding(status=Status.INCONCLUSIVE, reason=f"clocks or start not aligned: {why}",
                       action="synchronise the loadgen hosts' clocks (chrony/NTP) and re-run", **common)
    clients = host_clients(runs, cfg)
    observed["saturated_hosts"] = sorted(h for h, c in clients.items() if c["saturated"])
    if observed["saturated_hosts"]:
        why = "; ".join(f"{h}: {', '.join(clients[h]['reasons'][:2])}" for h in observed["saturated_hosts"])
        return Finding(status=Status.INCONCLUSIVE, reason=f"{loadgen_rules.SATURATED} on {why}",
                       action=loadgen_rules.RECOMMENDATION, **common)
    shortfall = expected_shortfall(runs)
    weaker = below_contract_shape(runs, cfg)
    observed["below_contract"] = weaker
    if row["meets_slo"] and not shortfall and weaker:
        return Finding(status=Status.INCONCLUSIVE, reason="the step ran below the contract's shape, so meeting the "
                       "SLO there says nothing about the contract: " + "; ".join(weaker),
                       action="remove the weakening loadgen_* variables (the defaults split the contract over the "
                              "hosts) and re-run playbooks/loadgen.yml", **common)
    if row["meets_slo"] and not shortfall:
        return Finding(status=Status.PASS, action="none", **common)
    # Preemptions unknown: a latency or error miss still fails, but a clean step cannot pass.
    if row["preemptions"] is None and not shortfall and meets_slo({**row, "preemptions": 0}, cfg):
        return Finding(status=Status.INCONCLUSIVE, reason="preemptions unknown (no metrics before/after)",
                       action="give the merge the server's /metrics (vllm_metrics_url) and re-run", **common)
    reasons = shortfall + ([] if row["meets_slo"] else ["merged step misses the SLO"])
    return Finding(status=Status.FAIL, reason="; ".join(reasons),
                   action="lower the per-host concurrency to find the knee, or expand capacity; adjust limits first",
                   **common)


def preemption_delta(before: Path | None, after: Path | None) -> float | None:
    """``vllm:num_preemptions`` after - before, from two saved /metrics texts (None if either is absent)."""
    from ..runtime.metrics import MetricsError, delta, parse_exposition

    if before is None or after is None or not before.is_file() or not after.is_file():
        return None
    try:
        return delta(parse_exposition(before.read_text()), parse_exposition(after.read_text()),
                     "vllm:num_preemptions")
    except (MetricsError, OSError):
        return None


def merge_stage(run_dir: Path, *, profile_path: str | None, expected_hosts: list[str], start_at: float | None,
                window_end: float | None, tolerance_s: float = DEFAULT_TOLERANCE_S,
                records_dir: str = "probes/load-distributed", metrics_before: Path | None = None,
                metrics_after: Path | None = None, stage: str = "load-distributed") -> tuple[Finding, dict[str, Any]]:
    """Merge, judge, and file ``findings/<stage>.json`` and ``stages/<stage>.json`` in the run."""
    from ..core.evidence import EvidenceStore
    from ..core.profile import load_profile

    profile = load_profile(profile_path) if profile_path else None
    cfg = LoadProbeConfig.from_profile(profile, {}, model="")
    directory = RunDir(run_dir).at(records_dir)
    runs = read_host_runs(directory, run_dir) if directory.is_dir() else []
    clock = clock_check(runs, start_at, window_end, tolerance_s)
    summary = merge_summary(runs)
    concurrency = sum(int((run.meta or {}).get("concurrency", 0)) for run in runs)
    preempt = preemption_delta(metrics_before, metrics_after)
    row = step_row(concurrency, [r for run in runs for r in run.records], [], preempt, cfg)
    store = EvidenceStore(run_dir, records_dir)
    details = {"hosts": sorted(run.host for run in runs), "expected_hosts": expected_hosts, "row": row,
               "summary": summary, "clock": clock, "meta": {run.host: run.meta for run in runs},
               "preemptions": preempt, "clients": host_clients(runs, cfg)}
    merged = store.write_json("merged.json", details)
    evidence = [merged] + [p for run in runs for p in run.evidence]
    for name in (metrics_before, metrics_after):
        if name is not None and name.is_file() and name.resolve().is_relative_to(run_dir.resolve()):
            evidence.append(str(name.resolve().relative_to(run_dir.resolve())))
    finding = judge(runs, expected_hosts, clock, row, evidence, cfg)
    write_findings(RunDir(run_dir).findings_path(stage), [finding])
    EvidenceStore(run_dir, "stages").write_json(f"{stage}.json", {**details, "finding": finding.to_dict()})
    return finding, details
