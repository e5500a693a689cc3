#!/usr/bin/python
"""Ansible module: validate inventory and profile, open the run directory."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_run
short_description: Validate the acceptance inputs and open a run directory
description:
  - Validates the inventory's C(acceptance_*)/C(vllm_*) variables and the selected profile against the
    JSON Schemas shipped in the vllm_acceptance package, before any node is touched.
  - Creates C(reports/<inventory>/<run-id>/) with C(run.json). A run never writes into another run's directory.
options:
  project_dir:
    description: The project root (holds C(profiles/)).
    type: path
    required: true
  reports_dir:
    description: Where run directories go.
    type: path
    required: true
  inventory:
    description: The inventory's name (the directory name under C(inventories/)).
    type: str
    required: true
  variables:
    description: The inventory variables to validate (C(acceptance_*), C(vllm_*), C(prometheus_*)).
    type: dict
    required: true
  hosts:
    description: The GPU nodes of this inventory.
    type: list
    elements: str
    default: []
  run_id:
    description: A run id; default is a UTC timestamp plus a random suffix.
    type: str
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Open the run
  acceptance_run:
    project_dir: "{{ playbook_dir }}/.."
    reports_dir: "{{ playbook_dir }}/../reports"
    inventory: lab
    variables: "{{ hostvars['localhost'] }}"
    hosts: "{{ groups['gpu_nodes'] }}"
"""

RETURN = r"""
run_dir:
  description: Absolute path of the new run directory.
  returned: success
  type: str
run_id:
  description: The run id.
  returned: success
  type: str
profile:
  description: The validated profile.
  returned: success
  type: dict
profile_path:
  description: Absolute path of the profile file.
  returned: success
  type: str
"""

import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "project_dir": {"type": "path", "required": True},
            "reports_dir": {"type": "path", "required": True},
            "inventory": {"type": "str", "required": True},
            "variables": {"type": "dict", "required": True},
            "hosts": {"type": "list", "elements": "str", "default": []},
            "run_id": {"type": "str"},
        },
        supports_check_mode=True,
    )
    try:
        from vllm_acceptance.core.profile import ConfigError, load_profile
        from vllm_acceptance.core.rundir import open_run, resolve_profile_path, validate_inventory_vars
    except ImportError as exc:
        module.fail_json(msg=f"the vllm_acceptance package is not importable by {module._name}'s python ({exc}); "
                             "run the controller from the project venv (`make venv`, then .venv/bin/ansible-playbook)")
    params = module.params
    project = Path(params["project_dir"]).resolve()
    try:
        if module.check_mode:
            validate_inventory_vars(params["variables"], f"inventory {params['inventory']}")
            path = resolve_profile_path(str(params["variables"]["acceptance_profile"]), project)
            profile = load_profile(path)
            # A scratch directory: stages see a real path, and reports/ is left untouched.
            scratch = tempfile.mkdtemp(prefix="vllm-acceptance-check-")
            module.exit_json(changed=False, run_dir=scratch, run_id="check-mode", profile=profile.data,
                             profile_path=str(path))
        run_dir, profile = open_run(project_dir=project, reports_dir=Path(params["reports_dir"]),
                                    inventory=params["inventory"], variables=params["variables"],
                                    hosts=params["hosts"], run_id=params["run_id"])
    except ConfigError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=True, run_dir=str(run_dir), run_id=run_dir.name, profile=profile.data,
                     profile_path=str(Path(profile.source).resolve()))


if __name__ == "__main__":
    main()
