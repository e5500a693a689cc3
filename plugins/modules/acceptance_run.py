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
  - Runs the gate every entry point runs (src/vllm_acceptance/gate.py) - the inventory's YAML, every variable's name
    and type, the profile, the inventory's shape, placeholders left in, and the plan (what C(vllm-acceptance plan)
    refuses is refused here, with the same message) - before any node is touched.
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
    description:
      - The inventory variables to validate, those with a product prefix (C(acceptance_), C(vllm_), C(preflight_),
        C(rebuild_), C(loadgen_), ...; the list is C(vllm_acceptance.core.variables.PREFIXES)).
      - A name declared neither in the inventory schema nor in a role's C(meta/argument_specs.yml) fails with the
        closest declared name; a wrong type names the expected type and an example.
    type: dict
    required: true
  host_variables:
    description: Per-host variables with a product prefix (host_vars), checked the same way, per host.
    type: dict
    default: {}
  hosts:
    description:
      - The GPU nodes of this inventory (the C(gpu_nodes) group).
      - On a profile with GPUs (C(hardware.accelerator) not C(none)) an empty list is refused before any node is
        touched, naming the group to add.
    type: list
    elements: str
    default: []
  groups:
    description:
      - The serve groups of this inventory, C(vllm_head) and C(vllm_workers), each a list of hosts.
      - In launch mode (the host's C(vllm_serve_mode)) a host of these groups that is not in C(hosts) (the
        C(gpu_nodes)) is refused before any node is touched, naming the host, the groups and the fix.
    type: dict
  inventory_source:
    description:
      - The inventory as given to ansible-playbook (C(ansible_inventory_sources)); the gate's messages name it, as
        C(vllm-acceptance validate -i) does, and its YAML files are checked (file, line) before anything else.
    type: str
  names:
    description:
      - Every variable name each host has (C(localhost) the controller's), product or not. A name whose prefix is
        close to the product's (C(acceptence_owner)) is refused with the name meant (the gate, gate.py).
    type: dict
    default: {}
  run_id:
    description: A run id; default is a UTC timestamp plus a random suffix.
    type: str
  launch:
    description:
      - "The launch to judge with vLLM's own argument checks before the run is opened
        (src/vllm_acceptance/serve/vllm_check.py). C(head) is the vllm_head host or none, C(workers) the
        vllm_workers, C(hostvars) each of their C(vllm_*) variables and C(ansible_host), C(python) the
        C(acceptance_vllm_check_python) (empty for the lab venv where present, C(none) to leave the judgement to
        preflight)."
      - A command vLLM refuses fails the task with vLLM's message and opens no run; the judgement is kept as
        C(evidence/validate/vllm-args.json).
    type: dict
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Open the run
  acceptance_run:
    project_dir: "{{ playbook_dir }}/.."
    reports_dir: "{{ playbook_dir }}/../reports"
    inventory: lab
    variables: "{{ hostvars['localhost'] | dict2items | selectattr('key', 'match', '^(acceptance|vllm|preflight)_')
      | items2dict }}"
    hosts: "{{ groups['gpu_nodes'] }}"
    groups: {vllm_head: "{{ groups['vllm_head'] }}", vllm_workers: "{{ groups['vllm_workers'] | default([]) }}"}
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
launch_check:
  description: vLLM's own judgement of every node's command (none when no vLLM Python judged it; why in summary).
  returned: success
  type: dict
launch_check_summary:
  description: The lines that state the judgement (version, platform, what was not judged).
  returned: success
  type: list
  elements: str
probes:
  description:
    - The required probes in run order (C(vllm_acceptance/core/probes.py)); the probes play runs these
      unless C(acceptance_probes) names others (an opt-in probe such as C(metrics) runs only when named).
  returned: success
  type: list
  elements: str
  sample: [cache, agent, load]
"""

import tempfile
import traceback
from pathlib import Path

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.core.inventory_yaml import check_inventory_yaml
    from vllm_acceptance.core.probes import default_probe_names
    from vllm_acceptance.core.rundir import RunDir, open_run, record_profile
    from vllm_acceptance.gate import Inputs, check
    from vllm_acceptance.hardware import vllm_batched_tokens_default
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def gate_inputs(params: dict) -> Inputs:
    """The inventory as this play resolved it, in the gate's terms (gate.py Inputs): the controller's variables,
    each host's (its product variables, its other names, the launch hosts' addresses), the groups."""
    names = {str(h): [str(n) for n in (v or [])] for h, v in (params.get("names") or {}).items()}
    launch = (params.get("launch") or {}).get("hostvars") or {}
    hosts = set(params["host_variables"]) | set(launch) | (set(names) - {"localhost"})
    hostvars = {h: {**dict.fromkeys(names.get(h, [])), **(params["host_variables"].get(h) or {}),
                    **(launch.get(h) or {})} for h in hosts}
    groups = {**{str(k): [str(h) for h in v or []] for k, v in (params.get("groups") or {}).items()},
              "gpu_nodes": [str(h) for h in params["hosts"]]}
    source = params.get("inventory_source") or params["inventory"]
    return Inputs(source=f"inventory {source}", site={**dict.fromkeys(names.get("localhost", [])),
                                                      **params["variables"]},
                  hostvars=hostvars, groups=groups)


def run_gate(params: dict, project: Path) -> tuple:
    """The gate (gate.py check), its YAML check first; (vLLM's judgement of every node's command, its lines)."""
    for source in str(params.get("inventory_source") or "").split(","):
        if source.strip() and Path(source.strip()).exists():
            check_inventory_yaml(Path(source.strip()))
    launch = params.get("launch") or {}
    gated = check(gate_inputs(params), project, None, launch.get("python") or None)
    return gated.plan.vllm_check, gated.plan.vllm_check_lines


def check_mode_run(module: AcceptanceModule, project: Path, judged: tuple) -> None:
    """Check mode: the gate passed; a scratch directory (reports/ is left untouched) holds the frozen profile, so
    that the read-only stages judge exactly as they would."""
    from vllm_acceptance.core.profile import load_profile
    from vllm_acceptance.core.rundir import resolve_profile_path

    profile = load_profile(resolve_profile_path(str(module.params["variables"]["acceptance_profile"]), project))
    scratch = Path(tempfile.mkdtemp(prefix="vllm-acceptance-check-"))
    frozen = scratch / record_profile(scratch, profile)
    module.exit_json(changed=False, run_dir=str(scratch), run_id="check-mode", profile=profile.data,
                     profile_path=str(frozen), launch_check=judged[0], launch_check_summary=judged[1],
                     probes=list(default_probe_names()))


def main() -> None:
    module = AcceptanceModule(
        argument_spec={
            "project_dir": {"type": "path", "required": True},
            "reports_dir": {"type": "path", "required": True},
            "inventory": {"type": "str", "required": True},
            "inventory_source": {"type": "str"},
            "names": {"type": "dict", "default": {}},
            "variables": {"type": "dict", "required": True},
            "host_variables": {"type": "dict", "default": {}},
            "hosts": {"type": "list", "elements": "str", "default": []},
            "groups": {"type": "dict"},
            "run_id": {"type": "str"},
            "launch": {"type": "dict"},
        },
        run_dir=False, import_error=IMPORT_ERROR,
    )
    params = module.params
    project = Path(params["project_dir"]).resolve()
    judged = module.guard(run_gate, params, project)
    if module.check_mode:
        module.guard(check_mode_run, module, project, judged)
    run_dir, profile = module.guard(open_run, project_dir=project, reports_dir=Path(params["reports_dir"]),
                                    inventory=params["inventory"], variables=params["variables"],
                                    hosts=params["hosts"], run_id=params["run_id"],
                                    host_variables=params["host_variables"], groups=params["groups"],
                                    batched_tokens_default=lambda p: vllm_batched_tokens_default(
                                        p, params["variables"].get("vllm_serve_extra_args"))[0])
    # Every later stage judges the run's frozen copy of the profile (evidence/profile.yml).
    frozen = RunDir(run_dir).at(record_profile(run_dir, profile))
    if judged[0] is not None or judged[1]:
        RunDir(run_dir).evidence("evidence/validate").write_json(
            "vllm-args.json", {"check": judged[0], "summary": judged[1]})
    module.exit_json(changed=True, run_dir=str(run_dir), run_id=run_dir.name, profile=profile.data,
                     profile_path=str(frozen), launch_check=judged[0], launch_check_summary=judged[1],
                     probes=list(default_probe_names()))


if __name__ == "__main__":
    main()
