"""Ansible filter: the commands of the node checks that are one file each (rules/node/), for these switches.

    {{ {'gpu_checks': true, 'mnnvl': true} | vllm.acceptance.acceptance_node_commands }}
"""

from __future__ import annotations

from typing import Any

try:
    from vllm_acceptance.rules.node import node_commands
except ImportError as exc:  # the controller venv lacks the package: say how to fix it
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

from ansible.errors import AnsibleFilterError


def acceptance_node_commands(switches: Any) -> list[dict[str, Any]]:
    if IMPORT_ERROR is not None:
        raise AnsibleFilterError(f"acceptance_node_commands needs the vllm_acceptance package in the controller's "
                                 f"Python (pip install -e . in the project venv): {IMPORT_ERROR}")
    if not isinstance(switches, dict):
        raise AnsibleFilterError(f"acceptance_node_commands takes a dictionary of switches, not "
                                 f"{type(switches).__name__}")
    return node_commands(switches)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"acceptance_node_commands": acceptance_node_commands}
