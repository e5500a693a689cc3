"""Knee and SLO logic of the capacity stage."""

from __future__ import annotations

from pathlib import Path

from vllm_acceptance.core.findings import Consequence, Finding, Status
from vllm_acceptance.probes.load import LoadProbeConfig, judge_soak_gpu_memory, knee_of, meets_slo

REPO = Path(__file__).resolve().parents[2]


def row(c: int, ok: bool = True, ttft: float = 0.2, preempt: float = 0, errors: float = 0.0) -> dict:
    return {"concurrency": c, "ok": 8 if ok else 0, "error_rate": errors, "preemptions": preempt,
            "ttft_p95": ttft, "e2e_p95": 1.0, "itl_p95": 0.05}


CFG = LoadProbeConfig(model="m", slo={"ttft_p95_s": 1.0, "e2e_p95_s": 5.0, "max_error_rate": 0.0})


def steps(*rows: dict) -> list[dict]:
    return [{**r, "meets_slo": meets_slo(r, CFG)} for r in rows]


def test_knee_is_last_step_before_the_first_break() -> None:
    assert knee_of(steps(row(1), row(2), row(4, ttft=3.0), row(8))) == 2


def test_preemption_or_errors_break_the_slo() -> None:
    assert knee_of(steps(row(1), row(2, preempt=3))) == 1
    assert knee_of(steps(row(1, errors=0.1))) is None


def test_missing_preemption_counter_never_meets_the_slo() -> None:
    assert meets_slo({**row(1), "preemptions": None}, CFG) is False


def soak(status: str = "inconclusive") -> Finding:
    return Finding(check="capacity.soak", status=Status(status), consequence=Consequence.EXPAND,
                   configuration={"window": {"start": 100.0, "end": 200.0}, "max_growth_pct": 5.0})


def gpu_rows(series: str, values: list[int], start: float = 110.0) -> list[dict]:
    return [{"t": start + 10 * i, "bytes": v, "series": series} for i, v in enumerate(values)]


def test_soak_is_judged_from_gpu_memory_when_no_process_memory() -> None:
    steady = gpu_rows("gpu0@n1", [100, 100, 101, 100, 100, 101, 100, 100])
    rising = gpu_rows("gpu1@n1", [100, 104, 108, 112, 116, 120, 124, 128])
    assert judge_soak_gpu_memory(soak(), steady).status == Status.PASS
    judged = judge_soak_gpu_memory(soak(), steady + rising)
    assert judged.status == Status.FAIL and judged.observed["worst_gpu"] == "gpu1@n1"


def test_soak_stays_inconclusive_without_samples_in_its_window() -> None:
    outside = gpu_rows("gpu0@n1", [100] * 8, start=500.0)
    assert judge_soak_gpu_memory(soak(), outside).status == Status.INCONCLUSIVE
    assert judge_soak_gpu_memory(soak("fail"), gpu_rows("gpu0@n1", [1] * 8)).status == Status.FAIL


def test_unreadable_metrics_leave_the_load_stage_missing_never_a_pass(tmp_path: Path) -> None:
    """A metrics URL that answers nothing (a closed port here): without running/waiting/KV/preemption
    counters no step can be judged, so the probe sends no load and files capacity.metrics as missing."""
    import socket

    from vllm_acceptance.core.evidence import EvidenceStore
    from vllm_acceptance.core.profile import load_profile
    from vllm_acceptance.probes.load import run_load_probe
    from vllm_acceptance.runtime.metrics import DirectMetrics
    from vllm_acceptance.verdict import decide

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = LoadProbeConfig.from_profile(load_profile(REPO / "profiles" / "cpu-lab.yml"), {}, model="tiny-agent")
    metrics = DirectMetrics(f"http://127.0.0.1:{port}/metrics", timeout_s=2)
    findings, details = run_load_probe(f"http://127.0.0.1:{port}/v1", metrics, cfg, EvidenceStore(tmp_path))
    assert [(f.check, f.status) for f in findings] == [("capacity.metrics", Status.MISSING)]
    assert f"127.0.0.1:{port}/metrics" in findings[0].reason and details == {}
    assert decide(findings).verdict == "incomplete"
