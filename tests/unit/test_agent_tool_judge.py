"""Issue 44 items 2-4 on constructed responses (vLLM's chat completion shape): the wrong tool judged (a write
tool severe), tool_choice honoured, parallel calls as a set; arguments against a reference under the documented
comparison, with a minimum of answered cases; repeats compared on the call's structure, free text loosely.
The lab twins (real server, gateway fault modes) are tests/integration/test_agent_tool_judge_lab.py."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.lab.gateway import Corruptor
from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig
from vllm_acceptance.probes.agent.rules import (
    argument_differences,
    call_signature,
    call_structure,
    calls_differences,
    judge_case,
    judge_tool_choice,
    reference_agreement,
    verifier_measures,
)
from vllm_acceptance.runtime.client import Exchange
from vllm_acceptance.scenarios import load_scenario
from vllm_acceptance.scenarios.cases import Case

OPS = load_scenario("ops-agent")
TOOLS = OPS["tools"]
WRITES = set(OPS["write_tools"])
TICKET = {"request_id": "req-00042", "title": "GPU 3 on node-07 has XID 79", "severity": "major",
          "details": {"node": "node-07"}}
STATUS = {"node": "node-07", "include": "gpus"}


def answer(*calls: tuple[str, dict[str, Any]], content: str | None = None) -> dict[str, Any]:
    """A chat completion as vLLM returns it (ids chatcmpl-tool-*, finish_reason tool_calls when calls are made)."""
    tool_calls = [{"id": f"chatcmpl-tool-{i}", "type": "function",
                   "function": {"name": name, "arguments": json.dumps(args)}} for i, (name, args) in enumerate(calls)]
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop",
                         "message": {"role": "assistant", "content": content, "tool_calls": tool_calls}}]}


def case(cid: str, cls: str, expect: list[str], tool_choice: Any = "auto") -> Case:
    return Case(cid, cls, [{"role": "system", "content": "s"}, {"role": "user", "content": cid}], TOOLS,
                expect, tool_choice=tool_choice)


def probe(tmp_path, **cfg: Any) -> AgentProbe:
    return AgentProbe(None, AgentProbeConfig(model="m", scenario=OPS, **cfg), EvidenceStore(tmp_path))


# --- item 2: the wrong tool, tool_choice, parallel sets ---------------------------------------------

def test_a_swapped_tool_name_is_a_wrong_tool_and_severe_when_the_tool_writes() -> None:
    body = answer(("create_ticket", STATUS))  # a gateway mapped get_node_status onto the write tool
    j = judge_case("single-0001", "single", ["get_node_status"], None, 200, body, TOOLS)
    choice = judge_tool_choice("single-0001", "single", ["get_node_status"], "auto", j.check.names, WRITES)
    assert choice.wrong == ["create_ticket"] and choice.severe == ["create_ticket"]
    read = judge_tool_choice("single-0002", "single", ["get_node_status"], "auto", ["get_service_health"], WRITES)
    assert read.wrong == ["get_service_health"] and not read.severe
    right = judge_tool_choice("single-0003", "single", ["get_node_status"], "auto", ["get_node_status"], WRITES)
    assert not (right.wrong or right.severe or right.violations)


def test_parallel_calls_are_judged_as_a_set() -> None:
    expect = ["get_node_status", "get_service_health"]
    # the expected set in another order: right; one of the two only: missing, not wrong
    assert not judge_tool_choice("p", "parallel", expect, "auto", expect[::-1], WRITES).wrong
    part = judge_tool_choice("p", "parallel", expect, "auto", ["get_service_health"], WRITES)
    assert not part.wrong and part.missing == ["get_node_status"]
    # a tool outside the set (a write) is wrong and severe; one tool twice breaks the set
    out = judge_tool_choice("p", "parallel", expect, "auto", ["get_node_status", "create_ticket"], WRITES)
    assert out.severe == ["create_ticket"]
    twice = judge_tool_choice("p", "parallel", expect, "auto", ["get_node_status"] * 2, WRITES)
    assert twice.violations and "get_node_status" in twice.violations[0]


@pytest.mark.parametrize(("choice", "names", "broken"), [
    ("required", [], True), ("required", ["get_node_status"], False),
    ("none", ["get_node_status"], True), ("none", [], False),
    ({"type": "function", "function": {"name": "get_service_health"}}, ["get_node_status"], True),
    ({"type": "function", "function": {"name": "get_service_health"}}, [], True),
    ({"type": "function", "function": {"name": "get_service_health"}}, ["get_service_health"], False),
])
def test_tool_choice_required_none_and_named_are_honoured(choice, names, broken) -> None:
    out = judge_tool_choice("c", "multi_turn", [], choice, names, WRITES)
    assert bool(out.violations) is broken, out


def test_an_irrelevance_case_that_calls_a_write_tool_is_severe_a_read_call_stays_with_abstention() -> None:
    assert judge_tool_choice("i", "irrelevance", [], "auto", ["create_ticket"], WRITES).severe == ["create_ticket"]
    assert not judge_tool_choice("i", "irrelevance", [], "auto", ["get_node_status"], WRITES).wrong


def _choices(n: int, wrong: dict[int, str]) -> tuple[list, dict[str, Case]]:
    cases = {f"single-{i:04d}": case(f"single-{i:04d}", "single", ["get_node_status"]) for i in range(n)}
    out = [judge_tool_choice(cid, "single", ["get_node_status"], "auto", [wrong.get(i, "get_node_status")], WRITES)
           for i, cid in enumerate(cases)]
    return out, cases


def test_tool_choice_finding_fails_on_one_wrong_write_and_passes_on_healthy(tmp_path) -> None:
    p = probe(tmp_path)
    healthy, cases = _choices(300, {})
    finding = p._judge_tool_choice(healthy, cases, [])
    assert finding.check == "agent.tool_choice" and finding.status == Status.PASS, finding.reason
    one_write, cases = _choices(300, {7: "create_ticket"})
    finding = p._judge_tool_choice(one_write, cases, [])
    assert finding.status == Status.FAIL and finding.layer == "model"
    assert "severe" in finding.reason and "single-0007 (create_ticket)" in finding.reason
    # a wrong read tool in 300 is within the 1 % bound's reach only as a rate: 30 of 300 fails it
    many_reads, cases = _choices(300, {i: "get_service_health" for i in range(30)})
    finding = p._judge_tool_choice(many_reads, cases, [])
    assert finding.status == Status.FAIL and "30 of 300" in finding.reason and "severe" not in finding.reason
    # too few cases to resolve 1 %: inconclusive, never a pass
    few, cases = _choices(20, {})
    assert p._judge_tool_choice(few, cases, []).status == Status.INCONCLUSIVE


def test_a_named_tool_choice_broken_by_the_server_fails_on_the_parser(tmp_path) -> None:
    named = {"type": "function", "function": {"name": "get_node_status"}}
    cases = {f"c{i}": case(f"c{i}", "multi_turn", [], named) for i in range(300)}
    choices = [judge_tool_choice(c.id, c.cls, c.expect, named, [] if i == 3 else ["get_node_status"], WRITES)
               for i, c in enumerate(cases.values())]
    choices += _choices(300, {})[0]
    finding = probe(tmp_path)._judge_tool_choice(choices, {**cases, **_choices(300, {})[1]}, [])
    assert (finding.status, finding.layer) == (Status.FAIL, "parser") and "tool_choice names" in finding.reason


# --- item 3: arguments against a reference ------------------------------------------------------------

def test_the_argument_comparison_is_exact_for_enums_and_ids_and_normalised_for_numbers_and_whitespace() -> None:
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == "create_ticket")
    same = {**TICKET, "title": "  GPU 3 on node-07\n has XID 79 "}
    assert argument_differences(TICKET, same, schema) == ([], [])
    hard, text = argument_differences(TICKET, {**TICKET, "severity": "critical"}, schema)
    assert hard == ["/severity: 'major' vs 'critical'"] and not text
    hard, _ = argument_differences(TICKET, {**TICKET, "request_id": "req-00043"}, schema)
    assert hard  # an id: exact
    _, text = argument_differences(TICKET, {**TICKET, "title": "XID 79 on GPU 3 of node-07"}, schema)
    assert text  # a rephrasing is a different argument (semantic equality left out)
    health = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == "get_service_health")
    assert argument_differences({"service": "vllm-engine", "window_minutes": 5},
                                {"service": "vllm-engine", "window_minutes": 5.0}, health) == ([], [])


def _rows(n: int, ref_args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    ours = call_signature(answer(("create_ticket", TICKET)))
    theirs = call_signature(answer(("create_ticket", ref_args or TICKET)))
    return [{"case": f"single-{i:04d}", "reference_status": 200, "reference_calls": theirs, "calls": ours,
             "tools": TOOLS} for i in range(n)]


def test_reference_agreement_counts_only_from_its_minimum_of_answered_cases() -> None:
    two = reference_agreement(_rows(2), min_cases=36)
    assert two["answered"] == 2 and not two["conclusive"] and two["f1"] == 1.0
    assert reference_agreement(_rows(36), min_cases=36)["conclusive"]


class _Reference:
    """A reference endpoint: answers the first `answers` requests with `calls`, the rest with HTTP 503."""

    def __init__(self, calls: tuple, answers: int = 10**6) -> None:
        self.calls, self.answers, self.sent = calls, answers, 0
        self.lock = threading.Lock()

    def chat(self, body: dict) -> Exchange:
        with self.lock:
            self.sent += 1
            n = self.sent
        if n > self.answers:
            return Exchange(request=body, status=503, body={"error": "overloaded"}, error="HTTP 503")
        return Exchange(request=body, status=200, body=answer(*self.calls))


def _reference_probe(tmp_path, reference: _Reference, n: int = 40) -> AgentProbe:
    p = AgentProbe(None, AgentProbeConfig(model="m", scenario=OPS, concurrency=1), EvidenceStore(tmp_path),
                   reference=reference)
    p.cases = [case(f"single-{i:04d}", "single", ["create_ticket"]) for i in range(n)]
    p.case_rows = [{"case": c.id, "class": c.cls, "status": 200, "response": answer(("create_ticket", TICKET))}
                   for c in p.cases]
    return p


def test_a_reference_that_disagrees_on_arguments_only_fails_argument_agreement(tmp_path) -> None:
    p = _reference_probe(tmp_path, _Reference((("create_ticket", {**TICKET, "severity": "critical"}),)))
    f1, args = p.reference_agreement(), p.reference_arguments()
    assert f1.status == Status.PASS, f1.reason  # it triggers exactly as we do
    assert (args.check, args.status, args.layer) == ("agent.reference_arguments", Status.FAIL, "model")
    assert "0 of 40" in args.reason and "severity" in args.reason
    # whitespace only: agreement
    p = _reference_probe(tmp_path / "ws", _Reference((("create_ticket", {**TICKET, "title": TICKET["title"] + "  "}),)))
    p.reference_agreement()
    assert p.reference_arguments().status == Status.PASS


def test_a_reference_answering_two_cases_is_inconclusive_with_the_count(tmp_path) -> None:
    p = _reference_probe(tmp_path, _Reference((("create_ticket", TICKET),), answers=2))
    f1, args = p.reference_agreement(), p.reference_arguments()
    assert f1.status == Status.INCONCLUSIVE and "only 2 case(s)" in f1.reason and "36" in f1.reason
    assert args.status == Status.INCONCLUSIVE and "only 2 case(s)" in args.reason
    assert probe(tmp_path / "none").reference_arguments().status == Status.NOT_APPLICABLE


# --- item 4: repeats on the call's structure -------------------------------------------------------

class _Repeats:
    """A server answering every request with create_ticket; `vary` names the argument each answer changes
    (a counter appended), as a non-batch-invariant GPU server can do to free text."""

    def __init__(self, vary: str | None) -> None:
        self.vary, self.count = vary, itertools.count()
        self.lock = threading.Lock()

    def chat(self, body: dict) -> Exchange:
        with self.lock:
            n = next(self.count)
        args = dict(TICKET)
        if self.vary == "title":
            args["title"] = f"{TICKET['title']} (take {n})"
        elif self.vary == "severity":
            args["severity"] = ("minor", "major", "critical")[n % 3]
        return Exchange(request=body, status=200, body=answer(("create_ticket", args)))


@pytest.mark.parametrize(("vary", "status"), [(None, Status.PASS), ("title", Status.PASS),
                                              ("severity", Status.WARN)])
def test_repeats_differ_in_free_text_without_alarm_and_in_an_enum_with_one(tmp_path, vary, status) -> None:
    p = _Repeats(vary)
    probe_ = AgentProbe(p, AgentProbeConfig(model="m", scenario=OPS, repeats=3, concurrency=2),
                        EvidenceStore(tmp_path))
    cases = [case(f"single-{i:04d}", "single", ["create_ticket"]) for i in range(3)]
    repeats, ev = probe_.repeat_sample(cases)
    from vllm_acceptance.probes.agent.rules import Rate

    finding = probe_._judge_trigger(repeats, Rate("abstain_rate", 0, 0, 0.9, "min"), [ev])
    assert finding.status == status, finding.reason
    varied = finding.observed["free_text_varied"]
    assert bool(varied) is (vary == "title")
    if vary == "title":
        assert "/title" in varied[0]["differences"][0]


def test_the_call_structure_keeps_tools_keys_enums_and_ids_and_leaves_text_and_numbers() -> None:
    a = call_signature(answer(("create_ticket", TICKET)))
    b = call_signature(answer(("create_ticket", {**TICKET, "title": "other words"})))
    c = call_signature(answer(("create_ticket", {**TICKET, "request_id": "req-99999"})))
    d = call_signature(answer(("create_ticket", {k: v for k, v in TICKET.items() if k != "details"})))
    assert call_structure(a, TOOLS) == call_structure(b, TOOLS)
    assert call_structure(a, TOOLS) != call_structure(c, TOOLS) != call_structure(d, TOOLS)
    assert calls_differences(a, b, TOOLS)[0] == []


# --- the gateway's modes (pure rewrites) ---------------------------------------------------------------

def test_gateway_swap_tool_name_and_perturb_free_text_rewrite_only_what_they_say() -> None:
    body = answer(("get_node_status", STATUS), ("create_ticket", TICKET))
    swapped = Corruptor("swap_tool_name").rewrite_body(body)
    assert [c["function"]["name"] for c in swapped["choices"][0]["message"]["tool_calls"]] == ["create_ticket"] * 2
    assert [c["function"]["arguments"] for c in swapped["choices"][0]["message"]["tool_calls"]] == \
        [c["function"]["arguments"] for c in body["choices"][0]["message"]["tool_calls"]]
    perturb = Corruptor("perturb_free_text")
    one, two = perturb.rewrite_body(body), perturb.rewrite_body(body)
    args = [json.loads(x["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"]) for x in (one, two)]
    assert args[0]["title"] != args[1]["title"] != TICKET["title"]
    assert all({**a, "title": TICKET["title"]} == TICKET for a in args)  # ids, enums, nested node untouched
    assert one["choices"][0]["message"]["tool_calls"][0] == body["choices"][0]["message"]["tool_calls"][0]
    # --nth 2: the first answer to a request body is the server's own, a re-sent one (a repeat) is worded anew
    repeats = Corruptor("perturb_free_text", nth=(2,))
    titles = []
    for data in (b'{"messages": 1}', b'{"messages": 2}', b'{"messages": 1}', b'{"messages": 1}'):
        repeats.rewrite_request(data)
        out = repeats.rewrite_body(body)
        titles.append(json.loads(out["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"])["title"])
    assert titles[0] == titles[1] == TICKET["title"] and len({TICKET["title"], titles[2], titles[3]}) == 3
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "x"}}]}}]}
    assert Corruptor("swap_tool_name").stream().rewrite(chunk) == chunk  # streams pass untouched


# --- item 5: the verifier's measures --------------------------------------------------------------------

def test_the_case_set_in_vendor_verifier_terms() -> None:
    judged = [judge_case("s1", "single", ["get_node_status"], None, 200, answer(("get_node_status", STATUS)), TOOLS),
              judge_case("s2", "single", ["get_node_status"], None, 200, answer(content="I cannot."), TOOLS),
              judge_case("s3", "single", ["get_node_status"], None, 200,
                         answer(("get_node_status", {"node": "n7"})), TOOLS),
              judge_case("i1", "irrelevance", [], None, 200, answer(("get_node_status", STATUS)), TOOLS),
              judge_case("i2", "irrelevance", [], None, 200, answer(content="Lisbon."), TOOLS)]
    m = verifier_measures(judged)
    assert (m["tp"], m["fn"], m["fp"], m["tn"]) == (2, 1, 1, 1)
    assert m["tool_call_f1"] == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    # schema accuracy: count_successful_tool_call / count_finish_reason_tool_calls (s3's node breaks the pattern)
    assert (m["count_finish_reason_tool_calls"], m["count_successful_tool_call"]) == (3, 2)


def test_gateway_refuse_after_nth_lets_the_first_n_through() -> None:
    refuse = Corruptor("refuse_after_nth", nth=(2,))
    seen = []
    for _ in range(4):
        refuse.stall_this()  # counts the chat completion, as the proxy does first
        seen.append(refuse.refuse_this())
    assert seen == [False, False, True, True]
    assert not Corruptor("passthrough").refuse_this()


def test_a_wrong_tool_the_direct_server_does_not_call_is_the_gateways(tmp_path) -> None:
    class Direct:
        def __init__(self, name: str) -> None:
            self.name = name

        def chat(self, body: dict) -> Exchange:
            args = STATUS if self.name == "get_node_status" else TICKET
            return Exchange(request=body, status=200, body=answer((self.name, args)))

    choices, cases = _choices(300, {7: "create_ticket"})
    for name, layer in (("get_node_status", "gateway"), ("create_ticket", "model")):
        p = AgentProbe(None, AgentProbeConfig(model="m", scenario=OPS), EvidenceStore(tmp_path / name),
                       direct=Direct(name))
        finding = p._judge_tool_choice(choices, cases, [])
        assert (finding.status, finding.layer) == (Status.FAIL, layer), finding.reason


# --- item 5: the verifier's bounds as the K3 profile's defaults -------------------------------------------

def test_the_k3_profiles_carry_the_verifiers_bounds_each_with_its_source(tmp_path) -> None:
    from pathlib import Path

    import yaml

    from vllm_acceptance.core.profile import ConfigError
    from vllm_acceptance.recipe.generate import generate, load_facts
    from vllm_acceptance.recipe.resolve import Selection

    root = Path(__file__).resolve().parents[2]
    recipe = root / "recipes" / "vllm-project" / "Kimi-K3.yaml"
    profile, _ = generate(recipe, Selection("gb300", "multi_node_tp"), name="kimi-k3")
    assert profile["thresholds"]["reference_agreement_min"] == 0.73  # K2-thinking's bound, not the 0.80 default
    assert profile["thresholds"]["reference_min_cases"] == 36
    notes = [n for n in profile["recipe"]["notes"] if n.startswith("thresholds.")]
    assert {n.split(" ")[0] for n in notes} == {"thresholds.reference_agreement_min", "thresholds.reference_min_cases",
                                                "thresholds.schema_accuracy_min"}
    assert all("K2-Vendor-Verifier" in n and "docs/sources.md#" in n for n in notes)
    facts = yaml.safe_load(load_facts().path.read_text())
    facts["verifier"]["thresholds"]["reference_min_cases"] = {"value": 2}  # no source: refused
    bad = tmp_path / "facts.yml"
    bad.write_text(yaml.safe_dump(facts))
    with pytest.raises(ConfigError, match="verifier.thresholds.reference_min_cases"):
        generate(recipe, Selection("gb300", "multi_node_tp"), name="kimi-k3", facts_path=bad)
