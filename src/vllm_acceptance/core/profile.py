"""Profiles: every model-, image- and threshold-specific value, validated before any node is touched."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .contract import contract_errors
from .profile_model import ProfileModel


class ConfigError(Exception):
    """Bad input (profile, inventory, option): the message names the file, the field and the fix."""


@lru_cache(maxsize=128)
def _parsed_yaml(text: str) -> Any:
    return yaml.safe_load(text)


def parse_yaml(text: str) -> Any:
    """yaml.safe_load(text), each distinct text parsed once per process: profiles and recipes are read again and
    again (extends chains, plan, validate, report) and the pure-Python parse is most of the time a read takes.
    Keyed by the text itself, so a changed file is parsed again; a deep copy, so a caller may change what it
    gets. A YAMLError is raised every time (never cached)."""
    return copy.deepcopy(_parsed_yaml(text))


def load_schema(name: str) -> dict[str, Any]:
    text = resources.files("vllm_acceptance.schemas").joinpath(f"{name}.schema.json").read_text()
    return json.loads(text)


def field_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
               "array": "a list", "object": "a mapping", "null": "null"}
_TYPE_EXAMPLES = {"string": '"text"', "integer": "30", "number": "2.5", "boolean": "true", "array": "[a, b]",
                  "object": "{key: value}", "null": "null"}


def describe_schema(schema: dict[str, Any]) -> str:
    """A subschema in words: "an integer 1..365", "a string matching ^sha256:...", "one of 'a', 'b'"."""
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    if "const" in schema:
        return f"exactly {schema['const']!r}"
    if "anyOf" in schema or "oneOf" in schema:
        return " or ".join(describe_schema(s) for s in schema.get("anyOf") or schema.get("oneOf") or [])
    types = schema.get("type")
    words = " or ".join(_TYPE_NAMES.get(t, t) for t in (types if isinstance(types, list) else [types])) \
        if types else "a value"
    if "minimum" in schema or "maximum" in schema:
        words += f" {schema.get('minimum', '')}..{schema.get('maximum', '')}"
    if "exclusiveMinimum" in schema:
        words += f" above {schema['exclusiveMinimum']}"
    if "pattern" in schema:
        words += f" matching {schema['pattern']}"
    if "minLength" in schema:
        words += f" of at least {schema['minLength']} character(s)"
    if "minItems" in schema:
        words += f" of at least {schema['minItems']} item(s)"
    return words


def example_of(schema: dict[str, Any]) -> str | None:
    """The schema's own example (`examples`), else one for its first type."""
    if schema.get("examples"):
        return json.dumps(schema["examples"][0])
    if "enum" in schema:
        return json.dumps(schema["enum"][0])
    for sub in schema.get("anyOf") or schema.get("oneOf") or []:
        found = example_of(sub)
        if found:
            return found
    types = schema.get("type")
    first = types[0] if isinstance(types, list) else types
    if first == "integer" and "minimum" in schema:
        return str(schema["minimum"])
    return _TYPE_EXAMPLES.get(first) if isinstance(first, str) else None


def describe_allowed(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        allowed = sorted((error.schema.get("properties") or {}).keys())
        return "known fields: " + ", ".join(allowed)
    if error.validator == "required":
        return "add the field"
    # A type, anyOf, enum, pattern or range error: name the expected type(s) and an example, from the
    # field's own subschema (the error's schema is a branch of anyOf when jsonschema descends into it).
    field = _field_schema(error)
    words = describe_schema(field)
    example = example_of(field)
    return f"expected {words}" + (f", e.g. {example}" if example else "")


def _field_schema(error: jsonschema.ValidationError) -> dict[str, Any]:
    schema = error.schema if isinstance(error.schema, dict) else {}
    parent = error.parent
    while parent is not None:
        if isinstance(parent.schema, dict):
            schema = parent.schema
        parent = parent.parent
    return schema


def validate_errors(data: Any, schema_name: str, source: str, *, partial: bool = False) -> list[str]:
    """Every violation as one line: file, field, what is wrong, what is allowed (with an example).
    `partial`: only the fields present are checked (per-host variables; required fields are global)."""
    schema = load_schema(schema_name)
    if partial:
        schema = {k: v for k, v in schema.items() if k not in ("required", "allOf")}
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"{source}: field `{field_path(e)}`: {_message(e)} (allowed: {describe_allowed(e)})" for e in errors]


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator in ("anyOf", "oneOf", "type"):
        return f"got {error.instance!r}"
    return error.message


def validate_document(data: Any, schema_name: str, source: str) -> None:
    lines = validate_errors(data, schema_name, source)
    if not lines and schema_name == "profile":
        lines = contract_errors(data, source)   # the contract against what the launch serves (core/contract.py)
    if lines:
        raise ConfigError("invalid " + schema_name + ":\n  " + "\n  ".join(lines[:10]))


# What makes a deployment the recipe's (issue 42, item 2; docs/acceptance.md "Official means the recipe's image and
# minimums"): the image, the CUDA major inside it, the forbidden tag suffixes, the driver and vLLM minimums. A
# profile whose value of one differs from the recipe it names (recipe/official.py regenerates it) or from the
# official profile it extends is judged on the experimental route, never released as the recipe's deployment.
OFFICIAL_FIELDS = ("image.reference", "image.digest", "image.cuda_major", "image.forbidden_tag_suffixes",
                   "driver.min_branch", "driver.min_version", "vllm.min_version")


def dotted_value(data: Any, dotted: str) -> Any:
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _comparable(value: Any) -> Any:
    """YAML's 580 and "580", 0.27.1 written quoted or not: compared as text; lists item by item."""
    if isinstance(value, list | tuple):
        return [_comparable(v) for v in value]
    return None if value is None else str(value).strip()


def deviations_from(data: dict[str, Any], official: dict[str, Any], source: str) -> list[dict[str, Any]]:
    """Each OFFICIAL_FIELDS value of `data` that differs from `official`'s: field, the profile's value, the official
    value, where the official value comes from. A digest the official document leaves unpinned may be pinned (the
    official image's own digest, compat.image_identity holds the image to it); every other difference counts,
    weaker or stricter."""
    out = []
    for field_name in OFFICIAL_FIELDS:
        mine, theirs = dotted_value(data, field_name), dotted_value(official, field_name)
        if field_name == "image.digest" and theirs is None:
            continue
        if _comparable(mine) != _comparable(theirs):
            out.append({"field": field_name, "profile": mine, "official": theirs, "source": source})
    return out


def chain_deviations(data: dict[str, Any], chain: tuple[str, ...]) -> tuple[dict[str, Any], ...]:
    """Against the official profiles it extends (`experimental` false), the farthest first: a field changed by any
    layer above an official profile is named once, against the farthest official value."""
    found: dict[str, dict[str, Any]] = {}
    for ancestor in reversed(chain):
        path = Path(ancestor)
        parent, _ = resolve_extends(_read_profile_file(path), path)
        if parent.get("experimental"):
            continue
        for row in deviations_from(data, parent, f"official profile {path.name} ({parent.get('name')})"):
            found.setdefault(row["field"], row)
    return tuple(found[f] for f in OFFICIAL_FIELDS if f in found)


@dataclass(frozen=True)
class Profile:
    data: dict[str, Any]
    source: str
    extends: tuple[str, ...] = ()      # the files this one was layered on (nearest first), merged into `data`
    # Where the merged profile's image and minimums differ from an official profile it extends (chain_deviations):
    # known only where `extends` is resolved, so open_run records it in run.json for the report.
    official_deviations: tuple[dict[str, Any], ...] = ()

    @cached_property
    def model(self) -> ProfileModel:
        """The typed profile (core/profile_model.py), built once from `data` (already validated by the JSON
        Schema): every field read goes through it. `data` stays the document as written (merged), for what
        writes or checks the whole document (the run's profile.yml, core/contract.py)."""
        return ProfileModel.model_validate(self.data)

    @property
    def name(self) -> str:
        return self.model.name

    def get(self, dotted: str, default: Any = None) -> Any:
        """The document's value at a dotted path as written (no model default): for tests and tools that
        inspect a profile file. The package reads `model` (tests/unit/test_profile_model.py holds it to that)."""
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def experimental(self) -> bool:
        return self.model.experimental

    @property
    def has_gpus(self) -> bool:
        return self.model.hardware.accelerator != "none"


def _read_profile_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"profile {path}: no such file (profiles live in profiles/*.yml)")
    try:
        data = parse_yaml(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"profile {path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"profile {path}: must be a mapping of fields, got {type(data).__name__}")
    return data


PROFILES_DIR = Path(__file__).resolve().parents[3] / "profiles"


def extends_path(ref: Any, child: Path) -> Path:
    """`extends: NAME` is profiles/NAME.yml (beside the child, else this checkout's profiles/); a value with a
    slash or a .yml suffix is a path relative to the child's folder."""
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError(f"profile {child}: field `extends`: got {ref!r} (allowed: a profile name or path, "
                          'e.g. "kimi-k3" for profiles/kimi-k3.yml)')
    if "/" in ref or ref.endswith((".yml", ".yaml")):
        candidates = [child.parent / ref, Path(ref)]
    else:
        candidates = [child.parent / f"{ref}.yml", PROFILES_DIR / f"{ref}.yml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(f"profile {child}: field `extends`: {ref!r} not found (looked for "
                      f"{', '.join(str(c) for c in candidates)}); name a profile of profiles/ or a path")


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) in `top` replaces the base's value."""
    out = dict(base)
    for key, value in top.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def mark_site_launch(parent: dict[str, Any], child: dict[str, Any], merged: dict[str, Any], source: str) -> None:
    """A generated profile names the recipe field behind each launch argument and variable
    (launch.provenance, src/vllm_acceptance/recipe/generate.py); what a site profile sets instead is named as
    the site's, so a deviation from the recipe never reads as the recipe's."""
    provenance = (merged.get("launch") or {}).get("provenance")
    launch = child.get("launch") or {}
    if not isinstance(provenance, dict) or not isinstance(launch, dict):
        return
    base_args = set((parent.get("launch") or {}).get("args") or [])
    args = dict(provenance.get("args") or {})
    for arg in launch.get("args") or []:
        if arg not in base_args:
            args[str(arg).split("=", 1)[0]] = f"site profile {source}"
    env = dict(provenance.get("env") or {})
    base_env = (parent.get("launch") or {}).get("env") or {}
    for name, value in (launch.get("env") or {}).items():
        if base_env.get(name) != value:
            env[str(name)] = f"site profile {source}"
    merged["launch"]["provenance"] = {**provenance, "args": args, "env": env}


def resolve_extends(data: dict[str, Any], path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any],
                                                                                             tuple[str, ...]]:
    """The profile with every `extends` layer merged under it, and the files merged (nearest first)."""
    if "extends" not in data:
        return data, ()
    parent_path = extends_path(data["extends"], path)
    if parent_path in seen or parent_path == path.resolve():
        raise ConfigError(f"profile {path}: field `extends`: {data['extends']!r} leads back to itself "
                          f"({' -> '.join(str(p) for p in (*seen, parent_path))}); remove the cycle")
    parent, chain = resolve_extends(_read_profile_file(parent_path), parent_path, (*seen, path.resolve()))
    child = {k: v for k, v in data.items() if k != "extends"}
    merged = deep_merge(parent, child)
    mark_site_launch(parent, child, merged, str(path))
    return merged, (str(parent_path), *chain)


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    data, chain = resolve_extends(_read_profile_file(path), path)
    where = f"profile {path}" + (f" (merged over {', '.join(chain)})" if chain else "")
    validate_document(data, "profile", where)
    return Profile(data=data, source=str(path), extends=chain,
                   official_deviations=chain_deviations(data, chain) if chain else ())
