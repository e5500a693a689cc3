"""Inventory variables: every one the product reads is declared, so a typo stops the run.

Two places declare them (docs/inventory.md):
- `schemas/inventory.schema.json`: the variables the playbooks read (acceptance_*, vllm_*, loadgen_*, ...),
  each with its type and an example;
- `roles/<role>/meta/argument_specs.yml`: the options of each role (preflight_*, vllm_serve_*, ...).

A variable that carries one of the product's prefixes but is declared nowhere stops validation with the
closest declared name ("did you mean `vllm_serve_stop_at_end`?"), because Ansible itself would run as if
it were absent. A site variable that only shares a prefix is listed in `acceptance_unchecked_vars`.

Every value an error quotes is redacted first (core/redact.py; docs/acceptance.md "Contracts": secrets never
reach evidence or reports): a URL's `user:password@`, a secret flag or header, and the literal values of
secret-named variables (vllm_serve_api_key) and of the operator's secret lists (preflight_secrets). The field
and the fix stay named.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .profile import ConfigError, load_schema, validate_errors
from .redact import REDACTED, is_secret_name, redact_text
from .reference import inventory_errors as reference_errors

# The prefixes of the product's variables (playbooks/validate.yml passes exactly these to acceptance_run).
PREFIXES: tuple[str, ...] = (
    "acceptance_", "vllm_", "prometheus_", "preflight_", "rebuild_", "rollback_", "loadgen_", "monitoring_",
    "build_image_", "isolated_env_", "gpu_memory_sampler_", "node_state_", "driver_upgrade_", "scheduler_hook_",
    "agent_reference_",   # the agent probe's reference endpoint only (core/reference.py), not every agent_* name
    "quality_reference_",   # the quality probe's reference path (core/reference.py QUALITY_VARIABLES)
    "recheck_",           # the scheduled re-check (roles/recheck_timer: recheck_scheduler, recheck_timer_*)
)
UNCHECKED = "acceptance_unchecked_vars"

# Ansible's boolean spellings (ansible.module_utils.parsing.convert_bool.BOOLEANS).
_BOOL_STRINGS = {"yes", "no", "true", "false", "on", "off", "1", "0", "y", "n", "t", "f"}

_EXAMPLES: dict[str, str] = {
    "str": '"text"', "path": "/abs/path", "int": "30", "float": "2.5", "bool": "true",
    "list": "[a, b]", "dict": "{key: value}", "raw": "any value",
}
_TYPE_WORDS: dict[str, str] = {
    "str": "a string", "path": "a path (string)", "int": "an integer", "float": "a number", "bool": "a boolean",
    "list": "a list", "dict": "a mapping", "raw": "any value",
}


@dataclass(frozen=True)
class Declared:
    """One declared variable: where it is declared, its type, and (for role options) its choices."""

    name: str
    source: str
    type: str = "raw"
    choices: tuple[Any, ...] = ()
    elements: str | None = None


def is_product_variable(name: str) -> bool:
    return name.startswith(PREFIXES)


def roles_dirs(project_dir: Path | None) -> list[Path]:
    """The roles whose argument specs declare options: the project's (checkout or installed collection)."""
    if project_dir is None:
        return []
    return sorted(p for p in (Path(project_dir) / "roles").glob("*") if p.is_dir())


def _load_yaml(path: Path) -> Any:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
    return yaml.load(path.read_text(), Loader=Loader)  # noqa: S506 - SafeLoader subclass, one tag added


def role_options(project_dir: Path | None) -> dict[str, Declared]:
    """Every option of every entry point in roles/*/meta/argument_specs.yml."""
    declared: dict[str, Declared] = {}
    for role in roles_dirs(project_dir):
        spec_file = role / "meta" / "argument_specs.yml"
        if not spec_file.is_file():
            continue
        specs = (_load_yaml(spec_file) or {}).get("argument_specs") or {}
        for entry, spec in specs.items():
            for name, opt in ((spec or {}).get("options") or {}).items():
                declared.setdefault(name, Declared(
                    name=name, source=f"roles/{role.name}/meta/argument_specs.yml ({entry})",
                    type=str(opt.get("type", "str")), choices=tuple(opt.get("choices") or ()),
                    elements=opt.get("elements")))
    return declared


def schema_variables() -> dict[str, Declared]:
    props = load_schema("inventory").get("properties") or {}
    return {name: Declared(name=name, source="schemas/inventory.schema.json", type="schema") for name in props}


def declared_variables(project_dir: Path | None) -> dict[str, Declared]:
    """Schema first (it carries the stricter rule), then the roles' options."""
    return {**role_options(project_dir), **schema_variables()}


def closest(name: str, known: list[str]) -> str | None:
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return matches[0] if matches else None


def unknown_variable_errors(names: list[str], declared: Mapping[str, Declared], source: str,
                            unchecked: set[str]) -> list[str]:
    known = sorted(declared)
    errors = []
    for name in sorted(n for n in names if is_product_variable(n) and n not in declared and n not in unchecked):
        guess = closest(name, known)
        hint = (f"did you mean `{guess}`?" if guess else
                "no vllm-acceptance variable is close to it (declared in schemas/inventory.schema.json and "
                "roles/*/meta/argument_specs.yml).")
        errors.append(f"{source}: unknown variable `{name}`: {hint} As written it would be ignored; "
                      f"if it belongs to something else, list it in {UNCHECKED}")
    return errors


def misspelt_prefix(name: str) -> str | None:
    """The product prefix a variable's name nearly starts with (`acceptence_owner` -> `acceptance_`): such a name
    is not a product variable, so Ansible and every check above would ignore it (issue 43, 1). The name's leading
    words, as many as the prefix has, compared with the prefix (difflib ratio >= 0.85)."""
    if is_product_variable(name):
        return None
    for prefix in PREFIXES:
        words = prefix.count("_")
        parts = name.split("_")
        if len(parts) <= words:
            continue
        head = "_".join(parts[:words]) + "_"
        if head != prefix and difflib.SequenceMatcher(None, head, prefix).ratio() >= 0.85:
            return prefix
    return None


def prefix_typo_errors(names: list[str], declared: Mapping[str, Declared], source: str,
                       unchecked: set[str]) -> list[str]:
    """A variable whose prefix is misspelt (misspelt_prefix): refused with the declared name it was meant to be."""
    errors = []
    for name in sorted(set(names) - unchecked):
        prefix = misspelt_prefix(name)
        if prefix is None:
            continue
        meant = prefix + name.split("_", prefix.count("_"))[-1]
        guess = meant if meant in declared else closest(meant, sorted(declared))
        hint = f"did you mean `{guess}`?" if guess else f"the product's prefix is `{prefix}`."
        errors.append(f"{source}: unknown variable `{name}`: {hint} Its prefix is close to the product's "
                      f"`{prefix}`, so as written it would be ignored; if it belongs to something else, list it in "
                      f"{UNCHECKED}")
    return errors


def _is_int(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (
        isinstance(value, str) and value.strip().lstrip("-").isdigit())


def _is_float(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    try:
        float(str(value))
    except ValueError:
        return False
    return True


def type_matches(value: Any, type_name: str) -> bool:
    """What Ansible's argument-spec validation would accept for this type (it converts digit strings,
    boolean words and comma-separated strings), never a list where a string is expected."""
    if value is None or type_name == "raw":
        return True
    checks = {
        "str": lambda v: isinstance(v, str | int | float) and not isinstance(v, bool),
        "path": lambda v: isinstance(v, str),
        "int": _is_int,
        "float": _is_float,
        "bool": lambda v: isinstance(v, bool) or (isinstance(v, str | int) and str(v).lower() in _BOOL_STRINGS),
        "list": lambda v: isinstance(v, list) or (isinstance(v, str) and not v.lstrip().startswith("{")),
        "dict": lambda v: isinstance(v, dict) or (isinstance(v, str) and v.lstrip().startswith("{")),
    }
    check = checks.get(type_name)
    return True if check is None else bool(check(value))


def describe(value: Any, *, secret: bool = False) -> str:
    """The value's kind and its text, redacted before it is shortened (a cut would hide the `@` that marks a
    URL's credentials); a secret-named variable's value is not shown at all."""
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)
    if secret:
        return f"{kind} {REDACTED}"
    text = redact_text(json.dumps(value, default=str))
    return f"{kind} {text if len(text) <= 60 else text[:57] + '...'}"


def _literals(value: Any) -> list[str]:
    """Every scalar inside a value, as text and as a message may quote it (repr, JSON)."""
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _literals(v)]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _literals(v)]
    if value is None or isinstance(value, bool):
        return []
    text = str(value)
    return [text, repr(text)[1:-1], json.dumps(text)[1:-1]]


def secret_values(variables: Mapping[str, Any]) -> list[str]:
    """The literal secrets among these variables: what a secret-named one holds (vllm_serve_api_key, and the
    operator's lists of literal secrets, preflight_secrets / node_state_secrets), longest first."""
    found = {t for name, value in variables.items() if is_secret_name(str(name)) for t in _literals(value)}
    return sorted(found, key=len, reverse=True)


def redact_errors(errors: list[str], secrets: list[str]) -> list[str]:
    """Each error line with every quoted value redacted (module docstring)."""
    return [redact_text(line, secrets) for line in errors]


def option_errors(variables: Mapping[str, Any], declared: Mapping[str, Declared], source: str) -> list[str]:
    """Type and choice errors of role options, each naming the expected type and an example."""
    errors = []
    for name, value in sorted(variables.items()):
        spec = declared.get(name)
        if spec is None or spec.type == "schema":
            continue
        secret = is_secret_name(name)
        if not type_matches(value, spec.type):
            expected = _TYPE_WORDS.get(spec.type, spec.type)
            errors.append(f"{source}: field `{name}`: got {describe(value, secret=secret)}; expected {expected}, "
                          f"e.g. {name}: {_EXAMPLES.get(spec.type, '...')} (declared in {spec.source})")
        elif spec.type == "list" and isinstance(value, list) and spec.elements in ("str", "path"):
            bad = [v for v in value if isinstance(v, list | dict)]
            if bad:
                errors.append(f"{source}: field `{name}`: items must be strings, got "
                              f"{describe(bad[0], secret=secret)}; e.g. {name}: [--flag, value] "
                              f"(declared in {spec.source})")
        elif spec.choices and value not in spec.choices:
            errors.append(f"{source}: field `{name}`: got {describe(value, secret=secret)}; expected one of "
                          f"{', '.join(repr(c) for c in spec.choices)}, e.g. {name}: {spec.choices[0]} "
                          f"(declared in {spec.source})")
    return errors


def check_variables(variables: Mapping[str, Any], source: str, project_dir: Path | None = None,
                    *, schema: bool = True) -> list[str]:
    """Every error of these variables: unknown names (with the closest declared one), schema violations,
    role-option types. `schema=False` for per-host variables: only the fields present are checked (the
    schema's required fields are global)."""
    relevant = {k: v for k, v in variables.items() if is_product_variable(k)}
    declared = declared_variables(project_dir)
    unchecked = {str(n) for n in (relevant.get(UNCHECKED) or []) if isinstance(relevant.get(UNCHECKED), list)}
    errors = unknown_variable_errors(list(relevant), declared, source, unchecked)
    errors += prefix_typo_errors([str(k) for k in variables], declared, source, unchecked)
    known = {k: v for k, v in relevant.items() if k in declared}
    schema_errors = validate_errors(known, "inventory", source, partial=not schema)
    if schema and attach_without_url(known):
        # The schema's `if attach then required` says only "'vllm_base_url' is a required property".
        schema_errors = [e for e in schema_errors if "'vllm_base_url' is a required property" not in e]
        errors.append(f"{source}: field `vllm_base_url`: vllm_base_url is required because vllm_serve_mode is attach: "
                      "set it to the running server's OpenAI base URL, e.g. vllm_base_url: http://head-01:8000/v1, "
                      "or set vllm_serve_mode: launch")
    errors.extend(schema_errors)
    errors.extend(option_errors(known, declared, source))
    errors.extend(reference_errors(known, source))
    errors.extend(attach_log_errors(known, source, whole=schema))
    return redact_errors(errors, secret_values(variables))


def attach_log_errors(variables: Mapping[str, Any], source: str, *, whole: bool = True) -> list[str]:
    """vllm_serve_attach_log_command (serve/log_identity.py): a non-empty command line, in attach mode only, and
    not together with vllm_serve_startup_log (one log source, judged against the server)."""
    command = variables.get("vllm_serve_attach_log_command")
    if command is None:
        return []
    field = f"{source}: field `vllm_serve_attach_log_command`"
    if not isinstance(command, str) or not command.strip():
        return [f"{field}: got {describe(command)}; expected one command line that prints the server's startup log, "
                "e.g. vllm_serve_attach_log_command: \"journalctl -u vllm.service -b --no-pager -o cat\""]
    if any(op in command for op in ("|", ">", "<", "&&", ";", "$(", "`")):
        return [f"{field}: {command!r} holds a shell operator; it runs as one command without a shell: give one "
                "command (e.g. kubectl logs -n llm deploy/vllm), or a script on the head that prints the log"]
    if whole and variables.get("vllm_serve_mode") != "attach":
        return [f"{field}: set, but vllm_serve_mode is {variables.get('vllm_serve_mode')!r}: the log command reads an "
                "attached server's log; set vllm_serve_mode: attach, or remove it (a launch keeps its own log)"]
    if variables.get("vllm_serve_startup_log"):
        return [f"{field}: set together with vllm_serve_startup_log: give one source of the server's startup log "
                "(remove one of the two)"]
    return []


def attach_without_url(variables: Mapping[str, Any]) -> bool:
    """Attach mode names no server to attach to (schemas/inventory.schema.json, allOf)."""
    return variables.get("vllm_serve_mode") == "attach" and not variables.get("vllm_base_url")


def validate_variables(variables: Mapping[str, Any], source: str, project_dir: Path | None = None,
                       host_variables: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Raise ConfigError naming every bad variable (global ones, then per host), at most 20 lines."""
    errors = check_variables(variables, source, project_dir)
    secrets = secret_values(variables)
    for host, host_vars in sorted((host_variables or {}).items()):
        own = {k: v for k, v in host_vars.items() if k not in variables or variables[k] != v}
        errors.extend(check_variables(own, f"{source}, host {host}", project_dir, schema=False))
        secrets += secret_values(host_vars)
    # a host's line may quote a secret the group declares (preflight_secrets in group_vars): redact with all
    errors = redact_errors(errors, sorted(set(secrets), key=len, reverse=True))
    if errors:
        raise ConfigError("invalid inventory:\n  " + "\n  ".join(errors[:20])
                          + (f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""))
