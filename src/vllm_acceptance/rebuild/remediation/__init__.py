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
healthy) is a function here, called by plugins/modules/acceptance_remediation.py through `actions`.

Submodules, one purpose each:

- `routes`: the route names, the checklist's conditions, whether the evidence confirms a driver
  incompatibility, `choose_route` and `route_for_report`;
- `entry`: the entry conditions of the rebuild and rollback playbooks (window, captures, rollback path,
  evidence bound to the nodes it changes);
- `capture`: a node's captured state (roles/node_state's records, state.json, its summary);
- `rollback`: which nodes a rollback changes and what it restores on each;
- `postcheck`: after a change, did the node come back healthy (and nothing that passed regressed);
- `smoke`: the model smoke test's endpoint and the rule its answer is judged by;
- `ledger`: the rebuild record, <run_dir>/rebuild.json;
- `experimental`: the self-built image's experimental profile with its lineage;
- `isolated`: the isolated environment's record in its inventory;
- `actions`: the acceptance_remediation module's actions, one function each (`ACTIONS`, `run_action`).

This package re-exports the names callers imported from the former single module:

    from vllm_acceptance.rebuild.remediation import choose_route, route_for_report
    route = choose_route(read_findings(Path("run/findings/preflight.json")), {"cluster_managed": True})
"""

from __future__ import annotations

from .capture import (
    CAPTURE_REQUIRED,
    ROLLBACK_CAPTURE_REQUIRED,
    capture_records,
    load_capture,
    package_driver_version,
    save_captures,
)
from .entry import (
    DEFAULT_EVIDENCE_MAX_AGE_H,
    WINDOW_RE,
    EntryDecision,
    entry_conditions,
    evidence_binding,
    parse_window,
)
from .experimental import LINEAGE_KEYS, experimental_profile
from .isolated import ISOLATED_VARS, isolated_environment_record
from .ledger import LEDGER_NAME, VERIFY_STEPS, Ledger
from .postcheck import NODE_CHECKS_SKIPPED_AFTER_CHANGE, ROLLBACK_REQUIRED, checks_summary, post_check, regressions
from .rollback import ROLLBACK_SCOPES, restore_plan, restore_specs, rollback_targets
from .routes import (
    CAPTURE_STATE_FIRST,
    DRIVER_UPGRADE,
    ISOLATED_ENVIRONMENT,
    NO_DRIVER_CHANGE,
    ROUTES,
    SELF_BUILT_IMAGE,
    TITLES,
    Condition,
    Incompatibility,
    Route,
    choose_route,
    driver_incompatibility,
    route_for_report,
)
from .smoke import OTHER_ENDPOINTS, SMOKE_ENDPOINTS, SMOKE_TOOL, judge_smoke, smoke_endpoint

__all__ = [
    "CAPTURE_REQUIRED", "CAPTURE_STATE_FIRST", "DEFAULT_EVIDENCE_MAX_AGE_H", "DRIVER_UPGRADE", "ISOLATED_ENVIRONMENT",
    "ISOLATED_VARS", "LEDGER_NAME", "LINEAGE_KEYS", "NODE_CHECKS_SKIPPED_AFTER_CHANGE", "NO_DRIVER_CHANGE",
    "OTHER_ENDPOINTS", "ROLLBACK_CAPTURE_REQUIRED", "ROLLBACK_REQUIRED", "ROLLBACK_SCOPES", "ROUTES",
    "SELF_BUILT_IMAGE", "SMOKE_ENDPOINTS", "SMOKE_TOOL", "TITLES", "VERIFY_STEPS", "WINDOW_RE",
    "Condition", "EntryDecision", "Incompatibility", "Ledger", "Route",
    "capture_records", "checks_summary", "choose_route", "driver_incompatibility", "entry_conditions",
    "evidence_binding", "experimental_profile", "isolated_environment_record", "judge_smoke", "load_capture",
    "package_driver_version", "parse_window", "post_check", "regressions", "restore_plan", "restore_specs",
    "rollback_targets", "route_for_report", "save_captures", "smoke_endpoint",
]
