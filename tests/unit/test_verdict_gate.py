"""accept.yml's last play gates CI (issue 43 item 2): the real ansible-playbook on playbooks/verdict_gate.yml, the
verdict handed over as the report play leaves it (the `acceptance_verdict` of localhost), no node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _gate(tmp_path: Path, verdict: dict | None, *args: str) -> tuple[int, str]:
    extra = {"acceptance_verdict": verdict} if verdict is not None else {}
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "progress",
           "ANSIBLE_NOCOLOR": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-e", json.dumps(extra), *args,
                           str(REPO / "playbooks" / "verdict_gate.yml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


REPORT = "/srv/reports/site/20261207T010156Z-0e7cc3/report.html"


@pytest.mark.parametrize(("verdict", "fail_on", "rc"), [
    ("incomplete", None, 2), ("limited_observation", None, 2), ("release", None, 0),
    ("limited_observation", ["rebuild_environment", "incomplete"], 0), ("incomplete", [], 0),
    ("release", ["release"], 2),
])
def test_the_playbook_fails_unless_the_inventory_accepts_the_verdict(tmp_path: Path, verdict: str,
                                                                    fail_on: list[str] | None, rc: int) -> None:
    args = ["-e", json.dumps({"acceptance_fail_on": fail_on})] if fail_on is not None else []
    code, out = _gate(tmp_path, {"verdict": verdict, "report": REPORT}, *args)
    assert code == rc, out[-3000:]
    listed = ", ".join(fail_on) if fail_on is not None else "every verdict but release, the default"
    said = f"verdict {verdict} fails this run (acceptance_fail_on: {listed}): report {REPORT}"
    assert (said in out) is (rc != 0), out[-3000:]


def test_a_run_with_no_verdict_fails_but_check_mode_does_not(tmp_path: Path) -> None:
    code, out = _gate(tmp_path, None)
    assert code == 2 and "no verdict was reached, which fails this run: report none" in out, out[-3000:]
    code, out = _gate(tmp_path, None, "--check")
    assert code == 0, out[-3000:]


def test_check_mode_removes_its_scratch_directory_and_nothing_else(tmp_path: Path) -> None:
    """The check run's stand-in run directory (acceptance_run in check mode) is removed at the end: `run --check`
    left /tmp/vllm-acceptance-check-* behind. A run directory of a real run is never touched."""
    scratch = tmp_path / "vllm-acceptance-check-abc123"
    (scratch / "evidence").mkdir(parents=True)
    code, out = _gate(tmp_path, None, "--check", "-e", f"acceptance_run_dir={scratch}")
    assert code == 0 and not scratch.exists(), out[-3000:]
    real = tmp_path / "20261207T010156Z-0e7cc3"
    real.mkdir()
    code, out = _gate(tmp_path, {"verdict": "release", "report": REPORT}, "-e", f"acceptance_run_dir={real}")
    assert code == 0 and real.is_dir(), out[-3000:]


def test_accept_yml_and_the_collection_playbook_end_with_the_gate() -> None:
    for path, gate in ((REPO / "accept.yml", "playbooks/verdict_gate.yml"),
                       (REPO / "playbooks" / "accept.yml", "verdict_gate.yml")):
        assert yaml.safe_load(path.read_text())[-1]["ansible.builtin.import_playbook"] == gate
