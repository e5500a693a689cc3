"""The lab P/D deployment for real (issue 45 items 1 and 5; docs/lab.md "Disaggregated prefill/decode"): accept.yml on
inventories/lab-pd launches a prefill and a decode server of the real vLLM CPU build joined by NIXL (CPU buffers)
behind vllm-router, the recipe's router, and reaches a verdict about the router's URL; the requests went through the
router, the prefill pool computed the prompts and the decode pool loaded them over the connector (their own
counters). A decode server whose connector is missing computes the prompts itself, and that shows in the same
counters; a stopped prefill server makes the router fail loudly while decode stays up.

One deployment serves the module: the run launches it and keeps it (stop_at_end false), the module stops it. What
these tests read is the hook the P/D path checks read (stages/serve.json `entry_point`, `pools`: ProbeOptions.pools);
the checks themselves (`quality.` findings) are another module's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import REPO, _skip_or_fail, lab_skip_reason

from support.accept import run_accept

pytestmark = pytest.mark.lab

LAB_BIN = REPO / ".venv-lab" / "bin"
VERDICTS = {"release", "limited_observation", "rebuild_environment", "expand_capacity", "incomplete"}
PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


def _pd_skip_reason() -> str | None:
    reason = lab_skip_reason()
    if reason:
        return reason
    if not (LAB_BIN / "vllm-router").is_file():
        return f"no vllm-router in {LAB_BIN}: run `make lab-venv` (it installs vllm-router and nixl, docs/lab.md)"
    probe = subprocess.run([str(LAB_BIN / "python"), "-c", "import nixl._api"], capture_output=True, timeout=120)
    if probe.returncode != 0:
        return f"the lab venv cannot import nixl: run `make lab-venv` ({probe.stderr.decode()[-200:]})"
    return None


def counters(metrics_url: str) -> dict[str, float]:
    """The pool's prompt-token sources, generation tokens and NIXL counters from its /metrics."""
    text = httpx.get(metrics_url, timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'^vllm:prompt_tokens_by_source_total\{.*source="([a-z_]+)".*\} ([0-9.e+]+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
        m = re.match(r"^(vllm:(?:generation_tokens_total|nixl_bytes_transferred_count|"
                     r"nixl_num_failed_transfers_total))\{.*\} ([0-9.e+]+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def router_counts(metrics_url: str) -> dict[str, float]:
    text = httpx.get(metrics_url, timeout=10).text
    return {f"{m.group(1)}@{m.group(2)}": float(m.group(3)) for m in re.finditer(
        r'^vllm_router_pd_(prefill|decode)_requests_total\{worker="([^"]+)"\} ([0-9.]+)$', text, re.M)}


def complete(entry_point: str, prompt: str = PROMPT, readmit_s: float = 0) -> httpx.Response:
    """One greedy completion through the router; `readmit_s`: after a pool server was started again, how long the
    router may answer 503 "No available workers" until its health check takes the server back (profiles/lab-pd.yml
    checks every 5 s)."""
    deadline = time.monotonic() + readmit_s
    while True:
        response = httpx.post(f"{entry_point}/completions", timeout=300, json={
            "model": "tiny-agent", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(2)


def shell(command: str) -> dict:
    proc = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, timeout=900)  # noqa: S602
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pd_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    reason = _pd_skip_reason()
    if reason:
        _skip_or_fail(reason)
    work = tmp_path_factory.mktemp("pd")
    state = work / "server"
    try:
        # `make test-full`: the inventory as copied, every probe and the quality probe (a release takes the agent
        # probe's ~300 turns and the load ramp through both pools: ~10 min on 2 cores); the default suite runs the
        # quality probe alone (its P/D path checks and parity), the other stages then missing by design
        settings = {"vllm_serve_state_dir": str(state), "vllm_serve_stop_at_end": False}
        if not os.environ.get("ACCEPTANCE_FULL"):
            settings["acceptance_probes"] = ["quality"]
        run_dir = run_accept(work, settings, env={"VLLM_API_KEY": ""}, inventory="lab-pd")
        serve = json.loads((run_dir / "stages" / "serve.json").read_text())
        record = json.loads((state / "pd" / "pd-serve.json").read_text())
        yield {"run_dir": run_dir, "serve": serve, "record": record, "state": state}
    finally:
        subprocess.run([sys.executable, "-m", "vllm_acceptance.serve.pools", "down", "--state-dir", str(state / "pd")],
                       cwd=REPO, capture_output=True, timeout=300)


def test_the_path_and_parity_checks_pass_on_the_healthy_pd_deployment(pd_run: dict) -> None:
    """quality.parity against a prefill instance called directly (the aggregated path of the same weights), and the
    path proven from each pool's own counters, the prefill stopped and started again through its commands."""
    report = json.loads((pd_run["run_dir"] / "report.json").read_text())
    findings = {f["check"]: f for f in report["findings"]}
    for check in ("quality.parity", "quality.reference", "quality.pd_prefill_served", "quality.pd_decode_loaded",
                  "quality.pd_transfer_failures", "quality.pd_prefill_stopped"):
        assert findings[check]["status"] == "pass", (check, findings[check])
    assert findings["quality.pd_prefill_stopped"]["observed"]["during"][0]["outcome"] == "loud"


@pytest.mark.full
def test_the_inventory_as_copied_releases(pd_run: dict) -> None:
    report = json.loads((pd_run["run_dir"] / "report.json").read_text())
    statuses = {f["check"]: f["status"] for f in report["findings"]}
    assert report["verdict"] == "release", {c: s for c, s in statuses.items() if s not in ("pass", "not_applicable")}
    # the cache probe read the prefill pool's engine (where prompts are computed and cached), not the router's
    findings = {f["check"]: f for f in report["findings"]}
    prefill_metrics = pd_run["record"]["pools"]["prefill"][0]["metrics_url"]
    assert statuses.get("cache.metrics") == "pass" and prefill_metrics in findings["cache.metrics"]["reason"]
    assert statuses.get("cache.hot_reuse") == "pass" and statuses.get("capacity.ramp") == "pass"


def test_accept_on_the_lab_pd_inventory_judges_the_router_and_both_pools_served(pd_run: dict) -> None:
    report = json.loads((pd_run["run_dir"] / "report.json").read_text())
    assert report["verdict"] in VERDICTS
    serve, record = pd_run["serve"], pd_run["record"]
    # the entry point users call is the router, and the serve stage records both pools (ProbeOptions.pools)
    assert serve["entry_point"] == serve["base_url"] == record["entry_point"] == "http://127.0.0.1:8603/v1"
    assert [i["base_url"] for i in serve["pools"]["prefill"]] == ["http://127.0.0.1:8601/v1"]
    assert [i["base_url"] for i in serve["pools"]["decode"]] == ["http://127.0.0.1:8602/v1"]
    prefill_url = serve["pools"]["prefill"][0]["metrics_url"]
    decode_url = serve["pools"]["decode"][0]["metrics_url"]
    before_p, before_d = counters(prefill_url), counters(decode_url)
    routed = router_counts(record["router"]["metrics_url"])
    response = complete(record["entry_point"])
    assert response.status_code == 200, response.text
    after_p, after_d = counters(prefill_url), counters(decode_url)
    # the request went through the router: one prefill and one decode request, each to its pool's server
    routed_after = router_counts(record["router"]["metrics_url"])
    for key in ("prefill@http://127.0.0.1:8601", "decode@http://127.0.0.1:8602"):
        assert routed_after[key] - routed.get(key, 0.0) == 1
    prompt = response.json()["usage"]["prompt_tokens"]
    # prefill computed the prompt; decode loaded it over NIXL, computed none of it, and generated the answer
    assert after_p["local_compute"] - before_p["local_compute"] == prompt
    assert after_d["external_kv_transfer"] - before_d["external_kv_transfer"] == prompt
    assert after_d["local_compute"] == before_d["local_compute"]
    assert after_d["vllm:nixl_bytes_transferred_count"] > before_d["vllm:nixl_bytes_transferred_count"]
    assert after_d["vllm:nixl_num_failed_transfers_total"] == 0
    assert after_d["vllm:generation_tokens_total"] - before_d["vllm:generation_tokens_total"] == 8


def test_a_decode_server_without_the_connector_shows_in_its_counters(pd_run: dict) -> None:
    """The fault: decode relaunched without --kv-transfer-config (the plan's args edited, as a site that dropped
    it); the router still answers, but decode computes the whole prompt itself and loads nothing."""
    record, state = pd_run["record"], pd_run["state"] / "pd"
    decode = record["pools"]["decode"][0]
    assert shell(decode["stop_command"])["stopped"] is True
    plan_path = state / "pd-plan.json"
    plan = json.loads(plan_path.read_text())
    original = plan_path.read_text()
    for inst in plan["instances"]:
        if inst["name"] == "decode-0":
            inst["args"] = [a for a in inst["args"] if not a.startswith("--kv-transfer-config")]
    plan_path.write_text(json.dumps(plan))
    try:
        shell(decode["start_command"])
    finally:
        plan_path.write_text(original)
    before = counters(decode["metrics_url"])
    response = complete(record["entry_point"], PROMPT + "A different tail.", readmit_s=120)
    assert response.status_code == 200, response.text
    after = counters(decode["metrics_url"])
    assert after["local_compute"] - before["local_compute"] == response.json()["usage"]["prompt_tokens"]
    assert after.get("external_kv_transfer", 0.0) == before.get("external_kv_transfer", 0.0)
    assert "vllm:nixl_bytes_transferred_count" not in after          # no connector: no NIXL series at all
    # ... and the product's check names it: the quality probe on the same deployment (no stop this time)
    out = pd_run["state"].parent / "probe-misconfigured"
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "quality", "--base-url",
                           record["entry_point"], "--model", "tiny-agent", "--out", str(out), "--profile",
                           str(REPO / "profiles" / "lab-pd.yml"), "--pools", f"@{state / 'pd-serve.json'}",
                           "--set", "quality.pd_stop_prefill=false", "--set", "quality.long_prompt_tokens=0"],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    findings = {f["check"]: f for f in json.loads((out / "result.json").read_text())["findings"]}
    loaded = findings["quality.pd_decode_loaded"]
    assert loaded["status"] == "fail", (loaded, proc.stderr[-2000:])


def test_a_stopped_prefill_server_fails_requests_loudly_and_decode_survives(pd_run: dict) -> None:
    record = pd_run["record"]
    prefill, decode = record["pools"]["prefill"][0], record["pools"]["decode"][0]
    assert shell(prefill["stop_command"])["stopped"] is True
    response = complete(record["entry_point"])
    assert response.status_code >= 500 and "Prefill request" in response.text
    assert httpx.get(decode["base_url"].removesuffix("/v1") + "/health", timeout=10).status_code == 200
