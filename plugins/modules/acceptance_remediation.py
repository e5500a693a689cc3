#!/usr/bin/python
"""Ansible module: remediation decisions (thin wrapper: one function per action in
vllm_acceptance.rebuild.remediation.actions)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_remediation
short_description: Entry conditions, route choice, post-change checks and the rebuild record
description:
  - Runs on the controller and only reads and writes files under the run directory (and, for
    C(action=experimental_profile), the profile file it is asked to write).
  - C(entry) refuses, with every reason, when the conditions of a driver change are not met
    (preflight evidence of the incompatibility, an open maintenance window, a state capture of every
    node, a recorded rollback path). C(route) names the route the evidence points to.
  - C(post_check) judges one node's preflight findings after its change; C(start) and C(record) keep
    C(<run_dir>/rebuild.json) saying which step ran, or failed, on which node.
  - C(experimental_profile) writes C(profiles/<name>.yml) for a self-built image (experimental, with lineage).
options:
  action:
    description: What to do.
    type: str
    required: true
    choices: [entry, route, capture, save_capture, post_check, smoke_endpoint, smoke_judge, start, record,
      experimental_profile]
  run_dir:
    description: Run directory on the controller (all actions but C(experimental_profile)).
    type: path
  kind:
    description: C(upgrade) or C(rollback) (C(entry), C(start), C(post_check)).
    type: str
    default: upgrade
    choices: [upgrade, rollback]
  hosts:
    description: The nodes of the roll, in order.
    type: list
    elements: str
    default: []
  host:
    description: One node (C(capture), C(post_check), C(record)).
    type: str
  preflight_findings:
    description: C(findings/preflight.json) of a previous run (C(entry) with kind upgrade, C(route)).
    type: path
  maintenance_window:
    description: START/END in ISO 8601 with a zone, e.g. 2026-08-30T22:00Z/2026-08-31T04:00Z.
    type: str
  rollback_plan:
    description: How a node goes back (the rollback playbook, a re-install image, a runbook link).
    type: str
  capture_dirs:
    description: Host -> directory holding that node's C(state.json) (roles/node_state).
    type: dict
    default: {}
  recorded_dirs:
    description: Host -> directory of the state captured before the upgrade (C(entry) with kind rollback); the
      rollback returns to its driver version and packages.
    type: dict
    default: {}
  upgrade_record:
    description: The upgrade's C(rebuild.json) (C(entry) with kind rollback) - which node it stopped on.
    type: path
  rollback_scope:
    description: C(failed) - the node the upgrade stopped on and any node left in a mixed state; C(all) - also
      every node not at its recorded state (C(entry) with kind rollback).
    type: str
    default: failed
    choices: [failed, all]
  profile_path:
    description: The profile (C(entry) with kind upgrade) - its C(remediation.evidence_max_age_h) bounds the age
      of the preflight evidence (default 72 h).
    type: path
  before_findings:
    description: The entry preflight's C(findings/preflight.json) (C(post_check)) - any check that passed there
      and does not pass after the change stops the roll.
    type: path
  bundles:
    description: The nodes' capture bundles of roles/node_state, each with C(host) and C(dest), the directory its
      C(state.json) goes to (C(save_capture)).
    type: list
    elements: dict
    default: []
  state_dir:
    description: One node's capture directory (C(capture)).
    type: path
  expect_version:
    description: Driver version the node must show after its change (C(post_check)).
    type: str
  findings_path:
    description: The node's post-change C(findings/preflight.json) (C(post_check)).
    type: path
  smoke_url:
    description: The smoke test's OpenAI base URL, C(rebuild_smoke_url) (C(smoke_endpoint)); a URL ending in
      C(/completions) or C(/chat/completions) is read as its base, any other endpoint is refused.
    type: str
  smoke_status:
    description: HTTP status of the smoke request (C(smoke_judge)).
    type: int
  smoke_body:
    description: The smoke request's JSON answer (C(smoke_judge)).
    type: raw
  smoke_tool_call:
    description: The smoke test must return a tool call (agent profiles) (C(smoke_judge)); the chat endpoint
      is then the one the request goes to (C(smoke_endpoint)).
    type: bool
    default: false
  smoke_expect:
    description: Regular expression the smoke answer must match (C(smoke_judge), completion kind).
    type: str
  step:
    description: Step name (C(record)).
    type: str
  status:
    description: Step status (C(record)).
    type: str
    choices: [ok, changed, skipped, failed]
    default: ok
  detail:
    description: Anything that explains the step (C(record), C(start)).
    type: raw
  site_facts:
    description: The site's facts for the route choice (C(route)); see
      vllm_acceptance.rebuild.remediation.routes.choose_route.
    type: dict
    default: {}
  base_profile_path:
    description: Profile the experimental one derives from (C(experimental_profile)).
    type: path
  profile_name:
    description: Name of the experimental profile (C(experimental_profile)).
    type: str
  profile_dest:
    description: Where to write the experimental profile (C(experimental_profile)).
    type: path
  image_reference:
    description: The built image's reference (C(experimental_profile)).
    type: str
  image_digest:
    description: The built image's digest, sha256:... (C(experimental_profile)).
    type: str
  cuda_major:
    description: CUDA major of the built image (C(experimental_profile)).
    type: int
  driver_min_branch:
    description: Driver branch floor of the built image (C(experimental_profile)).
    type: int
  driver_min_version:
    description: Driver version floor of the built image (C(experimental_profile)).
    type: str
  lineage:
    description: owner, exit_date, source_repo, source_commit, dockerfile, lock_files, patches, build_log,
      image_digest, rollback_image (C(experimental_profile)).
    type: dict
    default: {}
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Entry conditions (refuses with the reasons)
  acceptance_remediation:
    action: entry
    run_dir: "{{ rebuild_run_dir }}"
    hosts: "{{ ansible_play_hosts_all }}"
    preflight_findings: /runs/2026-08-29/findings/preflight.json
    maintenance_window: 2026-08-30T22:00Z/2026-08-31T04:00Z
    rollback_plan: playbooks/rollback.yml from the captured state
    capture_dirs: {gpu-01: /runs/rebuild/evidence/rebuild/gpu-01/before}

- name: Did the node come back healthy?
  acceptance_remediation:
    action: post_check
    run_dir: "{{ rebuild_run_dir }}"
    host: gpu-01
    findings_path: /runs/rebuild/nodes/gpu-01/preflight/findings/preflight.json
    expect_version: 580.95.05
"""

RETURN = r"""
allowed:
  description: Entry conditions met (C(entry)).
  type: bool
  returned: when action is entry
decision:
  description: The entry decision with every condition (C(entry)).
  type: dict
  returned: when action is entry
rollback_versions:
  description: Host -> driver version recorded before any change (C(entry)).
  type: dict
  returned: when action is entry
targets:
  description: Rollback - host -> why it is rolled back (C(entry) with kind rollback).
  type: dict
  returned: when action is entry
checks:
  description: check -> status of the node's findings and the cluster-level ones (C(post_check)).
  type: dict
  returned: when action is post_check
route:
  description: The route (name, title, reasons, command, conditions, blocked_by) (C(route), C(entry)).
  type: dict
  returned: when action is route or entry
paths:
  description: The state.json files written (C(save_capture)).
  type: list
  elements: str
  returned: when action is save_capture
capture:
  description: Summary of one node's captured state (C(capture)).
  type: dict
  returned: when action is capture
ok:
  description: The node passed its post-change check (C(post_check)), or the smoke answer its rule (C(smoke_judge)).
  type: bool
  returned: when action is post_check or smoke_judge
problems:
  description: Why the node (C(post_check)) or the smoke answer (C(smoke_judge)) did not pass.
  type: list
  elements: str
  returned: when action is post_check or smoke_judge
endpoint:
  description: The URL the smoke request goes to, under the base URL (C(smoke_endpoint)).
  type: str
  returned: when action is smoke_endpoint
answer:
  description: The smoke answer (text, or the tool call) (C(smoke_judge)).
  type: str
  returned: when action is smoke_judge
ledger:
  description: The rebuild record after this call (C(start), C(record)).
  type: dict
  returned: when action is start or record
profile_path:
  description: The experimental profile written (C(experimental_profile)).
  type: str
  returned: when action is experimental_profile
"""

import traceback

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.rebuild.remediation.actions import ActionError, run_action
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def main() -> None:
    module = AcceptanceModule(run_dir=False, import_error=IMPORT_ERROR, argument_spec={
        "action": {"type": "str", "required": True,
                   "choices": ["entry", "route", "capture", "save_capture", "post_check", "smoke_endpoint",
                               "smoke_judge", "start", "record", "experimental_profile"]},
        "run_dir": {"type": "path"},
        "kind": {"type": "str", "default": "upgrade", "choices": ["upgrade", "rollback"]},
        "hosts": {"type": "list", "elements": "str", "default": []},
        "host": {"type": "str"},
        "preflight_findings": {"type": "path"},
        "maintenance_window": {"type": "str"},
        "rollback_plan": {"type": "str"},
        "capture_dirs": {"type": "dict", "default": {}},
        "recorded_dirs": {"type": "dict", "default": {}},
        "upgrade_record": {"type": "path"},
        "rollback_scope": {"type": "str", "default": "failed", "choices": ["failed", "all"]},
        "profile_path": {"type": "path"},
        "before_findings": {"type": "path"},
        "bundles": {"type": "list", "elements": "dict", "default": []},
        "state_dir": {"type": "path"},
        "expect_version": {"type": "str"},
        "findings_path": {"type": "path"},
        "smoke_url": {"type": "str"},
        "smoke_status": {"type": "int"},
        "smoke_body": {"type": "raw"},
        "smoke_tool_call": {"type": "bool", "default": False},
        "smoke_expect": {"type": "str"},
        "step": {"type": "str"},
        "status": {"type": "str", "default": "ok", "choices": ["ok", "changed", "skipped", "failed"]},
        "detail": {"type": "raw"},
        "site_facts": {"type": "dict", "default": {}},
        "base_profile_path": {"type": "path"},
        "profile_name": {"type": "str"},
        "profile_dest": {"type": "path"},
        "image_reference": {"type": "str"},
        "image_digest": {"type": "str"},
        "cuda_major": {"type": "int"},
        "driver_min_branch": {"type": "int"},
        "driver_min_version": {"type": "str"},
        "lineage": {"type": "dict", "default": {}},
    }, supports_check_mode=True)
    try:
        result = run_action(module.params, check_mode=module.check_mode)
    except ActionError as exc:
        module.fail_json(msg=exc.msg, **exc.fields)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
