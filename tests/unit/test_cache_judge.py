"""Cache judging on recorded shapes: exact block-aligned hits pass; counters without prefill gain,
unclean measurements and hybrid first-session misses are handled as the spec says."""

from __future__ import annotations

from vllm_acceptance.findings import Status
from vllm_acceptance.probes.cache import CacheProbeConfig, Measurement, expected_hits, judge_reuse

BLOCK = 128


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


def test_no_reuse_fails() -> None:
    got = statuses(judge_reuse(session(1, hot_hits=0, hot_time=0.4) + session(2, hot_hits=0, hot_time=0.4),
                               cfg(), BLOCK, "r"))
    assert got["cache.hot_reuse"] == Status.FAIL
    assert got["cache.prefill_gain"] == Status.FAIL


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
