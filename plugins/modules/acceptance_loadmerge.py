#!/usr/bin/python
"""Ansible module: merge the records of every loadgen host and file capacity.distributed."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_loadmerge
short_description: Merge distributed load records into one judged step (capacity.distributed)
description:
  - Reads C(<run_dir>/<records_dir>/<host>.jsonl) and C(<host>.meta.json) fetched from every host of the group
    C(loadgen), pools the records, checks that the hosts started together on clocks that agree with the
    controller, and judges the merged step against the profile SLO.
  - Writes C(<records_dir>/merged.json), C(findings/<stage>.json) and C(stages/<stage>.json) in the run.
  - A host without records is C(missing), misaligned clocks are C(inconclusive); neither is ever a pass.
  - Each host's client self-check (from its meta) is kept and judged with the profile's C(loadgen) limits; a
    saturated host (or one without a self-check) makes the merged step C(inconclusive).
    A defect found does not fail the task; the report stage decides the verdict.
  - In check mode nothing is written.
options:
  expected_hosts:
    description: Every host of the group loadgen (a host that left no records is named).
    type: list
    elements: str
    required: true
  start_at:
    description: The shared start time given to every host (epoch seconds).
    type: float
    required: true
  window_end:
    description: Controller time after every host finished (epoch seconds).
    type: float
  tolerance_s:
    description: Allowed clock disagreement and start spread, in seconds.
    type: float
    default: 2.0
  records_dir:
    description: Directory of the fetched records, relative to run_dir.
    type: str
    default: probes/load-distributed
  metrics_before:
    description: The server's /metrics text saved before the load (for preemptions).
    type: path
  metrics_after:
    description: The server's /metrics text saved after the load.
    type: path
  stage:
    description: Name of the findings and stage files.
    type: str
    default: load-distributed
extends_documentation_fragment:
  - vllm.acceptance.acceptance
  - vllm.acceptance.acceptance.profile
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Merge the loadgen hosts' records
  acceptance_loadmerge:
    run_dir: "{{ acceptance_run_dir }}"
    expected_hosts: "{{ groups['loadgen'] }}"
    start_at: "{{ loadgen_start_at }}"
    window_end: "{{ loadgen_window_end }}"
"""

RETURN = r"""
status:
  description: pass, fail, inconclusive or missing.
  returned: success
  type: str
records:
  description: Merged record count.
  returned: success
  type: int
per_host:
  description: Record count per host.
  returned: success
  type: dict
finding:
  description: The capacity.distributed finding.
  returned: success
  type: dict
"""

import traceback
from pathlib import Path

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.probes.loadmerge import merge_stage
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def main() -> None:
    module = AcceptanceModule(
        argument_spec={
            "expected_hosts": {"type": "list", "elements": "str", "required": True},
            "start_at": {"type": "float", "required": True},
            "window_end": {"type": "float"},
            "tolerance_s": {"type": "float", "default": 2.0},
            "records_dir": {"type": "str", "default": "probes/load-distributed"},
            "metrics_before": {"type": "path"},
            "metrics_after": {"type": "path"},
            "stage": {"type": "str", "default": "load-distributed"},
        },
        profile=True, import_error=IMPORT_ERROR,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, status="skipped", msg="check mode: nothing merged or written")
    run = module.run()
    finding, details = module.guard(
        merge_stage, run.path, profile_path=p["profile_path"] or str(run.profile_path),
        expected_hosts=p["expected_hosts"], start_at=p["start_at"], window_end=p["window_end"],
        tolerance_s=p["tolerance_s"], records_dir=p["records_dir"],
        metrics_before=Path(p["metrics_before"]) if p["metrics_before"] else None,
        metrics_after=Path(p["metrics_after"]) if p["metrics_after"] else None, stage=p["stage"])
    per_host = {h: s["count"] for h, s in details["summary"]["per_host"].items()}
    module.exit_json(changed=True, status=finding.status.value, records=details["summary"]["overall"]["count"],
                     per_host=per_host, finding=finding.to_dict())


if __name__ == "__main__":
    main()
