"""Profiles: every model-, image- and threshold-specific value, validated before any node is touched."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml


class ConfigError(Exception):
    """Bad input (profile, inventory, option): the message names the file, the field and the fix."""


def load_schema(name: str) -> dict[str, Any]:
    text = resources.files("vllm_acceptance.schemas").joinpath(f"{name}.schema.json").read_text()
    return json.loads(text)


def field_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


def describe_allowed(error: jsonschema.ValidationError) -> str:
    schema = error.schema if isinstance(error.schema, dict) else {}
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    if error.validator == "additionalProperties":
        allowed = sorted((error.schema.get("properties") or {}).keys())
        return "known fields: " + ", ".join(allowed)
    if error.validator == "required":
        return "add the field"
    parts = []
    for key in ("type", "pattern", "minimum", "maximum", "exclusiveMinimum", "minItems", "const"):
        if key in schema:
            parts.append(f"{key} {schema[key]}")
    return ", ".join(parts) or str(error.validator)


def validate_document(data: Any, schema_name: str, source: str) -> None:
    validator = jsonschema.Draft202012Validator(load_schema(schema_name))
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{source}: field `{field_path(e)}`: {e.message} (allowed: {describe_allowed(e)})"
                 for e in errors[:10]]
        raise ConfigError("invalid " + schema_name + ":\n  " + "\n  ".join(lines))


@dataclass(frozen=True)
class Profile:
    data: dict[str, Any]
    source: str

    @property
    def name(self) -> str:
        return str(self.data["name"])

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def experimental(self) -> bool:
        return bool(self.data.get("experimental", False))

    @property
    def has_gpus(self) -> bool:
        return self.data["hardware"]["accelerator"] != "none"


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"profile {path}: no such file (profiles live in profiles/*.yml)")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"profile {path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path}: must be a mapping of fields, got {type(data).__name__}")
    validate_document(data, "profile", f"profile {path}")
    return Profile(data=data, source=str(path))
