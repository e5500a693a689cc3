"""Agent checks on recorded response shapes: each defect lands on its layer."""

from __future__ import annotations

import json

from vllm_acceptance.probes.agent.rules import (
    ToolExecutor,
    call_signature,
    check_separation,
    check_tool_call,
    markup_in,
    structure_diff,
)

TOOLS = [{"type": "function", "function": {"name": "get_node_status", "parameters": {
    "type": "object", "properties": {"node": {"type": "string"}, "include": {"enum": ["gpus", "all"]}},
    "required": ["node", "include"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "create_ticket", "parameters": {
        "type": "object", "properties": {"request_id": {"type": "string"}, "title": {"type": "string"}},
        "required": ["request_id", "title"]}}}]


def body(content=None, calls=None, finish="tool_calls", reasoning=None) -> dict:
    msg = {"role": "assistant", "content": content, "tool_calls": calls or []}
    if reasoning:
        msg["reasoning_content"] = reasoning
    return {"choices": [{"index": 0, "message": msg, "finish_reason": finish}]}


def call(name: str, args, cid: str = "c1") -> dict:
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}


def test_valid_call() -> None:
    assert check_tool_call(body(calls=[call("get_node_status", {"node": "n", "include": "gpus"})]), TOOLS).valid


def test_markup_in_content_without_tool_calls_is_the_parser() -> None:
    r = check_tool_call(body('<tool_call>{"name": "get_node_status"}</tool_call>', finish="stop"), TOOLS)
    assert not r.valid and r.problems[0][0] == "parser"


def test_kimi_markup_signatures_are_recognised() -> None:
    assert markup_in('<|open|>tools<|sep|><|open|>call tool="x" index="1"') == ["kimi_k3"]
    assert markup_in("<|tool_calls_section_begin|><|tool_call_begin|>functions.x:0") == ["kimi_k2"]
    assert markup_in("plain answer") == []


def test_schema_violations_and_unknown_names_are_the_model() -> None:
    bad_type = check_tool_call(body(calls=[call("get_node_status", {"node": 7, "include": "gpus"})]), TOOLS)
    unknown = check_tool_call(body(calls=[call("reboot_node", {})]), TOOLS)
    not_json = check_tool_call(body(calls=[call("get_node_status", '{"node": "n", ')]), TOOLS)
    no_call = check_tool_call(body("I will check.", finish="stop"), TOOLS)
    for r in (bad_type, unknown, not_json, no_call):
        assert not r.valid and r.problems[0][0] == "model"


def test_repeated_call_ids_are_the_parser() -> None:
    calls = [call("get_node_status", {"node": "n", "include": "gpus"}, "x"),
             call("get_node_status", {"node": "m", "include": "gpus"}, "x")]
    problems = check_tool_call(body(calls=calls), TOOLS).problems
    assert ("parser", "tool call ids missing or repeated: ['x', 'x']") in problems


def test_reasoning_glued_into_content_is_flagged() -> None:
    assert check_separation(body("Because X. Answer", reasoning="Because X.")) == [
        ("gateway", "reasoning text copied into content")]
    assert check_separation(body("<think>hmm</think> Answer"))[0][0] == "parser"
    assert check_separation(body("Answer", reasoning="Because X.")) == []


def test_stream_and_plain_signatures_compare_parsed_arguments() -> None:
    a = body(calls=[call("get_node_status", '{"node": "n", "include": "gpus"}')])
    b = body(calls=[call("get_node_status", '{"include":"gpus","node":"n"}')])
    assert call_signature(a) == call_signature(b)


def test_structure_diff_names_lost_fields_and_type_changes() -> None:
    direct = {"choices": [{"message": {"content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
                           "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3}}
    via = {"choices": [{"message": {"content": None, "tool_calls": [{"function": {"arguments": {}}}]}}],
           "usage": {"prompt_tokens": 3}}
    diffs = structure_diff(direct, via)
    assert "/choices/0/finish_reason: missing" in diffs
    assert "/choices/0/message/tool_calls/0/function/arguments: str became dict" in diffs
    assert structure_diff(direct, direct) == []


def test_executor_never_runs_invalid_calls_and_dedupes_writes() -> None:
    ex = ToolExecutor(TOOLS, {"create_ticket"})
    assert ex.execute("get_node_status", '{"node": "n", "include": "bogus"}')["executed"] is False
    assert ex.execute("get_node_status", "not json")["error"] == "invalid_json"
    assert ex.execute("nope", "{}")["error"] == "unknown_tool"
    assert ex.execute("create_ticket", '{"title": "t", "request_id": ""}')["executed"] is False
    first = ex.execute("create_ticket", '{"request_id": "r-12345678", "title": "t"}')
    again = ex.execute("create_ticket", '{"request_id": "r-12345678", "title": "t"}')
    assert first["executed"] and again["deduplicated"]
    assert [n for n, _ in ex.executed] == ["create_ticket"]
