"""The agent case set (scenarios/cases.py): seeded, reproducible, distinct, every argument type of the pack;
and the per-case judgement by class (probes/agent/rules.py judge_case) on recorded answer shapes."""

from __future__ import annotations

import json
from collections import Counter

import jsonschema
import pytest

from vllm_acceptance.probes.agent.rules import class_rates, judge_case
from vllm_acceptance.scenarios import load_scenario
from vllm_acceptance.scenarios.cases import build_cases, case_tools, class_counts


@pytest.mark.parametrize("pack", ["ops-agent", "shop-agent"])
def test_the_default_set_is_300_distinct_call_cases_and_the_other_classes(pack: str) -> None:
    scenario = load_scenario(pack)
    cases = build_cases(scenario, 300, 60)
    bodies = {json.dumps(c.body("m", 96, 0.0), sort_keys=True) for c in cases}
    assert len(bodies) == len(cases) == 360
    counts = Counter(c.cls for c in cases)
    assert counts["single"] + counts["parallel"] == 300 and counts["parallel"] == 50
    assert counts["multi_turn"] and counts["irrelevance"] and counts["structured"]
    # Every tool of the pack (and of its case_set) is asked for; every expected call is schema-valid.
    assert {n for c in cases for n in c.expect} == {t["function"]["name"] for t in case_tools(scenario)}
    assert all(not c.expect for c in cases if c.cls == "irrelevance")
    assert all(len(c.expect) == 2 and c.body("m", 1, 0)["parallel_tool_calls"] for c in cases if c.cls == "parallel")
    assert len({c.note_lines for c in cases}) > 2 and len({c.context_turns for c in cases}) > 2


def test_same_seed_same_cases_and_a_longer_set_starts_with_the_shorter() -> None:
    pack = load_scenario("ops-agent")
    a = [c.body("m", 1, 0) for c in build_cases(pack, 300, 60)]
    assert a == [c.body("m", 1, 0) for c in build_cases(pack, 300, 60)]
    short = [c.id for c in build_cases(pack, 60, 10) if c.cls == "single"]
    long = [c.id for c in build_cases(pack, 300, 60) if c.cls == "single"]
    assert long[:len(short)] == short
    assert a != [c.body("m", 1, 0) for c in build_cases(pack, 300, 60, seed=1)]


def test_the_arguments_cover_every_type_the_schemas_declare() -> None:
    pack = load_scenario("ops-agent")
    seen: set[str] = set()

    def walk(value: object) -> None:
        seen.add(type(value).__name__)
        for v in value.values() if isinstance(value, dict) else value if isinstance(value, list) else []:
            walk(v)

    for case in build_cases(pack, 300, 0):
        if case.cls == "single":
            text = case.messages[-1]["content"]
            if text.startswith("Call "):
                walk(json.loads(text[text.index("{"):]))
    assert {"str", "int", "float", "bool", "dict", "list"} <= seen


def test_class_counts_split_the_other_classes() -> None:
    assert class_counts(300, 60) == {"single": 250, "parallel": 50, "multi_turn": 24, "irrelevance": 24,
                                     "structured": 12}


TOOLS = load_scenario("ops-agent")["tools"]


def _answer(calls: list[tuple[str, dict]] | None = None, content: str | None = None, finish: str = "stop") -> dict:
    tool_calls = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                  for i, (n, a) in enumerate(calls or [])]
    return {"choices": [{"message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                         "finish_reason": "tool_calls" if tool_calls else finish}]}


def test_judge_case_by_class() -> None:
    good = _answer([("get_service_health", {"service": "vllm-engine"})])
    assert judge_case("s1", "single", ["get_service_health"], None, 200, good, TOOLS).ok
    # Another tool than the one asked for: a miss (reported), not a format defect.
    other = judge_case("s2", "single", ["get_node_status"], None, 200, good, TOOLS)
    assert other.ok and other.misses
    bad = judge_case("s3", "single", [], None, 200, _answer([("get_service_health", {"service": "x"})]), TOOLS)
    assert not bad.ok and bad.problems[0][0] == "model"
    assert judge_case("s4", "single", [], None, 502, None, TOOLS, "bad gateway").problems[0][0] == "gateway"
    # Irrelevance: no call is an abstention; a call is a miss; markup in content is the parser's.
    assert judge_case("i1", "irrelevance", [], None, 200, _answer(content="Lisbon."), TOOLS).abstained
    called = judge_case("i2", "irrelevance", [], None, 200, good, TOOLS)
    assert called.ok and called.abstained is False
    leak = judge_case("i3", "irrelevance", [], None, 200, _answer(content="<tool_call>{}</tool_call>"), TOOLS)
    assert not leak.ok and leak.abstained is False
    # Multi-turn: text after the tool result is a valid answer.
    assert judge_case("m1", "multi_turn", [], None, 200, _answer(content="Done."), TOOLS).ok
    assert not judge_case("m2", "multi_turn", [], None, 200, _answer(), TOOLS).ok
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    assert judge_case("j1", "structured", [], schema, 200, _answer(content='{"a": true}'), TOOLS).ok
    cut = judge_case("j2", "structured", [], schema, 200, _answer(content='{"a', finish="length"), TOOLS)
    assert cut.problems[0][0] == "model"
    table = class_rates([other, bad, called])
    assert table["single"]["cases"] == 2 and table["single"]["failed"] == ["s3"]
    assert table["irrelevance"]["abstained"] == 0


def test_expected_arguments_validate() -> None:
    pack = load_scenario("shop-agent")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case_tools(pack)}
    for case in build_cases(pack, 60, 0):
        text = case.messages[-1]["content"]
        if case.cls == "single" and text.startswith("Call "):
            jsonschema.validate(json.loads(text[text.index("{"):]), schemas[case.expect[0]])


def test_the_report_shows_each_class_alone_and_under_load_with_the_raw_bodies_a_click_away() -> None:
    from vllm_acceptance.report.render_html import render_html

    good = _answer([("get_service_health", {"service": "vllm-engine"})])
    bad = _answer([("get_service_health", {"service": "x"})])
    alone = [judge_case(f"single-{i:04d}", "single", [], None, 200, good, TOOLS) for i in range(1, 5)]
    loaded = [judge_case(f"single-{i:04d}", "single", [], None, 200, bad if i == 3 else good, TOOLS)
              for i in range(1, 5)]
    rates = {"classes": class_rates(alone), "under_load": {"concurrency": 4, "classes": class_rates(loaded)},
             "assumptions": "one-sided 95 % Clopper-Pearson bounds over distinct cases", "repeats": {"cases": 1}}
    report = {"schema_version": "1.0", "inventory": "lab", "profile": "cpu-lab", "run_id": "r1", "started": None,
              "finished": "2026-12-02T00:00:00Z", "verdict": "incomplete", "findings": [],
              "stages": {"agent": {"evidence_root": "probes/agent", "rates": rates}}}
    html = render_html(report)
    assert "Case set by class" in html and "Under load (4 in flight)" in html
    assert "1 / 4" in html and "single-0003" in html  # the case that broke under load, named
    assert 'href="probes/agent/cases.json"' in html and 'href="probes/agent/cases-under-load.json"' in html
    assert "Clopper-Pearson" in html


def test_pack_offer_gives_every_case_exactly_the_packs_tools() -> None:
    pack = load_scenario("ops-agent")
    cases = build_cases(pack, 30, 10, offer="pack")
    assert all(c.tools == pack["tools"] for c in cases if c.cls != "structured")
    assert all(c.trimmed() is None or c.trimmed().tools == c.tools for c in cases)
    sampled = build_cases(pack, 30, 10)
    assert len({len(c.tools) for c in sampled if c.cls == "single"}) > 2  # the default offers a varying share
    with pytest.raises(ValueError, match="agent.case_tools"):
        build_cases(pack, 1, 0, offer="every")
