"""The CI entry point: an exit code per verdict, and `vllm-acceptance run` refusing a typo before any node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_acceptance.api import (
    EXIT_CHECK_OK,
    EXIT_CODES,
    EXIT_INPUT_ERROR,
    EXIT_RUN_FAILED,
    _result,
    exit_code_for,
)

REPO = Path(__file__).resolve().parents[2]


def test_each_verdict_has_its_documented_exit_code() -> None:
    assert EXIT_CODES == {"release": 0, "limited_observation": 10, "expand_capacity": 20,
                          "rebuild_environment": 30, "incomplete": 40}
    for verdict, code in EXIT_CODES.items():
        assert exit_code_for(verdict, check=False, rc=0, events=[]) == code
        assert f"{code} {verdict}" in (REPO / "README.md").read_text()
    refused = [{"event": "failed", "stage": "validate", "reason": "unknown variable"}]
    assert exit_code_for(None, check=False, rc=2, events=refused) == EXIT_INPUT_ERROR
    assert exit_code_for(None, check=False, rc=2, events=[]) == EXIT_RUN_FAILED
    assert exit_code_for("release", check=False, rc=2, events=[]) == EXIT_RUN_FAILED   # a verdict, then a crash
    assert exit_code_for(None, check=True, rc=0, events=[]) == EXIT_CHECK_OK


def test_the_verdict_is_read_from_the_run_directory(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text('{"verdict": "expand_capacity"}')
    result = _result([{"event": "run", "run_dir": str(tmp_path)}], check=False, status="successful", rc=0)
    assert (result.verdict, result.exit_code, result.run_dir) == ("expand_capacity", 20, tmp_path)
    missing = _result([{"event": "run", "run_dir": str(tmp_path / "none")}], check=False, status="failed", rc=2)
    assert missing.verdict is None and missing.exit_code == EXIT_RUN_FAILED


@pytest.mark.parametrize("typo", ["vllm_serv_stop_at_end=true"])
def test_run_refuses_a_typo_before_touching_a_node(tmp_path: Path, typo: str) -> None:
    """A real run through ansible-runner: the validate stage stops, the progress says why, exit 2."""
    cli = Path(sys.executable).parent / "vllm-acceptance"
    proc = subprocess.run([str(cli), "run", "-i", str(REPO / "inventories" / "lab"), "-e", typo, "--reports-dir",
                           str(tmp_path / "reports")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "VLLM_API_KEY": ""})
    assert proc.returncode == EXIT_INPUT_ERROR, proc.stdout + proc.stderr
    assert "validate  | failed on localhost" in proc.stdout
    assert "did you mean `vllm_serve_stop_at_end`?" in proc.stdout
    assert "exit: 2" in proc.stdout and not (tmp_path / "reports" / "lab").exists()   # no run was opened
