"""Issue 43 items 2 and 6 through the real entry points, no lab server: `ansible-playbook accept.yml` gates CI by its
exit status, and the output says each thing once. The nodes are down (addresses of 127.0.0.0/8 with no sshd on their
port, as tests/integration/test_unreachable_run.py): the cheapest run that reaches a verdict (incomplete)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_unreachable_run import CLI, DOWN, REPO, _inventory

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"


def _recap(out: str) -> dict[str, dict[str, int]]:
    rows = {}
    for line in out.rsplit("PLAY RECAP", 1)[-1].splitlines():
        match = re.match(r"^(\S+)\s+:\s+(.*)$", line.strip())
        if match:
            rows[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
    return rows


def _accept(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    inventory = _inventory(tmp_path / "site", DOWN)
    return subprocess.run([str(ANSIBLE_PLAYBOOK), "-i", str(inventory), "accept.yml",
                           "-e", f"acceptance_reports_dir={tmp_path / 'reports'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                                                       "VLLM_API_KEY": ""})


def _check(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    inventory = _inventory(tmp_path / "site", DOWN)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    return subprocess.run([str(CLI), "run", "--check", "-i", str(inventory), "--reports-dir", str(tmp_path / "r")],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_API_KEY": "", "TMPDIR": str(scratch)})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """accept.yml and `run --check` on their own copies of the down inventory, started beside each other (neither
    reaches a node nor a server): name -> (the finished process, its folder)."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("accept", "check")}
    with ThreadPoolExecutor(2) as pool:
        started = {"accept": pool.submit(_accept, folders["accept"]), "check": pool.submit(_check, folders["check"])}
        return {name: (future.result(), folders[name]) for name, future in started.items()}


def test_accept_yml_fails_the_pipeline_on_an_incomplete_verdict_saying_each_thing_once(runs: dict) -> None:
    """Before: exit 0 on every verdict; "left out of this play" 11 times; the recap's unreachable=0 for nodes that
    were down; a literal \\r\\n-prone list of reasons."""
    proc, tmp_path = runs["accept"]
    reports = tmp_path / "reports"
    out = proc.stdout
    assert proc.returncode == 2, (out + proc.stderr)[-4000:]
    run_dir = (reports / "site" / "latest").resolve()
    assert json.loads((run_dir / "report.json").read_text())["verdict"] == "incomplete"
    gate = (f"verdict incomplete fails this run (acceptance_fail_on: every verdict but release, the default): "
            f"report {run_dir / 'report.html'}")
    last = [line for line in out.splitlines() if line.strip()]
    assert any(line.endswith(f"end       | finished in {line.split('finished in ')[-1].split(':')[0]}: {gate}")
               for line in last), out[-3000:]
    assert out.count(gate) == 1 and "[ERROR]" not in out + proc.stderr, out[-3000:]
    # each node's unreachability: where it failed, and once that the later plays leave it out
    for host in DOWN:
        assert out.count(f"unreachable on {host}:") == 1, out[-4000:]
    assert out.count("left out of every later play") == 1 and "left out of this play" not in out, out[-4000:]
    recap = _recap(out)
    assert recap["gb300-a01"]["unreachable"] == 1 and recap["gb300-a02"]["unreachable"] == 1, out[-1500:]
    assert recap["gb300-a01"]["ignored"] == 0 and recap["localhost"]["failed"] == 1, out[-1500:]
    assert "\\r\\n" not in out


def test_run_check_ends_with_one_verdictless_line_and_leaves_no_directory(runs: dict) -> None:
    """Before: "end | finished: verdict incomplete" then "verdict: none (check mode)", a "why:" for a run that
    went through, and /tmp/vllm-acceptance-check-* left behind."""
    proc, tmp_path = runs["check"]
    scratch = tmp_path / "tmp"
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-4000:]
    assert "verdict incomplete" not in out and "why:" not in out, out[-3000:]
    assert "end       | finished in" in out and "check mode, no verdict (nothing was measured)" in out
    assert "verdict: none (check mode: nothing was measured)" in out and "run: none (check mode keeps nothing)" in out
    assert not list(scratch.glob("vllm-acceptance-*")), sorted(p.name for p in scratch.iterdir())
    assert not (tmp_path / "r").exists()


def test_a_refused_input_is_said_once(tmp_path: Path) -> None:
    """Before: the refusal 4 times (the failure line, Ansible's error block, the last line, the CLI's `why:`)."""
    inventory = _inventory(tmp_path / "site", DOWN, gpu_nodes=False)
    proc = subprocess.run([str(CLI), "run", "-i", str(inventory), "--reports-dir", str(tmp_path / "reports")],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "VLLM_API_KEY": ""})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-4000:]
    assert out.count("group `gpu_nodes` is missing or empty") == 1, out[-4000:]
