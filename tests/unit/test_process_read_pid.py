"""runtime/process.py's read_pid and stop on a process that exited but is not yet reaped (a zombie).

A zombie answers signal 0, so a pid check by os.kill(pid, 0) alone called it running: stop() then waited its whole
timeout (20 s) for a process already gone, whenever the process that started the server stops it too (a test's
module fixture, `lab up` after a failed start, the P/D pools' `up` cleaning up after a failed instance)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from vllm_acceptance.runtime import process


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _child(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    pid_path = tmp_path / "vllm.pid"
    pid_path.write_text(str(proc.pid))
    return proc, pid_path


def _until_zombie(pid: int) -> None:
    for _ in range(200):   # bounded: the state is what is asserted, not how soon it came
        if _state(pid) == "Z":
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} did not exit after SIGTERM: state {_state(pid)}")


def test_a_running_child_is_running(tmp_path: Path) -> None:
    proc, pid_path = _child(tmp_path)
    try:
        assert process.read_pid(pid_path) == proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_an_exited_unreaped_child_is_not_running_and_is_reaped(tmp_path: Path) -> None:
    proc, pid_path = _child(tmp_path)
    os.kill(proc.pid, signal.SIGTERM)
    _until_zombie(proc.pid)
    os.kill(proc.pid, 0)   # the zombie still answers signal 0: what the old check went by
    assert process.read_pid(pid_path) is None
    with pytest.raises(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)   # read_pid reaped it


def test_stop_of_an_own_child_leaves_nothing_running(tmp_path: Path) -> None:
    proc, pid_path = _child(tmp_path)
    assert process.stop(pid_path) is True
    assert not pid_path.exists()
    assert not Path(f"/proc/{proc.pid}").exists()
