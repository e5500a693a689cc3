"""runtime/process.py's read_pid and stop on a process that exited but is not yet reaped (a zombie).

A zombie answers signal 0, so a pid check by os.kill(pid, 0) alone called it running: stop() then waited its whole
timeout (20 s) for a process already gone, whenever the process that started the server stops it too (a test's
module fixture, `lab up` after a failed start, the P/D pools' `up` cleaning up after a failed instance). Such a
child is reaped and gone. Another process's exited child stays until its parent reaps it: the serve role confirms a
stop by /proc/PID (roles/vllm_serve/tasks/stop.yml), and a first version that called every zombie gone made that
check see a server "stopped but not gone" in CI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def test_another_process_s_exited_child_counts_until_its_parent_reaps_it(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time\n"
                               "child = subprocess.Popen(['true'])\nprint(child.pid, flush=True)\ntime.sleep(600)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        _until_zombie(pid)
        pid_path = tmp_path / "vllm.pid"
        pid_path.write_text(str(pid))
        assert process.read_pid(pid_path) == pid
        assert Path(f"/proc/{pid}").exists()
    finally:
        parent.kill()
        parent.wait()


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
