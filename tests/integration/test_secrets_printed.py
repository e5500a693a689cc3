"""Issue 42 item 6 and issue 43: nothing secret written or printed by `plan` and `run --check`.

Real runs through the CLI on a copy of the lab inventory (this machine is the node, local connection), attached to
a port nobody listens on: no vLLM is started, preflight runs on the node for real and writes its evidence. Secrets
of every kind the issue names are planted in the inventory's variables (the server URL with credentials and a
query key), and in the node's environment (what `env` on the node dumps): none may appear in what `plan` and
`run --check` print, nor in any file of the check run's directory. A variable no check reads is in the env dump
by name only; a read one (VLLM_*) keeps its value with its credentials masked.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "vllm_acceptance.cli"]

KUBECONFIG = ("apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://k8s.invalid:6443\n  name: c\n"
              "users:\n- name: admin\n  user:\n    token: kubePLANTtoken0123456789\n")
KUBECONFIG_B64 = base64.b64encode(KUBECONFIG.encode()).decode()
# the node's environment: name -> value (each value, or its base64, is the planted secret)
NODE_ENV = {
    "GH_PAT": "ghp_PLANT0123456789abcdefghijklmnopqrstuv",
    "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0PLANT01/B0PLANT02/PLANTxyzPLANTxyz",
    "MODEL_MIRROR": "https://b.s3.invalid/w?X-Amz-Credential=AKIAPLANTAAAAAAAAAAA&X-Amz-Signature=PLANTsig0123",
    "HOOK_URL": "https://hooks.invalid/notify?api-key=PLANTqkey1&token=PLANTqtok2",
    "MY_CREDS": "deploy:PLANTpass3",
    "KUBECONFIG_DATA": KUBECONFIG_B64,
    "AWS_ACCESS_KEY_ID": "AKIAPLANT0EXAMPLE0AB",
    "HF_TOKEN": "hf_PLANTabcdefghijklmnopqrstuvwxyz",
    "SLACK_BOT": "xoxb-123456789012-PLANT0987654321-abcdef",
    "VLLM_REMOTE_URL": "http://admin:PLANTpass4@remote.invalid:8000/v1",
}
URL = "http://admin:PLANTpass5@127.0.0.1:{port}/v1?api_key=PLANTqkey6&sig=PLANTsig7"
# a planted value: PLANT in it, or the kubeconfig's base64 (which spells no PLANT)
LEAK = re.compile("PLANT|" + re.escape(KUBECONFIG_B64[16:56]))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The lab inventory, attached to a closed port through a URL holding credentials; the environment holding
    the node's planted secrets."""
    root = tmp_path_factory.mktemp("secrets")
    inventory = root / "lab"
    shutil.copytree(REPO / "inventories" / "lab", inventory)
    group_vars = inventory / "group_vars" / "all.yml"
    site = yaml.safe_load(group_vars.read_text())
    site.update({"vllm_serve_mode": "attach", "vllm_base_url": URL.format(port=_closed_port()),
                 "vllm_serve_attach_timeout_s": 2})
    group_vars.write_text(yaml.safe_dump(site))
    env = {**os.environ, **NODE_ENV}
    return {"root": root, "inventory": inventory, "env": env}


def _cli(planted: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=planted["root"], env=planted["env"], capture_output=True, text=True,
                          timeout=900, check=False)


def test_plan_prints_no_planted_secret(planted: dict) -> None:
    for extra in ([], ["--json"]):
        done = _cli(planted, "plan", "-i", str(planted["inventory"]), "--project-dir", str(REPO),
                    "--vllm-python", "none", *extra)
        assert done.returncode == 0, done.stderr[-2000:]
        shown = done.stdout + done.stderr
        assert not LEAK.search(shown), LEAK.search(shown)
        assert "127.0.0.1" in shown and "***REDACTED***@" in shown   # the URL stays readable, its userinfo masked


def test_run_check_prints_and_writes_no_planted_secret(planted: dict) -> None:
    """`run --check` (preflight on the node for real, the attach read refused): its output, and every file of its
    run directory (the node's env dump, run.json with the inventory's variables, events, findings)."""
    scratch = planted["root"] / "tmp"
    scratch.mkdir(exist_ok=True)
    # A dry run removes its scratch directory at the end (playbooks/verdict_gate.yml); kept here to read every file
    # it wrote (acceptance_keep_check_dir), under this test's own TMPDIR.
    done = subprocess.run([*CLI, "run", "-i", str(planted["inventory"]), "--project-dir", str(REPO), "--reports-dir",
                           str(planted["root"] / "reports"), "--check", "-e", "{acceptance_keep_check_dir: true}"],
                          cwd=planted["root"], env={**planted["env"], "TMPDIR": str(scratch)}, capture_output=True,
                          text=True, timeout=900, check=False)
    shown = done.stdout + done.stderr
    kept = sorted(scratch.glob("vllm-acceptance-check-*"))
    assert len(kept) == 1, shown[-3000:]
    run_dir = kept[0]
    try:
        assert not LEAK.search(shown), (LEAK.search(shown), shown[-3000:])
        assert "127.0.0.1" in shown
        written = [p for p in run_dir.rglob("*") if p.is_file()]
        assert len(written) > 10
        for path in written:
            text = path.read_bytes().decode(errors="replace")
            assert not LEAK.search(text), f"planted secret {LEAK.search(text)} in {path}"
        dumps = [p for p in written if p.name == "env.txt"]
        assert dumps, "no env dump among the evidence"
        lines = dumps[0].read_text().splitlines()
        for name in NODE_ENV:
            if name.startswith("VLLM_"):
                continue
            assert f"{name}=<not recorded: not read by any check>" in lines, name
        assert "VLLM_REMOTE_URL=http://***REDACTED***@remote.invalid:8000/v1" in lines
    finally:
        if run_dir.name.startswith("vllm-acceptance-check-"):
            shutil.rmtree(run_dir, ignore_errors=True)
