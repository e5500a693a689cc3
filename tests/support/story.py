"""The sign-off story on the lab, shared by the sign-off tests and the lab browser test (see
tests/integration/test_signoff_lab.py for what it proves)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from .accept import REPO, run_accept

CLI = [sys.executable, "-m", "vllm_acceptance.cli"]
REHEARSAL_PORT = 20000 + int(os.environ.get("LAB_PORT_OFFSET", "0")) + 51
OVERRIDE_REASON = "this tenant sends no images; every text agent check passed and the signed run proved the ramp"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def changed_profile(path: Path) -> Path:
    """cpu-lab with a new context limit and recipe record (two reopen triggers), a lighter load (the run stays
    short), and agent images on: the text-only lab model cannot take an image, so agent.multimodal fails for
    real (layer model) and the verdict is not release."""
    data = yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text())
    data["model"]["path"] = str(REPO / data["model"]["path"])
    data["contract"]["context_tokens"] = 1024
    data["recipe"]["checked"] = "2026-12-01"
    data["load"].update({"ramp": [1, 2], "requests_per_step": 4, "long_prompt_tokens": 900, "soak_s": 4})
    data["cache"]["sessions"] = 2
    data["agent"]["repeats"] = 2
    data["agent"]["images"] = True
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def build_story(lab_server: Any, lab_accept_run: Path, root: Path) -> dict[str, Any]:
    """Sign A, accept B under a changed contract, rehearse the restore: the paths and results."""
    run_a = root / "reports" / "lab" / lab_accept_run.name
    shutil.copytree(lab_accept_run, run_a)
    signed_a = cli("sign", str(run_a), "--reviewer", "P. Lead (SRE)", "--decision", "release",
                   "--monitoring-owner", "sre-oncall", "--confirm", "rate_limit_policy=64 rps per tenant")
    run_b = run_accept(root, {
        "acceptance_profile": str(changed_profile(root / "cpu-lab-changed.yml")), "vllm_serve_mode": "attach",
        "vllm_base_url": lab_server.base_url, "vllm_serve_pid": lab_server.pid,
        "vllm_serve_startup_log": str(lab_server.log_path)}, env={"VLLM_API_KEY": ""})
    (root / "runner-rehearsal").mkdir(exist_ok=True)
    rehearsal = ansible_runner.run(
        private_data_dir=str(root / "runner-rehearsal"), project_dir=str(REPO),
        playbook=str(REPO / "playbooks" / "restore_rehearsal.yml"), inventory=str(REPO / "inventories" / "lab"),
        envvars={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
        extravars={"acceptance_reports_dir": str(root / "reports"), "restore_rehearsal_port": REHEARSAL_PORT},
        quiet=True)
    # B's verdict is not release (agent.multimodal fails on the text model): release needs an override, in red.
    refused_b = cli("sign", str(run_b), "--reviewer", "P. Lead (SRE)", "--decision", "release")
    signoff_after_refusal = (run_b / "signoff.json").exists()
    signed_b = cli("sign", str(run_b), "--reviewer", "P. Lead (SRE)", "--decision", "release",
                   "--override-reason", OVERRIDE_REASON, "--monitoring-owner", "sre-oncall")
    return {"a": run_a, "b": run_b, "signed_a": signed_a, "rehearsal": rehearsal,
            "rehearsal_log": "".join(e.get("stdout", "") for e in rehearsal.events)[-4000:],
            "refused_b": refused_b, "signoff_after_refusal": signoff_after_refusal, "signed_b": signed_b}


