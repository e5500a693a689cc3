"""Issue 6 fault tests: a corrupting gateway in front of the real lab vLLM, one mode at a time.

Each mode must make the agent probe (the real CLI) fail exactly the checks it breaks and name the
layer: with `--direct-url` the direct server answers the same requests cleanly, so the defect is
the gateway's; without it the probe can only read the defect's signature (markup in content: the
parser; a schema violation: the model). The pass-through gateway raises no alarm; markup on one
response in five gives a rate whose bound the profile's threshold judges; markup on one in twenty
under a 10 % threshold, every error recovered by the validated retry, is a limited observation.

The fault cases judge fewer turns than the cpu-lab profile: their thresholds are raised to 20 % (and
schema accuracy 80 %), which 14 error-free turns resolve, so a check the fault does not touch passes
instead of staying unresolved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.verdict import decide

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
GATEWAY = "the direct server (--direct-url) answers the same request cleanly"


def probe(base_url: str, model: str, out: Path, *extra: str, timeout_s: int = 240) -> tuple[int, dict, list[Finding]]:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "agent", "--base-url", base_url,
                           "--model", model, "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    assert (out / "result.json").is_file(), proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    findings = [Finding.from_dict(f) for f in result["findings"]]
    # The report schema needs a layer on every failed agent finding.
    assert all(f.layer for f in findings if f.status == Status.FAIL), [f.check for f in findings if not f.layer]
    return proc.returncode, result, findings


def failing(findings: list[Finding]) -> dict[str, str | None]:
    return {f.check: f.layer for f in findings if f.status == Status.FAIL}


# agent.tool_choice too: the case set's `required` and named cases get no tool_calls when the call is moved into
# content (re-sent to a direct server, they honour it: the gateway).
MARKUP_CHECKS = ("agent.tool_call", "agent.schema_accuracy", "agent.trigger_consistency", "agent.separation",
                 "agent.stream_consistency", "agent.stream_structure", "agent.multi_turn",
                 "agent.tool_failure_fallback", "agent.tool_choice")
STREAM_CHECKS = ("agent.stream_consistency", "agent.stream_structure", "agent.stream_tool_calls")
ARGUMENT_CHECKS = ("agent.tool_call", "agent.schema_accuracy", "agent.tool_failure_fallback")
FEW_TURNS = ("--set", "thresholds.tool_format_error_rate=0.2", "--set", "thresholds.schema_accuracy_min=0.8",
             "--set", "agent.cases=1",  # the case set as small as the 0.2 threshold allows (14 call cases)
             "--set", "agent.stream_cases=4")  # 4 of them streamed too (agent.stream_tool_calls), in every pass

# (mode, through --direct-url?, {failing check: layer}) -- nothing else may fail.
CASES = [
    ("markup_in_content", False, dict.fromkeys(MARKUP_CHECKS, "parser")),
    ("markup_in_content", True, {**dict.fromkeys(MARKUP_CHECKS, "gateway"), "agent.gateway": "gateway"}),
    ("drop_stream_tool_calls", False, dict.fromkeys(STREAM_CHECKS, "parser")),
    ("drop_stream_tool_calls", True, dict.fromkeys(STREAM_CHECKS, "gateway")),
    # A streamed call split in two by its index: the deltas' structure and the assembled calls break.
    ("shift_stream_index", False, dict.fromkeys(STREAM_CHECKS, "parser")),
    ("shift_stream_index", True, dict.fromkeys(STREAM_CHECKS, "gateway")),
    # Reasoning text repeated in content is the gateway's signature even without a direct reference.
    ("reasoning_into_content", False, dict.fromkeys(
        ("agent.separation", "agent.stream_consistency", "agent.structured_output"), "gateway")),
    # Every call's arguments change type: the rates, and the fallback's ticket (a schema-invalid write the
    # reference client refuses: executor_safety holds).
    ("change_arg_types", False, dict.fromkeys(ARGUMENT_CHECKS, "model")),
    ("change_arg_types", True, {**dict.fromkeys(ARGUMENT_CHECKS, "gateway"), "agent.gateway": "gateway"}),
    # finish_reason dropped: the client library loses it, and a body cut by max_tokens arrives unmarked.
    ("drop_field", False, {"agent.client_library": "client", "agent.structured_output": "gateway"}),
    ("drop_field", True, {"agent.client_library": "gateway", "agent.gateway": "gateway",
                          "agent.structured_output": "gateway"}),
]


def test_passthrough_gateway_raises_no_alarm(lab_server, gateway, tmp_path: Path) -> None:
    url = gateway("passthrough")
    rc, result, findings = probe(url, lab_server.model, tmp_path / "out", "--direct-url", lab_server.base_url)
    assert rc == 0 and result["status"] == "pass"
    # Everything passes; the image case is not applicable on the text-only lab profile (and says so).
    # (Nor are the case set under load and against a reference, neither asked for here.)
    not_asked = ("agent.multimodal", "agent.under_load", "agent.reference_agreement", "agent.reference_arguments")
    assert {f.status for f in findings if f.check not in not_asked} == {Status.PASS}, failing(findings)
    assert {f.status for f in findings if f.check in not_asked} == {Status.NOT_APPLICABLE}
    assert {"agent.gateway", "agent.client_library", "agent.tool_call"} <= {f.check for f in findings}
    assert decide(findings).gates["agent"]["open"] is True


@pytest.mark.parametrize(("mode", "direct", "expected"), CASES,
                         ids=[f"{m}-{'direct' if d else 'alone'}" for m, d, _ in CASES])
def test_each_fault_fails_its_checks_on_its_layer(lab_server, gateway, tmp_path: Path, mode: str, direct: bool,
                                                  expected: dict[str, str]) -> None:
    url = gateway(mode)
    extra = ["--direct-url", lab_server.base_url] if direct else []
    rc, result, findings = probe(url, lab_server.model, tmp_path / "out", *extra, *FEW_TURNS)
    assert rc == 1 and result["status"] == "fail"
    assert failing(findings) == expected
    by_check = {f.check: f for f in findings}
    if direct:
        for check, layer in expected.items():
            if layer == "gateway" and check != "agent.gateway":
                assert GATEWAY in by_check[check].reason, (check, by_check[check].reason)
    if mode == "change_arg_types":
        assert result["details"]["rates"]["schema_accuracy"] == 0.0
        if direct:
            assert any("arguments(parsed)" in d and "str became list" in d for d in by_check["agent.gateway"].observed)
    if mode == "drop_field" and direct:
        assert "/choices/0/finish_reason: missing" in by_check["agent.gateway"].observed
    if mode == "drop_field":
        broken = by_check["agent.structured_output"].observed["broken_body"]
        assert broken["finish_reason"] is None and broken["client_validation"] != "accepted"
    if mode == "change_arg_types":
        executor = by_check["agent.executor_safety"].observed
        assert executor["invalid"] > 0 and executor["refusals"][0][0] == "schema_violation"
    if mode == "shift_stream_index":
        assert any("carries no id" in p for p in by_check["agent.stream_structure"].observed)
    # Plain text is not the agent's business: the verdict blocks agent traffic only -- except where the
    # fault leaves a check without evidence: without finish_reason the schema accuracy (defined over
    # finish_reason tool_calls) cannot be computed, so that run is incomplete.
    decision = decide(findings)
    assert decision.gates["agent"]["open"] is False
    assert decision.verdict == ("incomplete" if mode == "drop_field" else "limited_observation")
    if mode == "drop_field":
        assert by_check["agent.schema_accuracy"].status == Status.INCONCLUSIVE


def test_a_gateway_that_drops_tool_results_fails_the_turns_after_them(lab_server, gateway, tmp_path: Path) -> None:
    """A gateway that does not carry `tool` messages: the single-turn checks pass, but the second turn of the
    conversation reaches the server without its tool result (its prompt is shorter than the server's own
    rendering of what was sent), and the fallback never sees the failure it must answer."""
    rc, result, findings = probe(gateway("drop_tool_results"), lab_server.model, tmp_path / "out",
                                 "--direct-url", lab_server.base_url, *FEW_TURNS)
    assert rc == 1 and failing(findings) == {"agent.multi_turn": "gateway", "agent.tool_failure_fallback": "gateway"}
    turn = next(f for f in findings if f.check == "agent.multi_turn")
    assert turn.observed["prompt_tokens"] < turn.observed["rendered_tokens"], turn.observed
    assert "dropped or rewritten" in (turn.reason or "")


@pytest.mark.full
def test_markup_one_in_five_gives_the_rate_and_the_threshold_verdict(lab_server, gateway, tmp_path: Path) -> None:
    # The profile's threshold (cpu-lab: 0.01): a ~0.2 format-error rate blocks agent traffic as soon as
    # its lower bound clears the threshold (the first round of turns).
    rc, result, findings = probe(gateway("markup_one_in_five"), lab_server.model, tmp_path / "strict")
    rates = result["details"]["rates"]
    bound = rates["bounds"]["format_error_rate"]
    assert 0.15 < rates["format_error_rate"] < 0.25 and bound["verdict"] == "fail"
    assert rates["runs"] < rates["turn_target"]  # stopped early: more turns cannot mend it
    # The rates fail; any single-request check whose answer lands on a fifth response fails too (which
    # ones depends on the count of responses before it), always on the parser's signature.
    failed = failing(findings)
    assert rc == 1 and {"agent.tool_call": "parser", "agent.separation": "parser"}.items() <= failed.items()
    assert set(failed.values()) == {"parser"}
    by_check = {f.check: f for f in findings}
    assert (by_check["agent.trigger_consistency"].status, by_check["agent.trigger_consistency"].layer) == (
        Status.WARN, "parser")
    strict = decide(findings)
    assert strict.gates["agent"]["open"] is False
    # Stopped as soon as the format-error rate was certain to fail: the schema accuracy (52-odd valid calls)
    # is then unresolved against 0.99, so the run says what it could not establish instead of passing it.
    accuracy = by_check["agent.schema_accuracy"].status
    assert accuracy in (Status.PASS, Status.INCONCLUSIVE)
    assert strict.verdict == ("incomplete" if accuracy == Status.INCONCLUSIVE else "limited_observation")
    named = "agent.schema_accuracy" if accuracy == Status.INCONCLUSIVE else "agent.tool_call"
    assert any(named in r for r in strict.reasons), strict.reasons


@pytest.mark.full
def test_rare_errors_the_retry_recovers_are_a_limited_observation(lab_server, gateway, tmp_path: Path) -> None:
    """Markup on one tool-call response in sixty, a 10 % threshold: the probe sends the case set, retries every
    error for real (through the same gateway) and validates the retry: every one recovered -> warn, agents open
    under the retry policy. Through --direct-url: the direct runs are clean, so the layer is the gateway's.
    (Sixty: the case set's 324 tool-call responses carry the 5 hits at 60..300; the 30 repeats and the retries
    that follow, responses 325..359, fall before the next one, so every retry is a clean answer.)"""
    rc, result, findings = probe(gateway("markup_one_in_five", "--every", "60"), lab_server.model, tmp_path,
                                 "--direct-url", lab_server.base_url,
                                 "--set", "thresholds.tool_format_error_rate=0.1",
                                 "--set", "thresholds.schema_accuracy_min=0.9")
    rates = result["details"]["rates"]
    bound = rates["bounds"]["format_error_rate"]
    assert bound["events"] > 0 and bound["upper_95"] <= 0.1 and bound["verdict"] == "pass"
    # Every failed case is retried (the format-error events, and any other class a fifth-response markup hit).
    assert rates["retry"]["errors"] >= bound["events"] and rates["retry"]["errors"] == rates["retry"]["recovered"]
    retries = json.loads((tmp_path / "retries.json").read_text())
    assert all(r["recovered"] and r["attempts"][-1]["valid"] for r in retries)
    by_check = {f.check: f for f in findings}
    assert (by_check["agent.tool_call"].status, by_check["agent.tool_call"].layer) == (Status.WARN, "gateway")
    assert "recovered every one" in by_check["agent.tool_call"].reason
    gates = decide([f for f in findings if f.check in ("agent.tool_call", "agent.separation",
                                                         "agent.schema_accuracy")]).gates
    assert gates["agent"]["open"] is True and gates["agent"]["limited"] is True
