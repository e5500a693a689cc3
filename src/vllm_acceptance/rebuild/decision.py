"""The decision after remediation (docs/acceptance.md "Remediation playbooks", docs/sources.md#a001): four signs
measured from the re-run acceptance and the rebuild record, then one choice.

    vllm-acceptance remediation-decision RUN --before BEFORE_RUN --record REBUILD_DIR

The signs, each a finding of a catalogued check (rules/catalog.py, stage ``rebuild``):

- ``compat.remediation.recurrence``: the checks that failed in the acceptance before the change
  (BEFORE_RUN), judged again in the re-run (RUN): each must pass on the same host (or, in another
  environment, on every host that judges it);
- ``compat.remediation.prefix_cache``: the re-run's cache family (and the actual prefix-caching flag);
- ``compat.remediation.agent``: the re-run's agent family, with tool calls and structured output passing;
- ``compat.remediation.manual_actions``: the manual actions the rebuild record states (never assumed zero),
  against the allowed count.

The choice: ``keep_upgraded_cluster`` (driver upgrade: every sign holds, the roll completed with its
workload re-run on every node, the rollback documented), ``keep_isolated_environment`` (isolated environment
or self-built image: every sign holds, owner, review date and conditions to move recorded), or ``revert``
(a sign failed, or the roll stopped: the failed checks named). A sign without evidence is never "fine":
the choice is then not made, and says which sign lacks evidence.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.evidence import atomic_write
from ..core.findings import Finding, Status
from ..core.redact import redact_obj
from ..core.rundir import RunDir
from ..rules.registry import get as catalog_get
from .remediation.isolated import isolated_environment_record
from .remediation.ledger import LEDGER_NAME
from .remediation.routes import DRIVER_UPGRADE, ISOLATED_ENVIRONMENT, SELF_BUILT_IMAGE

DECISION_FILE = "remediation-decision.json"
KEEP_UPGRADED = "keep_upgraded_cluster"
KEEP_ISOLATED = "keep_isolated_environment"
REVERT = "revert"
CHOICE_TITLES = {
    KEEP_UPGRADED: "Keep the upgraded cluster",
    KEEP_ISOLATED: "Keep the isolated environment",
    REVERT: "Revert to the original setup",
}
SIGNS = {
    "recurrence": "compat.remediation.recurrence",
    "prefix_cache": "compat.remediation.prefix_cache",
    "agent": "compat.remediation.agent",
    "manual_actions": "compat.remediation.manual_actions",
}
# The agent sign needs both halves of "tools and structured output work".
AGENT_REQUIRED = ("agent.tool_call", "agent.structured_output")
PREFIX_FLAG = "compat.actual_config.prefix_caching"
UNKNOWN = (Status.MISSING, Status.INCONCLUSIVE)
CHECK_ID = re.compile(r"^(?:compat|capacity|cache|agent|interconnect)\.[a-z0-9_.]*[a-z0-9_]")


class DecisionInputError(ValueError):
    """An input of the decision cannot be read (the message names the path and the fix)."""


@dataclass
class RunFindings:
    """One acceptance run as the decision reads it: its report.json (or a probe's result.json)."""

    path: Path
    report: dict[str, Any]
    findings: list[Finding]
    file: Path            # the file read: every sign cites it

    @property
    def label(self) -> str:
        return f"{self.report.get('inventory')}/{self.report.get('run_id')}"


def load_run(path: Path) -> RunFindings:
    """A run directory (or its report.json): the findings its report judged."""
    path = Path(path)
    file = RunDir(path).report_json if path.is_dir() else path
    if not file.is_file():
        raise DecisionInputError(f"{path}: no report.json: give a run directory reports/<inventory>/<run-id> "
                                 "whose report was written (vllm-acceptance report --run-dir ...)")
    try:
        report = json.loads(file.read_text())
        findings = [Finding.from_dict(d) for d in report.get("findings") or []]
    except (ValueError, TypeError, KeyError) as exc:
        raise DecisionInputError(f"{file}: not a readable report.json ({exc})") from exc
    return RunFindings(file.parent, report, findings, file)


def load_record(path: Path | None) -> tuple[Path | None, dict[str, Any] | None]:
    """The rebuild record (rebuild.json, or its directory); (None, None) when none is given or it is absent."""
    if path is None:
        return None, None
    path = Path(path)
    file = path / LEDGER_NAME if path.is_dir() else path
    if not file.is_file():
        return file, None
    try:
        data = json.loads(file.read_text())
    except ValueError as exc:
        raise DecisionInputError(f"{file}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise DecisionInputError(f"{file}: a rebuild record is a JSON object (playbooks/rebuild.yml writes it)")
    return file, data


def _fid(f: Finding) -> str:
    return f"{f.check}@{f.host}" if f.host else f.check


def _ids(findings: Iterable[Finding]) -> list[str]:
    return sorted({_fid(f) for f in findings})


# --- sign 1: does the original error recur? -------------------------------------------------------

def recurrence_sign(before: RunFindings | None, after: RunFindings) -> Finding:
    check = catalog_get(SIGNS["recurrence"])
    evidence = [str(after.file)]
    if before is None:
        return check.missing(None, "no acceptance run before the change is given (--before RUN): the original "
                                   "error is unknown, so whether it recurs cannot be judged", evidence=evidence)
    evidence.insert(0, str(before.file))
    original = [f for f in before.findings if f.status == Status.FAIL]
    if not original:
        return check.missing(None, f"the run before the change ({before.label}) has no failed check: it does not "
                                   "show the error the remediation was for; give the run that failed",
                             evidence=evidence)
    hosts_after = {f.host for f in after.findings}
    recurs, fixed, unproven = [], [], []
    for old in original:
        same = [f for f in after.findings
                if f.check == old.check and (f.host == old.host or old.host not in hosts_after)]
        key = _fid(old)
        if any(f.status == Status.FAIL for f in same):
            recurs.append(f"{key} fails again ({'; '.join(_ids(f for f in same if f.status == Status.FAIL))})")
        elif same and all(f.status in (Status.PASS, Status.WARN) for f in same):
            fixed.append(key)
        else:
            states = ", ".join(sorted({f.status.value for f in same})) or "not judged"
            unproven.append(f"{key}: {states} in the re-run")
    observed = {"before": before.label, "after": after.label, "original_errors": _ids(original),
                "recurs": recurs, "fixed": fixed, "unproven": unproven}
    expected = "every check that failed before the change passes in the re-run"
    if recurs:
        return check.fail(None, observed=observed, expected=expected, evidence=evidence,
                          reason="the original error recurs: " + "; ".join(recurs),
                          action="revert (or fix the remaining cause): the remediation did not remove the error")
    if unproven:
        return check.missing(None, "the re-run does not judge every original error: " + "; ".join(unproven),
                             evidence=evidence)
    return check.passed(None, observed=observed, expected=expected, evidence=evidence,
                        reason="none of the original errors recurs: " + ", ".join(fixed))


# --- sign 2: does prefix caching behave? ------------------------------------------------------------

def prefix_cache_sign(after: RunFindings) -> Finding:
    check = catalog_get(SIGNS["prefix_cache"])
    evidence = [str(after.file)]
    own = [f for f in after.findings if f.check.startswith("cache.") or f.check == PREFIX_FLAG]
    return _family_sign(check, own, evidence, required=("cache.",), what="prefix caching",
                        expected="the cache family passes in the re-run (reuse on an identical prefix, none on "
                                 "the control, the flag in the actual process)")


# --- sign 3: do tools and structured output work? ---------------------------------------------------

def agent_sign(after: RunFindings) -> Finding:
    check = catalog_get(SIGNS["agent"])
    evidence = [str(after.file)]
    own = [f for f in after.findings if f.check.startswith("agent.")]
    return _family_sign(check, own, evidence, required=AGENT_REQUIRED, what="agent tools and structured output",
                        expected="the agent family passes in the re-run, agent.tool_call and "
                                 "agent.structured_output among them")


def _family_sign(check: Any, own: list[Finding], evidence: list[str], *, required: tuple[str, ...], what: str,
                 expected: str) -> Finding:
    failed = [f for f in own if f.status == Status.FAIL]
    unknown = [f for f in own if f.status in UNKNOWN]
    warned = [f for f in own if f.status == Status.WARN]
    observed = {"pass": _ids(f for f in own if f.status == Status.PASS), "fail": _ids(failed),
                "unknown": _ids(unknown), "warn": _ids(warned)}
    if failed:
        return check.fail(None, observed=observed, expected=expected, evidence=evidence,
                          reason=f"{what} fails in the re-run: " + "; ".join(
                              f"{_fid(f)}: {(f.reason or '')[:160]}" for f in failed),
                          action="revert, or fix the failed check named before keeping the environment")
    absent = [r for r in required if not any(f.check.startswith(r) and f.status in (Status.PASS, Status.WARN)
                                             for f in own)]
    if unknown or absent:
        why = ([f"no passing {r} finding" for r in absent]
               + [f"{_fid(f)} {f.status.value}" for f in unknown])
        return check.missing(None, f"{what}: the re-run lacks evidence ({'; '.join(why)})", evidence=evidence)
    if warned:
        return check.warn(None, observed=observed, expected=expected, evidence=evidence,
                          reason=f"{what} works with defects under a mitigation: " + ", ".join(_ids(warned)),
                          action="keep only with the mitigation the warned checks name")
    return check.passed(None, observed=observed, expected=expected, evidence=evidence,
                        reason=f"{what}: {len(observed['pass'])} checks pass in the re-run")


# --- sign 4: how many manual actions did the environment need? --------------------------------------

def manual_actions_sign(record_path: Path | None, record: Mapping[str, Any] | None, limit: int) -> Finding:
    check = catalog_get(SIGNS["manual_actions"])
    if record is None:
        where = f" ({record_path} does not exist)" if record_path else ""
        return check.missing(None, f"no rebuild record given (--record){where}: the manual actions the environment "
                                   "needed are unknown")
    evidence = [str(record_path)]
    actions = record.get("manual_actions")
    if not isinstance(actions, list):
        return check.missing(None, "the rebuild record does not state its manual actions (never assumed zero): "
                                   "record each with `vllm-acceptance rebuild-manual RECORD --what TEXT`, or "
                                   "`--none` when there were none", evidence=evidence)
    expected = f"at most {limit} manual action(s) outside the playbooks"
    observed = {"count": len(actions), "actions": [_action_text(a) for a in actions], "limit": limit}
    if len(actions) > limit:
        return check.fail(None, observed=observed, expected=expected, evidence=evidence, rule=expected,
                          reason=f"{len(actions)} manual action(s), more than the {limit} allowed: "
                                 + "; ".join(observed["actions"]),
                          action="automate the steps named (or raise --max-manual-actions with the site's "
                                 "agreement) before keeping the environment")
    return check.passed(None, observed=observed, expected=expected, evidence=evidence, rule=expected,
                        reason=f"{len(actions)} manual action(s), within {limit}")


def _action_text(action: Any) -> str:
    if isinstance(action, Mapping):
        who = f" by {action['by']}" if action.get("by") else ""
        host = f" on {action['host']}" if action.get("host") else ""
        return f"{action.get('what')}{host}{who}"
    return str(action)


def record_manual_action(record: Path, *, what: str | None, host: str | None = None, by: str | None = None,
                         none: bool = False) -> dict[str, Any]:
    """Add one manual action to the rebuild record (or state there were none); returns the record."""
    file = record / LEDGER_NAME if record.is_dir() else record
    _, data = load_record(file)
    if data is None:
        raise DecisionInputError(f"{file}: no rebuild record: give the rebuild run directory (its rebuild.json)")
    actions = data.get("manual_actions")
    if none:
        if actions:
            raise DecisionInputError(f"{file}: already records {len(actions)} manual action(s); --none would hide them")
        data["manual_actions"] = []
    else:
        if not (what or "").strip():
            raise DecisionInputError("--what is empty: say what was done by hand, e.g. --what 'reseated node2 PSU'")
        data["manual_actions"] = [*(actions or []), {"what": what, "host": host, "by": by,
                                                     "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}]
    atomic_write(file, json.dumps(redact_obj(data), indent=2, default=str) + "\n")
    return data


# --- the route and the choice -----------------------------------------------------------------------

def route_of(after: RunFindings, record: Mapping[str, Any] | None, route: str | None = None) -> str | None:
    """Which remediation was taken: given, or a driver upgrade's record, a self-built image's experimental
    profile, an isolated environment's inventory record."""
    if route:
        return route
    if after.report.get("experimental"):
        return SELF_BUILT_IMAGE
    if record is not None and record.get("kind") == "upgrade":
        return DRIVER_UPGRADE
    if record is not None and record.get("kind") == ISOLATED_ENVIRONMENT:
        return ISOLATED_ENVIRONMENT
    if isinstance(after.report.get("isolated_environment"), Mapping):
        return ISOLATED_ENVIRONMENT
    return None


def roll_problems(record: Mapping[str, Any] | None) -> tuple[list[str], list[str], list[str]]:
    """(failed, not proven, failed check ids) of a driver upgrade's record: a stopped roll fails (the checks
    its post-change judgement named, e.g. compat.gpu_visibility@node1); an unfinished one proves nothing."""
    if record is None:
        return [], ["no rebuild record"], []
    failed_step = record.get("failed")
    if isinstance(failed_step, Mapping):
        detail = failed_step.get("detail")
        problems = detail.get("problems") if isinstance(detail, Mapping) else None
        text = "; ".join(str(p) for p in problems) if problems else str(detail)[:300]
        host = failed_step.get("host")
        checks = sorted({f"{m.group(0)}@{host}" if host else m.group(0)
                         for p in problems or [] if (m := CHECK_ID.match(str(p)))})
        return ([f"the roll stopped at {failed_step.get('step')} on {host}: {text}"], [],
                checks or [f"rebuild step {failed_step.get('step')}@{host}"])
    unproven = []
    if record.get("status") != "completed":
        unproven.append(f"the roll is {record.get('status')!r}, not completed")
    nodes = record.get("nodes") or {}
    for host in record.get("hosts") or []:
        steps = {s.get("step"): s.get("status") for s in (nodes.get(host) or {}).get("steps") or []}
        if steps.get("workload") != "ok":
            unproven.append(f"{host}: the existing workload was not re-run ok ({steps.get('workload') or 'no step'})")
    if not str((record.get("plan") or {}).get("rollback_plan") or "").strip():
        unproven.append("no rollback plan documented in the record")
    return [], unproven, []


def _when(value: Any) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def chronology(before: RunFindings | None, after: RunFindings, record: Mapping[str, Any] | None) -> list[str]:
    """The runs must frame the change: the failed run before it, the re-run after it (a stale run proves
    nothing about the remediated environment). Unknown times are named too."""
    problems = []
    after_start = _when(after.report.get("started"))
    if after_start is None:
        problems.append(f"the re-run {after.label} has no start time")
    steps = [_when(s.get("at")) for n in ((record or {}).get("nodes") or {}).values() for s in n.get("steps") or []]
    steps = [s for s in steps if s is not None]
    change_start = _when((record or {}).get("started")) or (min(steps) if steps else None)
    change_end = max(steps) if steps else change_start
    before_end = _when(before.report.get("finished")) if before else None
    if after_start and change_end and after_start < change_end:
        problems.append(f"the re-run {after.label} started {after_start.isoformat()}, before the change ended "
                        f"({change_end.isoformat()}): re-run the acceptance after the change")
    if before and before_end and change_start and before_end > change_start:
        problems.append(f"the run before the change {before.label} finished {before_end.isoformat()}, after the "
                        f"change began ({change_start.isoformat()}): give the run that failed before it")
    if before and before_end and after_start and before_end > after_start:
        problems.append(f"the re-run {after.label} is older than the run before the change {before.label}")
    return problems


def keep_isolated_terms(after: RunFindings, route: str) -> tuple[dict[str, Any], list[str]]:
    """Owner, review date and conditions to move of an isolated environment (or a self-built image's lineage)."""
    if route == SELF_BUILT_IMAGE:
        lineage = after.report.get("lineage") or {}
        terms = {"owner": lineage.get("owner"), "review_date": lineage.get("exit_date"),
                 "move_back_criteria": "the exit date, or the official image passing on the cluster"}
        lacking = [f"lineage.{k} is not recorded" for k in ("owner", "exit_date") if not lineage.get(k)]
        return terms, lacking
    record = after.report.get("isolated_environment")
    if not isinstance(record, Mapping):
        record = isolated_environment_record({})
    return dict(record), list(record.get("problems") or [])


def decide_after_remediation(after_dir: Path, *, before_dir: Path | None = None, record: Path | None = None,
                             route: str | None = None, max_manual_actions: int = 0) -> dict[str, Any]:
    """The four signs and the choice; nothing is written (see write_decision)."""
    after = load_run(after_dir)
    before = load_run(before_dir) if before_dir is not None else None
    record_path, record_data = load_record(record)
    signs = {"recurrence": recurrence_sign(before, after), "prefix_cache": prefix_cache_sign(after),
             "agent": agent_sign(after),
             "manual_actions": manual_actions_sign(record_path, record_data, max_manual_actions)}
    taken = route_of(after, record_data, route)
    failed = [f"{f.check}: {f.reason}" for f in signs.values() if f.status == Status.FAIL]
    lacking = [f"{name} ({f.check}): {f.reason}" for name, f in signs.items() if f.status in UNKNOWN]
    terms: dict[str, Any] = {}
    roll_checks: list[str] = []
    lacking += [f"chronology: {p}" for p in chronology(before, after, record_data)]
    if taken == DRIVER_UPGRADE:
        roll_failed, roll_unproven, roll_checks = roll_problems(record_data)
        failed += roll_failed
        lacking += [f"roll: {p}" for p in roll_unproven]
    elif taken in (ISOLATED_ENVIRONMENT, SELF_BUILT_IMAGE):
        terms, problems = keep_isolated_terms(after, taken)
        lacking += [f"isolated environment record: {p}" for p in problems]
    elif record_data is not None and record_data.get("kind") == "rollback":
        lacking.append("the record is a rollback's (the change was already reverted): give the upgrade's "
                       "rebuild record (--record) to decide on the upgrade")
    else:
        lacking.append("route unknown: give --route (driver_upgrade, isolated_environment, self_built_image) or "
                       "the driver upgrade's rebuild record")
    if failed:
        choice: str | None = REVERT
        why = ["revert: " + f for f in failed] + [f"also without evidence: {x}" for x in lacking]
    elif lacking:
        choice = None
        why = ["no choice made: " + x for x in lacking]
    else:
        choice = KEEP_UPGRADED if taken == DRIVER_UPGRADE else KEEP_ISOLATED
        why = [f"{f.check} {f.status.value}: {f.reason}" for f in signs.values()]
    return {
        "decided_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "choice": choice,
        "title": CHOICE_TITLES.get(choice or "", "No choice: a sign lacks evidence"),
        "route": taken,
        "failed_checks": sorted({c for f in signs.values() if f.status == Status.FAIL for c in failed_ids(f)}
                                | set(roll_checks)),
        "reasons": why,
        "lacking_evidence": lacking,
        "terms": terms,
        "after": {"path": str(after.path), "run": after.label, "verdict": after.report.get("verdict")},
        "before": {"path": str(before.path), "run": before.label, "verdict": before.report.get("verdict")}
        if before else None,
        "record": str(record_path) if record_path else None,
        "signs": {name: f.to_dict() for name, f in signs.items()},
    }


def failed_ids(sign: Finding) -> list[str]:
    """The checks a failed sign names: the original errors that recur, the family's failed checks, or the
    sign itself (manual actions)."""
    observed = sign.observed if isinstance(sign.observed, Mapping) else {}
    if sign.check == SIGNS["recurrence"]:
        return [str(r).split(" ", 1)[0] for r in observed.get("recurs") or []] or [sign.check]
    return list(observed.get("fail") or []) or [sign.check]


def write_decision(run_dir: Path, decision: Mapping[str, Any]) -> Path:
    """remediation-decision.json beside the re-run's report; the rebuild record (when one was read) gets
    the choice too, so the record of the change says how it ended."""
    path = RunDir(Path(run_dir)).report_file(DECISION_FILE)
    atomic_write(path, json.dumps(redact_obj(decision), indent=2, default=str) + "\n")
    record_path, record = load_record(Path(decision["record"])) if decision.get("record") else (None, None)
    if record_path is not None and record is not None:
        record["decision"] = {k: decision.get(k) for k in ("choice", "title", "route", "failed_checks",
                                                           "lacking_evidence", "decided_at")}
        record["decision"]["run"] = str(path)
        atomic_write(record_path, json.dumps(redact_obj(record), indent=2, default=str) + "\n")
    return path
