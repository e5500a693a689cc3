"""Cache judging on recorded shapes: exact block-aligned hits pass; counters without prefill gain,
unclean measurements and hybrid first-session misses are handled as the spec says."""

from __future__ import annotations

from pathlib import Path

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.probes.cache import (
    CacheProbeConfig,
    Measurement,
    expected_hits,
    judge_reuse,
    one_instance,
    run_cache_probe,
)
from vllm_acceptance.probes.cache.rules import judge_restart, judge_rounds, kv_blocks, window_blocks
from vllm_acceptance.runtime.client import OpenAIClient
from vllm_acceptance.runtime.metrics import Instance, MetricsError, MetricsSource, Snapshot, parse_exposition

BLOCK = 128
METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "metrics"


def m(session: int, kind: str, hits: float, expected: int, prompt: int = 1723, prefill_s: float = 0.4,
      computed: float | None = None, clean: bool = True) -> Measurement:
    return Measurement(session=session, kind=kind, prompt_tokens=prompt, hits=hits, queries=prompt,
                       expected_hits=expected, prefill_time_s=prefill_s,
                       prefill_computed_tokens=computed if computed is not None else prompt - hits, clean=clean,
                       cached_by_source={"device": hits} if hits else {})


def session(s: int, hot_hits: float = 1664, hot_time: float = 0.05, control_hits: float = 0) -> list[Measurement]:
    return [m(s, "cold", 0, 0), m(s, "hot_a", hot_hits, 1664, prefill_s=hot_time),
            m(s, "hot_b", hot_hits, 1664, prefill_s=hot_time), m(s, "control", control_hits, 0)]


def statuses(findings) -> dict[str, Status]:
    return {f.check: f.status for f in findings}


def cfg(**kw) -> CacheProbeConfig:
    return CacheProbeConfig(model="m", scenario={}, **kw)


def test_expected_hits_are_whole_shared_blocks_and_identical_resend_recomputes_last() -> None:
    a = list(range(1723))
    b = a[:1700] + [9, 9, 9]
    assert expected_hits(b, [a], BLOCK) == 1664
    assert expected_hits(a, [a], BLOCK) == 1664  # 1722 shared -> 13 whole blocks
    assert expected_hits([7] + a[1:], [a], BLOCK) == 0
    assert expected_hits(None, [a], BLOCK) is None


def test_real_lab_shape_passes() -> None:
    got = statuses(judge_reuse(session(1) + session(2) + session(3), cfg(), BLOCK, "requests.json"))
    assert got["cache.hot_reuse"] == got["cache.cold_baseline"] == got["cache.control"] == Status.PASS
    assert got["cache.prefill_gain"] == Status.PASS and got["cache.source"] == Status.PASS
    assert got["cache.isolation"] == Status.PASS


def test_no_reuse_fails() -> None:
    got = statuses(judge_reuse(session(1, hot_hits=0, hot_time=0.4) + session(2, hot_hits=0, hot_time=0.4),
                               cfg(), BLOCK, "r"))
    assert got["cache.hot_reuse"] == Status.FAIL
    assert got["cache.prefill_gain"] == Status.FAIL


def test_a_shorter_hot_prompt_without_hits_is_no_prefill_gain() -> None:
    """The lab's stamped-prompt gateway shape: no hits, hot prompts shorter than the cold ones. Their absolute
    prefill work and time are smaller, but not per prompt token: no gain, a fail (it was inconclusive)."""
    def hot(s: int, kind: str) -> Measurement:
        return m(s, kind, 0, 1664, prompt=800, prefill_s=0.19)
    ms = [x for s in (1, 2) for x in (m(s, "cold", 0, 0), hot(s, "hot_a"), hot(s, "hot_b"), m(s, "control", 0, 0))]
    got = judge_reuse(ms, cfg(), BLOCK, "r")
    gain = next(f for f in got if f.check == "cache.prefill_gain")
    assert gain.status == Status.FAIL, gain
    assert gain.observed["hot_computed_share"] == gain.observed["cold_computed_share"] == 1.0
    # The lab's own figures: 4 % less prefill time per token without a hit (a fixed cost amortised) is noise.
    ms = [x for s in (1, 2) for x in (m(s, "cold", 0, 0), m(s, "hot_a", 0, 1664, prompt=800, prefill_s=0.1783),
                                      m(s, "hot_b", 0, 1664, prompt=800, prefill_s=0.1783), m(s, "control", 0, 0))]
    assert statuses(judge_reuse(ms, cfg(), BLOCK, "r"))["cache.prefill_gain"] == Status.FAIL


def test_hits_without_prefill_time_drop_are_inconclusive() -> None:
    got = statuses(judge_reuse(session(1, hot_time=0.5) + session(2, hot_time=0.5), cfg(), BLOCK, "r"))
    assert got["cache.hot_reuse"] == Status.PASS
    assert got["cache.prefill_gain"] == Status.INCONCLUSIVE


def test_control_that_still_hits_fails() -> None:
    got = statuses(judge_reuse(session(1, control_hits=1664), cfg(), BLOCK, "r"))
    assert got["cache.control"] == Status.FAIL


def test_unclean_measurement_is_inconclusive_never_pass() -> None:
    ms = session(1)
    ms[1].clean = False
    ms[2].clean = False
    got = statuses(judge_reuse(ms, cfg(), BLOCK, "r"))
    assert got["cache.isolation"] == Status.INCONCLUSIVE
    assert got["cache.hot_reuse"] == Status.INCONCLUSIVE  # nothing clean to judge


ONE, TWO = Instance(start=1.0), Instance(start=2.0)   # two process start times


def test_one_live_instance_through_the_protocol() -> None:
    """cache.crash once the protocol ended: the process start time of the first and the last request."""
    same = one_instance(Instance(start=1764660000.0), Instance(start=1764660000.0), 19, "requests.json", cfg())
    assert [f.status for f in same] == [Status.PASS] and same[0].check == "cache.crash"
    restarted = one_instance(Instance(start=1764660000.0), Instance(start=1764660420.0), 19, "requests.json", cfg())
    assert [f.status for f in restarted] == [Status.INCONCLUSIVE]
    assert "restarted during the protocol" in (restarted[0].reason or "")
    assert one_instance(None, Instance(start=1764660000.0), 19, "requests.json", cfg()) == []


def test_without_a_process_start_time_the_request_counter_tells_a_restart() -> None:
    """Several API servers (vllm serve with data parallel) export no process_* series: a counter that rose by the
    requests measured is one process; one that fell, or rose by less, is a new one (never a pass)."""
    same = one_instance(Instance(served=40), Instance(served=55), 15, "requests.json", cfg(), finished=15)
    assert [f.status for f in same] == [Status.PASS] and "rose by at least the 15" in same[0].reason
    quiet_restart = one_instance(Instance(served=40), Instance(served=12), 15, "requests.json", cfg(), finished=15)
    assert [f.status for f in quiet_restart] == [Status.INCONCLUSIVE]
    assert "vllm:request_success 40 -> vllm:request_success 12" in quiet_restart[0].reason
    assert one_instance(Instance(), Instance(), 15, "requests.json", cfg(), finished=15) == []
    hot = m(0, "restart", 0, 0)
    assert judge_restart(Instance(served=57), Instance(served=0), hot, cfg(), BLOCK, ["r"], True).status \
        == Status.PASS
    assert judge_restart(Instance(served=57), Instance(served=57), hot, cfg(), BLOCK, ["r"], True).status \
        == Status.INCONCLUSIVE


def test_hybrid_first_session_may_only_create_retention() -> None:
    ms = session(1, hot_hits=0, hot_time=0.4) + session(2, hot_hits=1536) + session(3, hot_hits=1536)
    assert statuses(judge_reuse(ms, cfg(hybrid=True), BLOCK, "r"))["cache.hot_reuse"] == Status.PASS
    assert statuses(judge_reuse(ms, cfg(hybrid=False), BLOCK, "r"))["cache.hot_reuse"] == Status.FAIL


def test_external_only_hits_never_pass_for_local_reuse() -> None:
    ms = session(1)
    for x in ms:
        if x.hits:
            x.cached_by_source = {"external_unspecified": x.hits}
    assert statuses(judge_reuse(ms, cfg(), BLOCK, "r"))["cache.source"] == Status.FAIL


def test_cold_hits_on_a_template_head_before_the_session_id_are_allowed_and_nothing_more() -> None:
    """Kimi-style templates render the tool declarations before the system prompt: every cold
    request shares that head (here 512 tokens, cached by earlier sessions or any other traffic)."""
    def shaped(cold_hits: float) -> list[Measurement]:
        # The probe sets every cold request's expected hits to at least the measured head.
        return [m(s, "cold", cold_hits if s > 1 else 0, 512) for s in (1, 2, 3)] + [
            x for s in (1, 2, 3) for x in session(s)[1:]]

    assert statuses(judge_reuse(shaped(512), cfg(), BLOCK, "r", head=512))["cache.cold_baseline"] == Status.PASS
    # One block of the session's own part beyond the head is a failure.
    cold = next(f for f in judge_reuse(shaped(768), cfg(), BLOCK, "r", head=512) if f.check == "cache.cold_baseline")
    assert cold.status == Status.FAIL and cold.expected == "hits <= 512 (template head) + 128"
    # The head cached by traffic before the probe: within the head it passes, without a head it fails.
    got = statuses(judge_reuse([m(1, "cold", 512, 512)] + session(1)[1:] + session(2), cfg(), BLOCK, "r", head=512))
    assert got["cache.cold_baseline"] == Status.PASS
    no_head = [m(1, "cold", 512, 0)] + session(1)[1:] + session(2)
    assert statuses(judge_reuse(no_head, cfg(), BLOCK, "r"))["cache.cold_baseline"] == Status.FAIL


def test_hybrid_hot_hits_that_only_reuse_the_template_head_fail() -> None:
    """Kimi templates render the tool declarations first: a hybrid hot request that hits only that head
    (which every cold request shares too) shows no reuse of the session's own prefix."""
    head_only = session(1, hot_hits=512) + session(2, hot_hits=512) + session(3, hot_hits=512)
    got = judge_reuse(head_only, cfg(hybrid=True), BLOCK, "r", head=512)
    hot = next(f for f in got if f.check == "cache.hot_reuse")
    assert hot.status == Status.FAIL and "512 < hits" in hot.expected
    stepped = session(1, hot_hits=0) + session(2, hot_hits=1536) + session(3, hot_hits=1664)
    assert statuses(judge_reuse(stepped, cfg(hybrid=True), BLOCK, "r", head=512))["cache.hot_reuse"] == Status.PASS


def rounds(*hits: float, expected: int = 1664) -> list[Measurement]:
    return [m(r, "round", h, expected) for r, h in enumerate(hits, 1)]


def test_repeated_rounds_on_one_prefix() -> None:
    assert judge_rounds(rounds(1664, 1664, 1664), cfg(), BLOCK, 0, ["r"]).status == Status.PASS
    assert judge_rounds(rounds(1664, 0, 1664), cfg(), BLOCK, 0, ["r"]).status == Status.FAIL
    # Hybrid: the first repeat may only create the retention; later rounds must hit past the head and
    # within one retention step (retention_interval 512 here) of the shared prefix.
    hybrid = cfg(hybrid=True, retention_interval=512)
    assert judge_rounds(rounds(0, 1536, 1536), hybrid, BLOCK, 512, ["r"]).status == Status.PASS
    assert judge_rounds(rounds(0, 512, 512), hybrid, BLOCK, 512, ["r"]).status == Status.FAIL
    assert judge_rounds(rounds(0, 1024, 1024), cfg(hybrid=True), BLOCK, 0, ["r"]).status == Status.FAIL
    unclean = rounds(1664, 1664)
    unclean[1].clean = False
    assert judge_rounds(unclean, cfg(), BLOCK, 0, ["r"]).status == Status.INCONCLUSIVE
    assert judge_rounds([], cfg(), BLOCK, 0, ["r"]).status == Status.NOT_APPLICABLE


def test_a_round_whose_window_the_kv_cache_cannot_hold_is_not_judged() -> None:
    # The lab's pressure configuration (--num-gpu-blocks-override 24, block 128): the last session's hot B and
    # control came between its hot A and round 1, 38 blocks for a 23-block cache, and LRU eviction took hot A's
    # tail (round 1 hit 1,152 of 1,664 in the recorded launch run); rounds 2 and 3 follow round 1 alone.
    cold, hot_a = [5] + list(range(1, 1723)), list(range(1723))
    hot_b, control = hot_a[:900] + list(range(5000, 5900)), [7] + list(range(9000, 10800))
    served = [cold, hot_a, hot_b, control]
    assert window_blocks(hot_a, served, BLOCK, 4) == 13 + 7 + 14 + 4   # whole blocks once, each own tail once
    assert window_blocks(hot_a, [*served, hot_a], BLOCK, 4) == 13 + 2
    assert window_blocks(control, served[:3], BLOCK, 4) is None           # nothing expected to hit
    lab = rounds(1152, 1664, 1664)
    for r, window in zip(lab, (38, 15, 15), strict=True):
        r.window_blocks = window
    got = judge_rounds(lab, cfg(), BLOCK, 0, ["r"], kv=23)
    assert got.status == Status.PASS and "more than the engine's cache holds (23)" in got.reason
    assert got.observed[0]["judged"] is False and "judged" not in got.observed[1]
    assert judge_rounds(lab, cfg(), BLOCK, 0, ["r"]).status == Status.FAIL   # capacity unknown: judged as sent
    assert judge_rounds(lab[:1], cfg(), BLOCK, 0, ["r"], kv=23).status == Status.INCONCLUSIVE
    lab[2].hits = 0   # a round the cache could hold that misses still fails
    assert judge_rounds(lab, cfg(), BLOCK, 0, ["r"], kv=23).status == Status.FAIL
    assert judge_rounds(lab, cfg(), BLOCK, 0, ["r"], kv=64).status == Status.FAIL


def test_kv_blocks_read_from_the_servers_cache_config() -> None:
    assert kv_blocks({"num_gpu_blocks": "4096", "block_size": "128"}) == 4095   # less vLLM's null block
    assert kv_blocks({"num_gpu_blocks": "None"}) is None and kv_blocks(None) is None


def test_hot_after_a_restart() -> None:
    hot = m(0, "restart", 0, 0)
    assert judge_restart(ONE, TWO, hot, cfg(), BLOCK, ["r"], launched=True).status == Status.PASS
    # Local hits right after a restart: not the restarted instance's empty device cache.
    assert judge_restart(ONE, TWO, m(0, "restart", 1664, 0), cfg(), BLOCK, ["r"], True).status == Status.FAIL
    # No restart seen (the start time did not move): never a pass.
    assert judge_restart(ONE, ONE, hot, cfg(), BLOCK, ["r"], True).status == Status.INCONCLUSIVE
    external = m(0, "restart", 0, 0)
    external.external_hits = 1536
    passed = judge_restart(ONE, TWO, external, cfg(), BLOCK, ["r"], True)
    assert passed.status == Status.PASS and "1536 tokens from the external KV connector" in passed.observed["note"]
    assert judge_restart(None, None, None, cfg(), BLOCK, [], launched=False).status == Status.NOT_APPLICABLE


def test_prompt_tokens_cached_must_add_up_to_local_and_external_hits() -> None:
    ms = session(1)
    for x in ms:
        x.prompt_tokens_cached = (x.hits or 0) + 128 if x.kind.startswith("hot") else x.hits
    source = next(f for f in judge_reuse(ms, cfg(), BLOCK, "r") if f.check == "cache.source")
    assert source.status == Status.INCONCLUSIVE and "disagree" in source.reason


class _Recorded(MetricsSource):
    """Snapshots of a recorded /metrics capture (tests/fixtures/real/metrics), or an unreadable endpoint."""

    def __init__(self, name: str | None) -> None:
        self.name, self.description = name, f"recorded {name}"

    def snapshot(self) -> Snapshot:
        if self.name is None:
            raise MetricsError("cannot read http://127.0.0.1:9/metrics: connection refused")
        return parse_exposition((METRICS / self.name).read_text())


def _probe_on(source: MetricsSource, tmp_path: Path) -> dict[str, Status]:
    client = OpenAIClient("http://127.0.0.1:9/v1")  # never reached: the probe stops at its first snapshot
    try:
        findings, _ = run_cache_probe(client, source, CacheProbeConfig(model="m", scenario={}),
                                      EvidenceStore(tmp_path))
    finally:
        client.close()
    return statuses(findings)


def test_cache_metrics_missing_when_unreadable_or_not_exported(tmp_path: Path) -> None:
    """An endpoint that does not answer; a real vLLM 0.7 V1 capture behind a router (no prefix-cache counters,
    no cache_config_info). Either way cache.metrics is missing and the reuse is not judged, never passed."""
    assert _probe_on(_Recorded(None), tmp_path / "down") == {"cache.metrics": Status.MISSING}
    old = _probe_on(_Recorded("vllm-0.7-router-v1-gpu-cache-usage.prom"), tmp_path / "old")
    assert old["cache.metrics"] == Status.MISSING and old["cache.reuse"] == Status.INCONCLUSIVE
    assert "cache.hot_reuse" not in old
