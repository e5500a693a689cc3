"""Validation refusals at `open_run` (core/rundir.py): the run is never opened and the error names the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_acceptance.core.profile import ConfigError
from vllm_acceptance.core.rundir import open_run

REPO = Path(__file__).resolve().parents[2]
BASE = {"acceptance_profile": "cpu-lab", "acceptance_owner": "me", "vllm_serve_mode": "launch"}


def refused(tmp_path: Path, variables: dict, host_variables: dict | None = None) -> str:
    """The ConfigError's text for the lab profile with these inventory variables; asserts no run was opened."""
    with pytest.raises(ConfigError) as caught:
        open_run(project_dir=REPO, reports_dir=tmp_path, inventory="site", hosts=["h"],
                 variables={**BASE, **variables}, host_variables=host_variables)
    assert not list(tmp_path.iterdir())                                      # no run was opened
    return str(caught.value)
