"""Opening a run: validate the inputs, then create reports/<inventory>/<run-id>/ with run.json.

Nothing touches a node before this succeeds: a bad profile or inventory value stops here with
the file, the field and what is allowed.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from pathlib import Path
from typing import Any

from .evidence import atomic_write
from .profile import ConfigError, Profile, load_profile, validate_document
from .redact import redact_obj

INVENTORY_KEYS = ("acceptance_", "vllm_", "prometheus_", "isolated_env_")


def resolve_profile_path(name_or_path: str, project_dir: Path) -> Path:
    """`cpu-lab` -> <project>/profiles/cpu-lab.yml; a path stays a path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yml", ".yaml"):
        return candidate if candidate.is_absolute() else project_dir / candidate
    path = project_dir / "profiles" / f"{name_or_path}.yml"
    if not path.is_file():
        known = sorted(p.stem for p in (project_dir / "profiles").glob("*.yml"))
        raise ConfigError(f"inventory field `acceptance_profile`: no profile {name_or_path!r} "
                          f"(allowed: {', '.join(known)} or a path to a .yml file)")
    return path


def validate_inventory_vars(variables: dict[str, Any], source: str) -> None:
    relevant = {k: v for k, v in variables.items() if k.startswith(INVENTORY_KEYS)}
    validate_document(relevant, "inventory", source)
    validate_probe_overrides(relevant.get("acceptance_probe_overrides") or {}, source)


def validate_probe_overrides(overrides: dict[str, Any], source: str) -> None:
    """A probe override tunes its own probe (`load.soak_s`, `cache.request_timeout_s`); it never changes
    the contract or the pass rules the verdict signs (README 'Inventory variables')."""
    for kind, fields in overrides.items():
        for name in fields or {}:
            if not str(name).startswith(f"{kind}."):
                raise ConfigError(
                    f"invalid inventory:\n  {source}: field `acceptance_probe_overrides.{kind}.{name}`: a {kind} "
                    f"probe override may only tune `{kind}.*` settings (allowed: {kind}.<setting>); the contract "
                    "(contract.*), the pass rules (thresholds.*) and the model come from the profile: write "
                    "profiles/<site>.yml with the contract you test and set acceptance_profile to it")


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def open_run(*, project_dir: Path, reports_dir: Path, inventory: str, variables: dict[str, Any],
             hosts: list[str], run_id: str | None = None) -> tuple[Path, Profile]:
    validate_inventory_vars(variables, f"inventory {inventory} (group_vars)")
    profile = load_profile(resolve_profile_path(str(variables["acceptance_profile"]), project_dir))
    run_id = run_id or new_run_id()
    run_dir = (reports_dir / inventory / run_id).resolve()
    try:
        run_dir.mkdir(parents=True, exist_ok=False)  # a run never writes into another run's directory
    except FileExistsError as exc:
        raise ConfigError(f"run directory {run_dir} already exists: another run with id {run_id}") from exc
    for sub in ("findings", "stages", "evidence"):
        (run_dir / sub).mkdir()
    run = {"inventory": inventory, "profile": profile.name, "profile_source": str(profile.source),
           "run_id": run_id, "started": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
           "hosts": hosts, "owner": variables.get("acceptance_owner"),
           "signoff": {"deployment_engineer": variables.get("acceptance_owner"),
                       "reviewer": variables.get("acceptance_reviewer") or None},
           "inventory_vars": redact_obj({k: v for k, v in variables.items() if k.startswith(INVENTORY_KEYS)})}
    atomic_write(run_dir / "run.json", json.dumps(run, indent=2, default=str) + "\n")
    record_profile(run_dir, profile)
    return run_dir, profile


PROFILE_EVIDENCE = "evidence/profile.yml"


def record_profile(run_dir: Path, profile: Profile) -> str:
    """The profile as judged: the recipe record and every threshold are evidence of this run."""
    target = run_dir / PROFILE_EVIDENCE
    if not target.is_file():
        atomic_write(target, Path(profile.source).read_text())
    return PROFILE_EVIDENCE


def update_run(run_dir: Path, **fields: Any) -> None:
    """Merge fields into run.json (e.g. unreachable hosts, environment) atomically."""
    path = run_dir / "run.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    for key, value in fields.items():
        if isinstance(value, list) and isinstance(data.get(key), list):
            data[key] = sorted(set(data[key]) | set(value))
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    atomic_write(path, json.dumps(redact_obj(data), indent=2, default=str) + "\n")
