"""Scenario packs (data): system prompts, tool schemas and tasks selected by a profile."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from ..core.profile import ConfigError, parse_yaml


def load_scenario(name_or_path: str) -> dict[str, Any]:
    """Load a scenario pack by name (packaged) or path, and meta-validate its tool schemas."""
    path = Path(name_or_path)
    if path.suffix in (".yml", ".yaml") and path.is_file():
        text = path.read_text()
    else:
        resource = resources.files(__name__).joinpath(f"{name_or_path}.yml")
        if not resource.is_file():
            raise ConfigError(f"scenario {name_or_path!r}: no such pack (profile field `agent.scenario`; "
                              f"packaged: {', '.join(packaged())})")
        text = resource.read_text()
    data = parse_yaml(text)                  # parsed once per distinct text, a fresh copy each call
    extra = list((data.get("case_set") or {}).get("extra_tools") or [])
    for problem in tool_schema_problems(list(data.get("tools", [])) + extra) + pack_problems(data):
        raise ConfigError(f"scenario {name_or_path!r}: {problem}")
    return data


def packaged() -> list[str]:
    return sorted(p.name[:-4] for p in resources.files(__name__).iterdir() if p.name.endswith(".yml"))


def _at(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


REQUIRED_FIELDS = ("name", "version", "system_prompt", "tools", "default_environment", "control_environment",
                   "cache_questions.cold", "cache_questions.hot_a", "cache_questions.hot_b",
                   "cache_questions.hot_b_user", "cache_questions.hot_b_call", "cache_questions.hot_b_tool_data",
                   "cache_questions.control", "tasks.required_tool.user", "tasks.required_tool.expect_tool",
                   "tasks.required_tool.call", "tasks.tool_result_ok", "tasks.second_turn_user",
                   "tasks.fallback.failed_result", "tasks.fallback.ticket.tool", "tasks.fallback.ticket.result",
                   "tasks.structured.user", "tasks.structured.schema")


def pack_problems(data: dict[str, Any]) -> list[str]:
    """Every scenario detail the probes use comes from the pack: each field present, each tool it names
    declared in `tools`, each write tool's idempotency key one of that tool's parameters."""
    problems = [f"field `{f}` is missing (see scenarios/ops-agent.yml)" for f in REQUIRED_FIELDS
                if _at(data, f) is None]
    if problems:
        return problems
    tools = {t.get("function", {}).get("name"): t.get("function", {}).get("parameters", {})
             for t in data.get("tools", [])}
    if "{session_id}" not in data["system_prompt"] or "{environment}" not in data["system_prompt"]:
        problems.append("field `system_prompt` must contain {session_id} and {environment}")
    named = {"tasks.required_tool.expect_tool": data["tasks"]["required_tool"]["expect_tool"],
             "tasks.required_tool.call.name": data["tasks"]["required_tool"]["call"].get("name"),
             "tasks.fallback.ticket.tool": data["tasks"]["fallback"]["ticket"]["tool"],
             "cache_questions.hot_b_call.name": data["cache_questions"]["hot_b_call"].get("name")}
    for name in data.get("write_tools") or {}:
        named[f"write_tools.{name}"] = name
    problems += [f"field `{f}` names tool {v!r}, which `tools` does not declare ({', '.join(map(str, tools))})"
                 for f, v in named.items() if v not in tools]
    for name, spec in (data.get("write_tools") or {}).items():
        key = (spec or {}).get("idempotency_key")
        if name in tools and key not in (tools[name].get("properties") or {}):
            problems.append(f"field `write_tools.{name}.idempotency_key` is {key!r}, not a parameter of {name}")
    driven = data["tasks"]["fallback"].get("driven_by", "client")
    if driven not in ("client", "model"):
        problems.append(f"field `tasks.fallback.driven_by` is {driven!r}: choose client or model")
    return problems


def tool_schema_problems(tools: list[dict[str, Any]]) -> list[str]:
    """Meta-validate every tool's parameters against JSON Schema before any request is sent."""
    problems = []
    for tool in tools:
        fn = tool.get("function", {})
        name = fn.get("name") or "<unnamed>"
        try:
            jsonschema.Draft202012Validator.check_schema(fn.get("parameters", {}))
        except jsonschema.SchemaError as exc:
            problems.append(f"tool {name}: parameters are not a valid JSON Schema: {exc.message}")
    return problems
