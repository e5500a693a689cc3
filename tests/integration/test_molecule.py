"""Each molecule scenario (namespace sshd hosts via project-owned create/destroy) passes `molecule test`.

One scenario per role (molecule/<role>; molecule/preflight runs the preflight playbook); molecule/shared holds the
create/destroy the role scenarios share and is no scenario. molecule/vllm_serve starts the real lab vLLM on its node
(the container stand-in), so it needs the lab venv and model as the lab tests do (CI fails without them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import _skip_or_fail, lab_skip_reason

from support.hosts import hosts_skip_reason

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))
LAB_SCENARIOS = {"vllm_serve"}     # start the real lab vLLM on a node
pytestmark = pytest.mark.hosts


# Longest first (measured on the 2-core machine: vllm_serve ~105 s, recheck_timer ~70 s, the others 25-60 s): the
# scenarios run two at a time (each its own namespace hosts, nshosts.up allocating under a lock, and its own
# ephemeral directory), which the hosts' SSH waits leave room for.
ORDER = ["vllm_serve", "recheck_timer", "gpu_memory_sampler", "scheduler_hook"]
AT_ONCE = 2


def _molecule(scenario: str) -> subprocess.CompletedProcess[str]:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    return subprocess.run([str(bindir / "molecule"), "test", "-s", scenario], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def molecule_runs(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """The selected scenarios' `molecule test`, started two at a time; each test waits for its own."""
    if hosts_skip_reason():
        yield {}
        return
    selected = {item.callspec.params["scenario"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_molecule_scenario" and hasattr(item, "callspec")}
    runnable = [s for s in SCENARIOS if s in selected and (s not in LAB_SCENARIOS or not lab_skip_reason())]
    runnable.sort(key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER))
    with ThreadPoolExecutor(AT_ONCE) as pool:
        yield {scenario: pool.submit(_molecule, scenario) for scenario in runnable}


@pytest.mark.parametrize("scenario", [pytest.param(s, marks=pytest.mark.lab) if s in LAB_SCENARIOS else s
                                      for s in SCENARIOS])
def test_molecule_scenario(scenario: str, molecule_runs: dict[str, Future[subprocess.CompletedProcess[str]]]) -> None:
    reason = hosts_skip_reason()
    if reason:
        pytest.skip(reason)
    if scenario in LAB_SCENARIOS and (reason := lab_skip_reason()):
        _skip_or_fail(reason)
    proc = molecule_runs[scenario].result()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
