"""Issue 6 fault tests: a corrupting gateway in front of the real lab vLLM, one mode at a time.

Each mode must make the agent probe (the real CLI) fail exactly the checks it breaks and name the
layer: with `--direct-url` the direct server answers the same requests cleanly, so the defect is
the gateway's; without it the probe can only read the defect's signature (markup in content: the
parser; a schema violation: the model). The pass-through gateway raises no alarm; markup on one
response in five gives a rate of 0.2 and the verdict the profile's threshold implies.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.verdict import decide

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
GATEWAY = "the direct server (--direct-url) answers the same request cleanly"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gateway(lab_server) -> Iterator[Callable[[str], str]]:
    """Start `python -m vllm_acceptance.lab.gateway` (fresh counters) on a free port; stopped after the test."""
    procs: list[subprocess.Popen] = []

    def start(mode: str) -> str:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "vllm_acceptance.lab.gateway", "--upstream",
                                 lab_server.base_url, "--port", str(port), "--mode", mode],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"gateway exited: {proc.stdout.read() if proc.stdout else ''}"
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:  # proxied to the real server
                    return url
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"gateway {mode} did not answer on {url} within 30 s")

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def probe(base_url: str, model: str, out: Path, *extra: str) -> tuple[int, dict, list[Finding]]:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "agent", "--base-url", base_url,
                           "--model", model, "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert (out / "result.json").is_file(), proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    findings = [Finding.from_dict(f) for f in result["findings"]]
    # The report schema needs a layer on every failed agent finding.
    assert all(f.layer for f in findings if f.status == Status.FAIL), [f.check for f in findings if not f.layer]
    return proc.returncode, result, findings


def failing(findings: list[Finding]) -> dict[str, str | None]:
    return {f.check: f.layer for f in findings if f.status == Status.FAIL}


MARKUP_CHECKS = ("agent.tool_call", "agent.trigger_consistency", "agent.separation", "agent.stream_consistency",
                 "agent.multi_turn")

# (mode, through --direct-url?, {failing check: layer}) -- nothing else may fail.
CASES = [
    ("markup_in_content", False, dict.fromkeys(MARKUP_CHECKS, "parser")),
    ("markup_in_content", True, {**dict.fromkeys(MARKUP_CHECKS, "gateway"), "agent.gateway": "gateway"}),
    ("drop_stream_tool_calls", False, {"agent.stream_consistency": "parser"}),
    ("drop_stream_tool_calls", True, {"agent.stream_consistency": "gateway"}),
    # Reasoning text repeated in content is the gateway's signature even without a direct reference.
    ("reasoning_into_content", False, dict.fromkeys(
        ("agent.separation", "agent.stream_consistency", "agent.structured_output"), "gateway")),
    ("change_arg_types", False, {"agent.tool_call": "model"}),
    ("change_arg_types", True, {"agent.tool_call": "gateway", "agent.gateway": "gateway"}),
    ("drop_field", False, {"agent.client_library": "client"}),
    ("drop_field", True, {"agent.client_library": "gateway", "agent.gateway": "gateway"}),
]


def test_passthrough_gateway_raises_no_alarm(lab_server, gateway, tmp_path: Path) -> None:
    url = gateway("passthrough")
    rc, result, findings = probe(url, lab_server.model, tmp_path / "out", "--direct-url", lab_server.base_url,
                                 "--set", "agent.repeats=2")
    assert rc == 0 and result["status"] == "pass"
    # Everything passes; the image case is not applicable on the text-only lab profile (and says so).
    assert {f.status for f in findings if f.check != "agent.multimodal"} == {Status.PASS}, failing(findings)
    assert {"agent.gateway", "agent.client_library", "agent.tool_call"} <= {f.check for f in findings}
    assert decide(findings).gates["agent"]["open"] is True


@pytest.mark.parametrize(("mode", "direct", "expected"), CASES,
                         ids=[f"{m}-{'direct' if d else 'alone'}" for m, d, _ in CASES])
def test_each_fault_fails_its_checks_on_its_layer(lab_server, gateway, tmp_path: Path, mode: str, direct: bool,
                                                  expected: dict[str, str]) -> None:
    url = gateway(mode)
    extra = ["--direct-url", lab_server.base_url] if direct else []
    rc, result, findings = probe(url, lab_server.model, tmp_path / "out", *extra, "--set", "agent.repeats=2")
    assert rc == 1 and result["status"] == "fail"
    assert failing(findings) == expected
    by_check = {f.check: f for f in findings}
    if direct:
        for check, layer in expected.items():
            if layer == "gateway" and check != "agent.gateway":
                assert by_check[check].reason.startswith(GATEWAY), by_check[check].reason
    if mode == "change_arg_types":
        assert result["details"]["rates"]["schema_accuracy"] == 0.0
        if direct:
            assert any("arguments(parsed)" in d and "str became list" in d for d in by_check["agent.gateway"].observed)
    if mode == "drop_field" and direct:
        assert "/choices/0/finish_reason: missing" in by_check["agent.gateway"].observed
    # Plain text is not the agent's business: the verdict blocks agent traffic only.
    decision = decide(findings)
    assert decision.verdict == "limited_observation" and decision.gates["agent"]["open"] is False


def test_markup_one_in_five_gives_the_rate_and_the_threshold_verdict(lab_server, gateway, tmp_path: Path) -> None:
    # The profile's threshold (cpu-lab: 0.01): a 0.2 format-error rate blocks agent traffic.
    rc, result, findings = probe(gateway("markup_one_in_five"), lab_server.model, tmp_path / "strict",
                                 "--set", "agent.repeats=10")
    rates = result["details"]["rates"]
    assert (rates["runs"], rates["format_error_rate"], rates["separation_error_rate"]) == (10, 0.2, 0.2)
    assert rc == 1 and failing(findings) == {"agent.tool_call": "parser", "agent.separation": "parser"}
    by_check = {f.check: f for f in findings}
    assert (by_check["agent.trigger_consistency"].status, by_check["agent.trigger_consistency"].layer) == (
        Status.WARN, "parser")
    strict = decide(findings)
    assert strict.verdict == "limited_observation" and strict.gates["agent"]["open"] is False
    assert any("agent traffic blocked: agent.separation, agent.tool_call" in r for r in strict.reasons)

    # A threshold of 0.25 tolerates the same rate: warn, agents open under the validated retry policy.
    # Through --direct-url as well: 0/10 direct runs with markup puts it on the gateway.
    rc, result, findings = probe(gateway("markup_one_in_five"), lab_server.model, tmp_path / "lenient",
                                 "--direct-url", lab_server.base_url,
                                 "--set", "agent.repeats=10", "--set", "thresholds.tool_format_error_rate=0.25")
    assert result["details"]["rates"]["format_error_rate"] == 0.2
    assert rc == 0 and failing(findings) == {}
    warned = {f.check: f.layer for f in findings if f.status == Status.WARN}
    assert warned == dict.fromkeys(("agent.tool_call", "agent.trigger_consistency", "agent.separation"), "gateway")
    assert "0/10 direct runs with a defect" in {f.check: f for f in findings}["agent.tool_call"].reason
    lenient = decide(findings)
    assert lenient.verdict == "limited_observation"
    assert lenient.gates["agent"] == {"open": True, "limited": True, "reason": "open with the validated retry "
                                      "policy: agent.separation, agent.tool_call, agent.trigger_consistency"}
