"""The model smoke test after a change: the endpoint its request goes to under rebuild_smoke_url, and the rule
its answer is judged by (a non-empty completion, or a well-formed tool call on an agent profile)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ...core.profile import ConfigError

SMOKE_TOOL = {"type": "function", "function": {
    "name": "report_status", "description": "Report the status of the service.",
    "parameters": {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}}}


# rebuild_smoke_url is the server's OpenAI base URL (docs/inventory.md), the form of vllm_base_url; a URL that
# names one of the two completion endpoints is read as its base, so either form works for either body.
SMOKE_ENDPOINTS = ("/chat/completions", "/completions")


def smoke_endpoint(url: str, *, tool_call: bool, host: str | None = None) -> str:
    """The endpoint the smoke body needs under the base URL ``url``: a chat request with tools on an agent
    profile (``tool_call``), a plain completion otherwise. A URL ending in ``/completions`` or
    ``/chat/completions`` is taken as its base; any other endpoint, a query, or a scheme other than http(s)
    cannot take the body and is refused (ConfigError naming the field and the fix)."""
    field_name = f"rebuild_smoke_url of {host}" if host else "rebuild_smoke_url"
    fix = "set it to the server's OpenAI base URL, e.g. http://HOST:8000/v1"
    parts = urlsplit(str(url or "").strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{field_name}: {url!r} is not an http(s) URL: {fix}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{field_name}: {url!r} has a query or fragment the smoke request cannot keep: {fix}")
    path = parts.path.rstrip("/")
    for suffix in SMOKE_ENDPOINTS:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    last = path.rsplit("/", 1)[-1]
    if last in OTHER_ENDPOINTS:
        raise ConfigError(f"{field_name}: {url!r} names the /{last} endpoint, which cannot take the smoke "
                          f"{'chat request with tools' if tool_call else 'completion'}: {fix}")
    base = f"{parts.scheme}://{parts.netloc}{path}"
    return base + ("/chat/completions" if tool_call else "/completions")


# OpenAI-compatible endpoints of vLLM's server that are not a base URL (a smoke URL naming one is a mistake).
OTHER_ENDPOINTS = frozenset({"models", "embeddings", "tokenize", "detokenize", "health", "metrics", "responses",
                             "chat", "score", "rerank", "pooling", "classify", "audio", "messages", "version",
                             "ping", "load"})


def judge_smoke(status: int | None, body: Any, *, tool_call: bool, expect: str | None = None) -> dict[str, Any]:
    """The smoke test's rule: HTTP 200 and a non-empty answer (matching `expect`, a regular expression,
    when given); on an agent profile (`tool_call`) a call of SMOKE_TOOL whose arguments are a JSON object
    with its required field. An empty completion, a refusal or a tool call with broken arguments fail."""
    problems: list[str] = []
    answer = ""
    choices = body.get("choices") if isinstance(body, Mapping) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else None
    if status != 200:
        problems.append(f"HTTP {status}: {str(body)[:200]}")
    elif first is None:
        problems.append("the answer has no choices")
    elif tool_call:
        answer = _smoke_tool_call(first, problems)
    else:
        answer = str(first.get("text") if "text" in first else (first.get("message") or {}).get("content") or "")
        if not answer.strip():
            problems.append(f"empty answer (finish_reason {first.get('finish_reason')!r})")
        elif expect and not re.search(expect, answer):
            problems.append(f"answer {answer[:120]!r} does not match rebuild_smoke_expect {expect!r}")
    return {"ok": not problems, "problems": problems, "answer": answer[:200], "tool_call": tool_call}


def _smoke_tool_call(choice: Mapping[str, Any], problems: list[str]) -> str:
    name = SMOKE_TOOL["function"]["name"]
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping)]
    if not calls:
        problems.append(f"no tool call (content {str(message.get('content') or '')[:120]!r}, finish_reason "
                        f"{choice.get('finish_reason')!r}): an agent profile's smoke test needs a call of {name}")
        return str(message.get("content") or "")
    function = calls[0].get("function") if isinstance(calls[0].get("function"), Mapping) else {}
    raw = str(function.get("arguments") or "")
    if function.get("name") != name:
        problems.append(f"tool call names {function.get('name')!r}, expected {name}")
    try:
        arguments = json.loads(raw)
    except ValueError:
        problems.append(f"tool call arguments are not JSON: {raw[:120]!r}")
        return raw
    if not isinstance(arguments, dict) or not isinstance(arguments.get("status"), str):
        problems.append(f"tool call arguments {raw[:120]!r} lack the required string field 'status'")
    return f"{function.get('name')}({raw[:150]})"
