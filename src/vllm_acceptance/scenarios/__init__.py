"""Scenario packs (data): system prompts, tool schemas and tasks selected by a profile."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from ..core.profile import ConfigError


def load_scenario(name_or_path: str) -> dict[str, Any]:
    """Load a scenario pack by name (packaged) or path, and meta-validate its tool schemas."""
    path = Path(name_or_path)
    if path.suffix in (".yml", ".yaml") and path.is_file():
        text = path.read_text()
    else:
        resource = resources.files(__name__).joinpath(f"{name_or_path}.yml")
        if not resource.is_file():
            raise ConfigError(f"scenario {name_or_path!r}: no such pack (profile field `agent.scenario`; "
                              "packaged: ops-agent)")
        text = resource.read_text()
    data = yaml.safe_load(text)
    for problem in tool_schema_problems(data.get("tools", [])):
        raise ConfigError(f"scenario {name_or_path!r}: {problem}")
    return data


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
