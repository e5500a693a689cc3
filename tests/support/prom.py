"""A real Prometheus (Debian package) scraping given targets, for integration tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str], interval_s: float = 1.0,
                 rule_files: list[Path] | None = None) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus not installed: apt-get install prometheus (make sysdeps)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        rules = "".join(f"\n  - {p}" for p in rule_files or [])
        config = workdir / "prometheus.yml"
        interval = f"{int(interval_s * 1000)}ms"  # Prometheus durations take no decimals
        config.write_text(
            f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
            + (f"rule_files:{rules}\n" if rules else "")
            + "scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: ["
            + ", ".join(f'"{t}"' for t in targets) + "]\n")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=(workdir / "prometheus.log").open("w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus not ready; log: {(workdir / 'prometheus.log').read_text()[-2000:]}")

    def wait_for_target(self, timeout_s: float = 30) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            data = httpx.get(f"{self.url}/api/v1/query", params={"query": "up"}).json()
            if any(r["value"][1] == "1" for r in data["data"]["result"]):
                return
            time.sleep(0.5)
        raise RuntimeError("prometheus never scraped the target")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
