"""Vendored case packs: public, licensed request sets a profile adds to the agent case set (`agent.case_pack`).

`kimi-vendor-verifier`: a subset of Moonshot's Kimi-Vendor-Verifier tool-call JSON schema cases (MIT; the walle
validator's valid schemas, MIT), sent as its `tests/tool_call_json_schema` sends them: one tool `kvv_walle_case`
whose `parameters` are the case's schema wrapped as the property `value` (`default` keywords stripped),
`strict: true`, `tool_choice: "required"`, the verifier's user prompt verbatim. Each case is a single case of the
case set: a call of `kvv_walle_case` expected, its arguments validated against the schema (agent.schema_accuracy,
agent.tool_call), `required` honoured (agent.tool_choice), streamed too (agent.stream_tool_calls). The files,
their licence and source commit: scenarios/packs/<name>/ (LICENSE, SOURCE.md); docs/sources.md#kimi-vendor-verifier.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from ..core.profile import ConfigError, parse_yaml
from . import tool_schema_problems
from .cases import Case

REQUIRED_FILES = ("cases.yml", "LICENSE", "SOURCE.md")


def packaged_case_packs() -> list[str]:
    root = resources.files(__name__.rsplit(".", 1)[0]).joinpath("packs")
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.joinpath("cases.yml").is_file())


def _dir(name: str) -> Any:
    root = resources.files(__name__.rsplit(".", 1)[0]).joinpath("packs")
    folder = root.joinpath(name)
    if not folder.joinpath("cases.yml").is_file():
        raise ConfigError(f"case pack {name!r}: no such pack (profile field `agent.case_pack`; packaged: "
                          f"{', '.join(packaged_case_packs()) or 'none'})")
    return folder


def load_case_pack(name: str) -> dict[str, Any]:
    """The pack's cases.yml, its LICENSE and SOURCE.md checked present, every case's tool schema meta-validated."""
    folder = _dir(name)
    missing = [f for f in REQUIRED_FILES if not folder.joinpath(f).is_file()]
    if missing:
        raise ConfigError(f"case pack {name!r}: {', '.join(missing)} missing beside cases.yml (a vendored pack "
                          "carries its licence and source)")
    data = parse_yaml(folder.joinpath("cases.yml").read_text(encoding="utf-8"))
    source = data.get("source") or {}
    for key in ("repository", "commit", "path", "license"):
        if not source.get(key):
            raise ConfigError(f"case pack {name!r}: source.{key} is empty (record where the cases come from)")
    for case in data.get("cases") or []:
        problems = tool_schema_problems([_tool(data, case)])
        if problems:
            raise ConfigError(f"case pack {name!r}, case {case.get('suite')}:{case.get('line')}: {problems[0]}")
    if not data.get("cases"):
        raise ConfigError(f"case pack {name!r}: no cases")
    return data


def pack_license(name: str) -> str:
    return str(_dir(name).joinpath("LICENSE").read_text(encoding="utf-8"))


# --- the verifier's request, as tests/tool_call_json_schema/validator.py builds it ------------------------------

def _refs(obj: Any) -> list[str]:
    if isinstance(obj, dict):
        return ([obj["$ref"]] if "$ref" in obj else []) + [r for v in obj.values() for r in _refs(v)]
    if isinstance(obj, list):
        return [r for v in obj for r in _refs(v)]
    return []


def _rewrite_root_refs(obj: Any, target: str) -> Any:
    if isinstance(obj, dict):
        return {k: target if k == "$ref" and v == "#" else _rewrite_root_refs(v, target) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rewrite_root_refs(v, target) for v in obj]
    return obj


def _strip(obj: Any, keyword: str) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v, keyword) for k, v in obj.items() if k != keyword}
    if isinstance(obj, list):
        return [_strip(v, keyword) for v in obj]
    return obj


def wrap_parameters(schema: Any) -> Any:
    """The verifier's `wrap_schema_as_parameter_property` then `strip_keyword_recursive(..., "default")`: the
    case schema as the required property `value` of an object (a root self-reference moved into $defs)."""
    if not isinstance(schema, dict):
        return schema
    wrapped: dict[str, Any] = {"type": "object", "required": ["value"], "additionalProperties": False}
    if "#" in _refs(schema):
        defs = dict(schema.get("$defs", {}))
        name = "__case_schema"
        while name in defs:
            name = f"_{name}"
        target = f"#/$defs/{name}"
        rewritten = _rewrite_root_refs(schema, target)
        defs.update(rewritten.get("$defs", {}))
        defs[name] = {k: v for k, v in rewritten.items() if k not in ("$defs", "$id")}
        wrapped["properties"] = {"value": {"$ref": target}}
        wrapped["$defs"] = defs
    else:
        wrapped["properties"] = {"value": {k: v for k, v in schema.items() if k not in ("$defs", "$id")}}
        if "$defs" in schema:
            wrapped["$defs"] = schema["$defs"]
    if "$id" in schema:
        wrapped["$id"] = schema["$id"]
    return _strip(wrapped, "default")


def _tool(data: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    req = data["request"]
    return {"type": "function", "function": {"name": req["tool_name"], "description": req["tool_description"],
                                             "parameters": wrap_parameters(json.loads(case["schema"])),
                                             "strict": bool(req.get("strict", True))}}


def pack_cases(name: str) -> list[Case]:
    """The pack's requests as single cases of the case set (ids `<name>-<suite>-<line>`)."""
    data = load_case_pack(name)
    req = data["request"]
    return [Case(f"{name}-{c['suite']}-{int(c['line']):03d}", "single",
                 [{"role": "user", "content": req["prompt"]}], [_tool(data, c)], [req["tool_name"]],
                 tool_choice=req["tool_choice"], fixed_tools=True)
            for c in data["cases"]]
