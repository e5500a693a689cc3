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
  unreachable_hosts:
    description: Hosts that could not be reached during the run.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - vllm.acceptance.acceptance
  - vllm.acceptance.acceptance.profile
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Decide and report
  acceptance_report:
    run_dir: "{{ acceptance_run_dir }}"
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

import traceback

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.report.build import build_report, point_latest
    from vllm_acceptance.report.write import write_reports
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def main() -> None:
    module = AcceptanceModule(
        argument_spec={"unreachable_hosts": {"type": "list", "elements": "str", "default": []}},
        profile=True, import_error=IMPORT_ERROR,
    )
    if module.check_mode:
        module.exit_json(changed=False, verdict="incomplete", reasons=["check mode: nothing was measured"])
    run, profile = module.run(), module.profile()
    if module.params["unreachable_hosts"]:
        run.update(unreachable_hosts=module.params["unreachable_hosts"])
    report = module.guard(build_report, run.path, profile)
    write_reports(run.path, report)
    point_latest(run.path)
    module.exit_json(changed=True, verdict=report["verdict"], reasons=report["verdict_reasons"],
                     gates=report["gates"], report=str(run.report_file("report.html")),
                     summary=report["summary"])


if __name__ == "__main__":
    main()
