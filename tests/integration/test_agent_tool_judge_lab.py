"""Issue 44 items 2-4 against the real lab vLLM, through the gateway's fault modes (src/vllm_acceptance/lab/gateway.py):

* `swap_tool_name` (every call renamed to the write tool `create_ticket`): agent.tool_choice fails, severe, and
  with --direct-url the layer is the gateway's (the direct server never calls the wrong tools);
* `perturb_free_text` (a ticket's title changes from answer to answer, keys, enums and ids kept): with `--nth 2`
  in front of the deployment (a re-sent request worded anew) the repeats stay consistent (the difference is
  reported, no alarm); in front of the reference (every answer) the reference disagrees on arguments only
  (agent.reference_arguments fails, agent.reference_agreement passes);
* `refuse_after_nth` as a reference answering only 2 cases: both reference checks inconclusive, with the count.

Few turns, as in test_agent_gateway_lab.py (thresholds raised so 14 call cases resolve them); the lab profile's
LAB-ONLY wrong-write bound is raised to 0.5 here because this small set leaves the 0.25 of cpu-lab unresolved on
the lab model's own one or two write calls (parallel and irrelevance cases).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Finding, Status

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FEW_TURNS = ("--set", "thresholds.tool_format_error_rate=0.2", "--set", "thresholds.schema_accuracy_min=0.8",
             "--set", "agent.cases=1", "--set", "thresholds.wrong_write_tool_rate=0.5")


def probe(base_url: str, model: str, out: Path, *extra: str) -> tuple[dict, dict[str, Finding]]:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "agent", "--base-url", base_url,
                           "--model", model, "--out", str(out), *FEW_TURNS, *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert (out / "result.json").is_file(), proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    return result, {f["check"]: Finding.from_dict(f) for f in result["findings"]}


def failing(findings: dict[str, Finding]) -> dict[str, str | None]:
    return {c: f.layer for c, f in findings.items() if f.status == Status.FAIL}


def test_a_gateway_that_swaps_the_tool_name_fails_as_a_wrong_write_tool(lab_server, gateway, tmp_path) -> None:
    url = gateway("swap_tool_name", "--swap-to", "create_ticket")
    _, findings = probe(url, lab_server.model, tmp_path / "out", "--direct-url", lab_server.base_url)
    choice = findings["agent.tool_choice"]
    assert (choice.status, choice.layer) == (Status.FAIL, "gateway"), choice.reason
    assert "severe" in choice.reason and "create_ticket" in choice.reason
    assert choice.observed["wrong_write_tool"]["events"] > choice.observed["wrong_write_tool"]["n"] / 2


def test_free_text_that_differs_raises_no_alarm_but_disagrees_with_a_reference(lab_server, gateway,
                                                                               tmp_path) -> None:
    # The deployment: a request's first answer is the server's own, a re-sent one (a repeat) is worded anew.
    # The reference: every answer's free text changed (tools, keys, enums, ids the same).
    url = gateway("perturb_free_text", "--nth", "2")
    reference = gateway("perturb_free_text")
    _, findings = probe(url, lab_server.model, tmp_path / "out", "--reference-url", reference,
                        "--set", "thresholds.reference_min_cases=10",
                        "--set", "thresholds.reference_argument_min=0.99")
    trigger = findings["agent.trigger_consistency"]
    assert trigger.status == Status.PASS, trigger.reason
    assert trigger.observed["free_text_varied"], "no repeated case called a tool with free text: nothing was shown"
    assert "/title" in json.dumps(trigger.observed["free_text_varied"])
    assert findings["agent.reference_agreement"].status == Status.PASS, findings["agent.reference_agreement"].reason
    # arguments only: the one failure, on the model layer (the comparison cannot tell who rephrased)
    assert failing(findings) == {"agent.reference_arguments": "model"}, {
        c: f.reason[:300] for c, f in findings.items() if f.status == Status.FAIL}
    assert "/title" in findings["agent.reference_arguments"].reason
    assert findings["agent.tool_choice"].status == Status.PASS


def test_a_reference_answering_two_cases_is_inconclusive_with_the_count(lab_server, gateway, tmp_path) -> None:
    reference = gateway("refuse_after_nth", "--nth", "2")
    _, findings = probe(lab_server.base_url, lab_server.model, tmp_path / "out", "--reference-url", reference)
    for check in ("agent.reference_agreement", "agent.reference_arguments"):
        assert findings[check].status == Status.INCONCLUSIVE, (check, findings[check].reason)
        assert "only 2 case(s)" in findings[check].reason
