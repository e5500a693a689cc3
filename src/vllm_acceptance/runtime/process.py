"""vLLM as a detached process: start, wait until it answers, stop, read its memory and its log's tail.

The vllm_serve role's `process` runtime (the `acceptance_process` module), the probes (the server's
RSS and log while they run), `make lab-up` / `lab-down` and the integration tests all use it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..core.contract import launch_flag_value
from ..core.redact import redact_text


@dataclass
class LaunchSpec:
    python: str
    model_path: str
    served_name: str
    host: str
    port: int
    args: list[str]
    env: dict[str, str]
    log_path: Path
    pid_path: Path

    def command(self) -> list[str]:
        """vLLM's one-API-server module; a data-parallel launch runs `vllm serve` (vLLM's own CLI, the image's
        entrypoint), which fronts the engines with one API server per engine by default (vllm/entrypoints/cli/
        serve.py): that changes how requests are balanced and what /metrics exports (docs/lab.md "Data
        parallel"), so the launch is the one a deployment runs."""
        entry = ["-m", "vllm.entrypoints.cli.main", "serve", self.model_path] if data_parallel_size(self.args) > 1 \
            else ["-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path]
        return [self.python, *entry, "--served-model-name", self.served_name, "--host", self.host,
                "--port", str(self.port), *self.args]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def data_parallel_size(args: list[str]) -> int:
    """The data-parallel size an argv asks vLLM for (`--data-parallel-size N`, else `-dp N`); 1 without."""
    for flag in ("--data-parallel-size", "-dp"):
        value = launch_flag_value(args, flag)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 1


class LaunchError(Exception):
    pass


class ServerExited(LaunchError):
    """The process ended before /health answered (the log tail is in the message)."""


class NotReadyYet(LaunchError):
    """/health did not answer within the wait; the process still runs."""


def read_pid(pid_path: Path) -> int | None:
    """The recorded process if it is still there; None when there is none or it is gone. A process that exited
    answers signal 0 until its parent reaps it: where that parent is this process (a test's fixture, `lab up`
    after a failed start), it is reaped here and counts as gone, so stop() does not wait its whole timeout for
    it; anyone else's exited process counts until its parent reaps it (the serve role confirms a stop by
    /proc/PID, which lasts that long)."""
    try:
        pid = int(pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except OSError:
        return None
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:   # our own child, exited: reaped now
            return None
    return pid


def start(spec: LaunchSpec) -> int:
    """Start detached (own session, so it outlives the caller); refuse if one already runs there."""
    running = read_pid(spec.pid_path)
    if running:
        raise LaunchError(f"a lab server already runs (pid {running}, {spec.pid_path}); run `make lab-down` first")
    if port_in_use(spec.host, spec.port):
        # Otherwise the readiness wait would see the other server's /health and judge the wrong instance.
        raise LaunchError(f"{spec.host}:{spec.port} is already in use by another process: stop it or choose "
                          "another port (--port / vllm_serve_port)")
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    spec.pid_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.env}
    with spec.log_path.open("w") as log:
        log.write("# launch: " + redact_text(" ".join(spec.command())) + "\n")
        log.flush()
        proc = subprocess.Popen(spec.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    spec.pid_path.write_text(str(proc.pid))
    return proc.pid


def port_in_use(host: str, port: int) -> bool:
    target = "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else host
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((target, port)) == 0


def wait_ready(base_url: str, pid: int | None, timeout_s: float, log_path: Path | None = None) -> float:
    """Poll /health until 200; bounded; fails fast when the process exits. Returns seconds to ready."""
    root = base_url[:-3] if base_url.rstrip("/").endswith("/v1") else base_url
    started = time.time()
    while time.time() - started < timeout_s:
        if pid is not None:
            try:
                os.kill(pid, 0)
                done, _ = os.waitpid(pid, os.WNOHANG) if _is_child(pid) else (0, 0)
                if done:
                    raise OSError
            except OSError as exc:
                tail = tail_lines(log_path, 15) if log_path else ""
                raise ServerExited(f"vLLM (pid {pid}) exited before it was ready; log tail:\n{tail}") from exc
        try:
            if httpx.get(f"{root.rstrip('/')}/health", timeout=2.0).status_code == 200:
                return time.time() - started
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise NotReadyYet(f"vLLM at {base_url} not ready within {timeout_s:.0f} s")


def _is_child(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[3] == str(os.getpid())
    except (OSError, IndexError):
        return False


def stop(pid_path: Path, timeout_s: float = 20.0) -> bool:
    """SIGTERM the process group, then SIGKILL; True if something was stopped."""
    pid = read_pid(pid_path)
    if pid is None:
        pid_path.unlink(missing_ok=True)
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except OSError:
        os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout_s
    while time.time() < deadline and read_pid(pid_path):
        time.sleep(0.3)
    if read_pid(pid_path):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    pid_path.unlink(missing_ok=True)
    return True


def tail_lines(path: Path | None, n: int) -> str:
    if path is None or not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process and its children (vLLM's engine core is a child process)."""
    total = 0
    pids = [pid] + children(pid)
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total or None


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for kid in kids:
        out.append(int(kid))
        out += children(int(kid))
    return out
