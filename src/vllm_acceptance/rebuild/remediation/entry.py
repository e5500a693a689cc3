"""The entry conditions of the rebuild and rollback playbooks (docs/sources.md#a001: its checklist): evidence of
the incompatibility bound to the nodes it changes, an open maintenance window, a capture of every node and a
recorded rollback path; checked before anything changes."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...core.findings import Finding
from ...core.profile_model import ProfileModel
from ...parsers.node_evidence import load_node_evidence
from .rollback import restore_plan, rollback_targets
from .routes import Condition, driver_incompatibility

# Preflight evidence older than this does not prove today's incompatibility (profile remediation.evidence_max_age_h).
DEFAULT_EVIDENCE_MAX_AGE_H = ProfileModel.default_of("remediation.evidence_max_age_h")   # the model's, once


# --- entry conditions of the rebuild / rollback playbooks -------------------------------------

@dataclass
class EntryDecision:
    allowed: bool
    kind: str
    reasons: list[str]
    conditions: list[Condition]
    hosts: list[str]
    rollback_versions: dict[str, str | None]
    current_versions: dict[str, str | None] = field(default_factory=dict)
    # Rollback: the nodes it changes (host -> why), and per target what it restores.
    targets: dict[str, str] = field(default_factory=dict)
    restore: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["conditions"] = [asdict(c) for c in self.conditions]
        return data


WINDOW_RE = re.compile(r"^\s*(\S+)\s*/\s*(\S+)\s*$")


def parse_window(text: str) -> tuple[dt.datetime, dt.datetime]:
    """'START/END' in ISO 8601 (a zone is required: a window without one is ambiguous)."""
    match = WINDOW_RE.match(text or "")
    if not match:
        raise ValueError(f"maintenance window {text!r} is not START/END (ISO 8601, e.g. "
                         "2026-08-30T22:00Z/2026-08-31T04:00Z)")
    start, end = (dt.datetime.fromisoformat(part.replace("Z", "+00:00")) for part in match.groups())
    if start.tzinfo is None or end.tzinfo is None:
        raise ValueError(f"maintenance window {text!r} needs a time zone on both ends (Z or +HH:MM)")
    if end <= start:
        raise ValueError(f"maintenance window {text!r} ends before it starts")
    return start, end


def entry_conditions(findings: Iterable[Finding] | None, *, hosts: list[str], maintenance_window: str | None,
                     captures: Mapping[str, Mapping[str, Any]], rollback_plan: str | None,
                     kind: str = "upgrade", recorded: Mapping[str, Mapping[str, Any]] | None = None,
                     now: dt.datetime | None = None, findings_path: Path | None = None,
                     evidence_max_age_h: float = DEFAULT_EVIDENCE_MAX_AGE_H,
                     upgrade_record: Mapping[str, Any] | None = None, scope: str = "failed") -> EntryDecision:
    """Checked before anything changes (docs/sources.md#a001: its checklist). kind 'upgrade' needs preflight
    evidence of the driver incompatibility on every node to be changed, from these nodes and recent
    (`evidence_binding`); 'rollback' needs the recorded version and packages of every node it changes
    (`rollback_targets` by `scope`), and accepts a broken node's capture (a failing nvidia-smi is the
    evidence of its state). Both need an open maintenance window, a capture of every node and a
    recorded rollback path. `captures`: each host's state now; `recorded` (rollback): the state captured
    before the upgrade, whose driver version and packages the rollback returns to (default: `captures`)."""
    now = now or dt.datetime.now(dt.UTC)
    conditions: list[Condition] = []
    recorded = captures if recorded is None else recorded
    changed = list(hosts)
    targets: dict[str, str] = {}
    if kind == "upgrade":
        incompat = driver_incompatibility(findings or [])
        detail = (", ".join(f"{h}: {incompat.versions[h]}" for h in incompat.confirmed_hosts)
                  if incompat.confirmed else
                  ("no preflight findings given" if not findings else
                   "no host fails compat.driver_branch below the profile minimum"
                   + (": " + "; ".join(incompat.notes) if incompat.notes else "")))
        conditions.append(Condition("incompatibility_confirmed", "preflight evidence confirms a driver below the "
                                    "profile's minimum (not a model or auth error)", incompat.confirmed, detail))
        if incompat.confirmed:
            conditions.append(evidence_binding(findings_path, changed, captures, incompat.confirmed_hosts,
                                               max_age_h=evidence_max_age_h, now=now))
    else:
        targets = rollback_targets(hosts, captures, recorded, upgrade_record, scope)
        changed = [h for h in hosts if h in targets]
        conditions.append(Condition("rollback_targets", f"nodes to roll back (scope {scope})", True,
                                    "; ".join(f"{h}: {why}" for h, why in targets.items())
                                    or "none: every node is at its recorded state or out of scope"))
    conditions.append(_window_condition(maintenance_window, now))
    conditions.append(_capture_condition(changed, captures, kind))
    versions = {h: (recorded.get(h) or {}).get("driver_version") for h in changed}
    current = {h: (captures.get(h) or {}).get("driver_version") for h in hosts}
    plan = str(rollback_plan or "").strip()
    no_version = [h for h, v in versions.items() if not v]
    no_packages = [h for h in changed if kind == "rollback" and not (recorded.get(h) or {}).get("packages")]
    conditions.append(Condition("rollback_recorded", "a rollback path is recorded (plan + each node's driver "
                                "version and packages from the captured state)",
                                bool(plan) and not no_version and not no_packages,
                                (f"plan: {plan}" if plan else "rebuild_rollback_plan is empty")
                                + (f"; no recorded driver version for {no_version}" if no_version else "")
                                + (f"; no recorded packages for {no_packages}" if no_packages else "")))
    restore = {h: restore_plan(captures.get(h) or {}, recorded.get(h) or {}, targets[h])
               for h in changed} if kind == "rollback" else {}
    refused = [c for c in conditions if c.met is not True]
    reasons = [f"{c.text}: {c.detail or 'not met'}" for c in refused]
    return EntryDecision(allowed=not refused, kind=kind, reasons=reasons, conditions=conditions,
                         hosts=list(hosts), rollback_versions=versions, current_versions=current,
                         targets=targets, restore=restore)



def _window_condition(window: str | None, now: dt.datetime) -> Condition:
    text = "a maintenance window is set and open now"
    if not str(window or "").strip():
        return Condition("maintenance_window", text, False, "rebuild_maintenance_window is not set")
    try:
        start, end = parse_window(str(window))
    except ValueError as exc:
        return Condition("maintenance_window", text, False, str(exc))
    if not start <= now <= end:
        return Condition("maintenance_window", text, False, f"now ({now.isoformat()}) is outside {window}")
    return Condition("maintenance_window", text, True, str(window))


def _capture_condition(hosts: list[str], captures: Mapping[str, Mapping[str, Any]], kind: str) -> Condition:
    problems = []
    broken = []
    key = "missing_for_rollback" if kind == "rollback" else "missing"
    for host in hosts:
        capture = captures.get(host)
        if not capture:
            problems.append(f"{host}: no state captured")
        elif capture.get(key):
            problems.append(f"{host}: capture lacks {', '.join(capture[key])}")
        elif kind == "rollback" and capture.get("gpu_tool") and not capture["gpu_tool"].get("ok"):
            broken.append(f"{host}: nvidia-smi exit {capture['gpu_tool']['rc']} (kept as the broken state)")
    return Condition("state_captured", "the state of every node to be changed was captured before any change",
                     not problems, "; ".join(problems + broken) or f"{len(hosts)} nodes captured")


# --- evidence bound to the change --------------------------------------------------------------

def evidence_binding(findings_path: Path | None, hosts: list[str], captures: Mapping[str, Mapping[str, Any]],
                     confirmed_hosts: list[str], *, max_age_h: float, now: dt.datetime) -> Condition:
    """The incompatibility proof covers every node to be changed, is from these nodes (the hostname
    its preflight evidence recorded is the one the node answers now) and is recent (the `date -u`
    its preflight recorded is at most max_age_h old). A node without its own proof is named."""
    text = (f"every node to be changed has its own preflight proof, from this inventory, at most {max_age_h:g} h old")
    problems: list[str] = []
    run_dir = Path(findings_path).parent.parent if findings_path else None
    for host in hosts:
        if host not in confirmed_hosts:
            problems.append(f"{host}: no compat.driver_branch failure of its own in the preflight findings")
            continue
        if run_dir is None:
            continue
        evidence = load_node_evidence(run_dir, host)
        recorded_name = evidence.get("hostname").stdout.strip() if evidence.get("hostname").ok else ""
        current_name = str((captures.get(host) or {}).get("hostname") or "")
        if not recorded_name:
            problems.append(f"{host}: its preflight evidence records no hostname")
        elif current_name and recorded_name != current_name:
            problems.append(f"{host}: the preflight evidence is of host {recorded_name!r}, the node answers "
                            f"{current_name!r} (evidence from another inventory)")
        taken = _parse_date_u(evidence.get("date_u").stdout if evidence.get("date_u").ok else "")
        if taken is None:
            problems.append(f"{host}: its preflight evidence has no readable `date -u`")
        elif (now - taken).total_seconds() > max_age_h * 3600:
            problems.append(f"{host}: its preflight evidence is from {taken.isoformat()}, older than {max_age_h:g} h: "
                            "run playbooks/preflight.yml again")
    return Condition("evidence_bound", text, not problems, "; ".join(problems) or f"{len(hosts)} nodes proven")


def _parse_date_u(text: str) -> dt.datetime | None:
    """`date -u` as coreutils prints it: 'Tue Dec  1 19:30:19 UTC 2026'."""
    words = text.split()
    if len(words) != 6 or words[4] != "UTC":
        return None
    try:
        return dt.datetime.strptime(" ".join(words[:4] + words[5:]), "%a %b %d %H:%M:%S %Y").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
