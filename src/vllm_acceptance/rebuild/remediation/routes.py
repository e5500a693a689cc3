"""The route a failed compatibility chain points to (docs/sources.md#a001: its route checklist and decision
rules): the route names, the checklist's conditions, whether the evidence confirms a driver incompatibility,
`choose_route` and what the report shows (`route_for_report`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.findings import Finding, Status
from ...parsers.base import version_at_least

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
