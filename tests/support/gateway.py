"""The lab gateway (src/vllm_acceptance/lab/gateway.py) in front of the session's lab server, as a fixture the
agent lab tests share (tests/conftest.py re-exports it): `gateway(mode, *args)` starts one on a free port with fresh
counters and returns its base URL; every gateway started is stopped after the test."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gateway(lab_server) -> Iterator[Callable[..., str]]:
    """Start `python -m vllm_acceptance.lab.gateway` (fresh counters) on a free port; stopped after the test."""
    procs: list[subprocess.Popen] = []

    def start(mode: str, *args: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "vllm_acceptance.lab.gateway", "--upstream",
                                 lab_server.base_url, "--port", str(port), "--mode", mode, *args],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"gateway exited: {proc.stdout.read() if proc.stdout else ''}"
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:  # proxied to the real server
                    return url
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"gateway {mode} did not answer on {url} within 30 s")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
