"""Issue 44 item 2, the case set's side: every run sends one case per tool_choice besides auto (required, a
named function, none), so agent.tool_choice judges them; a server that breaks any one of them fails it. The
server here is constructed (vLLM's chat completion shape); the lab runs the real one."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig
from vllm_acceptance.probes.agent.rules import judge_tool_choice
from vllm_acceptance.runtime.client import Exchange
from vllm_acceptance.scenarios import load_scenario
from vllm_acceptance.scenarios.cases import TOOL_CHOICES, arguments_for, build_cases, choice_cases

OPS = load_scenario("ops-agent")
WRITES = set(OPS["write_tools"])


def _named(case: Any) -> str | None:
    return case.tool_choice["function"]["name"] if isinstance(case.tool_choice, dict) else None


def test_choice_cases_set_required_named_and_none_with_their_expectations() -> None:
    cases = choice_cases(OPS, seed=0)
    assert TOOL_CHOICES == ("required", "named", "none") and len(cases) == 3
    required, named, none = cases
    offered = {c.id: [t["function"]["name"] for t in c.tools] for c in cases}
    assert (required.cls, required.tool_choice) == ("single", "required") and required.expect
    assert required.expect[0] in offered[required.id]
    assert named.cls == "single" and named.tool_choice == {"type": "function", "function": {"name": named.expect[0]}}
    assert _named(named) in offered[named.id]
    assert (none.cls, none.tool_choice, none.expect) == ("irrelevance", "none", [])
    # the requests carry it (the OpenAI chat completions shape), reproducibly from the seed
    assert [c.body("m", 8, 0.0)["tool_choice"] for c in cases] == ["required", named.tool_choice, "none"]
    assert [c.body("m", 8, 0.0) for c in choice_cases(OPS, seed=0)] == [c.body("m", 8, 0.0) for c in cases]
    assert [c.body("m", 8, 0.0) for c in choice_cases(OPS, seed=1)] != [c.body("m", 8, 0.0) for c in cases]
    # the case set itself is unchanged (its own seeded streams); every tool_choice there is auto
    assert {c.tool_choice for c in build_cases(OPS, 30, 10)} == {"auto"}


def test_judge_tool_choice_fails_each_generated_case_answered_against_its_tool_choice() -> None:
    required, named, none = choice_cases(OPS, seed=3)
    other = next(t["function"]["name"] for t in OPS["tools"] if t["function"]["name"] != _named(named))
    assert judge_tool_choice(none.id, none.cls, none.expect, none.tool_choice, ["get_node_status"], WRITES).violations
    assert judge_tool_choice(named.id, named.cls, named.expect, named.tool_choice, [other], WRITES).violations
    assert judge_tool_choice(required.id, required.cls, required.expect, required.tool_choice, [], WRITES).violations
    # answered as asked: nothing broken
    assert not judge_tool_choice(none.id, none.cls, none.expect, none.tool_choice, [], WRITES).violations
    assert not judge_tool_choice(named.id, named.cls, named.expect, named.tool_choice, named.expect, WRITES).violations
    assert not judge_tool_choice(required.id, required.cls, required.expect, required.tool_choice, required.expect,
                                 WRITES).violations


class _Server:
    """Answers every case as asked (its expected calls with schema-valid arguments, text where no call fits,
    the structured task's JSON), except the fault: `none` calls a tool under tool_choice none, `named` calls
    another tool than the one named, `required` answers with text under tool_choice required."""

    def __init__(self, fault: str | None, scratch: Any) -> None:
        self.fault = fault
        probe_cases = AgentProbe(self, AgentProbeConfig(model="m", scenario=OPS), EvidenceStore(scratch))
        self.expect = {json.dumps(c.messages, sort_keys=True): c.expect for c in probe_cases.case_set()}
        self.tools = {t["function"]["name"]: t for t in OPS["tools"] + OPS.get("case_set", {}).get("extra_tools", [])}

    def models(self) -> dict[str, Any]:
        raise ConnectionError("no /v1/models here: the probe fits no context")

    def chat(self, body: dict[str, Any]) -> Exchange:
        choice = body.get("tool_choice")
        if body.get("response_format"):
            return self._answer([], content=json.dumps({}))
        names = list(self.expect.get(json.dumps(body["messages"], sort_keys=True), []))
        if isinstance(choice, dict):
            names = [choice["function"]["name"]]
            if self.fault == "named":
                names = [next(n for n in self.tools if n != names[0] and n in
                              {t["function"]["name"] for t in body["tools"]})]
        elif choice == "none":
            names = [body["tools"][0]["function"]["name"]] if self.fault == "none" else []
            if self.fault == "markup":  # a model that writes a call anyway: vLLM runs no parser, so it is text
                return self._answer([], content='<tool_call>{"name": "get_node_status", "arguments": {}}</tool_call>')
        elif choice == "required" and self.fault == "required":
            names = []
        return self._answer(names, content=None if names else "Done.")

    def _answer(self, names: list[str], content: str | None) -> Exchange:
        rng = random.Random(0)
        calls = [{"id": f"chatcmpl-tool-{i}", "type": "function",
                  "function": {"name": n, "arguments": json.dumps(arguments_for(self.tools[n], rng))}}
                 for i, n in enumerate(names)]
        body = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop",
                             "message": {"role": "assistant", "content": content, "tool_calls": calls}}]}
        return Exchange(request={}, status=200, body=body)


@pytest.mark.parametrize(("fault", "case_kind"), [(None, None), ("none", "none"), ("named", "named"),
                                                  ("required", "required")])
def test_a_server_breaking_one_tool_choice_case_fails_agent_tool_choice(tmp_path, fault, case_kind) -> None:
    probe = AgentProbe(_Server(fault, tmp_path / "cases"), AgentProbeConfig(model="m", scenario=OPS, concurrency=4),
                       EvidenceStore(tmp_path / "run"))
    findings = {f.check: f for f in probe.required_tool_calls()}
    assert sum(1 for c in probe.cases if c.tool_choice != "auto") == 3
    finding = findings["agent.tool_choice"]
    if fault is None:
        assert finding.status == Status.PASS, finding.reason
        return
    assert finding.status == Status.FAIL, finding.reason
    assert f"choice-{case_kind}-" in finding.reason and "tool_choice" in finding.reason


def test_call_markup_in_content_under_tool_choice_none_is_no_parser_leak_and_honours_none(tmp_path) -> None:
    probe = AgentProbe(_Server("markup", tmp_path / "cases"), AgentProbeConfig(model="m", scenario=OPS, concurrency=4),
                       EvidenceStore(tmp_path / "run"))
    findings = {f.check: f for f in probe.required_tool_calls()}
    assert findings["agent.tool_choice"].status == Status.PASS, findings["agent.tool_choice"].reason
    assert findings["agent.separation"].status == Status.PASS, findings["agent.separation"].reason
    row = next(r for r in probe.case_rows if r["id"].startswith("choice-none-"))
    assert row["misses"] and "markup" in row["misses"][0]  # reported with the case: it did not abstain


@pytest.mark.parametrize(("direct_fault", "layer"), [(None, "gateway"), ("required", "parser")])
def test_a_broken_tool_choice_is_the_gateways_when_the_direct_server_honours_it(tmp_path, direct_fault,
                                                                               layer) -> None:
    """The `required` case answered with text through the client's URL, re-sent to the direct server (--direct-url):
    honoured there, the answer changed on the way (the gateway); broken there too, the server's parser."""
    probe = AgentProbe(_Server("required", tmp_path / "cases"), AgentProbeConfig(model="m", scenario=OPS,
                                                                                concurrency=4),
                       EvidenceStore(tmp_path / "run"), direct=_Server(direct_fault, tmp_path / "direct"))
    finding = {f.check: f for f in probe.required_tool_calls()}["agent.tool_choice"]
    assert finding.status == Status.FAIL, finding.reason
    assert finding.layer == layer, finding.reason
    assert "sent to it" in finding.reason if layer == "gateway" else "not the gateway" in finding.reason
