"""The prefix-cache probe against real vLLM: reuse proven (on either scenario pack, over repeated
rounds, and cleared by a real restart), caching off caught, the Prometheus path agrees, counters that
never move can never pass, a gateway that stamps the prompt breaks the repeated rounds (or, stamping every
prompt, the hot reuse), a gateway that replaces the system prompt fails the cold baseline and the control,
and a restart that restarts nothing is never a pass."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from conftest import LAB_PROFILE, LAB_PYTHON

from support.gateway import start_gateway
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
    rounds = result["details"]["rounds"]
    assert len(rounds) == 3 and all(r["hits"] == r["expected_hits"] > 0 for r in rounds)
    # Local reuse, told apart from external: prompt_tokens_cached = prefix_cache_hits, device tier only.
    source = next(f for f in result["findings"] if f["check"] == "cache.source")["observed"]
    assert source["local_hits"] == source["prompt_tokens_cached"] == source["tier_local"] > 0
    assert source["external_hits"] == source["tier_external"] == 0
    assert result["details"]["requests_sent"] <= 15
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


def test_the_second_scenario_pack_and_a_restart_that_restarts_nothing(lab_server, tmp_path: Path) -> None:
    """shop-agent's prefix (its own tools, history and hot B call) reuses the cache as ops-agent's does;
    a restart command that does not restart (the process start time stays) is inconclusive, never a pass."""
    rc, result = probe("cache", lab_server.base_url, tmp_path, "--set", "agent.scenario=shop-agent",
                       "--set", "cache.sessions=2", "--restart-command", "true")
    got = statuses(result)
    assert got.pop("cache.restart") == "inconclusive" and rc == 3
    assert got.pop("cache.engines") == "not_applicable"      # one engine: nothing to pin
    assert set(got.values()) == {"pass"}, got
    restart = next(f for f in result["findings"] if f["check"] == "cache.restart")
    assert "no restart observed" in restart["reason"]
    first = json.loads(next((tmp_path / "requests").glob("s1-hot_b-try1.json")).read_text())
    assert first["request"]["messages"][-3]["tool_calls"][0]["function"]["name"] == "lookup_order"


def test_a_gateway_that_stamps_the_prompt_breaks_the_repeated_rounds(lab_server, tmp_path: Path) -> None:
    """Requests 1-12 are the three sessions (untouched: hot reuse passes); rounds 2 and 3 (requests 14, 15)
    get a timestamp in front of their system prompt on the way: their prefix never repeats."""
    gateway, url = start_gateway(lab_server.base_url, "--mode", "stamp_system", "--nth", "14,15")
    try:
        rc, result = probe("cache", url, tmp_path, "--metrics-url", lab_server.metrics_url)
    finally:
        gateway.terminate()
    got = statuses(result)
    assert rc == 1 and got["cache.repeat_rounds"] == "fail" and got["cache.hot_reuse"] == "pass", got
    assert [r["hits"] > 0 for r in result["details"]["rounds"]] == [True, False, False]


def test_hot_after_a_real_restart_has_an_empty_device_cache(lab_server, tmp_path: Path) -> None:
    """The run launched the server, so the probe may restart it: the session lab server is restarted for
    real (same state dir and port; the fixture's pid is updated for the tests after this one)."""
    import os

    if os.environ.get("VLLM_ACCEPTANCE_REUSE_LAB"):
        pytest.skip("a reused developer server is not ours to restart")
    port = lab_server.base_url.rsplit(":", 1)[1].split("/")[0]
    cli = f"{sys.executable} -m vllm_acceptance.cli lab"
    restart = (f"{cli} down --state-dir {lab_server.state_dir} && {cli} up --state-dir {lab_server.state_dir} "
               f"--port {port} --python {LAB_PYTHON} --profile {LAB_PROFILE}")
    try:
        rc, result = probe("cache", lab_server.base_url, tmp_path, "--set", "cache.sessions=1",
                           "--set", "cache.rounds=1", "--restart-command", restart)
    finally:
        lab_server.pid = int((lab_server.state_dir / "vllm.pid").read_text())
    restart_finding = next(f for f in result["findings"] if f["check"] == "cache.restart")
    assert rc == 0 and restart_finding["status"] == "pass", statuses(result)
    observed = restart_finding["observed"]
    assert observed["after"]["process_start"] > observed["before"]["process_start"] and observed["local_hits"] == 0
    assert result["details"]["restart"]["prompt_tokens"] > 0  # the hot request was answered, cold
    assert (tmp_path / "restart.log").is_file()


def two_sessions_through(lab_server, tmp_path: Path, mode: str) -> tuple[int, dict]:
    """Two sessions of the protocol (no repeated rounds) through a gateway rewriting every request in `mode`."""
    gateway, url = start_gateway(lab_server.base_url, "--mode", mode, "--nth", "0")
    try:
        return probe("cache", url, tmp_path, "--metrics-url", lab_server.metrics_url,
                     "--set", "cache.sessions=2", "--set", "cache.rounds=0")
    finally:
        gateway.terminate()


def test_a_gateway_that_stamps_every_prompt_fails_hot_reuse(lab_server, tmp_path: Path) -> None:
    """Every request gets a timestamp in front of its system prompt on the way: no two prompts share a prefix,
    so the hot requests do not hit and the prefill does not shrink, while the cold baseline and the control
    (which must not hit anyway) still pass. (prefill_gain is never a pass; whether the hot prefill also took
    no less time per token than the cold one is a timing on 2 shared cores, so fail or inconclusive.)"""
    rc, result = two_sessions_through(lab_server, tmp_path, "stamp_system")
    got = statuses(result)
    assert rc == 1 and got["cache.hot_reuse"] == "fail", got
    assert got["cache.prefill_gain"] in ("fail", "inconclusive"), got
    assert got["cache.cold_baseline"] == got["cache.control"] == got["cache.isolation"] == "pass", got
    hot = next(f for f in result["findings"] if f["check"] == "cache.hot_reuse")
    assert hot["consequence"] == "rebuild_environment"


def test_a_gateway_that_replaces_the_system_prompt_fails_the_cold_baseline_and_the_control(
        lab_server, tmp_path: Path) -> None:
    """A gateway's "system prompt injection": every request's system message (which carries the session id
    and the control's environment) becomes one fixed company prompt. A later session's cold request then hits
    what the first session cached, and the control hits the session's own prefix: the measurement is not of
    the prompts the client sent, and both checks fail with the hits they saw."""
    rc, result = two_sessions_through(lab_server, tmp_path, "replace_system")
    got = statuses(result)
    assert rc == 1 and got["cache.cold_baseline"] == "fail" and got["cache.control"] == "fail", got
    rows = {(r["session"], r["kind"]): r for r in result["details"]["requests"]}
    block = result["details"]["block_size"]
    assert rows[(2, "cold")]["hits"] > rows[(2, "cold")]["expected_hits"] + block, rows[(2, "cold")]
