"""Ansible filter: a launch's arguments with some flags at new values (roles/vllm_serve/tasks/relaunch.yml).

    {{ vllm_serve_args | vllm.acceptance.acceptance_with_flags(['--max-num-seqs', '1']) }}
"""

from __future__ import annotations

from typing import Any

try:
    from vllm_acceptance.serve.args import with_flags
except ImportError as exc:  # the controller venv lacks the package: say how to fix it
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

from ansible.errors import AnsibleFilterError


def acceptance_with_flags(args: Any, flags: Any) -> list[str]:
    if IMPORT_ERROR is not None:
        raise AnsibleFilterError(f"acceptance_with_flags needs the vllm_acceptance package in the controller's "
                                 f"Python (pip install -e . in the project venv): {IMPORT_ERROR}")
    if not isinstance(args, list) or not isinstance(flags, list):
        raise AnsibleFilterError("acceptance_with_flags: the arguments and the flags must both be lists of strings")
    return with_flags([str(a) for a in args], [str(f) for f in flags])


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"acceptance_with_flags": acceptance_with_flags}
