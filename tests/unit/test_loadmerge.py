"""Merging the records of several loadgen hosts into capacity.distributed (loadmerge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Status, read_findings
from vllm_acceptance.load.engine import Record
from vllm_acceptance.load.worker import build_parser, host_seed, meta_path, validate
from vllm_acceptance.probes.loadmerge import CHECK, clock_check, merge_stage, read_host_runs

REPO = Path(__file__).resolve().parents[2]
PROFILE = str(REPO / "profiles" / "cpu-lab.yml")
START = 1_800_000_000.0
PROM = 'vllm:num_preemptions_total{engine="0",model_name="tiny-agent"} %s\n'


def records(host: str, n: int, start: float, e2e: float = 0.5, status: str = "ok") -> list[Record]:
    out = []
    for i in range(n):
        t = start + i * 0.1
        out.append(Record(request_id=f"{host}-{i:06d}", tag="dist", worker="p0.w0", scheduled=t, sent=t,
                          first_token=t + 0.05, end=t + e2e, status=status, http_status=200, prompt_tokens=256,
                          completion_tokens=8, chunks=9, itl_s=[0.01] * 7, finish_reason="length"))
    return out


def write_host(run_dir: Path, host: str, recs: list[Record], concurrency: int = 2, asked: int | None = None,
               torn: bool = False, cpu_pct: float | None = 20.0, prompt_tokens: int | None = None) -> None:
    d = run_dir / "probes" / "load-distributed"
    d.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r.to_dict()) + "\n" for r in recs)
    if torn:
        text += '{"request_id": "cut-mid-wri'
    (d / f"{host}.jsonl").write_text(text)
    meta = {"host": host, "concurrency": concurrency, "requests": len(recs) if asked is None else asked}
    if prompt_tokens is not None:
        meta["prompt_tokens"] = prompt_tokens
    if cpu_pct is not None:  # the worker's client self-check, as load/worker.py writes it
        meta["selfcheck"] = [{"process": 0, "host": host, "cpu_pct": cpu_pct, "loop_lag_s": {"p99": 0.002},
                              "chunks": sum(r.chunks for r in recs), "read_busy_s": 0.01}]
    (d / f"{host}.meta.json").write_text(json.dumps(meta))


def metrics(run_dir: Path, before: float, after: float) -> tuple[Path, Path]:
    d = run_dir / "probes" / "load-distributed"
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics-before.prom").write_text(PROM % before)
    (d / "metrics-after.prom").write_text(PROM % after)
    return d / "metrics-before.prom", d / "metrics-after.prom"


def merge(run_dir: Path, hosts: list[str], with_metrics: bool = True, preempt: float = 0.0, **kw):
    mb, ma = metrics(run_dir, 3.0, 3.0 + preempt) if with_metrics else (None, None)
    return merge_stage(run_dir, profile_path=PROFILE, expected_hosts=hosts, start_at=START,
                       window_end=START + 60, metrics_before=mb, metrics_after=ma, **kw)


def test_two_aligned_hosts_pass_and_counts_add_up(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 6, START + 0.01))
    write_host(tmp_path, "lg1", records("lg1", 4, START + 0.02), torn=True)  # torn last line is skipped
    finding, details = merge(tmp_path, ["lg0", "lg1"])
    assert finding.check == CHECK and finding.status == Status.PASS
    assert details["summary"]["overall"]["count"] == 10
    assert {h: s["count"] for h, s in details["summary"]["per_host"].items()} == {"lg0": 6, "lg1": 4}
    assert details["row"]["concurrency"] == 4 and details["row"]["preemptions"] == 0
    assert finding.observed["hosts"] == {"lg0": 6, "lg1": 4}
    # Evidence is relative to the run dir and exists; the stage files are filed for the report.
    assert finding.evidence and all((tmp_path / p).is_file() for p in finding.evidence)
    assert "probes/load-distributed/lg1.jsonl" in finding.evidence
    assert "probes/load-distributed/metrics-after.prom" in finding.evidence
    assert read_findings(tmp_path / "findings" / "load-distributed.json")[0].status == Status.PASS
    stage = json.loads((tmp_path / "stages" / "load-distributed.json").read_text())
    assert stage["finding"]["status"] == "pass" and stage["hosts"] == ["lg0", "lg1"]


def test_host_with_skewed_clock_is_inconclusive(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 4, START + 0.01))
    write_host(tmp_path, "lg1", records("lg1", 4, START + 5.0))  # 5 s off: clock or a late start
    finding, details = merge(tmp_path, ["lg0", "lg1"])
    assert finding.status == Status.INCONCLUSIVE
    assert "lg1 started +5" in finding.reason
    assert details["clock"]["ok"] is False and details["clock"]["start_spread_s"] == pytest.approx(4.99)


def test_missing_host_is_missing_not_pass(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 4, START + 0.01))
    finding, _ = merge(tmp_path, ["lg0", "lg1"])
    assert finding.status == Status.MISSING and "lg1" in finding.reason


def test_no_records_at_all_is_missing(tmp_path: Path) -> None:
    finding, details = merge(tmp_path, ["lg0"], with_metrics=False)
    assert finding.status == Status.MISSING and details["summary"]["overall"]["count"] == 0


def test_without_metrics_a_clean_step_is_inconclusive_but_a_slow_one_fails(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 4, START + 0.01))
    assert merge(tmp_path, ["lg0"], with_metrics=False)[0].status == Status.INCONCLUSIVE
    slow = tmp_path / "slow"
    write_host(slow, "lg0", records("lg0", 4, START + 0.01, e2e=30.0))  # e2e p95 SLO is 20 s
    finding, _ = merge(slow, ["lg0"], with_metrics=False)
    assert finding.status == Status.FAIL and "SLO" in finding.reason


def test_preemption_or_errors_or_shortfall_fail(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 4, START + 0.01))
    assert merge(tmp_path, ["lg0"], preempt=2)[0].status == Status.FAIL
    errs = tmp_path / "errs"
    write_host(errs, "lg0", records("lg0", 3, START + 0.01) + records("lgx", 1, START + 0.5, status="error"))
    assert merge(errs, ["lg0"])[0].status == Status.FAIL
    short = tmp_path / "short"
    write_host(short, "lg0", records("lg0", 3, START + 0.01), asked=8)
    finding, _ = merge(short, ["lg0"])
    assert finding.status == Status.FAIL and "3 of 8" in finding.reason


def test_clock_check_unknown_start_cannot_pass(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 2, START))
    runs = read_host_runs(tmp_path / "probes" / "load-distributed", tmp_path)
    assert clock_check(runs, None, None)["ok"] is None
    finding, _ = merge_stage(tmp_path, profile_path=PROFILE, expected_hosts=["lg0"], start_at=None, window_end=None)
    assert finding.status == Status.INCONCLUSIVE


def test_records_after_the_controller_window_are_flagged(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 2, START + 0.01, e2e=100.0))  # ends after window_end + tol
    runs = read_host_runs(tmp_path / "probes" / "load-distributed", tmp_path)
    check = clock_check(runs, START, START + 60, 2.0)
    assert check["ok"] is False and check["hosts"]["lg0"]["outside"] == 2


def test_cli_arguments() -> None:
    parser = build_parser()
    args = parser.parse_args(["run", "--base-url", "http://x/v1", "--model", "m", "--concurrency", "0",
                              "--requests", "2", "--out", "/tmp/x.jsonl"])
    assert "--concurrency must be >= 1" in (validate(args) or "")
    args.concurrency, args.start_at = 1, 9e12
    assert "ahead" in (validate(args) or "")
    args.start_at = None
    assert validate(args) is None
    assert meta_path(Path("/d/h.jsonl")) == Path("/d/h.meta.json")
    assert host_seed("lg0") != host_seed("lg1")


def test_a_saturated_loadgen_host_makes_the_merged_step_inconclusive(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 8, START + 0.2))
    write_host(tmp_path, "lg1", records("lg1", 8, START + 0.3), cpu_pct=99.0)  # its client was the bottleneck
    finding, details = merge(tmp_path, ["lg0", "lg1"])
    assert finding.status == Status.INCONCLUSIVE
    assert finding.reason.startswith("load generator saturated on lg1: lg1 worker process 0 used 99% of a core")
    assert "loadgen hosts" in finding.action and finding.observed["saturated_hosts"] == ["lg1"]
    assert details["clients"]["lg0"]["saturated"] is False  # per-host self-checks are kept


def test_a_host_without_a_self_check_cannot_pass(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 8, START + 0.2))
    write_host(tmp_path, "lg1", records("lg1", 8, START + 0.3), cpu_pct=None)  # an older worker, or a lost meta
    finding, _ = merge(tmp_path, ["lg0", "lg1"])
    assert finding.status == Status.INCONCLUSIVE and "no load generator self-check" in finding.reason


def test_a_step_below_the_contract_concurrency_never_passes(tmp_path: Path) -> None:
    """loadgen_concurrency: 1 on two hosts sends 2 sessions where the contract (cpu-lab) asks 4: the SLO is met
    there, which says nothing about the contract (issue 28, item 8)."""
    write_host(tmp_path, "lg0", records("lg0", 6, START + 0.01), concurrency=1)
    write_host(tmp_path, "lg1", records("lg1", 4, START + 0.02), concurrency=1)
    finding, _ = merge(tmp_path, ["lg0", "lg1"])
    assert finding.status == Status.INCONCLUSIVE
    assert "2 concurrency in all, below 4" in finding.reason and "loadgen_concurrency" in finding.reason


def test_shorter_prompts_than_the_profile_never_pass(tmp_path: Path) -> None:
    write_host(tmp_path, "lg0", records("lg0", 6, START + 0.01), prompt_tokens=256)
    write_host(tmp_path, "lg1", records("lg1", 4, START + 0.02), prompt_tokens=16)    # loadgen_prompt_tokens: 16
    finding, _ = merge(tmp_path, ["lg0", "lg1"])
    assert finding.status == Status.INCONCLUSIVE
    assert "prompt_tokens below the profile's 256 (loadgen_prompt_tokens): lg1 16" in finding.reason
    assert finding.observed["below_contract"]
