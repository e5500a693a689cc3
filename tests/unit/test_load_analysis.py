"""Knee and SLO logic of the capacity stage."""

from __future__ import annotations

from vllm_acceptance.probes.load import LoadProbeConfig, knee_of, meets_slo


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
