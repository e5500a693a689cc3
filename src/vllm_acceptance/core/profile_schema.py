"""schemas/profile.schema.json, generated from the typed profile (core/profile_model.py): pydantic's
model_json_schema() rewritten into the plain draft 2020-12 schema core/profile.py validates with (its error
messages read the schema: describe_schema, example_of), so the model and the schema never drift.

    python -m vllm_acceptance.core.profile_schema           # rewrite the schema and docs/profiles.md's table
    python -m vllm_acceptance.core.profile_schema --check   # exit 1 when either differs from the model

The rewriting: a section is inlined where its field is (no $defs per class, no titles); a type marked Def
(version, date, posnum, posint, envmap) is written once under $defs and referred to; `int | float` is a
"number"; pydantic's gt/ge/lt/le on a number are exclusiveMinimum/minimum/exclusiveMaximum/maximum; an
enum or const carries no "type" beside it; `X | None` is nullable only where the model marks it (NULL) or
the field has no default -- else None is the value of a field left out, and the schema refuses null."""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from .profile_model import ProfileModel

HEADER = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "vllm-acceptance/profile.schema.json",
    "title": "vllm-acceptance profile",
    "description": "Every model-, image- and threshold-specific value of an acceptance run.",
}
# The rule the model's validator (_lineage_when_experimental) states, in the schema's words.
ALL_OF = [{"if": {"properties": {"experimental": {"const": True}}, "required": ["experimental"]},
           "then": {"required": ["lineage"]}}]
# Keyword order of a written schema: the validating keywords in the order jsonschema reports them.
ORDER = ["$schema", "$id", "title", "description", "$ref", "type", "enum", "const", "additionalProperties",
         "required", "$defs", "properties", "anyOf", "oneOf", "items", "minItems", "minLength", "pattern",
         "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "default", "allOf"]
_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}
SCHEMA_FILE = "profile.schema.json"


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    known = [k for k in ORDER if k in node]
    return {k: node[k] for k in known + sorted(k for k in node if k not in ORDER)}


class _Writer:
    def __init__(self, pydantic_defs: dict[str, Any]) -> None:
        self.models = pydantic_defs
        self.defs: dict[str, Any] = {}

    def field(self, node: dict[str, Any], required: bool) -> dict[str, Any]:
        """A property's schema: nullable when required-and-None-allowed or marked."""
        node = dict(node)
        nullable = bool(node.pop("x-nullable", False)) or required
        if "default" in node and (node["default"] is None or isinstance(node["default"], dict)
                                  and "$ref" in node):
            node.pop("default")    # None: the field left out; a section's default instance: not a value
        return self.node(node, nullable)

    def node(self, node: dict[str, Any], nullable: bool = True) -> dict[str, Any]:
        node = {k: v for k, v in node.items() if k != "title"}
        ref = node.pop("$ref", None)
        if ref is not None:        # a section: inline its class, keep what the field says beside it
            inner = self.section(self.models[ref.rsplit("/", 1)[1]])
            return _ordered({**inner, **{k: v for k, v in node.items() if k not in ("default",)}})
        for bound, name in _BOUNDS.items():
            if bound in node:
                node[name] = node.pop(bound)
        if "anyOf" in node:
            node = self._union(node, nullable)
        if "items" in node:
            node["items"] = self.node(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            node["additionalProperties"] = self.node(node["additionalProperties"])
        if node.get("additionalProperties") is True:
            node.pop("additionalProperties")
        if ("enum" in node or "const" in node) and "type" in node:
            node.pop("type")
        name = node.pop("x-def", None)
        if name is not None:
            own = {k: v for k, v in node.items() if k not in ("description", "default")}
            self.defs.setdefault(name, _ordered(own))
            node = {"$ref": f"#/$defs/{name}", **{k: v for k, v in node.items() if k in ("description", "default")}}
        return _ordered(node)

    def _union(self, node: dict[str, Any], nullable: bool) -> dict[str, Any]:
        branches = node.pop("anyOf")
        if [b.get("type") for b in branches] == ["integer", "number"] and all(len(b) == 1 for b in branches):
            return {"type": "number", **node}                # int | float: a JSON number
        has_null = any(b == {"type": "null"} for b in branches)
        rest = [self.node(b) for b in branches if b != {"type": "null"}]
        types = [b.get("type") for b in rest]
        if has_null and not nullable:
            has_null = False                                 # None only as the value of a field left out
        if len(rest) == 1 and not has_null:
            return {**rest[0], **node}
        if len(rest) == 1 and "type" in rest[0] and isinstance(types[0], str):
            return {**rest[0], "type": [types[0], "null"], **node}
        if all(set(b) == {"type"} and isinstance(b["type"], str) for b in rest):
            merged = []
            for t in types:
                t = "number" if t == "integer" and "number" in types else t
                if t not in merged:
                    merged.append(t)
            return {"type": merged + (["null"] if has_null else []), **node}
        return {"anyOf": rest + ([{"type": "null"}] if has_null else []), **node}

    def section(self, model: dict[str, Any]) -> dict[str, Any]:
        required = set(model.get("required") or [])
        out: dict[str, Any] = {"type": "object"}
        if model.get("additionalProperties") is False:
            out["additionalProperties"] = False
        if model.get("required"):
            out["required"] = list(model["required"])
        if "description" in model:
            out["description"] = model["description"]
        out["properties"] = {name: self.field(prop, name in required)
                             for name, prop in (model.get("properties") or {}).items()}
        return _ordered(out)


def generate() -> dict[str, Any]:
    """The profile schema from the model."""
    raw = ProfileModel.model_json_schema(by_alias=True, mode="validation")
    writer = _Writer(raw.get("$defs") or {})
    top = writer.section({k: v for k, v in raw.items() if k != "$defs"})
    return {**HEADER, "type": "object", "additionalProperties": False, "required": top["required"],
            "$defs": dict(sorted(writer.defs.items(), key=lambda kv: _DEF_ORDER.index(kv[0])
                                 if kv[0] in _DEF_ORDER else len(_DEF_ORDER))),
            "properties": top["properties"], "allOf": ALL_OF}


_DEF_ORDER = ["version", "date", "posnum", "posint", "envmap"]


def render() -> str:
    return json.dumps(generate(), indent=2, ensure_ascii=False) + "\n"


def schema_path() -> Path:
    return Path(str(resources.files("vllm_acceptance.schemas").joinpath(SCHEMA_FILE)))


DOCS_FILE = Path(__file__).resolve().parents[3] / "docs" / "profiles.md"
BEGIN, END = "<!-- profile-fields:begin (python -m vllm_acceptance.core.profile_schema) -->", \
    "<!-- profile-fields:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def fields_table(schema: dict[str, Any] | None = None) -> str:
    """Every field of the profile: its path, what it takes (core/profile.py describe_schema, the words of a
    refusal), its default (the model's) and its description -- the table docs/profiles.md carries."""
    from .profile import describe_schema

    schema = schema or generate()
    defs = schema.get("$defs") or {}
    required_top = set(schema.get("required") or [])
    rows = ["| field | takes | default | description |", "| --- | --- | --- | --- |"]

    def walk(node: dict[str, Any], prefix: str, required: set[str]) -> None:
        for name, prop in (node.get("properties") or {}).items():
            path = f"{prefix}{name}"
            target = {**defs[prop["$ref"].rsplit("/", 1)[1]], **prop} if "$ref" in prop else prop
            section = target.get("type") == "object" and "properties" in target
            takes = "a section" if section else describe_schema(target)
            default = "required" if name in required else \
                (f"`{json.dumps(prop['default'])}`" if "default" in prop else "-")
            rows.append(f"| `{path}` | {_cell(takes)} | {default} | {_cell(prop.get('description', ''))} |")
            if section:
                walk(target, path + ".", set(target.get("required") or []))

    walk(schema, "", required_top)
    return "\n".join(rows)


def render_docs(text: str) -> str:
    """docs/profiles.md with its field table rewritten from the model."""
    head, _, rest = text.partition(BEGIN)
    _, found, tail = rest.partition(END)
    if not found:
        raise ValueError(f"{DOCS_FILE}: no {BEGIN} ... {END} block")
    return f"{head}{BEGIN}\n{fields_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.core.profile_schema",
                                     description="write schemas/profile.schema.json from core/profile_model.py")
    parser.add_argument("--check", action="store_true", help="exit 1 when the schema or the docs differ from the model")
    args = parser.parse_args(argv)
    stale = 0
    for path, text in ((schema_path(), render()), (DOCS_FILE, render_docs(DOCS_FILE.read_text()))):
        if path.read_text() == text:
            continue
        if args.check:
            print(f"{path}: differs from core/profile_model.py; run python -m vllm_acceptance.core.profile_schema",
                  file=sys.stderr)
            stale += 1
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
