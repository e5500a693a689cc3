"""Launch triage: every recorded startup failure gets its class, rule and line; remedies per class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.core.findings import Consequence, Finding, Status, write_findings
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.rules.launch_triage import (
    CHECK_EVIDENCE,
    CHECK_TRIAGE,
    CHECK_TRIAGE_CAPACITY,
    RULES,
    classify_launch_failure,
    evidence_groups,
    launch_findings,
)
from vllm_acceptance.serve.stage import ServeFacts, judge_serve

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "launch_failures"
INDEX = yaml.safe_load((FIXTURES / "index.yml").read_text())["cases"]
K3 = load_profile(REPO / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
LAB = load_profile(REPO / "profiles" / "cpu-lab.yml")

BROKEN_CHAIN = [Finding(check="compat.driver_branch", status=Status.FAIL, host="gb300-a01",
                        reason="driver 575.57.08 (R575) is below R580 / 580.65.06")]


def _profile_for(name: str):
    return LAB if name.startswith("lab_") else K3


@pytest.mark.parametrize("case", INDEX, ids=[f"{c['file']}-{c.get('preflight', 'plain')}" for c in INDEX])
def test_library_case_is_classified(case: dict) -> None:
    text = (FIXTURES / case["file"]).read_text()
    preflight = BROKEN_CHAIN if case.get("preflight") == "broken_chain" else []
    finding = classify_launch_failure(text, preflight, _profile_for(case["file"]), host="gb300-a01")
    if case["class"] is None:
        assert finding.status == Status.INCONCLUSIVE
        assert "class" not in finding.observed
        return
    assert finding.status == Status.FAIL
    assert finding.observed["class"] == case["class"]
    assert finding.observed["rule"] == case["rule"]
    line = text.splitlines()[finding.observed["line"] - 1]
    assert finding.observed["text"] in line.strip()          # the matched line is quoted from the log
    assert case["rule"] in finding.reason
    expected_check = CHECK_TRIAGE_CAPACITY if case["class"] == "capacity" else CHECK_TRIAGE
    assert finding.check == expected_check


def test_every_rule_is_exercised_or_listed() -> None:
    """A rule without a library case is a rule nobody checked against a real message text (the library
    here, or a real log of tests/fixtures/real/vllm/ whose expectation names the rule)."""
    covered = {c["rule"] for c in INDEX if c["rule"]}
    real = [yaml.safe_load(p.read_text()) for p in (REPO / "tests" / "fixtures" / "real" / "vllm").glob("*.yml")]
    covered |= {m["expect"]["triage"]["rule"] for m in real if (m["expect"].get("triage") or {}).get("rule")}
    untested = {"environment.forward_compat", "environment.driver_library_mismatch", "interconnect.rdma",
                "interconnect.remote", "capacity.no_cache_memory", "capacity.cpu_oom",
                "capacity.free_memory_below_utilization", "configuration.parallel_layout",
                "configuration.trust_remote_code", "configuration.port_in_use"}
    assert {r.name for r in RULES} == covered | untested


def test_environment_routes_and_no_flag_tuning() -> None:
    finding = classify_launch_failure((FIXTURES / "env_cuda_runtime_insufficient.log").read_text(), [], K3)
    assert finding.consequence == Consequence.REBUILD
    assert [r["route"] for r in finding.observed["routes"]] == ["driver_upgrade", "self_built_image",
                                                                "isolated_environment"]
    assert all(r["when"] for r in finding.observed["routes"])          # entry conditions stated
    assert "owner" in finding.observed["routes"][1]["how"] and "exit date" in finding.observed["routes"][1]["how"]
    assert "none is tuned" in finding.action
    assert "--max-model-len=" not in finding.action


def test_environment_wins_over_a_later_configuration_line() -> None:
    """r575 log: torch's driver warning comes with vLLM's 'No platform detected' / 'Failed to infer
    device type' (a weak signature: a consequence of several causes); the specific cause decides."""
    text = (FIXTURES / "env_driver_insufficient_r575.log").read_text()
    finding = classify_launch_failure(text, [], K3)
    rules = [m["rule"] for m in finding.observed["matches"]]
    assert "environment.no_platform" in rules
    assert finding.observed["class"] == "environment"
    assert finding.observed["rule"] == "environment.driver_insufficient"


def test_capacity_kv_lower_limit_or_expand() -> None:
    gpu = classify_launch_failure((FIXTURES / "cap_kv_too_small_gpu.log").read_text(), [], K3)
    assert gpu.consequence == Consequence.EXPAND
    assert gpu.observed["estimated_max_model_len"] == 674560
    assert gpu.observed["kv_needed_gib"] == 64.0 and gpu.observed["kv_available_gib"] == 41.2
    # 674,560 >= the contracted 262,144: a lower limit keeps the contract
    assert "--max-model-len=674560" in gpu.action
    lab = classify_launch_failure((FIXTURES / "lab_cap_kv_smaller_than_max_model_len.log").read_text(), [], LAB)
    assert lab.observed["estimated_max_model_len"] == 384      # < the lab contract of 1536
    assert "expand capacity" in lab.action and "--max-model-len=" not in lab.action


def test_dmabuf_remedy_only_with_its_message() -> None:
    dmabuf = classify_launch_failure((FIXTURES / "ic_dmabuf_errno524.log").read_text(), [], K3)
    assert "NCCL_DMABUF_ENABLE=0" in dmabuf.action
    plain = classify_launch_failure((FIXTURES / "ic_nccl_system_error.log").read_text(), [], K3)
    assert plain.observed["class"] == "interconnect"
    assert "NCCL_DMABUF_ENABLE=0" not in plain.action
    assert "driver" in plain.action and "not the driver" in plain.action


def test_configuration_never_asks_for_a_driver_change() -> None:
    for name in ("lab_cfg_wrong_model_path.log", "lab_cfg_unknown_tool_parser.log", "cfg_gpu_count.log"):
        finding = classify_launch_failure((FIXTURES / name).read_text(), BROKEN_CHAIN, _profile_for(name))
        assert finding.observed["class"] == "configuration", name
        assert "not the driver" in finding.action
        assert "routes" not in finding.observed


def test_launch_line_flags_are_not_messages() -> None:
    text = "# launch: python -m vllm... --tool-call-parser=x invalid tool call parser: x\nsomething else\n"
    assert classify_launch_failure(text, [], LAB).status == Status.INCONCLUSIVE


def test_no_log_is_missing_not_a_class() -> None:
    for text in (None, "", "  \n"):
        finding = classify_launch_failure(text, None, K3)
        assert finding.status == Status.MISSING


def test_evidence_groups_container_profile(tmp_path: Path) -> None:
    ev = "evidence/preflight/h1/"
    preflight = [
        Finding(check="compat.image_identity", status=Status.PASS, host="h1", evidence=[ev + "image_inspect.txt"]),
        Finding(check="compat.vllm_version", status=Status.PASS, host="h1", evidence=[ev + "image_probe.txt"]),
        Finding(check="compat.driver_branch", status=Status.FAIL, host="h1", evidence=[ev + "nvidia_smi.txt"]),
    ]
    cmd = "docker run -d vllm/vllm-openai:kimi-k3@sha256:" + "a" * 64 + " moonshotai/Kimi-K3 --port 8000"
    ok = evidence_groups(preflight, K3, "h1", ["evidence/serve/startup.log"], cmd)
    assert ok.status == Status.PASS
    assert ok.observed["image"]["launch_reference"].endswith("a" * 64)
    lacking = evidence_groups(preflight[:1], K3, "h1", [], cmd)
    assert lacking.status == Status.MISSING
    assert {"vllm", "nvidia_smi", "startup_log"} <= set(lacking.reason.split(": ", 1)[1].split(", "))
    other_host = evidence_groups(preflight, K3, "h2", ["evidence/serve/startup.log"], cmd)
    assert other_host.status == Status.MISSING


def test_evidence_groups_lab_profile_not_applicable() -> None:
    vllm = [Finding(check="compat.vllm_version", status=Status.PASS, host="localhost", evidence=["e/v.txt"])]
    finding = evidence_groups(vllm, LAB, "localhost", ["evidence/serve/startup.log"], None)
    assert finding.status == Status.PASS
    assert finding.observed["image"]["status"] == "not_applicable"
    assert finding.observed["nvidia_smi"]["status"] == "not_applicable"


def test_launch_findings_read_preflight_from_the_run(tmp_path: Path) -> None:
    write_findings(tmp_path / "findings" / "preflight.json", BROKEN_CHAIN)
    text = (FIXTURES / "env_nccl_on_broken_chain.log").read_text()
    _, triage = launch_findings(tmp_path, K3, "gb300-a01", text, ["evidence/serve/startup.log"], None)
    assert triage.observed["class"] == "environment"
    _, without = launch_findings(tmp_path / "other", K3, "gb300-a01", text, [], None)
    assert without.status == Status.INCONCLUSIVE


def test_judge_serve_hook_capacity_sets_model_load_consequence(tmp_path: Path) -> None:
    text = (FIXTURES / "lab_cap_kv_smaller_than_max_model_len.log").read_text()
    facts = ServeFacts(base_url="http://127.0.0.1:9/v1", host="localhost", startup_log=text,
                       launch_error="vLLM did not start: exited")
    findings = {f.check: f for f in judge_serve(tmp_path, LAB, facts)}
    assert findings[CHECK_TRIAGE_CAPACITY].observed["class"] == "capacity"
    assert findings["capacity.model_load"].consequence == Consequence.EXPAND
    assert findings[CHECK_EVIDENCE].observed["startup_log"]["status"] == "saved"
    saved = json.loads((tmp_path / "findings" / "serve.json").read_text())
    assert any(f["check"] == CHECK_TRIAGE_CAPACITY for f in saved)
    stage = json.loads((tmp_path / "stages" / "serve.json").read_text())
    assert stage["triage"]["class"] == "capacity"


def test_judge_serve_without_launch_error_has_no_triage(tmp_path: Path) -> None:
    facts = ServeFacts(base_url="http://127.0.0.1:9/v1", host="localhost", startup_log="", launch_error=None)
    checks = {f.check for f in judge_serve(tmp_path, LAB, facts)}
    assert CHECK_TRIAGE not in checks and CHECK_TRIAGE_CAPACITY not in checks
