"""Options every vllm-acceptance module shares (plugins/module_utils/acceptance_base.py adds them)."""

from __future__ import annotations


class ModuleDocFragment:
    # The run directory every stage module reads and writes.
    DOCUMENTATION = r"""
options:
  run_dir:
    description:
      - The run directory opened by C(acceptance_run) (C(reports/<inventory>/<run-id>/)).
      - Findings go to C(findings/<stage>.json), details to C(stages/<stage>.json), raw output under C(evidence/).
    type: path
    required: true
"""

    # Modules that judge: the profile defaults to the run's frozen copy.
    PROFILE = r"""
options:
  profile_path:
    description:
      - The profile to judge against. Default the copy the run froze when it opened (C(<run_dir>/evidence/profile.yml)),
        so that what the run records is what every stage judges.
    type: path
"""
