#!/usr/bin/python
"""Ansible module: Prometheus rules, promtool tests and a Grafana dashboard from an accepted run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_monitoring
short_description: Generate monitoring (Prometheus rules, promtool tests, Grafana dashboard) from an accepted run
description:
  - Reads C(report.json) of a run directory and writes C(monitoring/vllm-acceptance.rules.yml),
    C(monitoring/dashboard.json), C(monitoring/promtool-tests.yml) and C(monitoring/monitoring.json) into it.
  - Every alert threshold comes from the run's accepted figures or the profile's contract, named in the
    alert's C(threshold_source) annotation. OOM and NCCL errors are log-based and appear as rollback triggers.
  - In check mode nothing is written; the thresholds and the files that would be written are returned.
options:
  dest:
    description:
      - A directory to also copy the rules file into (e.g. a Prometheus C(rule_files) directory on the controller).
    type: path
  for_s:
    description: Seconds a condition must hold before an alert fires (sustained queue time uses twice this).
    type: int
    default: 300
  window_s:
    description: Rate and quantile window in seconds.
    type: int
    default: 300
  matchers:
    description: PromQL label matchers added to every vLLM selector, e.g. C(job="vllm-k3").
    type: str
    default: ""
  require_accepted:
    description: Refuse a run whose verdict is not C(release) or C(limited_observation).
    type: bool
    default: true
  tool_retry_metrics:
    description: Names of the agent gateway's retry counter and tool-call counter (vLLM exports no retry metric).
    type: list
    elements: str
extends_documentation_fragment:
  - vllm.acceptance.acceptance
  - vllm.acceptance.acceptance.profile
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Monitoring from the latest accepted run
  acceptance_monitoring:
    run_dir: reports/gb300-prod/latest
    matchers: 'job="vllm-k3"'
"""

RETURN = r"""
files:
  description: Files written (or that would be written), relative to the run directory.
  returned: always
  type: list
  elements: str
thresholds:
  description: Each threshold with its value and the figure it comes from.
  returned: always
  type: dict
rollback_triggers:
  description: The rollback triggers made concrete for this run (signal, alerts, log pattern, action).
  returned: always
  type: list
  elements: dict
verdict:
  description: The run's verdict.
  returned: always
  type: str
rules_copy:
  description: Path of the rules file copied into dest.
  returned: when dest is set
  type: str
"""

import json
import shutil
import traceback
from pathlib import Path

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.monitoring import generate as monitoring
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def read_report(module: AcceptanceModule, report_path: Path) -> dict:
    try:
        return json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"{report_path}: cannot read the run's report ({exc}); run accept.yml first or point "
                             "run_dir (acceptance_run_dir) at a finished run")


def main() -> None:
    module = AcceptanceModule(
        argument_spec={
            "dest": {"type": "path"},
            "for_s": {"type": "int", "default": 300},
            "window_s": {"type": "int", "default": 300},
            "matchers": {"type": "str", "default": ""},
            "require_accepted": {"type": "bool", "default": True},
            "tool_retry_metrics": {"type": "list", "elements": "str"},
        },
        profile=True, import_error=IMPORT_ERROR,
    )
    p = module.params
    run = module.run()
    run_dir = run.path.resolve()
    report = read_report(module, run.report_json)
    verdict = report.get("verdict")
    if p["require_accepted"] and verdict not in monitoring.ACCEPTED_VERDICTS:
        module.fail_json(msg=f"run {report.get('run_id')} has verdict {verdict!r}: monitoring is generated from an "
                             "accepted run (release or limited_observation). Re-run the acceptance, or set "
                             "require_accepted=false (monitoring_require_accepted) for a draft.", verdict=verdict)
    retry = p["tool_retry_metrics"]
    if retry is not None and len(retry) != 2:
        module.fail_json(msg="tool_retry_metrics takes two names: the retry counter, then the tool-call counter")
    profile = module.profile()
    # The summary was derived once, when the report was built; a report without one (older) derives it here.
    summary = report.get("monitoring") if "thresholds" in (report.get("monitoring") or {}) else None
    summary = summary or module.guard(monitoring.monitoring_summary, report, profile)
    result = {"verdict": verdict, "thresholds": summary["thresholds"],
              "rollback_triggers": summary["rollback_triggers"]}
    if module.check_mode:
        module.exit_json(changed=True, files=summary["files"], **result)
    files = monitoring.write_monitoring(run_dir, report, profile, for_s=p["for_s"], window_s=p["window_s"],
                                        matchers=p["matchers"], tool_retry_metrics=tuple(retry) if retry else None)
    if p["dest"]:
        dest = Path(p["dest"])
        try:
            dest.mkdir(parents=True, exist_ok=True)
            target = dest / monitoring.RULES_FILE
            shutil.copyfile(run.monitoring_dir / monitoring.RULES_FILE, target)
        except OSError as exc:
            module.fail_json(msg=f"cannot copy the rules into {dest}: {exc}; create it or fix its permissions")
        result["rules_copy"] = str(target)
    module.exit_json(changed=True, files=files, **result)


if __name__ == "__main__":
    main()
