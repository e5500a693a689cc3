"""Each molecule scenario (namespace sshd hosts via project-owned create/destroy) passes `molecule test`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.hosts import hosts_skip_reason

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
pytestmark = pytest.mark.hosts


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_scenario(scenario: str) -> None:
    reason = hosts_skip_reason()
    if reason:
        pytest.skip(reason)
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    proc = subprocess.run([str(bindir / "molecule"), "test", "-s", scenario], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
