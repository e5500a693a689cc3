"""The lab's corrupting gateway (src/vllm_acceptance/lab/gateway.py) in front of a lab server, for the probes' tests:
`start_gateway`, and the `gateway` fixture the agent lab tests share (tests/conftest.py re-exports it: `gateway(mode,
*args)` starts one on a free port with fresh counters and returns its base URL; each is stopped after the test)."""

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


def start_gateway(upstream: str, *args: str) -> tuple[subprocess.Popen, str]:
    """The gateway on a free loopback port with these arguments (`--mode M ...`); its process and base URL once it
    answers /v1/models."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "vllm_acceptance.lab.gateway", "--upstream", upstream,
                             "--port", str(port), *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(150):
        try:
            if httpx.get(url + "/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("gateway did not start")


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
