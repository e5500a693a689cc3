"""Issue 9 hard cases on real parts: the lab vLLM killed during the cache probe, and hung responses
(the corrupting gateway's stall_nth mode in front of the real lab vLLM) during the agent probe.

Each fault must end in a named finding that is never a pass, the evidence up to the fault on disk, a
bounded stage, the CLI's exit code and no Python traceback. The figures (evidence kept, time to the
finding) are printed as `FAULT-FIGURES {...}` lines for benchmarks/fault_matrix.md (pytest -s).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.verdict import decide

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lab


def cli(kind: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_acceptance.cli", "probe", kind, "--model", "tiny-agent", *args]


def figures(test: str, out: Path, seconds: float, statuses: dict[str, str]) -> None:
    files = [p for p in out.rglob("*") if p.is_file()]
    print("FAULT-FIGURES " + json.dumps({"test": test, "files": len(files), "bytes": sum(p.stat().st_size
                                                                                         for p in files),
                                         "seconds_to_finding": round(seconds, 1), "statuses": statuses}))


def test_server_killed_during_the_cache_probe(lab_server_factory, tmp_path: Path) -> None:
    server = lab_server_factory("", port=8071)
    out = tmp_path / "cache"
    probe = subprocess.Popen(cli("cache", "--base-url", server.base_url, "--out", str(out), "--server-pid",
                                 str(server.pid), "--server-log", str(server.log_path)),
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    requests = out / "requests"
    deadline = time.time() + 300
    while time.time() < deadline and not (requests.is_dir() and any(requests.glob("*.json"))):
        assert probe.poll() is None, probe.communicate()
        time.sleep(0.1)
    first = sorted(requests.glob("*.json"))
    assert first, "the cache probe never sent its first request"
    os.killpg(server.pid, signal.SIGKILL)
    killed = time.time()
    stdout, stderr = probe.communicate(timeout=300)
    seconds = time.time() - killed
    assert probe.returncode == 3, stdout + stderr  # incomplete: not a pass, not a usage error
    assert "Traceback" not in stdout + stderr
    result = json.loads((out / "result.json").read_text())
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    figures("cache: server SIGKILLed mid-protocol", out, seconds, statuses)
    # Only what was established before the kill passes: caching on, and the counters exported.
    assert result["status"] == "inconclusive" and "pass" not in {
        s for c, s in statuses.items() if c not in ("cache.config", "cache.metrics")}
    assert statuses["cache.crash"] == "inconclusive"
    for check in ("cache.cold_baseline", "cache.control", "cache.hot_reuse", "cache.prefill_gain", "cache.source"):
        assert statuses[check] == "missing", (check, statuses)
    crash = next(f for f in result["findings"] if f["check"] == "cache.crash")
    assert crash["observed"]["request"].startswith("s1-") and "crash_record.json" in crash["evidence"]
    assert "last log line" in crash["reason"]
    record = json.loads((out / "crash_record.json").read_text())
    assert record["process_state"] == "exited" and record["log_tail"]
    assert record["log_tail"] == server.log_path.read_text(errors="replace").splitlines()[-len(record["log_tail"]):]
    # The request answered before the kill is still on disk, with its body and the server's answer.
    kept = json.loads(first[0].read_text())
    assert kept["request"]["messages"] and kept["url"].endswith("/chat/completions")
    assert all((out / p).is_file() for p in crash["evidence"])
    assert decide([Finding.from_dict(f) for f in result["findings"]]).verdict == "incomplete"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_gateway(upstream: str, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vllm_acceptance.lab.gateway", "--upstream", upstream,
                             "--port", str(port), *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"gateway did not answer on {url}")


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


# The hung-request faults sit in the gateway, not the server: they run against the session's lab server,
# which answers every request the gateway forwards (only the kill test needs a server of its own).
@pytest.mark.full
def test_hung_requests_during_the_agent_probe_are_named_and_never_pass(lab_server, tmp_path: Path) -> None:
    server = lab_server
    # The 2nd chat request (one of the concurrent cases of the case set, not streamed) gets no byte; the
    # 392nd (the streamed half of the stream check, after the 360 cases of the set, 10 cases repeated 3
    # times and the plain half) gets its first chunk and then silence. Both are held far past the timeout.
    gateway, url = start_gateway(server.base_url, "--mode", "stall_nth", "--nth", "2,392", "--stall-s", "3600")
    out = tmp_path / "agent"
    try:
        began = time.time()
        proc = subprocess.run(cli("agent", "--base-url", url, "--out", str(out), "--set",
                                  "agent.request_timeout_s=20", "--set", "agent.stream_cases=4"), cwd=REPO,
                              capture_output=True, text=True,
                              timeout=900)
        seconds = time.time() - began
    finally:
        log = stop(gateway)
    assert "stalling chat request #2 (no byte)" in log and "stalling chat request #392 (streamed" in log
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert seconds < 600  # bounded: two 20 s timeouts, not two 3600 s stalls
    result = json.loads((out / "result.json").read_text())
    findings = [Finding.from_dict(f) for f in result["findings"]]
    statuses = {f.check: f.status.value for f in findings}
    figures("agent: two requests hung past the per-request timeout", out, seconds, statuses)
    # The hung requests by name: case, URL, the timeout; and the checks they belonged to.
    timeouts = next(f for f in findings if f.check == "agent.timeouts")
    assert timeouts.status == Status.INCONCLUSIVE
    hung = {h["case"]: h for h in timeouts.observed}
    turn = next(c for c in hung if c.startswith("01-single-"))
    assert set(hung) == {turn, "03-stream-streamed"}, hung
    assert all(h["url"] == url + "/chat/completions" and h["timeout_s"] == 20 for h in hung.values())
    assert hung[turn]["checks"][0] == "agent.tool_call"
    assert hung["03-stream-streamed"]["checks"] == ["agent.stream_consistency", "agent.stream_structure"]
    assert hung["03-stream-streamed"]["stream_chunks"] >= 1 and hung[turn]["stream_chunks"] == 0
    assert turn in timeouts.reason and url in timeouts.reason
    # Their evidence is kept: the request body, and what arrived before the stall.
    for h in hung.values():
        kept = json.loads((out / h["evidence"]).read_text())
        assert kept["timed_out"] and kept["request"]["messages"] and kept["timeout_s"] == 20
    streamed = json.loads((out / hung["03-stream-streamed"]["evidence"]).read_text())
    assert streamed["raw_stream"].startswith("data:")
    # The checks the hung requests belong to are not passes; the others still ran and were judged.
    for check in ("agent.tool_call", "agent.schema_accuracy", "agent.trigger_consistency", "agent.separation",
                  "agent.stream_consistency", "agent.stream_structure"):
        assert statuses[check] == "inconclusive", (check, statuses)
    for check in ("agent.tool_call", "agent.stream_consistency"):
        assert "hung:" in next(f.reason for f in findings if f.check == check)
    for check in ("agent.multi_turn", "agent.tool_failure_fallback", "agent.structured_output",
                  "agent.executor_safety"):
        assert statuses[check] == "pass", (check, statuses)
    assert result["details"]["rates"]["turns_sent"] == 324  # every case was sent; the hung one is not counted
    assert result["details"]["rates"]["runs"] == 323
    assert decide(findings).verdict != "release"


def test_a_hung_request_during_the_cache_probe_is_named_and_its_session_dropped(lab_server, tmp_path: Path) -> None:
    server = lab_server
    # The 2nd chat request of the protocol (session 1, hot A; streamed) gets its first chunk, then silence.
    gateway, url = start_gateway(server.base_url, "--mode", "stall_nth", "--nth", "2", "--stall-s", "3600")
    out = tmp_path / "cache"
    try:
        began = time.time()
        proc = subprocess.run(cli("cache", "--base-url", url, "--metrics-url", server.metrics_url, "--out", str(out),
                                  "--set", "cache.request_timeout_s=5"), cwd=REPO, capture_output=True, text=True,
                              timeout=600)
        seconds = time.time() - began
    finally:
        log = stop(gateway)
    assert "stalling chat request #2 (streamed" in log
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert seconds < 400
    result = json.loads((out / "result.json").read_text())
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    figures("cache: one request hung past the per-request timeout", out, seconds, statuses)
    timeouts = next(f for f in result["findings"] if f["check"] == "cache.timeouts")
    assert timeouts["status"] == "inconclusive"
    (hung,) = timeouts["observed"]
    assert hung["request"] == "s1-hot_a-try1" and hung["url"] == url + "/chat/completions"
    assert hung["timeout_s"] == 5 and hung["stream_chunks"] >= 1 and "s1-hot_a-try1" in timeouts["reason"]
    kept = json.loads((out / hung["evidence"]).read_text())
    assert kept["timed_out"] and kept["request"]["messages"]
    rows = result["details"]["requests"]
    # No retry against a cache the hung request may have filled; the rest of session 1 is dropped,
    # sessions 2 and 3 are measured and judged.
    assert [(r["session"], r["kind"]) for r in rows][:3] == [(1, "cold"), (1, "hot_a"), (2, "cold")]
    assert not (out / "requests" / "s1-hot_a-try2.json").exists()
    assert {r["session"] for r in rows if r["clean"]} == {1, 2, 3}
    assert statuses["cache.hot_reuse"] == "pass"  # judged on the measured sessions: reuse still proven
    assert statuses["cache.isolation"] == "pass"  # a hang is named as a hang, not as other traffic
    assert result["status"] == "inconclusive"  # but the probe as a whole is not a pass


def test_a_hung_request_in_the_load_ramp_is_counted_and_named(lab_server, tmp_path: Path) -> None:
    server = lab_server
    # Chat requests through the gateway: #1 the long prompt, #2 and #3 the context contract (at the
    # contracted window, then one token over it), #4 the first request of the ramp's concurrency-1 step:
    # streamed, it gets its first chunk and then silence.
    gateway, url = start_gateway(server.base_url, "--mode", "stall_nth", "--nth", "4", "--stall-s", "3600")
    out = tmp_path / "load"
    try:
        began = time.time()
        proc = subprocess.run(cli("load", "--base-url", url, "--metrics-url", server.metrics_url, "--out", str(out),
                                  "--server-pid", str(server.pid), "--set", "load.request_timeout_s=5",
                                  "--set", "load.requests_per_step=4", "--set", "load.soak_s=4"),
                              cwd=REPO, capture_output=True, text=True, timeout=600)
        seconds = time.time() - began
    finally:
        log = stop(gateway)
    assert "stalling chat request #4 (streamed" in log
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the contracted step is not met: fail
    assert "Traceback" not in proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    figures("load: one ramp request hung past the per-request timeout", out, seconds, statuses)
    ramp = next(f for f in result["findings"] if f["check"] == "capacity.ramp")
    c1 = next(s for s in ramp["observed"]["steps"] if s["concurrency"] == 1)
    records = [json.loads(line) for line in (out / "records" / "ramp_c1.jsonl").read_text().splitlines()]
    hung = [r["request_id"] for r in records if r["status"] == "timeout"]
    assert c1["timeouts"] == 1 and c1["timed_out"] == hung and c1["meets_slo"] is False
    assert ramp["status"] != "pass" and hung[0] in ramp["reason"] and "past 5 s" in ramp["reason"]
    assert len(records) == 4 and sum(r["status"] == "ok" for r in records) == 3  # the step went on
    assert "capacity.crash" not in statuses  # the server is healthy: a hang is not a crash
    assert statuses["capacity.mixed"] != "missing" and statuses["capacity.soak"] != "missing"  # later stages ran
