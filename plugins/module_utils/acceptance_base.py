"""The one base of the vllm-acceptance modules: shared options, the package import guard, and bad
input (`ConfigError`) -> `fail_json(msg=...)` that names the field and the fix.

Every module is a thin wrapper over the `vllm_acceptance` package (docs/checks.md lists what the
stages judge). A module declares only its own options; `run_dir` and, where the stage judges,
`profile_path` (default: the run's frozen copy) come from here and from the `acceptance` doc fragment.
A module imports what it needs from the package inside ``try``/``except ImportError`` and passes the
traceback as ``import_error``, as Ansible's own modules do for their libraries.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule

try:
    from vllm_acceptance.core.profile import ConfigError, load_profile
    from vllm_acceptance.core.rundir import RunDir
    from vllm_acceptance.runtime.client import ServerUnreachable
except ImportError:
    BASE_IMPORT_ERROR: str | None = traceback.format_exc()
    INPUT_ERRORS: tuple[type[BaseException], ...] = ()
else:
    BASE_IMPORT_ERROR = None
    INPUT_ERRORS = (ConfigError, ServerUnreachable, ValueError, OSError)

PACKAGE_FIX = ("run ansible-playbook from the project venv (`make venv`, then .venv/bin/ansible-playbook), or "
               "install the vllm-acceptance package into the python Ansible uses on the controller")


class AcceptanceModule(AnsibleModule):
    """AnsibleModule with the project's shared options and failure messages."""

    def __init__(self, argument_spec: dict[str, Any], *, import_error: str | None = None,
                 run_dir: bool = True, profile: bool = False, **kwargs: Any) -> None:
        spec: dict[str, Any] = {}
        if run_dir:
            spec["run_dir"] = {"type": "path", "required": True}
        if profile:
            spec["profile_path"] = {"type": "path"}
        spec.update(argument_spec)
        kwargs.setdefault("supports_check_mode", True)
        super().__init__(argument_spec=spec, **kwargs)
        trace = BASE_IMPORT_ERROR or import_error
        if trace:
            self.fail_json(msg=f"the vllm_acceptance package is not importable by {self._name}'s python: "
                               f"{trace.strip().splitlines()[-1]}; {PACKAGE_FIX}", exception=trace)

    def guard(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """Call into the package; bad input, an unreachable server or a bad value fail the task with the
        package's own message, which names the field or URL and the fix."""
        try:
            return func(*args, **kwargs)
        except INPUT_ERRORS as exc:
            self.fail_json(msg=str(exc))

    def run(self) -> Any:
        """The run directory (`RunDir`) named by `run_dir`; it must exist (playbooks/validate.yml opens it)."""
        return self.guard(RunDir.existing, Path(self.params["run_dir"]))

    def profile(self) -> Any:
        """The profile this stage judges: `profile_path` when given, else the run's frozen copy."""
        if self.params.get("profile_path"):
            return self.guard(load_profile, self.params["profile_path"])
        return self.guard(self.run().profile)
