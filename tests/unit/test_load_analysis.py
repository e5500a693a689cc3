"""Knee and SLO logic of the capacity stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Consequence, Finding, Status
from vllm_acceptance.probes.load import LoadProbeConfig, judge_soak_gpu_memory, knee_of, meets_slo, rules

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


def soak(status: str = "inconclusive", host_growth_pct: float | None = None) -> Finding:
    """The load probe's capacity.soak; `host_growth_pct`: the server's own memory (local pid or its /metrics)."""
    observed = {"memory_growth_pct": host_growth_pct, "not_observed": [] if host_growth_pct is not None else
                [rules.MEMORY_UNSEEN]}
    return Finding(check="capacity.soak", status=Status(status), consequence=Consequence.EXPAND, observed=observed,
                   configuration={"window": {"start": 100.0, "end": 200.0}, "max_growth_pct": 5.0})


def gpu_rows(series: str, values: list[int], start: float = 110.0) -> list[dict]:
    return [{"t": start + 10 * i, "bytes": v, "series": series} for i, v in enumerate(values)]


def test_soak_is_judged_from_gpu_memory_with_the_servers_own_memory() -> None:
    steady = gpu_rows("gpu0@n1", [100, 100, 101, 100, 100, 101, 100, 100])
    rising = gpu_rows("gpu1@n1", [100, 104, 108, 112, 116, 120, 124, 128])
    assert judge_soak_gpu_memory(soak(host_growth_pct=0.5), steady).status == Status.PASS
    judged = judge_soak_gpu_memory(soak(host_growth_pct=0.5), steady + rising)
    assert judged.status == Status.FAIL and judged.observed["worst_gpu"] == "gpu1@n1"
    # GPU memory rising fails the soak even where the server's own memory was never observed
    assert judge_soak_gpu_memory(soak(), steady + rising).status == Status.FAIL


@pytest.mark.parametrize("finding", [soak(), Finding(check="capacity.soak", status=Status.INCONCLUSIVE,
                                                     consequence=Consequence.EXPAND,
                                                     configuration={"window": {"start": 100.0, "end": 200.0},
                                                                    "max_growth_pct": 5.0})])
def test_flat_gpu_memory_alone_never_passes_the_soak(finding: Finding) -> None:
    """Issue 42: vLLM preallocates its GPU memory, so a host-memory leak leaves the GPU series flat; without the
    server's own memory the soak's memory part stays not observed (never a pass), whatever the finding said."""
    judged = judge_soak_gpu_memory(finding, gpu_rows("gpu0@n1", [100] * 8))
    assert judged.status == Status.INCONCLUSIVE
    assert judged.observed["not_observed"] == [rules.MEMORY_UNSEEN]
    assert "server's own memory" in judged.reason


def test_container_memory_rising_fails_while_gpu_memory_is_flat() -> None:
    """The container's cgroup series (cgroup:<host>) counts as the server's own memory: flat, it completes the
    memory part; rising, it fails the soak like rising GPU memory."""
    flat_gpu = gpu_rows("gpu0@n1", [100] * 8)
    flat = judge_soak_gpu_memory(soak(), flat_gpu + gpu_rows("cgroup:n1", [1000] * 8))
    assert flat.status == Status.PASS and flat.observed["container_memory_growth_pct"] == {"cgroup:n1": 0.0}
    rising = judge_soak_gpu_memory(soak(), flat_gpu + gpu_rows("cgroup:n1", [1000, 1100, 1200, 1300, 1400, 1500,
                                                                            1600, 1700]))
    assert rising.status == Status.FAIL and rising.reason.startswith("container memory rises")


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
