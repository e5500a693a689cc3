"""Every role has its own molecule scenario (issue 43 item 7): molecule/<role>/molecule.yml, whose playbooks use
the role, verified with testinfra. tests/integration/test_molecule.py runs each scenario with `molecule test`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())


@pytest.mark.parametrize("role", ROLES)
def test_each_role_has_its_own_scenario_verified_with_testinfra(role: str) -> None:
    scenario = REPO / "molecule" / role
    config = yaml.safe_load((scenario / "molecule.yml").read_text())
    assert config["verifier"]["name"] == "testinfra" and list((scenario / "tests").glob("test_*.py"))
    playbooks = config["provisioner"]["playbooks"]
    steps = [playbooks[step] for step in ("prepare", "converge", "side_effect") if step in playbooks]
    texts = "".join((scenario / step).read_text() for step in steps)
    # the role itself, or the project's playbook that runs it (molecule/preflight imports playbooks/preflight.yml)
    assert f"role: {role}" in texts or f"name: {role}" in texts or f"playbooks/{role}.yml" in texts, steps
    assert config["scenario"]["name"] == role and "verify" in config["scenario"]["test_sequence"]
