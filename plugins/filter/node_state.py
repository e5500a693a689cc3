"""Ansible filter: the framed answer of roles/node_state's one-call script, as that role's records.

    {{ node_state_node.stdout | vllm.acceptance.node_state_records(node_state_marker, node_state_commands) }}
"""

from __future__ import annotations

from typing import Any

try:
    from vllm_acceptance.rebuild.remediation.capture import capture_records
except ImportError as exc:  # the controller venv lacks the package: say how to fix it
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

from ansible.errors import AnsibleFilterError


def node_state_records(stream: Any, marker: str, commands: list[dict[str, Any]],
                       secrets: list[str] | None = None) -> list[dict[str, Any]]:
    if IMPORT_ERROR is not None:
        raise AnsibleFilterError(f"node_state_records needs the vllm_acceptance package in the controller's Python "
                                 f"(pip install -e . in the project venv): {IMPORT_ERROR}")
    try:
        return capture_records("" if stream is None else str(stream), str(marker), list(commands or []),
                               [str(s) for s in (secrets or []) if s])
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"node_state_records": node_state_records}
