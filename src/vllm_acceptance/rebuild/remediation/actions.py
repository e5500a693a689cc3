"""The actions of plugins/modules/acceptance_remediation.py, one function per action: each takes the module's
params (and whether Ansible runs in check mode) and returns the module's result, or raises `ActionError` whose
message (and fields) the module passes to fail_json. `run_action` checks the options an action needs first.

    from vllm_acceptance.rebuild.remediation.actions import ActionError, run_action
    result = run_action({"action": "capture", "state_dir": "run/evidence/rebuild/gpu-01/before", ...})
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ...core.evidence import atomic_write
from ...core.findings import Finding, read_findings
from ...core.profile import ConfigError, load_profile
from ...core.redact import redact_obj
from .capture import load_capture, save_captures
from .entry import DEFAULT_EVIDENCE_MAX_AGE_H, entry_conditions
from .experimental import experimental_profile
from .ledger import Ledger
from .postcheck import checks_summary, post_check
from .routes import route_for_report
from .smoke import judge_smoke, smoke_endpoint

Params = Mapping[str, Any]
Result = dict[str, Any]

# Bad input the package reports with a message naming the field and the fix (the module base's input errors,
# plugins/module_utils/acceptance_base.py, as far as these actions can raise them).
INPUT_ERRORS: tuple[type[BaseException], ...] = (ConfigError, ValueError, OSError)

REQUIRED_BY_ACTION = {
    "entry": ["run_dir"],
    "capture": ["state_dir"],
    "post_check": ["host", "findings_path"],
    "start": ["run_dir"],
    "record": ["run_dir", "host", "step"],
    "smoke_endpoint": ["smoke_url"],
    "experimental_profile": ["base_profile_path", "profile_name", "profile_dest", "image_reference", "cuda_major"],
}


class ActionError(Exception):
    """The action fails: `msg` says what to do; `fields` go into the failed result beside it."""

    def __init__(self, msg: str, **fields: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.fields = fields


def _guarded(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call into the package; bad input fails the action with the package's own message."""
    try:
        return func(*args, **kwargs)
    except INPUT_ERRORS as exc:
        raise ActionError(str(exc)) from exc


def _findings(path: str | None) -> list[Finding] | None:
    if not path:
        return None
    if not Path(path).is_file():
        raise ActionError(f"preflight findings {path} do not exist: run playbooks/preflight.yml (or accept.yml) "
                          "first and pass its <run>/findings/preflight.json")
    try:
        return read_findings(Path(path))
    except (ValueError, TypeError, KeyError) as exc:
        raise ActionError(f"{path} is not a findings file ({exc}): pass <run>/findings/preflight.json") from exc


def _max_age(p: Params) -> float:
    if not p["profile_path"]:
        return DEFAULT_EVIDENCE_MAX_AGE_H
    profile = _guarded(load_profile, p["profile_path"])
    return float(profile.model.remediation.evidence_max_age_h)


def _upgrade_record(path: str | None) -> Any:
    if not path or not Path(path).is_file():
        return None
    try:
        return json.loads(Path(path).read_text())
    except ValueError as exc:
        raise ActionError(f"{path} is not a rebuild record ({exc}): pass the upgrade run's rebuild.json") from exc


def entry(p: Params, check_mode: bool = False) -> Result:
    """The entry conditions of a driver change; the decision is written to <run_dir>/<kind>-entry.json (in check
    mode too: the refusal is part of the record) and a refusal fails with every reason."""
    findings = _findings(p["preflight_findings"])
    captures = {host: load_capture(Path(d)) for host, d in p["capture_dirs"].items()}
    recorded = {host: load_capture(Path(d)) for host, d in p["recorded_dirs"].items()} or None
    decision = _guarded(
        entry_conditions, findings, hosts=p["hosts"], maintenance_window=p["maintenance_window"],
        captures=captures, rollback_plan=p["rollback_plan"], kind=p["kind"], recorded=recorded,
        findings_path=Path(p["preflight_findings"]) if p["preflight_findings"] else None,
        evidence_max_age_h=_max_age(p), upgrade_record=_upgrade_record(p["upgrade_record"]),
        scope=p["rollback_scope"])
    route = route_for_report(findings, {"maintenance_window": p["maintenance_window"],
                                        "rollback_recorded": bool(p["rollback_plan"]),
                                        **p["site_facts"]}) if findings is not None else None
    record = {"decision": decision.to_dict(), "route": route, "captures": captures, "recorded": recorded,
              "preflight_findings": p["preflight_findings"]}
    # Evidence on the controller, written in check mode too: the refusal is part of the record.
    atomic_write(Path(p["run_dir"]) / f"{p['kind']}-entry.json",
                 json.dumps(redact_obj(record), indent=2, default=str) + "\n")
    if not decision.allowed:
        raise ActionError(f"refused: the {p['kind']} changes nothing until these are met: "
                          + " | ".join(decision.reasons), decision=decision.to_dict(), route=route)
    return {"changed": False, "allowed": True, "decision": decision.to_dict(), "route": route,
            "rollback_versions": decision.rollback_versions, "targets": decision.targets}


def route(p: Params, check_mode: bool = False) -> Result:
    return {"changed": False, "route": route_for_report(_findings(p["preflight_findings"]), p["site_facts"])}


def capture(p: Params, check_mode: bool = False) -> Result:
    return {"changed": False, "capture": load_capture(Path(p["state_dir"]))}


def save_capture(p: Params, check_mode: bool = False) -> Result:
    # Controller evidence of a read-only capture: written in check mode too (as the record is).
    return {"changed": False, "paths": _guarded(save_captures, p["bundles"])}


def post_check_action(p: Params, check_mode: bool = False) -> Result:
    """One node's preflight findings after its change, against the expected driver and the entry preflight."""
    path = Path(p["findings_path"])
    if not path.is_file():
        return {"changed": False, "ok": False, "problems": [f"no findings at {path}: the preflight judge did not run"]}
    before = read_findings(Path(p["before_findings"])) if p["before_findings"] else None
    if p["before_findings"] and not Path(p["before_findings"]).is_file():
        return {"changed": False, "ok": False, "problems": [f"no entry findings at {p['before_findings']}: "
                                                            "nothing to compare the node with"]}
    findings = read_findings(path)
    ok, problems = post_check(findings, p["host"], expect_version=p["expect_version"], kind=p["kind"],
                              before=before)
    return {"changed": False, "ok": ok, "problems": problems, "checks": checks_summary(findings, p["host"])}


def smoke_endpoint_action(p: Params, check_mode: bool = False) -> Result:
    endpoint = _guarded(smoke_endpoint, p["smoke_url"] or "", tool_call=p["smoke_tool_call"], host=p["host"])
    return {"changed": False, "endpoint": endpoint}


def smoke_judge(p: Params, check_mode: bool = False) -> Result:
    result = judge_smoke(p["smoke_status"], p["smoke_body"], tool_call=p["smoke_tool_call"], expect=p["smoke_expect"])
    return {"changed": False, **result}


def start(p: Params, check_mode: bool = False) -> Result:
    # The record is controller evidence: written in check mode as well (the plan is the point).
    return {"changed": False, "ledger": Ledger(Path(p["run_dir"])).start(p["kind"], p["hosts"], p["detail"] or {})}


def record(p: Params, check_mode: bool = False) -> Result:
    return {"changed": False,
            "ledger": Ledger(Path(p["run_dir"])).record(p["host"], p["step"], p["status"], p["detail"])}


def experimental_profile_action(p: Params, check_mode: bool = False) -> Result:
    """profiles/<name>.yml for a self-built image; not written in check mode (changed says whether it would be)."""
    base = _guarded(load_profile, p["base_profile_path"])
    data = _guarded(
        experimental_profile, base, name=p["profile_name"], image_reference=p["image_reference"],
        image_digest=p["image_digest"], cuda_major=p["cuda_major"], lineage=p["lineage"],
        driver_min_branch=p["driver_min_branch"], driver_min_version=p["driver_min_version"])
    dest = Path(p["profile_dest"])
    text = ("# EXPERIMENTAL: written by playbooks/build_image.yml; a self-built image, never an acceptance of "
            "the official image.\n" + yaml.safe_dump(data, sort_keys=False))
    changed = not dest.is_file() or dest.read_text() != text
    if changed and not check_mode:
        atomic_write(dest, text)
    return {"changed": changed, "profile_path": str(dest), "profile": data}


ACTIONS: dict[str, Callable[[Params, bool], Result]] = {
    "entry": entry,
    "route": route,
    "capture": capture,
    "save_capture": save_capture,
    "post_check": post_check_action,
    "smoke_endpoint": smoke_endpoint_action,
    "smoke_judge": smoke_judge,
    "start": start,
    "record": record,
    "experimental_profile": experimental_profile_action,
}


def run_action(p: Params, check_mode: bool = False) -> Result:
    """The module's action `p["action"]`, after checking the options it needs are set."""
    action = p["action"]
    absent = [k for k in REQUIRED_BY_ACTION.get(action, []) if p.get(k) in (None, "")]
    if absent:
        raise ActionError(f"action={action} needs {', '.join(absent)}")
    return ACTIONS[action](p, check_mode)
