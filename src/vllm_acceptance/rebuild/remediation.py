"""Remediation of a failed compatibility chain (docs/acceptance.md "Remediation playbooks", docs/sources.md#a001).

Three routes, chosen from evidence and the site's facts, never from a hunch:

- ``driver_upgrade``: rolling driver upgrade, one node out of the scheduler at a time
  (playbooks/rebuild.yml; back with playbooks/rollback.yml);
- ``self_built_image``: an image for the host's older CUDA, only as an experimental profile with
  owner, exit date and lineage (playbooks/build_image.yml);
- ``isolated_environment``: a separate compatible environment with owner, review date and
  criteria for moving back, when the shared cluster cannot change.

Two non-routes keep the decision honest: ``capture_state_first`` (no saved evidence: stop all
changes) and ``no_driver_change`` (the evidence does not prove a driver incompatibility: a model,
auth, image or layout problem is not fixed by a driver).

The playbooks are thin: every decision (entry conditions, which route, did a node come back
healthy) is a function here, called by plugins/modules/acceptance_remediation.py.

    from vllm_acceptance.rebuild.remediation import choose_route, route_for_report
    route = choose_route(read_findings(Path("run/findings/preflight.json")), {"cluster_managed": True})
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.evidence import atomic_write
from ..core.findings import Finding, Status
from ..core.profile import ConfigError, Profile, validate_document
from ..core.redact import redact_text
from ..parsers.base import version_at_least
from ..parsers.driver import branch_of, parse_fabricmanager_version, parse_proc_version
from ..parsers.lsmod import parse_lsmod
from ..parsers.node_evidence import load_node_evidence
from ..parsers.nvidia_smi import parse_query_csv
from ..preflight.stage import split_stream

DRIVER_UPGRADE = "driver_upgrade"
SELF_BUILT_IMAGE = "self_built_image"
ISOLATED_ENVIRONMENT = "isolated_environment"
CAPTURE_STATE_FIRST = "capture_state_first"
NO_DRIVER_CHANGE = "no_driver_change"
ROUTES = (DRIVER_UPGRADE, SELF_BUILT_IMAGE, ISOLATED_ENVIRONMENT)

TITLES = {
    DRIVER_UPGRADE: "Upgrade the host driver (rolling, one node at a time)",
    SELF_BUILT_IMAGE: "Self-built image for the host's CUDA (experimental profile, owner and exit date)",
    ISOLATED_ENVIRONMENT: "Isolated compatible environment (owner, review date, criteria to move back)",
    CAPTURE_STATE_FIRST: "Stop all changes: capture the state first",
    NO_DRIVER_CHANGE: "No driver change: the evidence does not prove a driver incompatibility",
}

# Node-level checks whose failure after a change stops the roll (everything the node's own
# evidence judges; the NCCL bandwidth, the fabric its all-reduce crossed and the startup log belong to
# later stages).
NODE_CHECKS_SKIPPED_AFTER_CHANGE = {"compat.startup_log", "interconnect.nccl_bandwidth", "interconnect.fabric_path"}
# A rollback returns a node to its recorded (old) driver: these must still hold.
ROLLBACK_REQUIRED = ("compat.driver_module", "compat.gpu_visibility", "compat.fabric_manager",
                     "compat.state_snapshot", "compat.peermem")

# The captured state must hold at least these (docs/sources.md#a001: hostname, uname -a, nvidia-smi, the
# driver version) for an upgrade to start from a known state.
CAPTURE_REQUIRED = ("hostname", "uname_a", "nvidia_smi", "nvidia_smi_query")
# A rollback starts from a node that may be broken: the package database and some driver evidence
# (the loaded module's version file, or nvidia-smi's answer whatever its exit status) are enough;
# a failing nvidia-smi is the evidence of the broken state, kept with its output and exit status.
ROLLBACK_CAPTURE_REQUIRED = ("hostname", "packages")
ROLLBACK_SCOPES = ("failed", "all")
# Preflight evidence older than this does not prove today's incompatibility (profile remediation.evidence_max_age_h).
DEFAULT_EVIDENCE_MAX_AGE_H = 72


# --- the route checklist (docs/sources.md#a001 "Чек-лист выбора маршрута") ---------------------

@dataclass(frozen=True)
class Condition:
    key: str
    text: str
    met: bool | None          # None: unknown (not stated by the site, not in the evidence)
    detail: str = ""


@dataclass
class Route:
    name: str
    reasons: list[str]
    command: str
    conditions: list[Condition] = field(default_factory=list)
    blocked_by: list[str] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return TITLES[self.name]

    @property
    def ready(self) -> bool:
        """Every condition of the route is met (nothing unknown or missing)."""
        return not self.blocked_by

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["title"] = self.title
        data["ready"] = self.ready
        return data


def _facts_value(site_facts: Mapping[str, Any], key: str) -> bool | None:
    value = site_facts.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "no", "0", "none")
    return bool(value)


def _record_complete(record: Any, keys: Iterable[str]) -> tuple[bool, list[str]]:
    if not isinstance(record, Mapping):
        return False, list(keys)
    absent = [k for k in keys if not str(record.get(k) or "").strip()]
    return not absent, absent


# --- evidence: is the driver incompatibility confirmed? --------------------------------------

@dataclass
class Incompatibility:
    confirmed_hosts: list[str]
    versions: dict[str, str | None]
    notes: list[str]
    evidence: list[str]
    has_driver_evidence: bool

    @property
    def confirmed(self) -> bool:
        return bool(self.confirmed_hosts)


def driver_incompatibility(findings: Iterable[Finding]) -> Incompatibility:
    """Hosts whose `compat.driver_branch` failed because the driver is below the profile's
    minimum. Not confirmed: versions that differ between sources (a reload or reboot, not an
    upgrade), or a startup log whose failure is the model, weights or auth (docs/sources.md#a001)."""
    findings = list(findings)
    confirmed: list[str] = []
    versions: dict[str, str | None] = {}
    notes: list[str] = []
    evidence: list[str] = []
    driver = [f for f in findings if f.check == "compat.driver_branch"]
    has_evidence = any(f.status in (Status.PASS, Status.FAIL) for f in driver)
    for finding in driver:
        if finding.status != Status.FAIL:
            continue
        observed = finding.observed if isinstance(finding.observed, Mapping) else {}
        version, branch = observed.get("version"), observed.get("branch")
        expected = finding.expected if isinstance(finding.expected, Mapping) else {}
        sources = observed.get("sources") or {}
        if isinstance(sources, Mapping) and len(set(sources.values())) > 1:
            notes.append(f"{finding.host}: driver versions differ between sources {dict(sources)}: reload the "
                         "module or reboot; not an upgrade")
            continue
        below = _below_minimum(version, branch, expected.get("min_branch"), expected.get("min_version"))
        if not below:
            notes.append(f"{finding.host}: compat.driver_branch failed but the driver {version} is not below "
                         "the minimum: read its reason")
            continue
        confirmed.append(str(finding.host))
        versions[str(finding.host)] = version
        evidence.extend(finding.evidence)
    other_causes = [f for f in findings if f.check == "compat.startup_log" and f.status == Status.FAIL
                    and isinstance(f.observed, Mapping) and f.observed.get("failure_class") == "other"
                    and not f.observed.get("driver_incompatible")]
    for finding in other_causes:
        notes.append(f"{finding.host}: the startup log fails for another cause (model name, weights, auth, "
                     f"layout): {finding.reason[:200]}; a driver upgrade is justified only by a proven "
                     "version incompatibility")
    if other_causes and not any(f.check == "compat.startup_log" and isinstance(f.observed, Mapping)
                                and f.observed.get("failure_class") == "environment" for f in findings):
        # The log says the launch failed for something else: the driver is not the proven cause.
        blocked = {str(f.host) for f in other_causes}
        confirmed = [h for h in confirmed if h not in blocked]
    return Incompatibility(confirmed, versions, notes, evidence, has_evidence)


def _below_minimum(version: Any, branch: Any, min_branch: Any, min_version: Any) -> bool:
    if version is None and branch is None:
        return False
    if min_branch is not None and (branch is None or int(branch) < int(min_branch)):
        return True
    return min_version is not None and version is not None and \
        version_at_least(str(version), str(min_version)) is False


# --- choose_route ------------------------------------------------------------------------------

def _checklist(findings: list[Finding], site_facts: Mapping[str, Any],
               incompat: Incompatibility) -> dict[str, Condition]:
    facts = dict(site_facts)
    window = str(facts.get("maintenance_window") or "").strip()
    conditions = [
        Condition("incompatibility_confirmed", "the log/evidence confirms the CUDA/driver incompatibility, not "
                  "a model or auth error", incompat.confirmed,
                  ", ".join(f"{h}: {incompat.versions.get(h)}" for h in incompat.confirmed_hosts)
                  or "; ".join(incompat.notes)),
        Condition("maintenance_window", "a maintenance window is agreed for the driver upgrade",
                  True if window else _facts_value(facts, "maintenance_window"), window),
        Condition("spare_node", "a separate node for the first test", _facts_value(facts, "spare_node")),
        Condition("state_saved", "image, vLLM version, nvidia-smi output and full logs are saved",
                  _facts_value(facts, "state_saved") if "state_saved" in facts else
                  (True if incompat.has_driver_evidence else None)),
        Condition("rollback_recorded", "a way to roll back the driver or re-create the node is recorded",
                  _facts_value(facts, "rollback_recorded")),
        Condition("regression_workload", "at least one existing workload can be re-run after the change",
                  _facts_value(facts, "regression_workload")),
        Condition("cluster_managed", "the team manages the cluster", _facts_value(facts, "cluster_managed")),
    ]
    return {c.key: c for c in conditions}


def choose_route(findings: Iterable[Finding] | None, site_facts: Mapping[str, Any] | None = None) -> Route:
    """The route the evidence and the site's facts point to (docs/sources.md#a001: its decision rules).

    site_facts (all optional; absent = unknown): cluster_managed, maintenance_window, spare_node,
    state_saved, rollback_recorded, regression_workload, shared_cluster_frozen (the shared cluster
    cannot change now), isolated_environment {owner, review_date, move_back_criteria},
    self_built {owner, exit_date}, inventory, findings_path.
    """
    findings = list(findings or [])
    facts = dict(site_facts or {})
    incompat = driver_incompatibility(findings)
    inventory = str(facts.get("inventory") or "inventories/<site>")
    findings_path = str(facts.get("findings_path") or "<run>/findings/preflight.json")
    if not findings or not incompat.has_driver_evidence and not incompat.confirmed:
        return Route(CAPTURE_STATE_FIRST, command=_preflight_command(inventory),
                     reasons=["no saved driver evidence (compat.driver_branch neither passed nor failed on any "
                              "host): stop all changes and capture the node state first (source 001)"])
    if not incompat.confirmed:
        failing = sorted({f.check for f in findings if f.status == Status.FAIL})
        return Route(NO_DRIVER_CHANGE, command=_preflight_command(inventory),
                     reasons=["no host fails compat.driver_branch for a driver below the profile's minimum; "
                              "a driver change is not justified"
                              + (f" (failing instead: {', '.join(failing)}: follow their actions)" if failing else ""),
                              *incompat.notes])
    checks = _checklist(findings, facts, incompat)
    base_reasons = [f"driver below the profile minimum on {', '.join(incompat.confirmed_hosts)} "
                    f"({', '.join(sorted({str(v) for v in incompat.versions.values()}))})", *incompat.notes]
    frozen = _facts_value(facts, "shared_cluster_frozen") is True
    managed = checks["cluster_managed"].met
    upgrade_keys = ("incompatibility_confirmed", "maintenance_window", "spare_node", "state_saved",
                    "rollback_recorded", "regression_workload", "cluster_managed")
    refused = [checks[k] for k in upgrade_keys if checks[k].met is False]
    unknown = [checks[k] for k in upgrade_keys if checks[k].met is None]
    alternatives = [ISOLATED_ENVIRONMENT, SELF_BUILT_IMAGE]
    if not frozen and managed is not False and not refused:
        return Route(DRIVER_UPGRADE, command=_rebuild_command(inventory, findings_path),
                     conditions=[checks[k] for k in upgrade_keys],
                     reasons=base_reasons + ["the team can change the cluster: the official image stays, "
                                             "fewer local patches, reproducible on every node"],
                     blocked_by=[f"confirm: {c.text}" for c in unknown], alternatives=alternatives)
    why_not = ["the shared cluster cannot change now"] if frozen else []
    why_not += [f"not met: {c.text}" for c in refused]
    isolated = facts.get("isolated_environment")
    self_built = facts.get("self_built")
    iso_ok, iso_missing = _record_complete(isolated, ("owner", "review_date", "move_back_criteria"))
    sb_ok, _ = _record_complete(self_built, ("owner", "exit_date"))
    if sb_ok and not iso_ok and isolated is None:
        return Route(SELF_BUILT_IMAGE, command=_build_image_command(inventory),
                     reasons=base_reasons + [f"driver upgrade not possible: {'; '.join(why_not)}",
                                             f"the team owns a custom stack (owner {self_built['owner']}, exit "
                                             f"date {self_built['exit_date']}): transitional, experimental only"],
                     alternatives=[ISOLATED_ENVIRONMENT])
    return Route(ISOLATED_ENVIRONMENT, command=_isolated_command(),
                 reasons=base_reasons + [f"driver upgrade not possible: {'; '.join(why_not)}",
                                         "stop changes on the shared cluster and move the check to a compatible "
                                         "environment; its results do not carry over by themselves"],
                 blocked_by=[f"isolated environment record lacks {k}" for k in iso_missing] if not iso_ok else [],
                 alternatives=[SELF_BUILT_IMAGE] + ([] if sb_ok else []))


def _preflight_command(inventory: str) -> str:
    return (f"ansible-playbook -i {inventory} playbooks/preflight.yml -e acceptance_run_dir=<run dir> "
            "-e acceptance_profile_path=profiles/<profile>.yml")


def _rebuild_command(inventory: str, findings_path: str) -> str:
    return (f"ansible-playbook -i {inventory} playbooks/rebuild.yml -e rebuild_preflight_findings={findings_path} "
            "-e rebuild_maintenance_window=<START>/<END> -e rebuild_rollback_plan='<how a node goes back>' "
            "-e driver_upgrade_version=<R580+ version>")


def _build_image_command(inventory: str) -> str:
    return (f"ansible-playbook -i {inventory} playbooks/build_image.yml -e build_image_owner=<owner> "
            "-e build_image_exit_date=<YYYY-MM-DD> -e build_image_source_ref=<model's vLLM branch>")


def _isolated_command() -> str:
    return ("ansible-playbook -i inventories/<isolated-site> accept.yml (set isolated_env_owner, "
            "isolated_env_review_date, isolated_env_move_back_criteria in that inventory)")


def route_for_report(findings: Iterable[Finding] | None, site_facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the report of a failed preflight shows: the route the evidence points to, why, the
    command to run it, and what the site still has to confirm (report/build.py calls this)."""
    route = choose_route(findings, site_facts)
    data = route.to_dict()
    data["conditions"] = [asdict(c) for c in route.conditions]
    return data


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
    restore = {h: _restore_plan(captures.get(h) or {}, recorded.get(h) or {}, targets[h])
               for h in changed} if kind == "rollback" else {}
    refused = [c for c in conditions if c.met is not True]
    reasons = [f"{c.text}: {c.detail or 'not met'}" for c in refused]
    return EntryDecision(allowed=not refused, kind=kind, reasons=reasons, conditions=conditions,
                         hosts=list(hosts), rollback_versions=versions, current_versions=current,
                         targets=targets, restore=restore)


def _restore_plan(now: Mapping[str, Any], before: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """What a rollback restores on one node: the recorded packages (exact versions), and whether a
    reboot is needed even if no package changes (the loaded module is not the recorded one)."""
    version = before.get("driver_version")
    return {"version": version, "packages": restore_specs(before.get("packages") or [], version), "reason": reason,
            "from": now.get("sources") or {}, "gpu_tool": now.get("gpu_tool"),
            "reboot_required": (now.get("sources") or {}).get("kernel_module") != version}


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


# --- the captured state (roles/node_state) -----------------------------------------------------

def capture_records(stream: str, marker: str, commands: list[Mapping[str, Any]],
                    secrets: list[str] | None = None) -> list[dict[str, Any]]:
    """roles/node_state's records from its one-call script (the framing of roles/preflight's
    node_script.sh.j2, cut by preflight.stage.split_stream): one record per command, in order, with
    raw stdout and stderr (secrets redacted), the exit status and whether the tool was absent. A
    command the answer never reached (connection lost) gets rc None and says so."""
    records, _finished = split_stream(stream, marker)
    by_name = {r.name: r for r in records}
    out = []
    for command in commands:
        name = str(command.get("name"))
        record = by_name.get(name)
        out.append({
            "name": name, "cmd": list(command.get("argv") or []), "image": command.get("image"),
            "rc": record.rc if record else None,
            "stdout": redact_text(record.stdout, secrets) if record else "",
            "stderr": redact_text(record.stderr, secrets) if record else "the node's answer never reached this command",
            "missing": bool(record and record.missing), "timed_out": bool(record and record.timed_out),
            "skipped": False})
    return out


def save_captures(bundles: Iterable[Mapping[str, Any]]) -> list[str]:
    """Write each node's capture bundle (roles/node_state: host, dest, runtime, records) to
    <dest>/state.json, atomically; `dest` itself is not part of the file."""
    paths = []
    for bundle in bundles:
        if not bundle.get("dest") or not bundle.get("host"):
            raise ConfigError(f"a capture bundle needs host and dest (got keys {sorted(bundle)}): roles/node_state "
                              "sets both")
        path = Path(str(bundle["dest"])) / "state.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {k: v for k, v in bundle.items() if k != "dest"}
        atomic_write(path, json.dumps(data, indent=2, default=str) + "\n")
        paths.append(str(path))
    return paths


def load_capture(state_dir: Path) -> dict[str, Any]:
    """Summarise roles/node_state's bundle: the driver and Fabric Manager versions a rollback
    returns to, modules, containers, the installed packages, the boot id, and what nvidia-smi
    answered (exit status and output, also when it fails). `missing` names required records of an
    upgrade's capture that did not succeed; `missing_for_rollback` those a rollback needs (a broken
    node's capture is usable). `sources` is the driver version each source reports; `mixed` says
    they disagree (new user space over an old kernel module, Fabric Manager apart from the driver)."""
    bundle_path = Path(state_dir) / "state.json"
    if not bundle_path.is_file():
        return {"missing": list(CAPTURE_REQUIRED), "missing_for_rollback": list(ROLLBACK_CAPTURE_REQUIRED),
                "path": str(bundle_path), "driver_version": None, "sources": {}, "mixed": False,
                "packages": [], "gpu_tool": None}
    bundle = json.loads(bundle_path.read_text())
    records = {r["name"]: r for r in bundle.get("records", [])}

    def ok(name: str) -> str | None:
        record = records.get(name)
        return str(record.get("stdout") or "") if record and record.get("rc") == 0 else None

    query = ok("nvidia_smi_query")
    gpus = parse_query_csv(query) if query is not None else None
    proc = ok("driver_version")
    proc_version = parse_proc_version(proc).version if proc else None
    fm = ok("fabricmanager_version")
    fm_version = parse_fabricmanager_version(fm).version if fm else None
    lsmod_text = ok("lsmod")
    packages = (ok("packages") or "").strip().splitlines()
    smi_version = gpus.driver_version if gpus is not None else None
    driver_version = proc_version or smi_version
    gpu_tool = _gpu_tool(records.get("nvidia_smi"))
    sources = {k: v for k, v in {"kernel_module": proc_version, "nvidia_smi": smi_version,
                                 "packages": package_driver_version(packages),
                                 "fabricmanager": fm_version}.items() if v}
    mixed = len(set(sources.values())) > 1 or bool(gpu_tool and gpu_tool["version_mismatch"])
    return {
        "host": bundle.get("host"),
        "path": str(bundle_path),
        "hostname": (ok("hostname") or "").strip() or None,
        "boot_id": (ok("boot_id") or "").strip() or None,
        "driver_version": driver_version,
        "driver_branch": branch_of(driver_version) if driver_version else None,
        "gpu_count": gpus.count if gpus is not None else None,
        "fabricmanager_version": fm_version,
        "modules": parse_lsmod(lsmod_text).nvidia_modules() if lsmod_text else [],
        "containers": [line for line in (ok("containers") or "").splitlines() if line.strip()],
        "packages": packages,
        "gpu_tool": gpu_tool,
        "sources": sources,
        "mixed": mixed,
        "missing": [name for name in CAPTURE_REQUIRED if ok(name) is None]
                   + ([] if driver_version else ["driver version (nvidia-smi query or driver version file)"]),
        "missing_for_rollback": [name for name in ROLLBACK_CAPTURE_REQUIRED if not (ok(name) or "").strip()]
                                + ([] if proc_version or gpu_tool else
                                   ["driver evidence (driver version file or nvidia-smi's answer)"]),
    }


def _gpu_tool(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """nvidia-smi as it answered: exit status and exact output, failing or not (None: not run)."""
    if not record or record.get("missing") or record.get("rc") is None:
        return None
    output = "\n".join(x for x in (str(record.get("stdout") or ""), str(record.get("stderr") or "")) if x.strip())
    return {"rc": record.get("rc"), "output": output[:4000], "ok": record.get("rc") == 0,
            "version_mismatch": "Driver/library version mismatch" in output,
            "no_devices": "No devices were found" in output}


_VERSION = re.compile(r"(\d{3,}\.\d+(?:\.\d+)?)")


def package_driver_version(packages: Iterable[str]) -> str | None:
    """The driver version of the installed driver package (dpkg `NAME VERSION` or rpm NEVRA lines)."""
    for line in packages:
        parts = line.split()
        if not parts or not re.match(r"^(nvidia-driver|nvidia-open|cuda-drivers)", parts[0]):
            continue
        match = _VERSION.search(parts[1] if len(parts) > 1 else parts[0])
        if match:
            return match.group(1)
    return None


def restore_specs(packages: Iterable[str], version: str | None = None) -> list[str]:
    """Package specs that reinstall exactly the recorded packages: dpkg `NAME VERSION` lines become
    apt's NAME=VERSION; a one-word line (rpm -qa NEVRA) is dnf's spec as it stands. With `version`,
    only the packages of that driver version (the ones a driver change replaces; nvidia-container-toolkit
    and other nvidia-* packages of their own versions stay as they are)."""
    specs = []
    for line in packages:
        parts = line.split()
        if version and version not in line:
            continue
        if len(parts) >= 2:
            specs.append(f"{parts[0]}={parts[1]}")
        elif parts:
            specs.append(parts[0])
    return specs


def rollback_targets(hosts: list[str], captures: Mapping[str, Mapping[str, Any]],
                     recorded: Mapping[str, Mapping[str, Any]], upgrade_record: Mapping[str, Any] | None,
                     scope: str = "failed") -> dict[str, str]:
    """Which nodes a rollback changes, each with why. `failed`: the node the upgrade stopped on and
    any node left in a mixed state (driver sources that disagree, NVML's version mismatch); `all`:
    also every node whose driver or packages differ from the state recorded before the upgrade."""
    if scope not in ROLLBACK_SCOPES:
        raise ConfigError(f"rollback_scope {scope!r}: choose failed (the failed node and any node in a mixed "
                          "state) or all (every node not at its recorded state)")
    failed = (upgrade_record or {}).get("failed") or {}
    targets: dict[str, str] = {}
    for host in hosts:
        now, before = captures.get(host) or {}, recorded.get(host) or {}
        if failed.get("host") == host:
            targets[host] = f"the upgrade stopped on it at step {failed.get('step')!r}"
        elif now.get("mixed"):
            targets[host] = f"mixed state: {_describe_sources(now)}"
        elif scope == "all" and _differs(now, before):
            targets[host] = (f"not at its recorded state (driver {now.get('driver_version')}, recorded "
                             f"{before.get('driver_version')})")
    return targets


def _describe_sources(capture: Mapping[str, Any]) -> str:
    tool = capture.get("gpu_tool") or {}
    parts = [", ".join(f"{k} {v}" for k, v in (capture.get("sources") or {}).items())]
    if tool and not tool.get("ok"):
        parts.append(f"nvidia-smi exit {tool.get('rc')}: {str(tool.get('output') or '').splitlines()[0][:120]}"
                     if tool.get("output") else f"nvidia-smi exit {tool.get('rc')}")
    return "; ".join(p for p in parts if p)


def _differs(now: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    return (now.get("driver_version") != before.get("driver_version")
            or sorted(now.get("packages") or []) != sorted(before.get("packages") or []))


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


# --- after a change: did the node come back healthy? --------------------------------------------

def post_check(findings: Iterable[Finding], host: str, *, expect_version: str | None,
               kind: str = "upgrade", before: Iterable[Finding] | None = None) -> tuple[bool, list[str]]:
    """Judge one node's preflight findings after its change. Upgrade: every node check passes
    (or is not applicable) and the driver is the expected version. Rollback: the node is back on
    its recorded version (compat.driver_branch may fail again: that is where it came from) and
    its module, GPUs, Fabric Manager, peer memory and snapshot neither fail nor lack evidence.
    Both: any check of this node, or of the cluster (host null), that passed in `before` (the entry
    preflight, judged with the cluster's expectations) and does not pass now stops the roll.
    Missing or inconclusive evidence is a failure: a node is never put back on a guess."""
    findings = list(findings)
    own = [f for f in findings if f.host == host and f.check not in NODE_CHECKS_SKIPPED_AFTER_CHANGE]
    problems: list[str] = []
    if not own:
        return False, [f"no preflight findings for {host}"]
    by_check = {f.check: f for f in own}
    driver = by_check.get("compat.driver_branch")
    observed = driver.observed if driver is not None and isinstance(driver.observed, Mapping) else {}
    version = observed.get("version")
    sources = observed.get("sources") or {}
    if expect_version and (version != expect_version or
                           any(v != expect_version for v in (sources.values() if isinstance(sources, Mapping)
                                                             else []))):
        problems.append(f"driver is {version} ({dict(sources) if isinstance(sources, Mapping) else sources}), "
                        f"expected {expect_version} on every source")
    if kind == "rollback":
        # Back on the old driver, the profile's (newer-CUDA) image may be refused by the container
        # runtime again: that leaves the container side inconclusive, exactly as before the upgrade.
        # The host side must still be there (fail or missing stops); the re-run of the existing
        # workload is what proves the old stack works again.
        for check in ROLLBACK_REQUIRED:
            finding = by_check.get(check)
            if finding is not None and finding.status in (Status.FAIL, Status.MISSING):
                problems.append(f"{check} {finding.status.value}: {finding.reason}")
    else:
        for finding in own:
            if finding.status not in (Status.PASS, Status.NOT_APPLICABLE, Status.WARN):
                problems.append(f"{finding.check} {finding.status.value}: {finding.reason}")
    problems.extend(p for p in regressions(before or [], findings, host) if p not in problems)
    return not problems, problems


def regressions(before: Iterable[Finding], after: Iterable[Finding], host: str) -> list[str]:
    """Checks of `host` (and cluster-level ones) that passed before the change and do not pass after.
    A check absent after the change counts: its evidence is gone."""
    def key(f: Finding) -> tuple[str, str | None]:
        return f.check, f.host

    relevant = [f for f in before if f.host in (host, None) and f.check not in NODE_CHECKS_SKIPPED_AFTER_CHANGE
                and f.check != "compat.recipe_record"]
    now = {key(f): f for f in after}
    problems = []
    for finding in relevant:
        if finding.status != Status.PASS:
            continue
        later = now.get(key(finding))
        if later is None:
            problems.append(f"{finding.check} passed before the change and has no finding after it")
        elif later.status != Status.PASS:
            problems.append(f"{finding.check} passed before the change and is {later.status.value} after it: "
                            f"{later.reason}")
    return problems


def checks_summary(findings: Iterable[Finding], host: str) -> dict[str, str]:
    """check -> status of one node's findings and the cluster-level ones (the record's `verified`)."""
    return {f.check if f.host == host else f"{f.check} (cluster)": f.status.value
            for f in findings if f.host in (host, None)}


# --- the model smoke test after a change ----------------------------------------------------------

SMOKE_TOOL = {"type": "function", "function": {
    "name": "report_status", "description": "Report the status of the service.",
    "parameters": {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}}}


# rebuild_smoke_url is the server's OpenAI base URL (docs/inventory.md), the form of vllm_base_url; a URL that
# names one of the two completion endpoints is read as its base, so either form works for either body.
SMOKE_ENDPOINTS = ("/chat/completions", "/completions")


def smoke_endpoint(url: str, *, tool_call: bool, host: str | None = None) -> str:
    """The endpoint the smoke body needs under the base URL ``url``: a chat request with tools on an agent
    profile (``tool_call``), a plain completion otherwise. A URL ending in ``/completions`` or
    ``/chat/completions`` is taken as its base; any other endpoint, a query, or a scheme other than http(s)
    cannot take the body and is refused (ConfigError naming the field and the fix)."""
    field_name = f"rebuild_smoke_url of {host}" if host else "rebuild_smoke_url"
    fix = "set it to the server's OpenAI base URL, e.g. http://HOST:8000/v1"
    parts = urlsplit(str(url or "").strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{field_name}: {url!r} is not an http(s) URL: {fix}")
    if parts.query or parts.fragment:
        raise ConfigError(f"{field_name}: {url!r} has a query or fragment the smoke request cannot keep: {fix}")
    path = parts.path.rstrip("/")
    for suffix in SMOKE_ENDPOINTS:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    last = path.rsplit("/", 1)[-1]
    if last in OTHER_ENDPOINTS:
        raise ConfigError(f"{field_name}: {url!r} names the /{last} endpoint, which cannot take the smoke "
                          f"{'chat request with tools' if tool_call else 'completion'}: {fix}")
    base = f"{parts.scheme}://{parts.netloc}{path}"
    return base + ("/chat/completions" if tool_call else "/completions")


# OpenAI-compatible endpoints of vLLM's server that are not a base URL (a smoke URL naming one is a mistake).
OTHER_ENDPOINTS = frozenset({"models", "embeddings", "tokenize", "detokenize", "health", "metrics", "responses",
                             "chat", "score", "rerank", "pooling", "classify", "audio", "messages", "version",
                             "ping", "load"})


def judge_smoke(status: int | None, body: Any, *, tool_call: bool, expect: str | None = None) -> dict[str, Any]:
    """The smoke test's rule: HTTP 200 and a non-empty answer (matching `expect`, a regular expression,
    when given); on an agent profile (`tool_call`) a call of SMOKE_TOOL whose arguments are a JSON object
    with its required field. An empty completion, a refusal or a tool call with broken arguments fail."""
    problems: list[str] = []
    answer = ""
    choices = body.get("choices") if isinstance(body, Mapping) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else None
    if status != 200:
        problems.append(f"HTTP {status}: {str(body)[:200]}")
    elif first is None:
        problems.append("the answer has no choices")
    elif tool_call:
        answer = _smoke_tool_call(first, problems)
    else:
        answer = str(first.get("text") if "text" in first else (first.get("message") or {}).get("content") or "")
        if not answer.strip():
            problems.append(f"empty answer (finish_reason {first.get('finish_reason')!r})")
        elif expect and not re.search(expect, answer):
            problems.append(f"answer {answer[:120]!r} does not match rebuild_smoke_expect {expect!r}")
    return {"ok": not problems, "problems": problems, "answer": answer[:200], "tool_call": tool_call}


def _smoke_tool_call(choice: Mapping[str, Any], problems: list[str]) -> str:
    name = SMOKE_TOOL["function"]["name"]
    message = choice.get("message") if isinstance(choice.get("message"), Mapping) else {}
    calls = [c for c in message.get("tool_calls") or [] if isinstance(c, Mapping)]
    if not calls:
        problems.append(f"no tool call (content {str(message.get('content') or '')[:120]!r}, finish_reason "
                        f"{choice.get('finish_reason')!r}): an agent profile's smoke test needs a call of {name}")
        return str(message.get("content") or "")
    function = calls[0].get("function") if isinstance(calls[0].get("function"), Mapping) else {}
    raw = str(function.get("arguments") or "")
    if function.get("name") != name:
        problems.append(f"tool call names {function.get('name')!r}, expected {name}")
    try:
        arguments = json.loads(raw)
    except ValueError:
        problems.append(f"tool call arguments are not JSON: {raw[:120]!r}")
        return raw
    if not isinstance(arguments, dict) or not isinstance(arguments.get("status"), str):
        problems.append(f"tool call arguments {raw[:120]!r} lack the required string field 'status'")
    return f"{function.get('name')}({raw[:150]})"


# --- the rebuild record (which step on which node) -----------------------------------------------

LEDGER_NAME = "rebuild.json"


class Ledger:
    """<run_dir>/rebuild.json: the plan, every node's steps and where a roll stopped. Written
    atomically after each step, so a roll that stops mid-way still says what happened."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LEDGER_NAME

    def load(self) -> dict[str, Any]:
        if self.path.is_file():
            return json.loads(self.path.read_text())
        return {"kind": None, "hosts": [], "nodes": {}, "failed": None, "status": "planned"}

    def save(self, data: dict[str, Any]) -> None:
        nodes = data.get("nodes", {})
        data["untouched"] = [h for h in data.get("hosts", []) if not nodes.get(h, {}).get("steps")]
        for node in nodes.values():
            node.update(_node_summary(node.get("steps", []), str(data.get("kind"))))
        atomic_write(self.path, json.dumps(data, indent=2, default=str) + "\n")

    def start(self, kind: str, hosts: list[str], plan: Mapping[str, Any]) -> dict[str, Any]:
        data = {"kind": kind, "hosts": list(hosts), "plan": dict(plan), "nodes": {}, "failed": None,
                "status": "running", "started": _now()}
        self.save(data)
        return data

    def record(self, host: str, step: str, status: str, detail: Any = None) -> dict[str, Any]:
        data = self.load()
        node = data.setdefault("nodes", {}).setdefault(host, {"steps": [], "result": "running"})
        node["steps"].append({"step": step, "status": status, "at": _now(), "detail": detail})
        if status == "failed":
            node["result"] = "failed"
            data["failed"] = {"host": host, "step": step, "detail": detail}
            data["status"] = "stopped"
        elif step == "planned":
            node["result"] = "planned"
            data["status"] = "planned (check mode: nothing changed)"
        elif step == "done":
            node["result"] = "done"
            if all(data["nodes"].get(h, {}).get("result") == "done" for h in data.get("hosts", [])):
                data["status"] = "completed"
        self.save(data)
        return data


VERIFY_STEPS = ("preflight", "smoke", "workload")


def _node_summary(steps: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Per node, what was restored (or installed) and what was verified, read from its steps: the
    install step's packages and reboot; each verification step's status and its checks."""
    install = next((s for s in reversed(steps) if s.get("step") == "install"), None)
    verified: dict[str, Any] = {}
    for step in steps:
        name = step.get("step")
        if name in VERIFY_STEPS:
            detail = step.get("detail") if isinstance(step.get("detail"), Mapping) else {}
            verified[name] = {"status": step.get("status"),
                              **({"checks": detail["checks"]} if "checks" in detail else {})}
    failed = next((s for s in steps if s.get("status") == "failed"), None)
    if failed is not None and failed.get("step") in VERIFY_STEPS:
        verified[failed["step"]] = {"status": "failed", "problems": (failed.get("detail") or {}).get("problems")}
    return {"restored" if kind == "rollback" else "installed": (install or {}).get("detail"), "verified": verified}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


# --- self-built image: its experimental profile --------------------------------------------------

LINEAGE_KEYS = ("owner", "exit_date", "base_profile", "source_repo", "source_branch", "source_commit", "dockerfile",
                "dependency_sources", "lock_files", "compile_options", "patches", "build_log", "image_digest",
                "rollback_image", "inputs")


def experimental_profile(base: Profile, *, name: str, image_reference: str, image_digest: str | None,
                         cuda_major: int, lineage: Mapping[str, Any], driver_min_branch: int | None = None,
                         driver_min_version: str | None = None) -> dict[str, Any]:
    """The base profile turned into an experimental one for a self-built image: same model,
    contract and thresholds; its own image, CUDA major and driver floor; `experimental: true`
    and the full lineage (owner, exit date, source commit, lock files, patches, build log,
    digest, rollback image). The verdict never reports such a run as `release`."""
    owner, exit_date = str(lineage.get("owner") or ""), str(lineage.get("exit_date") or "")
    if not owner or not exit_date:
        raise ConfigError("a self-built image needs lineage.owner and lineage.exit_date (source 001: a "
                          "transitional route with a named owner and an exit date)")
    if dt.date.fromisoformat(exit_date) <= dt.datetime.now(dt.UTC).date():
        raise ConfigError(f"lineage.exit_date {exit_date} is not in the future: set a real exit date")
    data = copy.deepcopy(base.data)
    data["name"] = name
    data["description"] = (f"EXPERIMENTAL self-built image {image_reference} (CUDA {cuda_major}) of "
                           f"{base.name}; owner {owner}, exit {exit_date}. Never an acceptance of the official "
                           "image.")
    data["experimental"] = True
    data["lineage"] = {k: lineage[k] for k in LINEAGE_KEYS
                       if lineage.get(k) not in (None, "", []) or (k == "patches" and lineage.get(k) == [])}
    data["lineage"]["base_profile"] = base.name
    data["recipe"] = {**data.get("recipe", {}), "status": "experimental",
                      "notes": [*data.get("recipe", {}).get("notes", []),
                                f"self-built from {lineage.get('source_repo')}@{lineage.get('source_commit')}"]}
    image = data.setdefault("image", {})
    image["reference"] = image_reference
    image["digest"] = image_digest if image_digest and re.fullmatch(r"sha256:[0-9a-f]{64}", image_digest) else None
    image["cuda_major"] = int(cuda_major)
    tag = image_reference.rsplit("/", 1)[-1].partition(":")[2]
    image["forbidden_tag_suffixes"] = [s for s in image.get("forbidden_tag_suffixes", []) if not tag.endswith(s)]
    data["vllm"] = {**data.get("vllm", {}), "install_source": f"self-built {lineage.get('source_repo')}@"
                                                             f"{lineage.get('source_commit')}"}
    if driver_min_branch is not None or driver_min_version is not None:
        data["driver"] = {**data.get("driver", {}), "min_branch": driver_min_branch,
                          "min_version": driver_min_version}
    validate_document(data, "profile", f"experimental profile {name}")
    return data


# --- isolated compatible environment: its record in the inventory ---------------------------------------

ISOLATED_VARS = {
    "isolated_env_owner": "owner",
    "isolated_env_review_date": "review_date",
    "isolated_env_move_back_criteria": "move_back_criteria",
    "isolated_env_shared_inventory": "shared_inventory",
}


def isolated_environment_record(inventory_vars: Mapping[str, Any], today: dt.date | None = None) -> dict[str, Any]:
    """The record an isolated environment's inventory must carry (docs/acceptance.md: owner, review date and
    criteria for moving back; its results do not carry over to the shared cluster by themselves).
    Returns {owner, review_date, move_back_criteria, shared_inventory, complete, problems, note};
    an overdue review date is a problem (a temporary environment must not become permanent by inertia)."""
    today = today or dt.datetime.now(dt.UTC).date()
    record: dict[str, Any] = {key: inventory_vars.get(var) for var, key in ISOLATED_VARS.items()}
    problems = [f"{var} is not set" for var, key in ISOLATED_VARS.items()
                if key != "shared_inventory" and not str(record[key] or "").strip()]
    if record["review_date"]:
        try:
            review = dt.date.fromisoformat(str(record["review_date"]))
        except ValueError:
            problems.append(f"isolated_env_review_date {record['review_date']!r} is not YYYY-MM-DD")
        else:
            if review < today:
                problems.append(f"review date {review} has passed: review the environment (move back or extend)")
    record["complete"] = not problems
    record["problems"] = problems
    record["note"] = ("results of this isolated environment do not carry over to the shared cluster"
                      + (f" ({record['shared_inventory']})" if record["shared_inventory"] else "")
                      + " by themselves")
    return record
