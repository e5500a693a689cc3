"""The cache probe on a data-parallel server (issue 41 item 2): every session pinned to one engine, the engine that
served each request read from its counters, each engine judged and named (cache.engines). The live behaviour is
tests/integration/test_data_parallel_lab.py's; these hold the rules to recorded shapes and real captures."""

from __future__ import annotations

from pathlib import Path

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.probes.cache import CacheProbe, CacheProbeConfig, Measurement
from vllm_acceptance.probes.cache.probe import RANK_HEADER, session_id_of
from vllm_acceptance.probes.cache.rules import judge_engines, judge_source
from vllm_acceptance.runtime.client import OpenAIClient
from vllm_acceptance.runtime.metrics import Snapshot, parse_exposition

BLOCK = 128
METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "metrics"
DP2 = METRICS / "vllm-0.32-cpu-lab-dp2.prom"                       # one API server, engines 0 and 1, after traffic
HYBRID_IDLE = METRICS / "vllm-0.32-cpu-lab-dp4-hybrid-lb-idle.prom"  # an API server of hybrid LB, nothing served yet


def cfg(**kw) -> CacheProbeConfig:
    return CacheProbeConfig(model="m", scenario={}, **kw)


def hot(engine: str, session: int, hits: float, expected: int = 1664, clean: bool = True,
        served_by: str | None = None, kind: str = "hot_a") -> Measurement:
    return Measurement(session=session, kind=kind, engine=engine, served_by=served_by or engine, hits=hits,
                       expected_hits=expected, prompt_tokens=1723, clean=clean)


def healthy(engine: str) -> list[Measurement]:
    return [hot(engine, s, 1664, kind=k) for s in (1, 2, 3) for k in ("hot_a", "hot_b")]


def bumped(snap: Snapshot, family: str, engine: str, by: float, **labels: str) -> Snapshot:
    """`snap` with one engine's sample of a counter raised by `by` (a request served there)."""
    out = Snapshot(taken=snap.taken + 1, samples={k: dict(v) for k, v in snap.samples.items()})
    series = out.samples[family]
    key = next(k for k in series if dict(k).get("engine") == engine and set(labels.items()) <= set(k))
    series[key] += by
    return out


def probe(tmp_path: Path, engines: list[str]) -> CacheProbe:
    p = CacheProbe(OpenAIClient("http://127.0.0.1:9/v1"), None, cfg(), EvidenceStore(tmp_path, "probes/cache"))  # type: ignore[arg-type]
    p.engines = engines
    return p


def test_engines_are_read_from_counters_when_the_gauges_are_not_there_yet() -> None:
    """Several API servers (vllm serve with data parallel): an engine exports its scheduler gauges only once it
    served; the engines are still known from cache_config_info and the counters (real capture)."""
    snap = parse_exposition(HYBRID_IDLE.read_text())
    assert snap.value("vllm:num_requests_running") is None
    assert snap.engines() == ["0", "1"]


def test_a_pinned_request_served_by_its_engine_is_measured_and_another_engine_is_a_problem(tmp_path: Path) -> None:
    before = parse_exposition(DP2.read_text())
    after = bumped(before, "vllm:prefix_cache_queries", "1", 1723)
    p = probe(tmp_path, ["0", "1"])
    good = Measurement(session=1, kind="cold", engine="1")
    p.served(good, before, after)
    assert good.served_by == "1" and good.problems == []
    elsewhere = Measurement(session=1, kind="cold", engine="0")
    p.served(elsewhere, before, after)
    assert elsewhere.served_by == "1"
    assert "served by engine 1, not engine 0" in elsewhere.problems[0] and RANK_HEADER in elsewhere.problems[0]
    both = bumped(after, "vllm:prefix_cache_queries", "0", 10)
    split = Measurement(session=1, kind="cold", engine="0")
    p.served(split, before, both)
    assert split.served_by is None and "engine(s) ['0', '1']" in split.problems[0]


def test_the_rank_header_is_the_engines_position_and_absent_on_one_engine(tmp_path: Path) -> None:
    hybrid = probe(tmp_path, ["2", "3"])            # hybrid LB: an API server fronting its local engines 2 and 3
    assert hybrid.rank_header("3") == {RANK_HEADER: "1"}
    assert hybrid.rank_header(None) is None
    hybrid.pin(parse_exposition(HYBRID_IDLE.read_text()))
    assert hybrid.engines == ["0", "1"]
    single = probe(tmp_path, [])
    single.pin(Snapshot(taken=0, samples={"vllm:prefix_cache_queries": {frozenset({("engine", "0")}): 0.0}}))
    assert single.engines == [] and single.rank_header("0") is None
    assert session_id_of("t", "1", 2) != session_id_of("t", "0", 2) != session_id_of("t", None, 2)


def test_each_engine_judged_and_the_failing_one_named() -> None:
    ok = judge_engines(healthy("0") + healthy("1"), ["0", "1"], cfg(), BLOCK, 0, ["requests.json"])
    assert ok.status == Status.PASS and "(0, 1)" in ok.reason
    one_misses = healthy("0") + [hot("1", s, 0) for s in (1, 2, 3)]
    failed = judge_engines(one_misses, ["0", "1"], cfg(), BLOCK, 0, ["requests.json"])
    assert failed.status == Status.FAIL and failed.reason.startswith("engine 1:") and "engine 0" not in failed.reason
    assert failed.observed["per_engine"]["0"]["status"] == "pass"


def test_an_engine_without_a_clean_measurement_of_its_own_decides_nothing() -> None:
    """A proxy that drops X-data-parallel-rank: engine 1's requests were served by engine 0, never measured as
    engine 1's: inconclusive, named, never a pass."""
    stray = [hot("1", s, 1664, clean=False, served_by="0") for s in (1, 2, 3)]
    for m in stray:
        m.problems.append("served by engine 0, not engine 1 it was pinned to")
    got = judge_engines(healthy("0") + stray, ["0", "1"], cfg(), BLOCK, 0, ["requests.json"])
    assert got.status == Status.INCONCLUSIVE and "engine(s) 1" in got.reason and "served by engine 0" in got.reason


def test_one_engine_is_not_applicable() -> None:
    assert judge_engines(healthy("0"), ["0"], cfg(), BLOCK, 0, []).status == Status.NOT_APPLICABLE
    assert judge_engines(healthy("0"), [], cfg(), BLOCK, 0, []).status == Status.NOT_APPLICABLE


def test_by_source_counts_once_per_source_over_two_engines(tmp_path: Path) -> None:
    """The per-source series have one sample per engine: a request's local hits are counted once (the bug that made
    cache.source inconclusive on every data-parallel server: 'the local tiers (9984) do not account for the local
    hits (4992)')."""
    before = parse_exposition(DP2.read_text())
    after = bumped(before, "vllm:prefix_cache_queries", "0", 1723)
    after = bumped(after, "vllm:prefix_cache_hits", "0", 1664)
    after = bumped(after, "vllm:prompt_tokens_cached", "0", 1664)
    after = bumped(after, "vllm:prompt_tokens_cached_by_source", "0", 1664, source="device")
    after = bumped(after, "vllm:request_success", "0", 1, finished_reason="length")
    m = Measurement(session=1, kind="hot_a", engine="0")
    probe(tmp_path, ["0", "1"]).fill(m, before, after, {"prompt_tokens": 1723}, 0.1)
    assert m.cached_by_source == {"device": 1664} and m.hits == 1664 and m.served_by == "0"
    m.clean = True
    assert judge_source([m], ["requests.json"], Consequence.REBUILD).status == Status.PASS


def test_a_restart_of_data_parallel_engines_is_told_by_the_request_counter() -> None:
    """Data parallel `/metrics` exports no process start time (docs/lab.md "Data parallel"): a restart is told by the
    request counter falling (runtime/metrics.py Instance.restarted_since) -- here the real counters after the cache
    probe against a fresh server's zeros. The live restart of both engines is test_data_parallel_lab.py's under
    ACCEPTANCE_FULL."""
    from vllm_acceptance.runtime.metrics import Instance

    served = Instance.of(parse_exposition(DP2.read_text()))
    fresh = Instance.of(parse_exposition(HYBRID_IDLE.read_text()))
    assert served.start is None and fresh.start is None
    assert served.served == 102 and fresh.served == 0
    assert fresh.restarted_since(served) is True
    assert served.restarted_since(served) is False
    # the same process after 3 more requests finished: its counter grew by them, never fell
    assert Instance(start=None, served=105).restarted_since(served, finished=3) is False
    assert Instance(start=None, served=104).restarted_since(served, finished=3) is True
    assert Instance(start=None, served=None).restarted_since(served) is None
