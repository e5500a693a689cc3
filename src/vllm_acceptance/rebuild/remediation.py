"""Remediation of a failed compatibility chain (docs/acceptance.md "Remediation playbooks", source 001).

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

from ..core.evidence import atomic_write
from ..core.findings import Finding, Status
from ..core.profile import ConfigError, Profile, validate_document
from ..parsers.base import version_at_least
from ..parsers.driver import branch_of, parse_fabricmanager_version, parse_proc_version
from ..parsers.lsmod import parse_lsmod
from ..parsers.nvidia_smi import parse_query_csv

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
# evidence judges; the NCCL bandwidth and startup log belong to later stages).
NODE_CHECKS_SKIPPED_AFTER_CHANGE = {"compat.startup_log", "compat.nccl_bandwidth"}
# A rollback returns a node to its recorded (old) driver: these must still hold.
ROLLBACK_REQUIRED = ("compat.driver_module", "compat.gpu_visibility", "compat.fabric_manager",
                     "compat.state_snapshot")

# The captured state must hold at least these (source 001: hostname, uname -a, nvidia-smi, the
# driver version) for a rollback target to be known.
CAPTURE_REQUIRED = ("hostname", "uname_a", "nvidia_smi", "nvidia_smi_query")


# --- the route checklist (source 001 "Чек-лист выбора маршрута") -----------------------------

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
    upgrade), or a startup log whose failure is the model, weights or auth (source 001)."""
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
    """The route the evidence and the site's facts point to (source 001's decision rules).

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
                     now: dt.datetime | None = None) -> EntryDecision:
    """Checked before anything changes (source 001's checklist). kind 'upgrade' needs preflight
    evidence of the driver incompatibility; 'rollback' needs the recorded version of every host.
    Both need an open maintenance window, a usable state capture of every host and a recorded
    rollback path. `captures`: each host's state now; `recorded` (rollback): the state captured
    before the upgrade, whose driver version the rollback returns to (default: `captures`)."""
    now = now or dt.datetime.now(dt.UTC)
    conditions: list[Condition] = []
    if kind == "upgrade":
        incompat = driver_incompatibility(findings or [])
        detail = (", ".join(f"{h}: {incompat.versions[h]}" for h in incompat.confirmed_hosts)
                  if incompat.confirmed else
                  ("no preflight findings given" if not findings else
                   "no host fails compat.driver_branch below the profile minimum"
                   + (": " + "; ".join(incompat.notes) if incompat.notes else "")))
        conditions.append(Condition("incompatibility_confirmed", "preflight evidence confirms a driver below the "
                                    "profile's minimum (not a model or auth error)", incompat.confirmed, detail))
    conditions.append(_window_condition(maintenance_window, now))
    conditions.append(_capture_condition(hosts, captures))
    recorded = captures if recorded is None else recorded
    versions = {h: (recorded.get(h) or {}).get("driver_version") for h in hosts}
    current = {h: (captures.get(h) or {}).get("driver_version") for h in hosts}
    plan = str(rollback_plan or "").strip()
    no_version = [h for h, v in versions.items() if not v]
    conditions.append(Condition("rollback_recorded", "a rollback path is recorded (plan + each node's current "
                                "driver version from the captured state)", bool(plan) and not no_version,
                                (f"plan: {plan}" if plan else "rebuild_rollback_plan is empty")
                                + (f"; no recorded driver version for {no_version}" if no_version else "")))
    refused = [c for c in conditions if c.met is not True]
    reasons = [f"{c.text}: {c.detail or 'not met'}" for c in refused]
    return EntryDecision(allowed=not refused, kind=kind, reasons=reasons, conditions=conditions,
                         hosts=list(hosts), rollback_versions=versions, current_versions=current)


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


def _capture_condition(hosts: list[str], captures: Mapping[str, Mapping[str, Any]]) -> Condition:
    problems = []
    for host in hosts:
        capture = captures.get(host)
        if not capture:
            problems.append(f"{host}: no state captured")
        elif capture.get("missing"):
            problems.append(f"{host}: capture lacks {', '.join(capture['missing'])}")
    return Condition("state_captured", "the state of every node was captured before any change", not problems,
                     "; ".join(problems) or f"{len(hosts)} nodes captured")


# --- the captured state (roles/node_state) -----------------------------------------------------

def load_capture(state_dir: Path) -> dict[str, Any]:
    """Summarise roles/node_state's bundle: the driver and Fabric Manager versions a rollback
    returns to, modules, containers; `missing` names required records that did not succeed."""
    bundle_path = Path(state_dir) / "state.json"
    if not bundle_path.is_file():
        return {"missing": list(CAPTURE_REQUIRED), "path": str(bundle_path), "driver_version": None}
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
    lsmod_text = ok("lsmod")
    driver_version = proc_version or (gpus.driver_version if gpus is not None else None)
    return {
        "host": bundle.get("host"),
        "path": str(bundle_path),
        "hostname": (ok("hostname") or "").strip() or None,
        "driver_version": driver_version,
        "driver_branch": branch_of(driver_version) if driver_version else None,
        "gpu_count": gpus.count if gpus is not None else None,
        "fabricmanager_version": parse_fabricmanager_version(fm).version if fm else None,
        "modules": parse_lsmod(lsmod_text).nvidia_modules() if lsmod_text else [],
        "containers": [line for line in (ok("containers") or "").splitlines() if line.strip()],
        "packages": (ok("packages") or "").strip().splitlines(),
        "missing": [name for name in CAPTURE_REQUIRED if ok(name) is None]
                   + ([] if driver_version else ["driver version (nvidia-smi query or driver version file)"]),
    }


# --- after a change: did the node come back healthy? --------------------------------------------

def post_check(findings: Iterable[Finding], host: str, *, expect_version: str | None,
               kind: str = "upgrade") -> tuple[bool, list[str]]:
    """Judge one node's preflight findings after its change. Upgrade: every node check passes
    (or is not applicable) and the driver is the expected version. Rollback: the node is back on
    its recorded version (compat.driver_branch may fail again: that is where it came from) and
    its module, GPUs, Fabric Manager and snapshot neither fail nor lack evidence. Missing or
    inconclusive evidence is a failure: a node is never put back on a guess."""
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
    return not problems, problems


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
