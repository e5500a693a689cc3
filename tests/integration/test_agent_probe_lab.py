"""The agent probe straight against the real lab vLLM: every check passes (hermes parser, strict
tool grammar) over enough turns to resolve the profile's thresholds, on either scenario pack; each
check fails on real behaviour: an image request to this text-only model, a fallback the model must
choose but ignores, a write whose idempotency key a sampling model writes anew on every retry."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from vllm_acceptance.probes.agent import solid_png_base64

from support.resolution import LAB_AGENT_5PCT, as_set_args

REPO = Path(__file__).resolve().parents[2]


def run_agent(server, out: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "agent", "--base-url",
                           server.base_url, "--model", "tiny-agent", "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    return proc.returncode, json.loads((out / "result.json").read_text())


@pytest.mark.lab
def test_every_agent_check_passes_on_the_lab(lab_accept_run: Path) -> None:
    """The session's accept run on the lab profile (conftest.lab_accept_run): its agent stage, as the report and
    the stage's evidence have it."""
    found = {f["check"]: f for f in json.loads((lab_accept_run / "report.json").read_text())["findings"]
             if f["check"].startswith("agent.")}
    statuses = {check: f["status"] for check, f in found.items()}
    stage = json.loads((lab_accept_run / "stages" / "agent.json").read_text())
    assert stage["status"] == "pass" and set(statuses.values()) == {"pass", "not_applicable"}, statuses
    assert statuses["agent.multimodal"] == "not_applicable"  # cpu-lab: agent.images false, said so
    rates = stage["rates"]
    assert rates["schema_accuracy"] == 1.0 and rates["format_error_rate"] == 0.0
    # The case set: >= 300 distinct bodies (every request and raw response kept in cases.json), each class
    # answered; the rates are over distinct cases, with their assumptions stated.
    kept = json.loads((lab_accept_run / "probes" / "agent" / "cases.json").read_text())["cases"]
    assert rates["distinct_bodies"] == len({json.dumps(c["request"], sort_keys=True) for c in kept}) >= 300
    assert all(c["response"] for c in kept) and "independent Bernoulli" in rates["assumptions"]
    assert set(rates["classes"]) == {"single", "parallel", "multi_turn", "irrelevance", "structured"}
    assert rates["repeats"]["consistent"] == rates["repeats"]["cases"] == 10
    # The lab model calls a tool whenever tools are offered: it never abstains (the lab threshold is 0, stated).
    assert rates["classes"]["irrelevance"]["abstained"] == 0 and rates["abstain_rate"] == 0.0
    # Zero errors in 299 distinct call cases bound the rate at <= 1 %.
    assert rates["runs"] >= 299 and rates["bounds"]["format_error_rate"]["upper_95"] <= 0.01
    assert rates["bounds"]["schema_accuracy"]["lower_95"] >= 0.99  # thresholds.schema_accuracy_min
    assert "agent.turn_budget=600 buys" in rates["resolution"]
    # The reference client saw every real call of the run; the planned fallback was walked step by step;
    # the structured-output rejection ran on a body the server really cut.
    executor = found["agent.executor_safety"]["observed"]
    assert executor["calls"] >= rates["runs"] and executor["writes"] and not executor["unsafe"]
    steps = [s["step"] for s in found["agent.tool_failure_fallback"]["observed"]["steps"]]
    assert steps == ["answer", "ticket", "ticket-resent", "final"]
    broken = found["agent.structured_output"]["observed"]["broken_body"]
    assert broken["finish_reason"] == "length" and broken["client_validation"] != "accepted"
    assert found["agent.stream_structure"]["status"] == "pass"


@pytest.mark.lab
def test_image_request_to_a_text_model_fails_with_a_layer(lab_server, tmp_path: Path) -> None:
    rc, result = run_agent(lab_server, tmp_path, "--set", "agent.images=true", "--set", "agent.turn_budget=8")
    mm = next(f for f in result["findings"] if f["check"] == "agent.multimodal")
    assert rc == 1 and mm["status"] == "fail" and mm["layer"] == "model"
    assert mm["evidence"] and (tmp_path / mm["evidence"][0]).is_file()


def test_the_probe_image_is_a_real_png() -> None:
    image = Image.open(io.BytesIO(base64.b64decode(solid_png_base64(8, (1, 2, 3)))))
    assert image.size == (8, 8) and image.getpixel((4, 4)) == (1, 2, 3)


@pytest.mark.lab
def test_the_second_scenario_pack_runs_with_its_own_tools(lab_server, tmp_path: Path) -> None:
    """shop-agent: other tools, another idempotency key, another ticket tool: nothing of ops-agent is
    hard-coded in the probe."""
    # The rehearsal profile's lab-only resolution (5 %: a case set of 60, profiles/rehearsal-gb300.yml): what this
    # test shows is another pack's tools, keys and ticket, not the 1 % resolution the lab's own run shows (the
    # shop pack's 300-case set took 90 s of the suite).
    rc, result = run_agent(lab_server, tmp_path, "--set", "agent.scenario=shop-agent", *as_set_args(LAB_AGENT_5PCT))
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    assert rc == 0 and result["status"] == "pass", statuses
    tools = {t["function"]["name"] for t in json.loads((tmp_path / "tool_schemas.json").read_text())}
    # The pack's tools and the two its case set adds (case_set.extra_tools: numbers, booleans, nested arrays).
    assert tools == {"lookup_order", "check_stock", "issue_refund", "open_case", "quote_shipping", "tag_order_lines"}
    executed = json.loads((tmp_path / "executor.json").read_text())
    # (The key names are redacted on disk: evidence redaction treats every "*key*" field as a secret.)
    assert set(executed["write_tools"]) == {"issue_refund", "open_case"}
    names = {c["call"]["function"]["name"] for c in executed["calls"]}
    assert names <= tools and "open_case" in names  # the fallback's ticket is the pack's own


def _pack(tmp_path: Path, **fallback: object) -> str:
    import yaml

    from vllm_acceptance.scenarios import load_scenario

    pack = load_scenario("ops-agent")
    pack["tasks"]["fallback"].update(fallback)
    path = tmp_path / "ops-agent-variant.yml"
    path.write_text(yaml.safe_dump(pack))
    return str(path)


@pytest.mark.lab
def test_a_fallback_the_model_must_choose_fails_when_the_answer_ignores_the_failure(lab_server, tmp_path) -> None:
    """The same pack with `driven_by: model`: the deployment itself must retry, open the ticket or say the
    tool failed. The lab model answers any tool result with its canned "Done: tool result received!"."""
    pack = _pack(tmp_path, driven_by="model")
    rc, result = run_agent(lab_server, tmp_path / "out", "--set", f"agent.scenario={pack}",
                           "--set", "agent.turn_budget=8")
    fallback = next(f for f in result["findings"] if f["check"] == "agent.tool_failure_fallback")
    assert rc == 1 and fallback["status"] == "fail" and fallback["layer"] == "model"
    assert "ignores the failure" in fallback["reason"] and "Done: tool result received!" in fallback["reason"]
    kept = json.loads((tmp_path / "out" / fallback["evidence"][0]).read_text())
    assert kept["request"]["messages"][-1]["role"] == "tool" and "timeout" in kept["request"]["messages"][-1]["content"]


@pytest.mark.lab
def test_a_write_key_written_anew_by_a_sampling_model_runs_the_write_twice(lab_server, tmp_path: Path) -> None:
    """At temperature 1 the model writes a fresh request_id into each create_ticket call: the reference
    client, re-sent one operation, executes the write more than once -> executor_safety, layer retry.
    The run is seeded (agent.seed): unseeded, the sampling model also writes arguments its schema refuses
    (the client refuses them, so the write runs once) in most runs; seed 2 is a run in which both answers
    are valid tickets. One request at a time: on vLLM's CPU backend a seeded request that chunked prefill
    splits stops the engine ("CPU Generator does not use offset"); alone, a lab prompt is never split."""
    rc, result = run_agent(lab_server, tmp_path, "--set", "agent.temperature=1.0", "--set", "agent.turn_budget=40",
                           "--set", "agent.seed=2", "--set", "agent.concurrency=1",
                           "--set", "agent.stream_cases=4")  # one at a time: few streamed twins
    safety = next(f for f in result["findings"] if f["check"] == "agent.executor_safety")
    assert rc == 1 and safety["status"] == "fail" and safety["layer"] == "retry", safety
    assert "the key came from the model, not from the client" in safety["reason"]
    calls = json.loads((tmp_path / "executor.json").read_text())["calls"]
    assert sum(c["executions"] for c in calls if c["call"]["function"]["name"] == "create_ticket") > 1
