"""Each molecule scenario (namespace sshd hosts via project-owned create/destroy) passes `molecule test`.

One scenario per role (molecule/<role>; molecule/preflight runs the preflight playbook); molecule/shared holds the
create/destroy the role scenarios share and is no scenario. molecule/vllm_serve starts the real lab vLLM on its node
(the container stand-in), so it needs the lab venv and model as the lab tests do (CI fails without them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import _skip_or_fail, lab_skip_reason

from support.hosts import hosts_skip_reason

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
LAB_SCENARIOS = {"vllm_serve"}     # start the real lab vLLM on a node
pytestmark = pytest.mark.hosts


@pytest.mark.parametrize("scenario", [pytest.param(s, marks=pytest.mark.lab) if s in LAB_SCENARIOS else s
                                      for s in SCENARIOS])
def test_molecule_scenario(scenario: str) -> None:
    reason = hosts_skip_reason()
    if reason:
        pytest.skip(reason)
    if scenario in LAB_SCENARIOS and (reason := lab_skip_reason()):
        _skip_or_fail(reason)
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    proc = subprocess.run([str(bindir / "molecule"), "test", "-s", scenario], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
