"""The corrupting gateway's rewrites, judged by the agent checks: each mode produces the defect it names.

Bodies are in the shape real vLLM 0.32 returns (recorded from the lab server); the live proxy is
exercised against the real lab vLLM in tests/integration/test_agent_gateway_lab.py.
"""

from __future__ import annotations

import json

import pytest

from vllm_acceptance.lab.gateway import GATEWAY_SYSTEM, MODES, STAND_IN_REASONING, Corruptor, drop_path, main
from vllm_acceptance.probes.agent.rules import (
    arguments_diff,
    call_signature,
    check_separation,
    check_tool_call,
    client_library_problems,
    structure_diff,
)
from vllm_acceptance.runtime.client import assemble_stream

TOOLS = [{"type": "function", "function": {"name": "get_node_status", "parameters": {
    "type": "object", "properties": {"node": {"type": "string"}, "include": {"enum": ["gpus", "all"]}},
    "required": ["node", "include"], "additionalProperties": False}}}]
ARGS = '{"node": "node-07", "include": "gpus"}'


def body() -> dict:
    """A recorded vLLM 0.32 non-streamed tool-call response (lab server, hermes parser)."""
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny-agent",
            "choices": [{"index": 0, "message": {
                "role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
                "function_call": None, "reasoning": None,
                "tool_calls": [{"id": "chatcmpl-tool-1", "type": "function",
                                "function": {"name": "get_node_status", "arguments": ARGS}}]},
                "logprobs": None, "finish_reason": "tool_calls", "stop_reason": None}],
            "usage": {"prompt_tokens": 10, "total_tokens": 20, "completion_tokens": 10}}


def chunks() -> list[dict]:
    """The same answer as vLLM streams it: role, name, argument fragments, finish."""
    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "tiny-agent",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return [chunk({"role": "assistant", "content": ""}),
            chunk({"tool_calls": [{"index": 0, "id": "chatcmpl-tool-1", "type": "function",
                                   "function": {"name": "get_node_status", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[:12]}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[12:]}}]}),
            chunk({"content": ""}, "tool_calls")]


def streamed(mode: str, corruptor: Corruptor | None = None) -> dict:
    rewriter = (corruptor or Corruptor(mode)).stream()
    return assemble_stream([rewriter.rewrite(c) for c in chunks()])


def test_recorded_shapes_are_clean_before_the_gateway() -> None:
    assert check_tool_call(body(), TOOLS).valid and check_separation(body()) == []
    assert call_signature(assemble_stream(chunks())) == call_signature(body())
    assert Corruptor("passthrough").rewrite_body(body()) == body()


def test_markup_in_content_is_the_parser_signature_in_both_paths() -> None:
    for out in (Corruptor("markup_in_content").rewrite_body(body()), streamed("markup_in_content")):
        message = out["choices"][0]["message"]
        assert message["tool_calls"] == [] and out["choices"][0]["finish_reason"] == "stop"
        assert json.loads(message["content"].split("\n")[1]) == {"name": "get_node_status",
                                                                 "arguments": json.loads(ARGS)}
        problems = check_tool_call(out, TOOLS).problems
        assert problems == [("parser", "tool-call markup (hermes) in content, no tool_calls")]


def test_drop_stream_tool_calls_leaves_plain_answers_alone() -> None:
    corruptor = Corruptor("drop_stream_tool_calls")
    assert corruptor.rewrite_body(body()) == body()
    out = streamed("drop_stream_tool_calls")
    assert call_signature(out) == [] and out["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_into_content_copies_upstream_reasoning_or_the_stand_in() -> None:
    with_reasoning = body()
    with_reasoning["choices"][0]["message"]["reasoning_content"] = "Node state is live data."
    out = Corruptor("reasoning_into_content").rewrite_body(with_reasoning)
    assert out["choices"][0]["message"]["content"] == "Node state is live data."
    assert check_separation(out) == [("gateway", "reasoning text copied into content")]
    for out in (Corruptor("reasoning_into_content").rewrite_body(body()), streamed("reasoning_into_content")):
        message = out["choices"][0]["message"]
        assert message["reasoning_content"] == STAND_IN_REASONING and message["content"] == STAND_IN_REASONING
        assert check_separation(out) == [("gateway", "reasoning text copied into content")]
        assert check_tool_call(out, TOOLS).valid  # the calls survive; only separation is broken


def test_changed_argument_types_fail_the_schema_and_show_in_the_parsed_diff() -> None:
    pairs = [(body(), Corruptor("change_arg_types").rewrite_body(body())),
             (assemble_stream(chunks()), streamed("change_arg_types"))]
    for before, out in pairs:
        assert json.loads(out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {
            "node": ["node-07"], "include": ["gpus"]}
        layer, message = check_tool_call(out, TOOLS).problems[0]
        assert layer == "model" and "violate the schema" in message  # without a direct reference
        assert structure_diff(before, out) == []  # the raw shape hides it: both are strings
        assert "/choices/0/message/tool_calls/0/function/arguments(parsed)/node: str became list" in \
            arguments_diff(before, out)


def test_drop_field_removes_the_path_in_bodies_and_chunks() -> None:
    out = Corruptor("drop_field").rewrite_body(body())
    assert structure_diff(body(), out) == ["/choices/0/finish_reason: missing"]
    assert streamed("drop_field")["choices"][0]["finish_reason"] is None
    custom = Corruptor("drop_field", drop_field="choices.*.message.tool_calls.*.id").rewrite_body(body())
    assert "id" not in custom["choices"][0]["message"]["tool_calls"][0]
    nested = {"a": [{"b": 1}, {"b": 2, "c": 3}]}
    assert drop_path(nested, "a.*.b") == 2 and nested == {"a": [{}, {"c": 3}]}
    assert drop_path(nested, "x.y") == 0


def test_one_in_five_corrupts_exactly_every_fifth_tool_response_streamed_or_not() -> None:
    corruptor = Corruptor("markup_one_in_five")
    outs = [corruptor.rewrite_body(body()) if i % 2 else streamed("", corruptor) for i in range(10)]
    bad = [i for i, out in enumerate(outs) if not check_tool_call(out, TOOLS).valid]
    assert bad == [4, 9] and corruptor.corrupted == 2
    plain = body()
    plain["choices"][0]["message"]["tool_calls"] = []
    corruptor.rewrite_body(plain)  # an answer without tool calls is not counted
    assert corruptor.tool_responses == 10


def test_client_library_keeps_raw_fields_and_refuses_a_body_without_finish_reason() -> None:
    pytest.importorskip("openai")
    raw = body()
    raw["kv_transfer_params"] = {"x": 1}  # a vLLM extra field the library must keep
    assert client_library_problems(raw) == []
    assert client_library_problems(Corruptor("drop_field").rewrite_body(body())) == [
        "rejected by openai ChatCompletion: choices.0.finish_reason: Field required"]
    broken = body()
    broken["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = {"node": "node-07"}
    assert any("function.arguments" in p for p in client_library_problems(broken) or [])


def test_unknown_mode_and_bad_cli_are_refused() -> None:
    assert len(MODES) == len(set(MODES)) == 20
    with pytest.raises(ValueError, match="choose one of"):
        Corruptor("eat_everything")
    with pytest.raises(SystemExit):
        main(["--upstream", "http://127.0.0.1:1/v1", "--port", "1", "--mode", "nope"])
    for bad in (["--nth", "0"], ["--nth", "two"], ["--stall-s", "-1"]):
        with pytest.raises(SystemExit):
            main(["--upstream", "http://127.0.0.1:1/v1", "--port", "1", "--mode", "stall_nth", *bad])


def test_stall_nth_holds_exactly_the_chosen_requests_and_changes_no_byte() -> None:
    corruptor = Corruptor("stall_nth", nth=(2, 5))
    assert [corruptor.stall_this() for _ in range(7)] == [False, True, False, False, True, False, False]
    assert corruptor.corrupted == 2 and corruptor.chat_requests == 7
    assert corruptor.rewrite_body(body()) == body()
    assert streamed("", corruptor) == assemble_stream(chunks())
    # Other modes count requests but never stall.
    other = Corruptor("markup_in_content", nth=(1,))
    assert not other.stall_this() and other.corrupted == 0


def test_shift_stream_index_splits_one_streamed_call_and_the_structure_check_names_it() -> None:
    from vllm_acceptance.probes.agent.rules import stream_structure_problems

    rewriter = Corruptor("shift_stream_index").stream()
    out = [rewriter.rewrite(c) for c in chunks()]
    assert stream_structure_problems(chunks()) == []
    problems = stream_structure_problems(out)
    assert problems and "the first delta of call 1 carries no id" in problems[0]
    assembled = assemble_stream(out)["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in assembled] == ["get_node_status", ""]
    assert Corruptor("shift_stream_index").rewrite_body(body()) == body()  # non-streamed answers untouched


def test_stamp_system_changes_only_the_chosen_requests_system_prompt() -> None:
    request = json.dumps({"model": "m", "messages": [{"role": "system", "content": "You are ops."},
                                                     {"role": "user", "content": "hi"}]}).encode()
    corruptor = Corruptor("stamp_system", nth=(2,))
    seen = []
    for _ in range(3):
        corruptor.stall_this()  # counts the request, as the proxy does first
        seen.append(json.loads(corruptor.rewrite_request(request)))
    assert seen[0] == seen[2] == json.loads(request)
    assert seen[1]["messages"][0]["content"].endswith("] You are ops.") and seen[1]["messages"][1]["content"] == "hi"
    every = Corruptor("stamp_system", nth=(0,))
    every.stall_this()
    assert json.loads(every.rewrite_request(request))["messages"][0]["content"] != "You are ops."
    assert Corruptor("passthrough").rewrite_request(request) == request


def test_replace_system_and_drop_tool_results_rewrite_the_request_only() -> None:
    request = json.dumps({"model": "m", "messages": [
        {"role": "system", "content": "You are ops. Session s-1."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                                 "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": true}"},
        {"role": "user", "content": "and now?"}]}).encode()
    replace = Corruptor("replace_system", nth=(0,))
    replace.stall_this()
    out = json.loads(replace.rewrite_request(request))
    assert out["messages"][0] == {"role": "system", "content": GATEWAY_SYSTEM}
    assert out["messages"][1:] == json.loads(request)["messages"][1:] and replace.corrupted == 1
    drop = Corruptor("drop_tool_results")
    out = json.loads(drop.rewrite_request(request))
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "user"] and drop.corrupted == 1
    assert drop.rewrite_body(body()) == body() and replace.rewrite_body(body()) == body()


def test_strip_images_removes_image_parts_and_keeps_the_text() -> None:
    request = json.dumps({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What colour?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}).encode()
    corruptor = Corruptor("strip_images")
    out = json.loads(corruptor.rewrite_request(request))
    assert out["messages"][0]["content"] == [{"type": "text", "text": "What colour?"}] and corruptor.corrupted == 1


def test_arguments_are_corrupted_only_with_three_or_more_in_flight() -> None:
    gw = Corruptor("change_arg_types_under_load")
    assert gw.min_in_flight == 3
    gw.in_flight = 2
    assert gw.rewrite_body(body()) == body() and gw.corrupted == 0
    gw.in_flight = 3
    changed = gw.rewrite_body(body())
    args = json.loads(changed["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert args != json.loads(body()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert gw.corrupted == 1
