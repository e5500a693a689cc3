"""Sign-off as a record: `vllm-acceptance sign RUN_DIR --reviewer NAME --decision DECISION`.

signoff.json (beside report.json) holds who signed, when, the decision, the limits and note, the
items a person confirms at sign-off (maintenance window, spare node, monitoring owner...), the
restore rehearsal the reviewer saw, and the sha256 of the report.json it signs. report.json itself
is not rewritten, so the hash stays checkable: report.html and report.md are re-rendered with the
record attached, and show in red when report.json no longer matches what was signed.

A decision more permissive than the run's verdict (release on a limited_observation run, anything
that lets traffic through on a rebuild or incomplete run) is refused unless an override reason is
given; the override is recorded and shown in red on the first screen.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from ..core.rundir import RunDir
from .reopen import read_signoff, sha256_file

DECISIONS = ("release", "limited_observation", "expand_capacity", "rebuild_environment")
# How much traffic a verdict or decision lets through; precedence of README's decision table.
PERMISSIVENESS = {"incomplete": 0, "rebuild_environment": 0, "expand_capacity": 1, "limited_observation": 2,
                  "release": 3}
REHEARSAL_FILE = "restore_rehearsal.json"

# Items of the source checklists that no tool can prove: a person confirms them when signing.
CONFIRM_FIELDS: dict[str, str] = {
    "maintenance_window": "maintenance window agreed (driver upgrade route)",
    "spare_node": "a separate node available for the first test",
    "rollback_plan": "a way to roll back the driver or recreate the node recorded",
    "regression_workload": "a previous workload that is re-checked after the change",
    "isolated_environment": "an isolated compatible environment, if the shared cluster cannot change",
    "rate_limit_policy": "the rate-limit policy for the released traffic",
}


def sign_command(report: dict[str, Any]) -> str:
    """The command a report prints for its sign-off: the run directory as `sign` takes it (reports/<inventory>/<run
    id>, the default reports directory, from the project directory), not a bare run id; the decision the verdict
    allows without an override."""
    decision = report.get("verdict") if report.get("verdict") in DECISIONS else "DECISION"
    return (f"vllm-acceptance sign reports/{report.get('inventory')}/{report.get('run_id')} "
            f"--reviewer NAME --decision {decision}")


class SignRefused(ValueError):
    """The sign-off cannot be recorded as asked; the message says what to give instead."""


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def more_permissive(decision: str, verdict: str) -> bool:
    return PERMISSIVENESS.get(decision, 0) > PERMISSIVENESS.get(verdict, 0)


def parse_confirmations(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise SignRefused(f"--confirm {item!r}: expected FIELD=TEXT, e.g. --confirm spare_node=gpu-node-17")
        if key not in CONFIRM_FIELDS:
            raise SignRefused(f"--confirm {key!r}: unknown field; allowed: {', '.join(CONFIRM_FIELDS)}")
        out[key] = value.strip()
    return out


def load_run_report(run_dir: Path) -> dict[str, Any]:
    path = RunDir(run_dir).report_json
    if not path.is_file():
        raise SignRefused(f"{run_dir}: no report.json to sign (give a run directory reports/<inventory>/<run-id>, "
                          "after its report stage ran)")
    try:
        report = json.loads(path.read_text())
    except ValueError as exc:
        raise SignRefused(f"{path}: not valid JSON ({exc}); re-run the report stage") from exc
    if not isinstance(report, dict) or "verdict" not in report:
        raise SignRefused(f"{path}: no verdict in report.json; re-run the report stage")
    judged_on_run_profile(run_dir, report)
    return report


def judged_on_run_profile(run_dir: Path, report: dict[str, Any]) -> None:
    """A report judged on another profile than the run's is never signed (report/judged_profile.py)."""
    ran = (read_json_dict(RunDir(run_dir).run_json) or {}).get("profile")
    frozen = RunDir(run_dir).profile_path
    if frozen.is_file():
        from ..core.profile import load_profile

        ran = load_profile(frozen).name
    if ran and report.get("profile") != ran:
        raise SignRefused(f"{RunDir(run_dir).report_json} was judged on profile {report.get('profile')!r}, "
                          f"but the run ran with {ran!r}: re-run `vllm-acceptance report --run-dir {run_dir}` "
                          "(the run's own profile) and sign that")


def build_signoff(run_dir: Path, report: dict[str, Any], *, reviewer: str, decision: str,
                  limits: list[str] | None = None, note: str | None = None, override_reason: str | None = None,
                  deployment_engineer: str | None = None, monitoring_owner: str | None = None,
                  confirmations: dict[str, str] | None = None, signed_at: str | None = None) -> dict[str, Any]:
    """The signoff record, or SignRefused naming what is wrong and how to sign instead."""
    reviewer = (reviewer or "").strip()
    verdict = str(report.get("verdict"))
    if not reviewer or reviewer.upper() == "NAME":
        raise SignRefused("--reviewer: a sign-off needs a reviewer: give the name of the SRE or platform lead who "
                          "reviewed the run (not the person who ran the acceptance)")
    if decision not in DECISIONS:
        raise SignRefused(f"--decision {decision!r}: one of {', '.join(DECISIONS)}")
    if verdict == "incomplete":
        # The report says so ("Incomplete: no decision can be signed", verdict.py IMMEDIATE_ACTION): no decision,
        # however strict, is recorded on evidence that is missing (issue 43 item 6).
        missing = ", ".join(str(m) for m in (report.get("missing") or [])[:8])
        raise SignRefused(f"run {Path(run_dir).name} is incomplete: its report says no decision can be signed"
                          + (f" (missing: {missing}{', ...' if len(report.get('missing') or []) > 8 else ''})"
                             if missing else "")
                          + "; collect the missing evidence, re-run the acceptance and sign the new run")
    engineer = deployment_engineer or (report.get("signoff") or {}).get("deployment_engineer")
    if engineer and engineer.strip().lower() == reviewer.lower():
        raise SignRefused(f"--reviewer {reviewer!r} ran this acceptance (deployment engineer): the review is by "
                          "another person (an SRE or platform lead)")
    override = bool(override_reason and override_reason.strip())
    if more_permissive(decision, verdict) and not override:
        instead = f"sign {verdict!r} or a stricter decision"
        raise SignRefused(f"decision {decision!r} lets more traffic through than the run's verdict {verdict!r}; "
                          f"{instead}, or give --override-reason (recorded and shown in red)")
    limits = [x.strip() for x in limits or [] if x.strip()]
    if decision == "limited_observation" and not limits:
        limits = [f"{k}={v}" for k, v in sorted((report.get("limits") or {}).items())
                  if not isinstance(v, dict) and k != "reason"]
        if not limits:
            raise SignRefused("limited_observation needs the traffic cap: --limit max_num_seqs=N (repeatable); it "
                              "goes into the serving config and the alerts")
    rehearsal = read_json_dict(RunDir(run_dir).report_file(REHEARSAL_FILE))
    return {
        "schema": "signoff/1",
        "inventory": report.get("inventory"),
        "run_id": report.get("run_id"),
        "reviewer": reviewer,
        "deployment_engineer": engineer,
        "decision": decision,
        "verdict": verdict,
        "override": override and more_permissive(decision, verdict),
        "override_reason": override_reason.strip() if override else None,
        "limits": limits,
        "note": note,
        "monitoring_owner": monitoring_owner,
        "confirmations": confirmations or {},
        "restore_rehearsal": rehearsal_summary(rehearsal) if rehearsal else None,
        "signed_at": signed_at or now_iso(),
        "report_sha256": sha256_file(RunDir(run_dir).report_json),
        "reopen_fired": [t.get("trigger") for t in (report.get("reopen") or {}).get("fired") or []],
    }


def read_json_dict(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def rehearsal_summary(rehearsal: dict[str, Any]) -> str:
    status = rehearsal.get("status", "?")
    what = rehearsal.get("relaunched") or "?"
    when = rehearsal.get("finished") or rehearsal.get("started") or "?"
    origin = rehearsal.get("from_run") or "?"
    return f"{status}: {when}, relaunched {what} (accepted in run {origin})"


def signed_view(run_dir: Path) -> dict[str, Any] | None:
    """The signoff record with its check against the current report.json (None when unsigned)."""
    record = read_signoff(run_dir)
    if record is None:
        return None
    report_path = RunDir(run_dir).report_json
    current = sha256_file(report_path) if report_path.is_file() else None
    return {**record, "report_intact": current == record.get("report_sha256"), "current_sha256": current}


def attachments(run_dir: Path) -> dict[str, Any]:
    """What is recorded beside report.json after the run: the sign-off, the restore rehearsal and the decision
    after remediation (rebuild/decision.py)."""
    rehearsal = read_json_dict(RunDir(run_dir).report_file(REHEARSAL_FILE))
    return {"signed": signed_view(run_dir), "restore_rehearsal": rehearsal,
            "remediation_decision": read_json_dict(RunDir(run_dir).report_file("remediation-decision.json"))}

