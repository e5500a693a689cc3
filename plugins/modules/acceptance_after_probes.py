#!/usr/bin/python
"""Ansible module: judge what the nodes recorded during the probes into the load stage."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_after_probes
short_description: Judge the nodes' GPU memory series and the servers' logs after the probes
description:
  - Runs once the probes are done and the nodes' records are fetched (C(playbooks/probes.yml)). Reads the per-GPU
    memory sampled on every GPU node (C(evidence/memory/<host>.csv)) and the log of a server in a container or on
    another node (C(evidence/serve/after-probes/<host>.log)).
  - Judges them into the load stage's own artefacts (C(findings/load.json), C(stages/load.json)) - the soak of a
    server without a local process on the GPU series, a crash without a signature as the OOM its log shows - so
    that the report only assembles. Runs once per run; a second call changes nothing.
  - In check mode nothing is written.
options: {}
extends_documentation_fragment:
  - vllm.acceptance.acceptance
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Judge the nodes' records into the load stage
  acceptance_after_probes:
    run_dir: "{{ acceptance_run_dir }}"
"""

RETURN = r"""
status:
  description: C(judged), C(already_judged) or C(no_load_stage) (the load probe left no stage to judge into).
  returned: success
  type: str
changed_checks:
  description: The check ids whose status this step changed (e.g. C(capacity.soak)).
  returned: success
  type: list
  elements: str
"""

import traceback

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.probes.after import judge_after_probes
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def main() -> None:
    module = AcceptanceModule(argument_spec={}, import_error=IMPORT_ERROR)
    if module.check_mode:
        module.exit_json(changed=False, status="skipped", changed_checks=[], msg="check mode: nothing judged")
    run = module.run()
    result = module.guard(judge_after_probes, run.path)
    module.exit_json(changed=result["status"] == "judged", status=result["status"],
                     changed_checks=result.get("changed", []))


if __name__ == "__main__":
    main()
