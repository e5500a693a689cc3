"""The lab's corrupting gateway (src/vllm_acceptance/lab/gateway.py) in front of a lab server, for the probes' tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

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
