"""The prefix-cache probe against real vLLM: reuse proven, caching off caught, the Prometheus path
agrees, and counters that never move can never pass."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from support.prom import Prometheus

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lab


def probe(kind: str, server_url: str, out: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", kind, "--base-url", server_url,
                           "--model", "tiny-agent", "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    return proc.returncode, result


def statuses(result: dict) -> dict[str, str]:
    return {f["check"]: f["status"] for f in result["findings"]}


def test_reuse_is_proven_on_the_lab(lab_server, tmp_path: Path) -> None:
    rc, result = probe("cache", lab_server.base_url, tmp_path)
    assert rc == 0 and result["status"] == "pass", statuses(result)
    block = result["details"]["block_size"]
    hot = [r for r in result["details"]["requests"] if r["kind"] in ("hot_a", "hot_b")]
    assert hot and all(r["hits"] == r["expected_hits"] > 0 and r["expected_hits"] % block == 0 for r in hot)
    assert all(r["hits"] == 0 for r in result["details"]["requests"] if r["kind"] in ("cold", "control"))
    assert result["details"]["requests_sent"] <= 12
    assert any(p.suffix == ".prom" for p in (tmp_path / "metrics").iterdir())  # raw snapshots kept


def test_the_prometheus_path_gives_the_same_verdict(lab_server, tmp_path: Path) -> None:
    target = lab_server.base_url.split("//")[1].split("/")[0]
    prom = Prometheus(tmp_path / "prom", [target], interval_s=1.0)
    try:
        prom.wait_for_target()
        rc, result = probe("cache", lab_server.base_url, tmp_path / "out", "--prometheus-url", prom.url,
                           "--set", "cache.sessions=2")
    finally:
        prom.stop()
    assert rc == 0 and result["status"] == "pass", statuses(result)
    assert "Prometheus" in result["details"]["metrics_source"]


class FrozenMetrics(BaseHTTPRequestHandler):
    """Fault injection: a metrics endpoint whose counters never move (a snapshot of the real one)."""

    text = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        body = self.text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_counters_that_never_move_never_pass(lab_server, tmp_path: Path) -> None:
    FrozenMetrics.text = httpx.get(lab_server.metrics_url).text
    server = ThreadingHTTPServer(("127.0.0.1", 0), FrozenMetrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rc, result = probe("cache", lab_server.base_url, tmp_path, "--metrics-url",
                           f"http://127.0.0.1:{server.server_port}/metrics", "--set", "cache.sessions=1")
    finally:
        server.shutdown()
    assert result["status"] in ("inconclusive", "fail")
    assert rc in (1, 3)
    assert statuses(result).get("cache.hot_reuse") != "pass"


def test_caching_off_fails_with_the_configuration_reason(lab_server_factory, tmp_path: Path) -> None:
    server = lab_server_factory("--no-enable-prefix-caching", port=8023)
    rc, result = probe("cache", server.base_url, tmp_path)
    config = next(f for f in result["findings"] if f["check"] == "cache.config")
    assert rc == 1 and config["status"] == "fail"
    assert "configuration" in config["reason"] and config["consequence"] == "rebuild_environment"


def test_unreachable_base_url_is_a_usage_error(tmp_path: Path) -> None:
    rc, result = probe("cache", "http://127.0.0.1:9/v1", tmp_path)
    assert rc == 2 and result == {}
