#!/usr/bin/python
"""Ansible module: decide the verdict and write the report documents."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_report
short_description: Decide the verdict of a run and write report.json, report.html, report.md and junit.xml
description:
  - Collects every stage's findings from the run directory (a stage that left none becomes a C(missing)
    finding), applies the decision table, writes the reports atomically and points
    C(reports/<inventory>/latest) at the run.
options:
  run_dir:
    description: The run directory.
    type: path
    required: true
  profile_path:
    description: The validated profile.
    type: path
    required: true
  unreachable_hosts:
    description: Hosts that could not be reached during the run.
    type: list
    elements: str
    default: []
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Decide and report
  acceptance_report:
    run_dir: "{{ acceptance_run_dir }}"
    profile_path: "{{ acceptance_profile_path }}"
"""

RETURN = r"""
verdict:
  description: release, limited_observation, rebuild_environment, expand_capacity or incomplete.
  returned: success
  type: str
reasons:
  description: Why.
  returned: success
  type: list
  elements: str
gates:
  description: Text and agent traffic gates.
  returned: success
  type: dict
report:
  description: Path of report.html.
  returned: success
  type: str
"""

from pathlib import Path

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_dir": {"type": "path", "required": True},
            "profile_path": {"type": "path", "required": True},
            "unreachable_hosts": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    if module.check_mode:
        module.exit_json(changed=False, verdict="incomplete", reasons=["check mode: nothing was measured"])
    try:
        from vllm_acceptance.core.profile import ConfigError, load_profile
        from vllm_acceptance.core.rundir import update_run
        from vllm_acceptance.report.build import build_report, point_latest
        from vllm_acceptance.report.write import write_reports
    except ImportError as exc:
        module.fail_json(msg=f"vllm_acceptance is not importable ({exc}); run ansible-playbook from the project venv")
    p = module.params
    run_dir = Path(p["run_dir"])
    try:
        profile = load_profile(p["profile_path"])
    except ConfigError as exc:
        module.fail_json(msg=str(exc))
    if p["unreachable_hosts"]:
        update_run(run_dir, unreachable_hosts=p["unreachable_hosts"])
    report = build_report(run_dir, profile)
    write_reports(run_dir, report)
    point_latest(run_dir)
    module.exit_json(changed=True, verdict=report["verdict"], reasons=report["verdict_reasons"],
                     gates=report["gates"], report=str(run_dir / "report.html"),
                     summary=report["summary"])


if __name__ == "__main__":
    main()
