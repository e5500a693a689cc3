"""Agent rules on small shapes: rate bounds that resolve (or not) a threshold, streamed delta structure,
the fallback plan's step rules, the reference client on calls as a deployment returns them, and the
scenario packs' own validation."""

from __future__ import annotations

import json

import pytest

from vllm_acceptance.core.profile import ConfigError
from vllm_acceptance.probes.agent.rules import (
    Rate,
    channel_diff,
    execute_real_calls,
    judge_fallback_step,
    rate_lower_bound,
    rate_upper_bound,
    stream_structure_problems,
    turns_to_resolve,
)
from vllm_acceptance.scenarios import load_scenario, pack_problems

OPS = load_scenario("ops-agent")
SHOP = load_scenario("shop-agent")


def test_zero_errors_bound_is_the_rule_of_three_and_fixes_the_turn_count() -> None:
    assert turns_to_resolve(0.01) == 299  # 1 - 0.99**299 >= 0.95
    assert rate_upper_bound(0, 299) <= 0.01 < rate_upper_bound(0, 298)
    assert abs(rate_upper_bound(0, 300) - 3 / 300) < 0.0005
    # One error in 299 no longer resolves 1 %; the turns it would need are computed, not guessed.
    assert rate_upper_bound(1, 299) > 0.01
    n = turns_to_resolve(0.01, errors=1)
    assert rate_upper_bound(1, n) <= 0.01 < rate_upper_bound(1, n - 1) and 470 < n < 480


def test_rate_verdicts_judge_on_the_bound() -> None:
    assert Rate("e", 0, 299, 0.01).verdict() == "pass"
    assert Rate("e", 0, 10, 0.01).verdict() == "unresolved"  # ten clean turns prove nothing about 1 %
    assert Rate("e", 1, 10, 0.01).verdict() == "fail"
    assert Rate("acc", 299, 299, 0.99, "min").verdict() == "pass"
    assert Rate("acc", 10, 10, 0.99, "min").verdict() == "unresolved"
    assert Rate("acc", 95, 100, 0.99, "min").verdict() == "fail"
    assert rate_lower_bound(0, 50) == 0.0 and 0 < rate_lower_bound(5, 50) < 0.1
    assert "resolution_95" in Rate("e", 0, 299, 0.01).to_dict()


def _delta(index, id_=None, name=None, args=None) -> dict:
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    call = {"index": index, **({"id": id_} if id_ else {}), "function": fn}
    return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}


def test_stream_structure_accepts_consistent_deltas_and_names_each_break() -> None:
    good = [_delta(0, "c1", "get_node_status"), _delta(0, args='{"node": '), _delta(0, args='"node-07"}'),
            _delta(1, "c2", "create_ticket"), _delta(1, args="{}")]
    assert stream_structure_problems(good) == []
    split = [_delta(0, "c1", "get_node_status"), _delta(1, args='{"node": "node-07"}')]  # shifted index
    assert any("call 1 carries no id" in p for p in stream_structure_problems(split))
    renamed = [_delta(0, "c1", "get_node_status"), _delta(0, "c9", "create_ticket")]
    assert {p.split(": ", 1)[1].split(" ", 2)[2] for p in stream_structure_problems(renamed)} == {
        "id changed 'c1' -> 'c9'", "name changed 'get_node_status' -> 'create_ticket'"}
    assert "expected 0" in stream_structure_problems([_delta(1, "c1", "x")])[0]


def test_channel_diff_compares_reasoning_only_with_a_reasoning_parser() -> None:
    plain = {"choices": [{"message": {"reasoning": "think", "content": None, "tool_calls": []}}]}
    streamed = {"choices": [{"message": {"reasoning_content": "other", "content": None, "tool_calls": []}}]}
    assert channel_diff(plain, streamed, reasoning=False) == []
    assert channel_diff(plain, streamed, reasoning=True)[0].startswith("reasoning:")


def _reply(content=None, calls=()) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)]}, "finish_reason": "tool_calls" if calls else "stop"}]}


FAILED = {"name": "get_node_status", "arguments": {"node": "node-07", "include": "gpus"}}
PLAN = {**OPS["tasks"]["fallback"], "tool": "create_ticket", "require": {}}


def test_fallback_steps_follow_the_plan() -> None:
    tools = OPS["tools"]
    retry = judge_fallback_step({**PLAN, "kind": "retry"}, _reply(calls=[FAILED.values()]), tools, FAILED, "model")
    assert retry.ok
    other_args = _reply(calls=[("get_node_status", {"node": "node-00", "include": "driver"})])
    assert "differ" in judge_fallback_step({**PLAN, "kind": "retry"}, other_args, tools, FAILED, "model").problems[0]
    ticket = _reply(calls=[("create_ticket", {"request_id": "abcdefgh", "title": "x y", "severity": "critical",
                                              "details": {"node": "node-07"}})])
    assert judge_fallback_step({**PLAN, "kind": "ticket"}, ticket, tools, FAILED, "client").ok
    required = {**PLAN, "kind": "ticket", "require": {"severity": "major"}}
    assert not judge_fallback_step(required, ticket, tools, FAILED, "client").ok
    # The lab model's canned reply after any tool result ignores the failure: fine when the client drives
    # the fallback (it states no missing data), a failure when the model must choose the fallback.
    done = _reply("Done: tool result received!")
    assert judge_fallback_step({**PLAN, "kind": "user_error"}, done, tools, FAILED, "client").ok
    ignored = judge_fallback_step({**PLAN, "kind": "user_error"}, done, tools, FAILED, "model")
    assert not ignored.ok and ignored.layer == "model" and "ignores the failure" in ignored.problems[0]
    invented = judge_fallback_step({**PLAN, "kind": "user_error"}, _reply("All 8 GPUs are fine, the node is healthy"),
                                   tools, FAILED, "client")
    assert "never returned" in invented.problems[0]


def _call(name: str, args: dict | str) -> dict:
    return {"id": "x", "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def test_reference_client_on_real_calls_refuses_invalid_and_runs_each_write_once() -> None:
    ticket = {"request_id": "testtest", "title": "test", "severity": "critical", "details": {"node": ""}}
    calls = [{"case": "turn-1", "call": _call("create_ticket", ticket), "retry_group": "g"},
             {"case": "turn-2", "call": _call("create_ticket", ticket), "retry_group": "g"},
             {"case": "turn-3", "call": _call("get_node_status", {"node": ["node-07"], "include": "gpus"})},
             {"case": "turn-4", "call": _call("get_node_status", '{"node": ')}]
    records, unsafe, retry = execute_real_calls(calls, OPS["tools"], OPS["write_tools"])
    assert (unsafe, retry) == ([], [])
    assert [r["executions"] for r in records] == [1, 0, 0, 0]
    assert records[1]["outcome"]["deduplicated"] and records[2]["outcome"]["error"] == "schema_violation"
    assert records[3]["outcome"]["error"] == "invalid_json" and not records[3]["valid"]
    # The same write re-sent as one operation, but the model wrote a new key each time: it runs twice.
    fresh = [{"case": f"t{i}", "call": _call("create_ticket", {**ticket, "request_id": f"key-{i}-abcdefgh"}),
              "retry_group": "g"} for i in range(2)]
    _, unsafe, retry = execute_real_calls(fresh, OPS["tools"], OPS["write_tools"])
    assert unsafe == [] and "ran 2 times" in retry[0] and "not from the client" in retry[0]


def test_the_shop_pack_brings_its_own_idempotency_keys() -> None:
    refund = {"idempotency_key": "k-000001", "order_id": "ORD-204811", "amount_cents": 1299, "reason": "late"}
    calls = [{"case": f"t{i}", "call": _call("issue_refund", refund), "retry_group": "g"} for i in range(3)]
    records, unsafe, retry = execute_real_calls(calls, SHOP["tools"], SHOP["write_tools"])
    assert sum(r["executions"] for r in records) == 1 and not unsafe and not retry
    no_key = {k: v for k, v in refund.items() if k != "idempotency_key"}
    records, _, _ = execute_real_calls([{"case": "t", "call": _call("issue_refund", no_key)}], SHOP["tools"],
                                       SHOP["write_tools"])
    assert records[0]["outcome"]["error"] == "schema_violation"


def test_a_pack_that_names_undeclared_tools_or_keys_is_refused_with_the_field(tmp_path) -> None:
    bad = json.loads(json.dumps(OPS))
    bad["tasks"]["fallback"]["ticket"]["tool"] = "page_oncall"
    bad["write_tools"] = {"create_ticket": {"idempotency_key": "ticket_id"}}
    problems = pack_problems(bad)
    assert any("tasks.fallback.ticket.tool" in p and "page_oncall" in p for p in problems)
    assert any("write_tools.create_ticket.idempotency_key" in p for p in problems)
    del bad["cache_questions"]["hot_b_call"]
    path = tmp_path / "bad.yml"
    path.write_text(json.dumps(bad))
    path = path.rename(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="cache_questions.hot_b_call"):
        load_scenario(str(path))


def test_an_invalid_tool_schema_fails_before_any_request_is_sent(tmp_path) -> None:
    """A bad scenario: a tool whose parameters are no JSON Schema. The probe stops at agent.tool_schemas
    (layer client) without touching the server (no client is given: any request would raise)."""
    from vllm_acceptance.core.evidence import EvidenceStore
    from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig

    bad = json.loads(json.dumps(OPS))
    bad["tools"][0]["function"]["parameters"] = {"type": "object", "properties": {"node": {"type": "strnig"}}}
    findings, _ = AgentProbe(None, AgentProbeConfig(model="m", scenario=bad), EvidenceStore(tmp_path)).run()
    assert [(f.check, f.status.value, f.layer) for f in findings] == [("agent.tool_schemas", "fail", "client")]
    assert "get_node_status" in findings[0].observed[0]


class _ImageCountingServer:
    """A stand-in chat endpoint for agent.multimodal: 20 prompt tokens for the text, `per_image` more for each
    image part that reaches it (0: a text-only model that ignores images); `strip` drops image parts first,
    as a gateway that rewrites message content does. The real server's case is tests/integration/
    test_multimodal_lab.py; this keeps the check's paths tested where no vision model is built."""

    def __init__(self, per_image: int, strip: bool = False) -> None:
        self.per_image, self.strip = per_image, strip

    def chat(self, body: dict):
        from vllm_acceptance.runtime.client import Exchange

        parts = [p for m in body["messages"] for p in (m["content"] if isinstance(m["content"], list) else [])]
        images = 0 if self.strip else sum(str(p.get("type", "")).startswith("image") for p in parts)
        details = {"multimodal_tokens": {"image": images * self.per_image} if images and self.per_image else None}
        return Exchange(request=body, status=200, body={
            "choices": [{"message": {"role": "assistant", "content": "red"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 20 + images * self.per_image, "prompt_tokens_details": details}})


@pytest.mark.parametrize(("server", "image_tokens", "status", "layer"), [
    (_ImageCountingServer(7), 7, "pass", None),
    (_ImageCountingServer(7), None, "pass", None),  # no count stated: more prompt tokens suffice
    (_ImageCountingServer(7, strip=True), 7, "fail", "gateway"),  # the image never reached the model
    (_ImageCountingServer(5), 7, "fail", "model"),  # reached it, but not as the profile says
], ids=["counted", "counted-no-profile-count", "stripped", "wrong-count"])
def test_multimodal_passes_only_when_the_image_tokens_reach_the_model(tmp_path, server, image_tokens, status,
                                                                      layer) -> None:
    from vllm_acceptance.core.evidence import EvidenceStore
    from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig

    cfg = AgentProbeConfig(model="m", scenario=OPS, images=True, image_tokens=image_tokens)
    finding = AgentProbe(server, cfg, EvidenceStore(tmp_path)).multimodal()
    assert (finding.status.value, finding.layer) == (status, layer), finding.reason
    seen = finding.observed
    assert seen["image_tokens"] == seen["prompt_tokens_with_image"] - seen["prompt_tokens_without"]
    assert seen["server_multimodal_tokens"] == ({"image": server.per_image} if not server.strip else None)


def test_a_seeded_run_gives_each_request_its_own_seed_in_build_order(tmp_path) -> None:
    """agent.seed: the seed plus the request's position (a re-sent request is sampled anew); no seed, none sent."""
    from vllm_acceptance.core.evidence import EvidenceStore
    from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig

    seeded = AgentProbe(None, AgentProbeConfig(model="m", scenario=OPS, seed=40), EvidenceStore(tmp_path / "a"))
    bodies = [seeded.base([{"role": "user", "content": "x"}]) for _ in range(3)]
    assert [b["seed"] for b in bodies] == [40, 41, 42]
    plain = AgentProbe(None, AgentProbeConfig(model="m", scenario=OPS), EvidenceStore(tmp_path / "b"))
    assert "seed" not in plain.base([{"role": "user", "content": "x"}])


def test_seeds_follow_the_cases_order_also_when_sent_concurrently(tmp_path) -> None:
    """The case set sent again (under load, to a reference) through a pool: every body is built, in the cases'
    order, before the first is sent, so each case keeps its own seed whatever order the pool runs them in."""
    import threading

    from vllm_acceptance.core.evidence import EvidenceStore
    from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig
    from vllm_acceptance.runtime.client import Exchange
    from vllm_acceptance.scenarios.cases import build_cases

    seen: dict[str, int] = {}
    built: list[int] = []   # bodies built so far, at each send
    lock = threading.Lock()

    class Recorder:
        def chat(self, body: dict) -> Exchange:
            with lock:
                seen[json.dumps(body["messages"], sort_keys=True)] = body["seed"]
                built.append(probe._sent)
            return Exchange(request=body, status=200, body={"choices": [{"message": {"role": "assistant",
                                                                                    "content": "ok"}}]})

    probe = AgentProbe(None, AgentProbeConfig(model="m", scenario=OPS, seed=100), EvidenceStore(tmp_path))
    cases = build_cases(OPS, 12, 0, 0, probe.system)[:12]
    probe._judge_all(Recorder(), cases, concurrency=4)
    assert built == [len(cases)] * len(cases)
    assert [seen[json.dumps(c.messages, sort_keys=True)] for c in cases] == list(range(100, 100 + len(cases)))
