"""The load generator's self-check: measured by the engine against a real local streaming server,
judged by rules/loadgen.py. Saturation is forced deterministically (a limit of 0, a blocked loop),
never by racing the machine's speed."""

from __future__ import annotations

import time

import pytest
from test_loadgen import StreamServer, server, specs  # noqa: F401 - the module's real streaming server

from vllm_acceptance.core.findings import Consequence, Finding, Status
from vllm_acceptance.load import engine as loadgen
from vllm_acceptance.load.engine import Record
from vllm_acceptance.load.stats import client_summary
from vllm_acceptance.rules import loadgen as rules
from vllm_acceptance.rules.loadgen import ClientLimits
from vllm_acceptance.verdict import decide

SLO = {"ttft_p95_s": 5.0}
# max_cpu_pct is per process, over every thread (the sender thread included): it can pass 100 %.
LENIENT = ClientLimits(max_cpu_pct=1000, max_send_lag_p99_s=10, send_lag_ttft_fraction=1, max_loop_lag_p99_s=10)


def measured(srv: StreamServer, mode: str = "closed", on_record=None) -> tuple[list[Record], dict]:
    checks: list[dict] = []
    recs = loadgen.run_load(srv.url("ok"), "m", specs(12, 8), mode=mode, concurrency=3, rate=100.0,
                            timeout_s=10, selfcheck=checks, on_record=on_record)
    return recs, client_summary(checks, recs)


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_engine_measures_its_own_client(server: StreamServer, mode: str) -> None:  # noqa: F811
    recs, client = measured(server, mode)
    (proc,) = client["processes"]
    assert proc["requests"] == 12 and proc["chunks"] == sum(r.chunks for r in recs) > 0
    assert proc["cpu_s"] > 0 and proc["wall_s"] > 0 and proc["cpu_pct"] > 0
    assert proc["loop_lag_s"]["count"] > 0 and proc["reads"] > 0 and proc["chunk_us"] > 0
    assert proc["sender"] == ("thread" if mode == "open" else "closed loop")
    assert client["send_lag_s"]["count"] == 12 and client["workers"] == 1
    # A client that kept up, judged with limits it cannot miss on a healthy run: not saturated.
    assert rules.saturation(client, LENIENT, SLO) == []


def test_cpu_limit_zero_flags_every_step(server: StreamServer) -> None:  # noqa: F811
    _, client = measured(server)
    reasons = rules.saturation(client, ClientLimits(max_cpu_pct=0), SLO)
    assert any("of a core (limit 0%)" in r for r in reasons)


def test_blocked_event_loop_is_named_by_the_self_check(server: StreamServer) -> None:  # noqa: F811
    blocked: list[Record] = []

    def block(rec: Record) -> None:
        if not blocked:
            blocked.append(rec)
            time.sleep(0.3)  # the client's loop stops reading for 0.3 s

    _, client = measured(server, "open", on_record=block)
    assert client["processes"][0]["loop_lag_s"]["max"] >= 0.29
    judged = rules.judge_client(client, ClientLimits(max_loop_lag_p99_s=0.0, max_cpu_pct=100), SLO)
    assert judged["saturated"] and any("event-loop lag" in r for r in judged["reasons"])


def test_multiprocess_run_reports_one_check_per_worker(server: StreamServer) -> None:  # noqa: F811
    checks: list[dict] = []
    recs = loadgen.run_load(server.url("ok"), "m", specs(8, 3), mode="open", rate=100.0, processes=2,
                            timeout_s=10, selfcheck=checks)
    assert len(recs) == 8 and sorted(c["process"] for c in checks) == [0, 1]
    assert sum(c["requests"] for c in checks) == 8


# --- rules (pure) -----------------------------------------------------------------------------------


def check(cpu: float = 20.0, loop_p99: float = 0.001, send_p99: float | None = 0.0002) -> dict:
    return {"processes": [{"process": 0, "cpu_pct": cpu, "loop_lag_s": {"p99": loop_p99}}],
            "send_lag_s": {"p99": send_p99}}


def test_saturation_reasons() -> None:
    limits = ClientLimits()
    assert rules.saturation(check(), limits, SLO) == []
    assert "95% of a core" in rules.saturation(check(cpu=95), limits, SLO)[0]
    assert "event-loop lag p99 80.0 ms" in rules.saturation(check(loop_p99=0.08), limits, SLO)[0]
    assert "send lag p99 6.00 ms" in rules.saturation(check(send_p99=0.006), limits, SLO)[0]
    # A tight TTFT SLO tightens the send-lag bound: 10% of 20 ms is 2 ms.
    assert rules.saturation(check(send_p99=0.003), limits, {"ttft_p95_s": 0.02})
    assert rules.saturation(None, limits, SLO) == ["no load generator self-check was recorded for this step"]


def test_limits_come_from_the_profile() -> None:
    values = {"loadgen.max_cpu_pct": 50, "loadgen.processes": 3, "loadgen.max_send_lag_p99_s": 0.001}
    limits = ClientLimits.from_profile(lambda k, d: values.get(k, d))
    assert (limits.max_cpu_pct, limits.processes, limits.max_send_lag_p99_s) == (50.0, 3, 0.001)
    assert ClientLimits.from_profile(lambda k, d: d).processes is None  # "auto"


def test_workers_sized_to_the_work() -> None:
    auto = ClientLimits(target_cpu_pct=50)
    assert rules.workers_for(None, None, auto, 16) == 1  # nothing measured yet
    assert rules.workers_for(50_000, 5.0, auto, 16) == 1  # 0.25 core -> one process
    assert rules.workers_for(300_000, 5.0, auto, 16) == 3  # 1.5 cores at 50% each
    assert rules.workers_for(10_000_000, 5.0, auto, 4) == 4  # never more than the cores
    assert rules.workers_for(10_000_000, 5.0, ClientLimits(processes=2), 16) == 2  # the profile decides


def ramp_finding(status: Status, reason: str = "") -> Finding:
    return Finding(check="capacity.ramp", status=status, consequence=Consequence.LIMIT, reason=reason)


def judged(saturated: bool) -> dict:
    return {"saturated": saturated, "reasons": ["worker process 0 used 99% of a core (limit 90%)"] if saturated else []}


def test_saturated_step_makes_capacity_inconclusive_never_a_verdict() -> None:
    for status in (Status.PASS, Status.FAIL):
        f = rules.overrule(ramp_finding(status, "stable only up to concurrency 2"),
                           [("ramp_c1", judged(False)), ("ramp_c4", judged(True))])
        assert f.status == Status.INCONCLUSIVE and f.reason.startswith("load generator saturated in ramp_c4")
        assert "worker processes" in f.action and "loadgen hosts" in f.action
        assert decide([f]).verdict == "incomplete"  # never expand_capacity or limited_observation


def test_failure_on_a_step_the_client_carried_stands() -> None:
    steps = [{"concurrency": 1, "meets_slo": True, "client": judged(False)},
             {"concurrency": 2, "meets_slo": False, "client": judged(False)},
             {"concurrency": 4, "meets_slo": False, "client": judged(True)}]
    assert rules.first_break_trusted(steps)
    f = rules.overrule(ramp_finding(Status.FAIL, "stable only up to concurrency 1"),
                       [("ramp_c2", judged(False)), ("ramp_c4", judged(True))], trusted_failure=True)
    assert f.status == Status.FAIL and "saturated only above the failing step" in f.reason
    steps[1]["client"] = judged(True)  # the failing step itself was the client's
    assert not rules.first_break_trusted(steps)
    steps[1]["client"] = {}  # no self-check: cannot be trusted either
    assert not rules.first_break_trusted(steps)


def test_a_stage_inconclusive_anyway_names_the_saturation_first() -> None:
    f = rules.overrule(ramp_finding(Status.INCONCLUSIVE), [("soak", judged(True))])
    assert f.reason.startswith("load generator saturated in soak") and "inconclusive on its own" in f.reason
    gone = Finding(check="capacity.soak", status=Status.MISSING, reason="not run: the server died")
    assert rules.overrule(gone, [("soak", judged(True))]).reason == "not run: the server died"


def test_client_that_kept_up_changes_nothing() -> None:
    f = rules.overrule(ramp_finding(Status.PASS), [("ramp_c1", judged(False))])
    assert f.status == Status.PASS


def test_capacity_loadgen_finding() -> None:
    ok = rules.loadgen_finding([("ramp_c1", judged(False))], ["client.json"])
    assert ok.check == "capacity.loadgen" and ok.status == Status.PASS
    bad = rules.loadgen_finding([("ramp_c1", judged(False)), ("soak", judged(True))], ["client.json"])
    assert bad.status == Status.INCONCLUSIVE and bad.reason == "load generator saturated in soak"
    assert rules.loadgen_finding([], []).status == Status.MISSING
