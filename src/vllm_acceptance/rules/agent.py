"""Judging one assistant message of an agent exchange, and the client-side executor harness.

Pure functions over response bodies: the agent probe feeds them real server responses, the unit
tests feed them recorded ones. Each problem names the layer at fault (docs/acceptance.md "Agent interface").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

# Tool-call markup that a parser should have consumed; left in `content` it means the parser did
# not recognise the format (hermes, Kimi K2, Kimi K3 wire formats).
MARKUP_SIGNATURES = {
    "hermes": re.compile(r"</?tool_call>"),
    "kimi_k2": re.compile(r"<\|tool_calls?_section_begin\|>|<\|tool_call_begin\|>|<\|tool_call_argument_begin\|>"),
    "kimi_k3": re.compile(r"<\|open\|>(?:tools|call|argument)\b"),
}
REASONING_SIGNATURES = re.compile(r"<think>|</think>|<\|open\|>think<\|sep\|>|<\|close\|>think")


@dataclass
class CallCheck:
    """The verdict on one response that was expected to call a tool."""

    tool_calls: int = 0
    finish_reason: str | None = None
    names: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (layer, message)

    @property
    def valid(self) -> bool:
        return self.tool_calls > 0 and not self.problems


def message_of(body: dict[str, Any] | None) -> dict[str, Any]:
    try:
        return body["choices"][0]["message"] or {}
    except (KeyError, IndexError, TypeError):
        return {}


def finish_of(body: dict[str, Any] | None) -> str | None:
    try:
        return body["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def markup_in(text: str | None) -> list[str]:
    return [name for name, pattern in MARKUP_SIGNATURES.items() if text and pattern.search(text)]


def tool_schemas(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}


def check_tool_call(body: dict[str, Any] | None, tools: list[dict[str, Any]]) -> CallCheck:
    """tool_calls present, names from the schema, indexes consistent, arguments valid JSON per schema."""
    schemas = tool_schemas(tools)
    message = message_of(body)
    calls = message.get("tool_calls") or []
    result = CallCheck(tool_calls=len(calls), finish_reason=finish_of(body))
    content = message.get("content")
    leaked = markup_in(content)
    if leaked and not calls:
        result.problems.append(("parser", f"tool-call markup ({', '.join(leaked)}) in content, no tool_calls"))
    elif leaked:
        result.problems.append(("parser", f"tool-call markup ({', '.join(leaked)}) left in content"))
    if not calls and not leaked:
        result.problems.append(("model", "no tool call where one was required"))
    ids = [c.get("id") for c in calls]
    if len(set(ids)) != len(ids) or any(not i for i in ids):
        result.problems.append(("parser", f"tool call ids missing or repeated: {ids}"))
    for call in calls:
        fn = call.get("function") or {}
        name = fn.get("name")
        result.names.append(name)
        if name not in schemas:
            result.problems.append(("model", f"function name {name!r} is not in the schema"))
            continue
        try:
            args = json.loads(fn.get("arguments") or "")
        except (ValueError, TypeError):
            result.problems.append(("model", f"{name}: arguments are not valid JSON: {fn.get('arguments')!r:.120}"))
            continue
        errors = sorted(jsonschema.Draft202012Validator(schemas[name]).iter_errors(args), key=str)
        if errors:
            result.problems.append(("model", f"{name}: arguments violate the schema: {errors[0].message}"))
    return result


def check_separation(body: dict[str, Any] | None) -> list[tuple[str, str]]:
    """content, reasoning and tool_calls kept apart: nothing of one glued into another."""
    message = message_of(body)
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    problems = []
    if leaked := markup_in(content):
        # Name the format: it tells which --tool-call-parser the server should run.
        problems.append(("parser", f"tool-call markup ({', '.join(leaked)}) in content"))
    if REASONING_SIGNATURES.search(content):
        problems.append(("parser", "reasoning markup in content"))
    if reasoning and reasoning.strip() and reasoning.strip() in content:
        problems.append(("gateway", "reasoning text copied into content"))
    return problems


def call_signature(body: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The structure that streaming and non-streaming must share: names and parsed arguments."""
    out = []
    for call in message_of(body).get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "")
        except (ValueError, TypeError):
            args = fn.get("arguments")
        out.append((fn.get("name"), args))
    return out


def structure_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Keys present in `a` (direct) but absent or of another type in `b` (through a gateway/client)."""
    if isinstance(a, dict):
        if not isinstance(b, dict):
            return [f"{path or '/'}: object became {type(b).__name__}"]
        out = []
        for key, value in a.items():
            if key in ("id", "created", "system_fingerprint"):
                continue
            if key not in b:
                if value is not None:
                    out.append(f"{path}/{key}: missing")
                continue
            out += structure_diff(value, b[key], f"{path}/{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items became {len(b)}"]
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += structure_diff(x, y, f"{path}/{i}")
        return out
    if a is not None and b is not None and type(a) is not type(b):
        return [f"{path}: {type(a).__name__} became {type(b).__name__}"]
    return []


def arguments_diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """Tool-call arguments compared after JSON parsing: a type changed inside the argument string
    (which `structure_diff` sees only as str == str) is a reshaping too."""
    out = []
    for i, ((_, x), (_, y)) in enumerate(zip(call_signature(a), call_signature(b), strict=False)):
        out += structure_diff(x, y, f"/choices/0/message/tool_calls/{i}/function/arguments(parsed)")
    return out


def client_library_problems(body: dict[str, Any] | None) -> list[str] | None:
    """What the `openai` Python library does to a raw response: rejects it, or loses a field.

    The probe itself speaks raw HTTP; production agents usually parse through the library, so a
    field present in the raw JSON but absent after `ChatCompletion.model_validate` is the client
    layer's. Returns None when the library is not installed (the check cannot be made).
    """
    try:
        from openai.types.chat import ChatCompletion
    except ImportError:
        return None
    if not isinstance(body, dict):
        return ["no JSON object to parse"]
    try:
        parsed = ChatCompletion.model_validate(body)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        if callable(errors):
            return [f"rejected by openai ChatCompletion: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                    for e in errors()[:5]]
        return [f"rejected by openai ChatCompletion: {exc}"]
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return [f"lost by openai ChatCompletion: {d}" for d in structure_diff(body, dumped)]


class ToolExecutor:
    """The client-side harness a safe agent uses: validate before executing, dedupe writes by id.

    An invalid call never reaches a tool; the caller gets a predictable error object instead.
    A write tool runs at most once per request id, however often it is retried.
    """

    def __init__(self, tools: list[dict[str, Any]], write_tools: set[str]) -> None:
        self.schemas = tool_schemas(tools)
        self.write_tools = write_tools
        self.executed: list[tuple[str, dict[str, Any]]] = []
        self.seen_request_ids: dict[str, dict[str, Any]] = {}

    def execute(self, name: str, arguments: str) -> dict[str, Any]:
        if name not in self.schemas:
            return {"error": "unknown_tool", "tool": name, "executed": False}
        try:
            args = json.loads(arguments)
        except (ValueError, TypeError):
            return {"error": "invalid_json", "tool": name, "executed": False}
        errors = list(jsonschema.Draft202012Validator(self.schemas[name]).iter_errors(args))
        if errors:
            return {"error": "schema_violation", "tool": name, "detail": errors[0].message, "executed": False}
        if name in self.write_tools:
            request_id = args.get("request_id")
            if not request_id:
                return {"error": "write_without_request_id", "tool": name, "executed": False}
            if request_id in self.seen_request_ids:
                return {**self.seen_request_ids[request_id], "deduplicated": True}
        self.executed.append((name, args))
        result = {"ok": True, "tool": name, "executed": True}
        if name in self.write_tools:
            self.seen_request_ids[args["request_id"]] = result
        return result
