"""Ansible filters over the package's redaction: secrets never reach evidence files.

    {{ env_result.stdout_lines | sort | join('\n') | acceptance_redact }}
    {{ some_dict | acceptance_redact_obj }}
"""

from __future__ import annotations

from typing import Any

try:
    from vllm_acceptance.core.redact import redact_obj, redact_text
except ImportError as exc:  # the controller venv lacks the package: say how to fix it
    IMPORT_ERROR: ImportError | None = exc
else:
    IMPORT_ERROR = None

from ansible.errors import AnsibleFilterError


def _need_package() -> None:
    if IMPORT_ERROR is not None:
        raise AnsibleFilterError(f"acceptance_redact needs the vllm_acceptance package in the controller's Python "
                                 f"(pip install -e . in the project venv): {IMPORT_ERROR}")


def acceptance_redact(text: Any, secrets: list[str] | None = None) -> str:
    """Redact secret values (NAME=value for *TOKEN*/*KEY*/*SECRET*/*PASSWORD*, --api-key VALUE, ...)."""
    _need_package()
    return redact_text("" if text is None else str(text), [str(s) for s in (secrets or []) if s])


def acceptance_redact_obj(data: Any, secrets: list[str] | None = None) -> Any:
    _need_package()
    return redact_obj(data, [str(s) for s in (secrets or []) if s])


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"acceptance_redact": acceptance_redact, "acceptance_redact_obj": acceptance_redact_obj}
