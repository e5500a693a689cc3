"""The agent case set under load and against a reference, on the real lab vLLM (issue 29).

Small sets (the 0.2 thresholds of FEW_TURNS need 14 distinct call cases, plus 5 of the other classes): what
is shown is the comparison, not the rates (test_agent_probe_lab.py runs the full set of >= 300 cases).

* under load, healthy: the set again with 4 requests in flight gives the same results -> agent.under_load passes;
  the lab server as its own reference -> agent.reference_agreement passes at F1 1.0;
* a gateway that corrupts tool-call arguments only while >= 3 requests are in flight: served two at a time every
  idle check passes, with 4 in flight agent.under_load fails on the gateway layer (the direct server, under the
  same load, passes the same cases); the always-corrupting gateway fails the idle checks
  (test_agent_gateway_lab.py, change_arg_types);
* a reference that never calls tools (a gateway that moves every call into content): F1 0 -> fails;
* the lab model never abstains on the irrelevance cases: with a real deployment's threshold it fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_agent_gateway_lab import FEW_TURNS, failing, probe

from vllm_acceptance.core.findings import Status

pytestmark = pytest.mark.lab
ALONE = ("--set", "agent.concurrency=2")  # served alone: at most two in flight, below the gateway's three
# The 19 cases of FEW_TURNS are below the 36 a reference result needs by default (thresholds.reference_min_cases):
# what these tests show is the comparison, so the minimum is lowered to what they send.
FEW_REFERENCE = ("--set", "thresholds.reference_min_cases=10")


def test_healthy_under_load_and_its_own_reference(lab_server, tmp_path: Path) -> None:
    rc, result, findings = probe(lab_server.base_url, lab_server.model, tmp_path, *FEW_TURNS, "--under-load", "4",
                                 "--reference-url", lab_server.base_url, *FEW_REFERENCE)
    by = {f.check: f for f in findings}
    assert rc == 0 and not failing(findings), {f.check: f.status.value for f in findings}
    loaded = by["agent.under_load"]
    assert loaded.status == Status.PASS and loaded.observed["concurrency"] == 4
    assert loaded.observed["cases"] == result["details"]["rates"]["cases"] >= 19
    ref = by["agent.reference_agreement"]
    assert ref.status == Status.PASS and ref.observed["f1"] == 1.0 and ref.observed["argument_agreement"] == 1.0
    assert by["agent.reference_arguments"].status == Status.PASS
    kept = json.loads((tmp_path / "reference.json").read_text())["cases"]
    assert kept and all(c["reference_response"] for c in kept)
    assert result["details"]["rates"]["under_load"]["classes"]["single"]["cases"] >= 12
    # The streamed twins (agent.stream_tool_calls), alone and mixed into the under-load pass, carried their calls.
    stream = by["agent.stream_tool_calls"]
    assert stream.status == Status.PASS and stream.observed["under_load"]["compared"] >= 1, stream.reason


def test_a_gateway_that_corrupts_only_under_concurrency(lab_server, gateway, tmp_path: Path) -> None:  # noqa: F811
    url = gateway("change_arg_types_under_load", "--min-in-flight", "3")
    rc, result, findings = probe(url, lab_server.model, tmp_path, *FEW_TURNS, *ALONE, "--under-load", "4",
                                 "--direct-url", lab_server.base_url)
    statuses = {f.check: f.status.value for f in findings}
    assert rc == 1 and failing(findings) == {"agent.under_load": "gateway"}, statuses
    assert set(statuses.values()) == {"pass", "fail", "not_applicable"}
    loaded = next(f for f in findings if f.check == "agent.under_load")
    assert loaded.observed["concurrency"] == 4 and loaded.observed["broke_under_load"]
    assert "with 4 requests in flight" in loaded.reason and "gateway" in loaded.reason
    assert "violate the schema" in loaded.reason
    assert (tmp_path / "cases-under-load-direct.json").is_file()


def test_a_reference_that_never_calls_tools_and_a_model_that_never_abstains(lab_server, gateway,  # noqa: F811
                                                                              tmp_path: Path) -> None:
    reference = gateway("markup_in_content")  # every call moved into content: the reference calls no tool
    rc, result, findings = probe(lab_server.base_url, lab_server.model, tmp_path, *FEW_TURNS,
                                 "--reference-url", reference, "--set", "thresholds.tool_abstain_min=0.9",
                                 *FEW_REFERENCE)
    by = {f.check: f for f in findings}
    ref = by["agent.reference_agreement"]
    assert ref.status == Status.FAIL and ref.observed["f1"] == 0.0 and ref.observed["tp"] == 0
    # Every case the deployment answered with a call is a false positive against it; none a false negative.
    assert ref.observed["fp"] >= 12 and ref.observed["fn"] == 0
    trigger = by["agent.trigger_consistency"]
    assert trigger.status == Status.FAIL and trigger.layer == "model"
    assert "irrelevance cases: a tool was called" in trigger.reason
    assert rc == 1
