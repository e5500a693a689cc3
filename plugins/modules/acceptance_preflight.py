#!/usr/bin/python
"""Ansible module: judge the preflight evidence of every GPU node (thin wrapper over the package)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_preflight
short_description: Judge the compatibility chain from saved preflight evidence
description:
  - Reads C(<run_dir>/evidence/preflight/<host>/) as written by the C(preflight) role and writes the
    findings to C(<run_dir>/findings/preflight.json).
  - A host without evidence (unreachable) or with a missing tool gets C(missing) findings, never a pass.
  - Runs on the controller; needs the C(vllm_acceptance) package in the interpreter that runs it.
options:
  run_dir:
    description: Run directory on the controller.
    type: path
    required: true
  profile_path:
    description: Profile YAML (validated again here).
    type: path
    required: true
  hosts:
    description: Every GPU node of the inventory, reachable or not.
    type: list
    elements: str
    required: true
  findings_name:
    description: File name under C(<run_dir>/findings/).
    type: str
    default: preflight.json
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Judge the compatibility chain
  acceptance_preflight:
    run_dir: "{{ acceptance_run_dir }}"
    profile_path: "{{ acceptance_profile_path }}"
    hosts: "{{ groups['gpu_nodes'] }}"
  register: preflight_judgement
"""

RETURN = r"""
findings_path:
  description: Where the findings were written (not written in check mode).
  type: str
  returned: always
counts:
  description: Number of findings per status.
  type: dict
  returned: always
  sample: {pass: 10, fail: 1, not_applicable: 3}
failed_checks:
  description: C(check@host) of every failed finding.
  type: list
  elements: str
  returned: always
missing_checks:
  description: C(check@host) of every missing or inconclusive finding.
  type: list
  elements: str
  returned: always
unreachable:
  description: Hosts that left no evidence directory.
  type: list
  elements: str
  returned: always
findings:
  description: The findings as dicts (report shape).
  type: list
  elements: dict
  returned: always
"""

import traceback
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

try:
    from vllm_acceptance.findings import write_findings
    from vllm_acceptance.preflight import judge, unreachable
    from vllm_acceptance.profile import ConfigError, load_profile
except ImportError:
    IMPORT_TRACE = traceback.format_exc()
else:
    IMPORT_TRACE = None


def _label(finding) -> str:
    return f"{finding.check}@{finding.host}" if finding.host else finding.check


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_dir": {"type": "path", "required": True},
            "profile_path": {"type": "path", "required": True},
            "hosts": {"type": "list", "elements": "str", "required": True},
            "findings_name": {"type": "str", "default": "preflight.json"},
        },
        supports_check_mode=True,
    )
    if IMPORT_TRACE is not None:
        import sys

        module.fail_json(msg=f"the vllm_acceptance package is not importable by {sys.executable}: run the "
                             "playbook from the project venv (.venv/bin/ansible-playbook) or set "
                             "ansible_python_interpreter for localhost to that venv's python",
                         exception=IMPORT_TRACE)
    run_dir = Path(module.params["run_dir"])
    try:
        profile = load_profile(module.params["profile_path"])
    except ConfigError as exc:
        module.fail_json(msg=f"fix the profile, then re-run: {exc}")
    hosts = module.params["hosts"]
    findings = judge(run_dir, profile, hosts)
    path = run_dir / "findings" / module.params["findings_name"]
    if not module.check_mode:
        write_findings(path, findings)
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.status.value] = counts.get(finding.status.value, 0) + 1
    module.exit_json(
        changed=not module.check_mode, findings_path=str(path), counts=counts,
        failed_checks=[_label(f) for f in findings if f.status.value == "fail"],
        missing_checks=[_label(f) for f in findings if f.status.value in ("missing", "inconclusive")],
        unreachable=unreachable(run_dir, hosts), findings=[f.to_dict() for f in findings])


if __name__ == "__main__":
    main()
