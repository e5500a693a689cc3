"""Capacity on the real lab: the normal lab holds the contract past it (knee, headroom); the pressure
configuration fails the KV readout, queues on a full cache, and its proposed limit is verified; a server
killed mid-ramp leaves a complete OOM/crash record with its stage classified, the records up to the kill,
and never a release."""

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
from vllm_acceptance.probes.load import STAGE_LABELS
from vllm_acceptance.probes.load.rules import OOM_RECORD_FIELDS, oom_action
from vllm_acceptance.verdict import decide

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lab


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_acceptance.cli", "probe", "load", "--model", "tiny-agent", *args]


def result_of(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


def test_normal_lab_holds_the_contract_with_knee_and_headroom(lab_server, tmp_path: Path) -> None:
    """Default cpu-lab profile on the normal lab: every stage passes; the ramp goes past the contract."""
    started = time.time()
    proc = subprocess.run(cli("--base-url", lab_server.base_url, "--out", str(tmp_path), "--server-pid",
                              str(lab_server.pid), "--server-log", str(lab_server.log_path), "--set",
                              "load.soak_s=8"), cwd=REPO, capture_output=True, text=True, timeout=900)
    print(f"capacity stage, normal lab: {time.time() - started:.0f} s")
    result = result_of(tmp_path)
    details = result["details"]
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    print("normal lab:", details["knee_text"], "| limit:", details["limits"])
    steps = details["steps"]
    if statuses["capacity.loadgen"] != "pass":  # the client could not keep up (a loaded machine)
        # Every stage that ran on a saturated client gives no verdict; the others stand (a soak on a starved
        # client says nothing about the ramp before it).
        loadgen = next(f for f in result["findings"] if f["check"] == "capacity.loadgen")
        saturated = [label for label, c in loadgen["observed"].items() if c["saturated"]]
        assert statuses["capacity.loadgen"] == "inconclusive" and saturated, loadgen
        for check, prefix in STAGE_LABELS.items():
            if any(label.startswith(prefix) for label in saturated):
                assert statuses[check] != "pass", (check, saturated, statuses)
        return
    # The cache holds the contract and more: no step is short of KV, none preempts, none errs.
    assert all(s["preemptions"] == 0 and s["errors"] == 0 and not s["kv_saturated"] for s in steps), steps
    for check in ("capacity.kv_capacity", "capacity.long_prompt", "capacity.context_contract", "capacity.mixed",
                  "capacity.soak"):
        assert statuses[check] == "pass", (check, statuses, proc.stdout)
    if statuses["capacity.ramp"] == "pass":
        # Past the contract until a limit broke or the bound: knee and headroom shown.
        assert statuses["capacity.verified_limit"] == "not_applicable"
        assert [s["concurrency"] for s in steps][:4] == [1, 2, 4, 8]
        assert details["knee"] >= 4 and details["headroom"] == details["knee"] / 4
    else:
        # Latency is this shared machine's (2 cores for every session), not the deployment's KV: a break below
        # the contract is on a latency or queue SLO, and the proposed limit was re-run, not just printed.
        assert details["broke_on"] in ("ttft_p95", "itl_p95", "e2e_p95", "queue_p95"), details["knee_text"]
        assert details["limit_attempts"] and statuses["capacity.verified_limit"] in ("pass", "fail")
    kv = next(f for f in result["findings"] if f["check"] == "capacity.kv_capacity")
    assert kv["observed"]["kv_cache_tokens"] >= 4 * (1984 + 64) and kv["observed"]["max_concurrency_at_contract"] >= 4
    # The contracted shape: half the ramp at the contracted context, counted by the server's /tokenize.
    workload = json.loads((tmp_path / "workload.json").read_text())
    ctx = [r for r in workload["requests"] if r["tag"].startswith("ramp_c4-ctx")]
    # Within a word of the target (one word can be several tokens).
    assert workload["tokenize"] is True and ctx and all(1980 <= r["counted_tokens"] <= 1984 for r in ctx)
    contract = json.loads((tmp_path / "context_contract.json").read_text())
    assert contract["over_contract"]["prompt_tokens"] > 2048 and contract["over_contract"]["http_status"] == 400
    assert contract["at_contract"]["http_status"] == 200
    long = next(f for f in result["findings"] if f["check"] == "capacity.long_prompt")["observed"]
    assert long["prefill_peak_bytes"] and long["decode_peak_bytes"]  # prefill vs decode memory, RSS in the lab
    memory = details["memory_timeline"]
    # the pid's RSS, and the server's own from its /metrics (issue 42 item 4: what a container hides from a pid)
    assert {m["label"] for m in memory} == {"process RSS (no GPU)",
                                            "server RSS from its /metrics (process_resident_memory_bytes)"}
    assert all(s["peak_memory_bytes"] for s in steps)
    soak = next(f for f in result["findings"] if f["check"] == "capacity.soak")["observed"]
    assert soak["restarts"] == [] and soak["log_observed"] and soak["comm_errors"] == []
    assert (tmp_path / "samples.jsonl").stat().st_size > 0 and (tmp_path / "records" / "ramp_c4.jsonl").exists()
    # Every step carries the client's own measured self-check (its verdict depends on this shared machine).
    for step in steps:
        (worker,) = step["client"]["processes"]
        assert worker["cpu_s"] > 0 and worker["chunks"] > 0 and worker["loop_lag_s"]["count"] > 0
        assert step["client"]["send_lag_s"]["count"] == step["requests"]
    assert "capacity.loadgen" in statuses and (tmp_path / "client.json").is_file()


def test_pressure_configuration_fails_kv_capacity_and_verifies_a_limit(lab_pressure_server, tmp_path: Path) -> None:
    """--max-num-seqs 4 --num-gpu-blocks-override 24 (3,072 KV tokens) with the default cpu-lab contract
    (4 x (1,984 + 64) = 8,192 tokens): the readout fails the contract with its numbers, the ramp at the
    contracted shape waits on a full cache, and the run at the proposed limit decides the verdict."""
    server = lab_pressure_server
    started = time.time()
    proc = subprocess.run(cli("--base-url", server.base_url, "--out", str(tmp_path), "--server-pid", str(server.pid),
                              "--server-log", str(server.log_path), "--set", "load.soak_s=5"),
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    print(f"capacity stage, pressure lab: {time.time() - started:.0f} s")
    result = result_of(tmp_path)
    found = {f["check"]: f for f in result["findings"]}
    kv = found["capacity.kv_capacity"]
    assert kv["status"] == "fail", proc.stdout
    assert kv["observed"]["kv_cache_tokens"] == 3072 and kv["observed"]["needed_tokens"] == 8192
    assert kv["observed"]["max_concurrency_at_contract"] == 1 and "3072" in kv["reason"]
    steps = {s["concurrency"]: s for s in result["details"]["steps"]}
    top = steps[4]
    # Waiting requests (sampled gauge or, exactly, the queue-time histogram) on a cache too small for the next
    # session: real vLLM queues the contracted sessions rather than preempting them.
    assert (top["max_waiting"] or 0) > 0 or (top["queue_time_mean_s"] or 0) > 0
    assert top["kv_saturated"] and "kv_saturated" in top["breaches"]
    assert steps[1]["preemptions"] == 0 and not steps[1]["kv_saturated"]
    details = result["details"]
    assert details["knee"] is not None and details["knee"] < 4
    print("pressure lab:", details["knee_text"], "| limit:", details["limits"], "| attempts:",
          [(a["setting"]["kind"], a["held"], a["breaches"]) for a in details["limit_attempts"]])
    verified = found["capacity.verified_limit"]
    findings = [Finding.from_dict(f) for f in result["findings"]]
    if found["capacity.loadgen"]["status"] != "pass":  # the client could not keep up (a loaded machine)
        assert found["capacity.loadgen"]["status"] == "inconclusive", found["capacity.loadgen"]
        assert decide(findings).verdict == "incomplete", decide(findings).reasons  # it decides nothing
    elif verified["status"] == "pass":  # the run at the limit held: the limit is the recommendation
        assert details["limits"]["max_num_seqs"] == details["limit_attempts"][-1]["setting"]["max_num_seqs"] <= 1
        assert kv["consequence"] == "limited_observation" and found["capacity.ramp"]["consequence"] == kv["consequence"]
        assert found["capacity.soak"]["configuration"]["concurrency"] == details["limits"]["client_concurrency"]
        assert decide(findings).verdict == "limited_observation", decide(findings).reasons
    else:  # refuted: every admissible setting failed
        assert verified["status"] == "fail" and details["limits"] == {} and len(details["limit_attempts"]) >= 1
        assert decide(findings).verdict == "expand_capacity"


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
    # A SIGKILL leaves no OOM line: the death proves nothing about capacity (docs/checks.md capacity.crash),
    # so the stage is inconclusive (exit 3) and the run can only be incomplete, never a release.
    assert probe.returncode == 3
    result = result_of(tmp_path)
    found = {f["check"]: f for f in result["findings"]}
    statuses = {check: f["status"] for check, f in found.items()}
    assert statuses["capacity.crash"] == "inconclusive"
    reason = found["capacity.crash"]["reason"]
    assert "ramp_c" in reason and "HTTP/1.1" not in reason  # the first failed request's error, not an access line
    assert statuses["capacity.soak"] == "missing" and statuses["capacity.mixed"] == "missing"
    record = json.loads((tmp_path / "oom_record.json").read_text())
    assert record["probe_stage"].startswith("ramp_c") and record["log_tail"] and record["process_state"] == "exited"
    assert record["gaps"] == [] and set(OOM_RECORD_FIELDS) <= set(record)
    # Concurrency 1 in the ramp: the request in flight was in prefill or decode, the model was loaded.
    assert record["model_loaded"] is True and record["stage"] in ("long_prefill", "decode"), record["stage_evidence"]
    assert record["action"] == oom_action(record["stage"]) and record["in_flight"]
    assert record["prefix_caching"] == "True" and record["max_model_len"] == 2048
    assert record["memory_timeline"]["before"] and record["memory_timeline"]["after"] == []
    kept = [json.loads(line) for line in first.read_text().splitlines()]
    assert any(r["status"] == "ok" for r in kept)  # what was measured before the kill is on disk
    findings = [Finding.from_dict(f) for f in result["findings"]]
    assert decide(findings).verdict == "incomplete", decide(findings).reasons


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


def test_a_launched_server_is_relaunched_at_the_proposed_limit(lab_launch_run: dict) -> None:
    """accept.yml launches the lab in the pressure configuration (conftest.lab_launch_run: the cache and load
    probes): the contract does not hold, so the load stage stops after the ramp, the server this run launched is
    relaunched with the proposed limit's flags, and the limit is measured on a server that enforces it; the mixed
    stream and the soak run at the limit that held. The relaunched server is the one stopped at the end."""
    run_dir = lab_launch_run["run_dir"]
    print(f"accept.yml, pressure lab launched, restarted for the cache and relaunched at its limit: "
          f"{lab_launch_run['seconds']:.0f} s")
    stage = json.loads((run_dir / "stages" / "load.json").read_text())
    found = {f["check"]: f for f in json.loads((run_dir / "findings" / "load.json").read_text())}
    assert "relaunch_point" not in stage, "the stage still waits for a relaunch"
    assert found["capacity.kv_capacity"]["status"] == "fail"
    first = stage["limit_attempts"][0]
    assert first["setting"]["max_num_seqs"] == 1 and first["mode"] == "server relaunched with --max-num-seqs 1"
    relaunch = [json.loads(line) for line in (run_dir / "probes" / "load" / "relaunch.jsonl").read_text().splitlines()]
    assert relaunch[0]["flags"] == ["--max-num-seqs", "1"] and relaunch[0]["error"] is None
    assert "ready after" in relaunch[0]["log"] and "--max-num-seqs 4" not in relaunch[0]["log"]
    # the server measured at the limit is a new process that enforces it: vLLM's own non-default args say so
    log = (lab_launch_run["state_dir"] / "vllm.log").read_text()
    assert "'max_num_seqs': 1" in log and "'num_gpu_blocks_override': 24" in log, log[:3000]
    verified = found["capacity.verified_limit"]
    decision = decide([Finding.from_dict(f) for f in found.values()])  # the load stage alone
    print("verified limit:", verified["status"], verified["reason"], "| load verdict:", decision.verdict)
    if found["capacity.loadgen"]["status"] != "pass":  # the client could not keep up (a loaded machine)
        assert decision.verdict == "incomplete"
    elif found["capacity.soak"]["status"] in ("inconclusive", "missing"):
        # a soak step that lacked samples on a loaded machine (CI, 2026-12-03) is inconclusive, never a pass: the
        # run is incomplete for that reason alone, the limit itself having been relaunched and measured above
        assert decision.verdict == "incomplete" and decision.reasons == [
            "missing or inconclusive evidence: capacity.soak"], decision.reasons
        assert found["capacity.soak"]["reason"], found["capacity.soak"]
    elif verified["status"] == "pass":
        assert "(server relaunched with --max-num-seqs 1)" in verified["reason"]
        assert stage["limits"]["serving_flags"] == "--max-num-seqs 1"
        assert found["capacity.soak"]["configuration"]["concurrency"] == 1
        assert decision.verdict == "limited_observation", decision.reasons
    else:
        assert verified["status"] == "fail" and decision.verdict == "expand_capacity"
    record = json.loads((run_dir / "stages" / "teardown.json").read_text())
    assert record["action"] == "stopped" and record["gone"] is True


@pytest.mark.full
def test_limits_refuted_on_the_relaunched_server_mean_expand_capacity(tmp_path: Path) -> None:
    """The same launch under an end-to-end SLO of 50 ms that no step meets: no concurrency holds, the proposed
    context limit (4 sessions of 704 + 64 tokens) is relaunched with --max-num-seqs 4 --max-model-len 768 and
    breaks too: every admissible setting failed on a server that enforced it, so capacity must grow. The mixed
    stream and the soak run at that last setting, which the relaunched server can serve."""
    import yaml
    from conftest import PRESSURE_ARGS, lab_skip_reason

    from support.accept import run_accept

    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    profile = yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text())
    profile["name"] = "cpu-lab-strict-e2e"
    profile["contract"]["slo"]["e2e_p95_s"] = 0.05
    path = tmp_path / "cpu-lab-strict-e2e.yml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    port = 8030 + int(os.environ.get("LAB_PORT_OFFSET", "0"))
    run_dir = run_accept(tmp_path, {"acceptance_profile": str(path), "acceptance_probes": ["load"],
                                    "vllm_serve_port": port, "vllm_serve_state_dir": str(tmp_path / "server"),
                                    "vllm_serve_extra_args": PRESSURE_ARGS.split(),
                                    "acceptance_probe_overrides": {"load": {"load.soak_s": 5}}})
    stage = json.loads((run_dir / "stages" / "load.json").read_text())
    found = {f["check"]: f for f in json.loads((run_dir / "findings" / "load.json").read_text())}
    assert "relaunch_point" not in stage and stage["knee"] is None
    attempts = stage["limit_attempts"]
    assert [a["mode"] for a in attempts] == ["server relaunched with --max-num-seqs 4 --max-model-len 768"], attempts
    assert not attempts[0]["held"] and "e2e_p95" in " ".join(attempts[0]["breaches"]), attempts[0]
    assert "'max_model_len': 768" in (tmp_path / "server" / "vllm.log").read_text()
    verified = found["capacity.verified_limit"]
    decision = decide([Finding.from_dict(f) for f in found.values()])
    print("refuted limit:", verified["reason"], "| load verdict:", decision.verdict, decision.reasons)
    if found["capacity.loadgen"]["status"] != "pass":
        assert decision.verdict == "incomplete"
        return
    assert verified["status"] == "fail" and verified["consequence"] == "expand_capacity"
    assert decision.verdict == "expand_capacity", decision.reasons
    # measured at the setting the relaunched server runs, not at a context it now rejects
    assert found["capacity.soak"]["configuration"]["concurrency"] == 4
    mixed = json.loads((run_dir / "probes" / "load" / "mixed.json").read_text())
    assert mixed["context_tokens"] == 704 and all(w["errors"] == 0 for w in mixed["windows"]), mixed
