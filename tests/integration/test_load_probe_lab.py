"""Capacity on the real lab: the normal ramp holds; the pressure configuration shows queueing, a full
KV cache, preemptions and a knee below the contract; a server killed mid-ramp leaves a crash record,
the records up to the kill, and never a release."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Finding
from vllm_acceptance.verdict import decide

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lab


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_acceptance.cli", "probe", "load", "--model", "tiny-agent", *args]


def result_of(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def test_normal_lab_ramp_has_no_preemption(lab_server, tmp_path: Path) -> None:
    proc = subprocess.run(cli("--base-url", lab_server.base_url, "--out", str(tmp_path), "--server-pid",
                              str(lab_server.pid), "--set", "load.soak_s=8"), cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    result = result_of(tmp_path)
    steps = result["details"]["steps"]
    assert [s["concurrency"] for s in steps] == [1, 2, 4]
    assert all(s["preemptions"] == 0 and s["errors"] == 0 for s in steps)
    assert all(s["ttft_p95"] is not None and s["e2e_p95"] is not None for s in steps)
    memory = result["details"]["memory_timeline"]
    assert memory and all(m["label"] == "process RSS (no GPU)" for m in memory)
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    assert statuses["capacity.context_contract"] == "pass", proc.stdout
    assert (tmp_path / "samples.jsonl").stat().st_size > 0 and (tmp_path / "records" / "ramp_c4.jsonl").exists()
    # Every step carries the client's own measured self-check (its verdict depends on this shared machine).
    for step in steps:
        (worker,) = step["client"]["processes"]
        assert worker["cpu_s"] > 0 and worker["chunks"] > 0 and worker["loop_lag_s"]["count"] > 0
        assert step["client"]["send_lag_s"]["count"] == step["requests"]
    assert "capacity.loadgen" in statuses and (tmp_path / "client.json").is_file()


PRESSURE = ["--set", "load.prompt_tokens=690", "--set", "load.output_tokens=600",
            "--set", "load.sample_interval_s=0.1", "--set", "load.ramp=[1,2,4,8]",
            "--set", "load.requests_per_step=4", "--set", "contract.concurrency=8", "--set", "load.soak_s=5",
            "--set", "load.long_prompt_tokens=900",
            # Latency SLOs loose on purpose: on 2 shared cores the knee must come from KV pressure (preemption).
            "--set", "contract.slo={ttft_p95_s: 60, itl_p95_s: 20, e2e_p95_s: 300, max_error_rate: 0}"]


def test_pressure_configuration_shows_the_knee(lab_server_factory, tmp_path: Path) -> None:
    server = lab_server_factory("--max-num-seqs 4 --num-gpu-blocks-override 24", port=8024)
    subprocess.run(cli("--base-url", server.base_url, "--out", str(tmp_path), "--server-pid", str(server.pid),
                       *PRESSURE), cwd=REPO, capture_output=True, text=True, timeout=1200)
    result = result_of(tmp_path)
    steps = {s["concurrency"]: s for s in result["details"]["steps"]}
    top = steps[8]
    # Waiting requests: sampled gauge or, exactly, the queue-time histogram of the step.
    assert (top["max_waiting"] or 0) > 0 or (top["queue_time_mean_s"] or 0) > 0
    # A full KV cache: vLLM preempts only when no block can be allocated.
    assert top["kv_saturated"] and (top["preemptions"] or 0) > 0
    assert steps[1]["preemptions"] == 0 and not steps[1]["kv_saturated"]
    knee = result["details"]["knee"]
    assert knee is not None and knee < 8
    assert result["details"]["limits"]["max_num_seqs"] == knee
    findings = [Finding.from_dict(f) for f in result["findings"]]
    assert decide(findings).verdict in ("limited_observation", "expand_capacity")


def test_server_killed_mid_ramp(lab_server_factory, tmp_path: Path) -> None:
    server = lab_server_factory("", port=8025)
    probe = subprocess.Popen(cli("--base-url", server.base_url, "--out", str(tmp_path), "--server-pid",
                                 str(server.pid), "--server-log", str(server.log_path), "--set", "load.ramp=[1,2,4]",
                                 "--set", "load.requests_per_step=40", "--set", "load.output_tokens=64"),
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    first = tmp_path / "records" / "ramp_c1.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (first.exists() and first.stat().st_size > 0):
        time.sleep(0.5)
    assert first.exists(), "the ramp never started"
    os.killpg(server.pid, signal.SIGKILL)
    probe.wait(timeout=300)
    assert probe.returncode == 1
    result = result_of(tmp_path)
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    assert statuses["capacity.crash"] == "fail"
    assert statuses["capacity.soak"] == "missing" and statuses["capacity.mixed"] == "missing"
    record = json.loads((tmp_path / "oom_record.json").read_text())
    assert record["stage"].startswith("ramp_c") and record["log_tail"] and record["process_state"] == "exited"
    kept = [json.loads(line) for line in first.read_text().splitlines()]
    assert any(r["status"] == "ok" for r in kept)  # what was measured before the kill is on disk
    findings = [Finding.from_dict(f) for f in result["findings"]]
    assert decide(findings).verdict != "release"


def test_saturated_load_generator_makes_capacity_inconclusive(lab_server, tmp_path: Path) -> None:
    """The client self-check against the real server: with the profile's CPU limit at 0 every step's
    client counts as saturated (deterministic), so no capacity stage may pass or fail on its figures.
    (The passing side: test_normal_lab_ramp_has_no_preemption measures the same self-check with the
    profile's limits; tests/unit/test_loadgen_selfcheck.py judges a client that kept up.)"""
    small = ["--set", "load.ramp=[1,4]", "--set", "load.requests_per_step=4", "--set", "load.output_tokens=8",
             "--set", "load.soak_s=2"]
    proc = subprocess.run(cli("--base-url", lab_server.base_url, "--out", str(tmp_path / "sat"), *small,
                              "--set", "loadgen.max_cpu_pct=0"), cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # inconclusive
    result = result_of(tmp_path / "sat")
    by_check = {f["check"]: f for f in result["findings"]}
    for check in ("capacity.ramp", "capacity.mixed", "capacity.soak", "capacity.long_prompt"):
        assert by_check[check]["status"] == "inconclusive", by_check[check]
        assert by_check[check]["reason"].startswith("load generator saturated"), by_check[check]
        assert "worker processes" in by_check[check]["action"]
    assert by_check["capacity.loadgen"]["status"] == "inconclusive"
    assert all(s["client"]["saturated"] for s in result["details"]["steps"])
    assert decide([Finding.from_dict(f) for f in result["findings"]]).verdict == "incomplete"
