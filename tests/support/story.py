"""The sign-off story on the lab, shared by the sign-off tests, the lab browser test and the secrets test (see
tests/integration/test_signoff_lab.py for what it proves).

Run B is also the secrets run (tests/integration/test_pipeline_lab.py): it is attached to a server of its own that
requires an API key, its log read by the operator's command, with an HF token, URLs holding credentials and other
secret-bearing variables in the environment. One whole accept.yml run serves both stories."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

from .accept import REPO, run_accept
from .resolution import LAB_AGENT_5PCT, apply_to

CLI = [sys.executable, "-m", "vllm_acceptance.cli"]
REHEARSAL_PORT = 20000 + int(os.environ.get("LAB_PORT_OFFSET", "0")) + 51
OVERRIDE_REASON = "this tenant sends no images; every text agent check passed and the signed run proved the ramp"
KEYED_PORT = 8026   # run B's server (requires SECRET_KEY), plus LAB_PORT_OFFSET

SECRET_KEY = "sk-acceptance-PLANTED-4f1c2b"
HF_SECRET = "hf_PLANTEDtoken9d8e7f"
# Credentials inside URLs and secret-bearing names that are not *_TOKEN/*_KEY (issue 30, item 5). HTTPS_PROXY
# applies to https:// only, so the probes' plain-http traffic to the lab server does not go through it.
URL_SECRETS = {"HTTPS_PROXY": ("http://proxyPLANTEDuser:PLANTEDproxypass@proxy.invalid:3128", "proxy.invalid:3128"),
               "DATABASE_URL": ("postgres://dbPLANTEDu:PLANTEDdbpw@db.invalid:5432/acc", "db.invalid:5432/acc"),
               "GIT_REMOTE": ("https://ghp_PLANTEDgittoken@github.com/org/repo.git", "github.com/org/repo.git"),
               "NCCL_AUTH_CREDENTIAL": ("PLANTEDcredential77", None)}
# Issue 42 item 6: the other kinds of secret an environment holds; none is read by a check but VLLM_REMOTE_URL, so
# the env dump names them only, and VLLM_REMOTE_URL keeps its host with its credentials masked.
KUBECONFIG_B64 = base64.b64encode(b"apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: "
                                  b"https://k8s.invalid:6443\nusers:\n- name: admin\n  user:\n    token: "
                                  b"kubePLANTEDtoken0123456789\n").decode()
OTHER_SECRETS = {"GH_PAT": "ghp_PLANTED0123456789abcdefghijklmnopqrst",
                 "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0PLANTED/B0PLANTED/PLANTEDxyzxyzxyz",
                 "MODEL_MIRROR": "https://b.s3.invalid/w?X-Amz-Credential=AKIAPLANTEDAAAAAAAAA"
                                 "&X-Amz-Signature=PLANTEDsig0123",
                 "HOOK_URL": "https://hooks.invalid/notify?api-key=PLANTEDqkey1&token=PLANTEDqtok2",
                 "MY_CREDS": "deploy:PLANTEDpass3",
                 "KUBECONFIG_DATA": KUBECONFIG_B64,
                 "AWS_ACCESS_KEY_ID": "AKIAPLANTED0EXAMPLE0",
                 "VLLM_REMOTE_URL": "http://admin:PLANTEDpass4@remote.invalid:8000/v1"}
PLANTED = [SECRET_KEY, HF_SECRET, "proxyPLANTEDuser", "PLANTEDproxypass", "dbPLANTEDu", "PLANTEDdbpw",
           "ghp_PLANTEDgittoken", "PLANTEDcredential77", "PLANTED", KUBECONFIG_B64[16:56]]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def changed_profile(path: Path) -> Path:
    """cpu-lab with a new context limit and recipe record (two reopen triggers), a lighter load and agent case set
    (the run stays short), and agent images on: the text-only lab model cannot take an image, so agent.multimodal
    fails for real (layer model) and the verdict is not release."""
    data = yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text())
    data["model"]["path"] = str(REPO / data["model"]["path"])
    data["contract"]["context_tokens"] = 1024
    data["recipe"]["checked"] = "2026-12-01"
    data["load"].update({"ramp": [1, 2], "requests_per_step": 4, "long_prompt_tokens": 900, "soak_s": 4})
    data["cache"]["sessions"] = 2
    data["agent"]["repeats"] = 2
    data["agent"]["images"] = True
    # What B shows is the reopen triggers, the keyed server and the secrets, not the lab's 1 % agent resolution.
    apply_to(data, LAB_AGENT_5PCT)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def build_story(start_server: Callable[..., Any], stop_server: Callable[[Any], None], lab_accept_run: Path,
                root: Path) -> dict[str, Any]:
    """Sign A, accept B under a changed contract on a keyed server (stopped after B), rehearse the restore: the
    paths and results. `start_server(state_dir, port=, extra_args=)` and `stop_server` are conftest's lab ones."""
    run_a = root / "reports" / "lab" / lab_accept_run.name
    shutil.copytree(lab_accept_run, run_a)
    signed_a = cli("sign", str(run_a), "--reviewer", "P. Lead (SRE)", "--decision", "release",
                   "--monitoring-owner", "sre-oncall", "--confirm", "rate_limit_policy=64 rps per tenant")
    keyed = start_server(root / "keyed-server", port=KEYED_PORT + int(os.environ.get("LAB_PORT_OFFSET", "0")),
                         extra_args=f"--api-key {SECRET_KEY}")
    try:
        # the log read by the operator's command on the head (vllm_serve_attach_log_command), as for a systemd unit
        run_b = run_accept(root, {
            "acceptance_profile": str(changed_profile(root / "cpu-lab-changed.yml")), "vllm_serve_mode": "attach",
            "vllm_base_url": keyed.base_url, "vllm_serve_pid": keyed.pid,
            "vllm_serve_attach_log_command": f"cat {keyed.log_path}"},
            env={"VLLM_API_KEY": SECRET_KEY, "HF_TOKEN": HF_SECRET, **{k: v for k, (v, _) in URL_SECRETS.items()},
                 **OTHER_SECRETS})
        keyed_log_first_line = keyed.log_path.read_text().splitlines()[0]
    finally:
        stop_server(keyed)
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
    return {"a": run_a, "b": run_b, "b_log_first_line": keyed_log_first_line, "signed_a": signed_a,
            "rehearsal": rehearsal,
            "rehearsal_log": "".join(e.get("stdout", "") for e in rehearsal.events)[-4000:],
            "refused_b": refused_b, "signoff_after_refusal": signoff_after_refusal, "signed_b": signed_b}


