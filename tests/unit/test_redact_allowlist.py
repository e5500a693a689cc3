"""Secrets never written (issue 42 item 6): environment evidence by allow-list, and the free-text redactor
(core/redact.py) for every kind of secret the issue names, through the paths that write and print them: the
preflight evidence a node's answer becomes (preflight/stage.py), `plan` (text and JSON) and the progress lines."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from vllm_acceptance import plan as planmod
from vllm_acceptance.core.redact import (
    ENV_READ_NAMES,
    ENV_READ_PREFIXES,
    NOT_RECORDED,
    REDACTED,
    env_value_read,
    redact_env,
    redact_env_text,
    redact_obj,
    redact_text,
)
from vllm_acceptance.parsers.container import parse_image_inspect
from vllm_acceptance.parsers.env import COMM_PREFIXES
from vllm_acceptance.parsers.live import live_launch
from vllm_acceptance.preflight.stage import NodeStream, save_node_stream
from vllm_acceptance.progress import Progress

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "vllm_acceptance"

# A kubeconfig (base64, as KUBECONFIG_DATA or a CI variable holds one) and a PEM key, generated here (no real
# credential); each secret's value carries PLANT so a leak is found by that word alone.
KUBECONFIG = ("apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://k8s.invalid:6443\n  name: c\n"
              "users:\n- name: admin\n  user:\n    token: kubePLANTtoken0123456789\n")
KUBECONFIG_B64 = base64.b64encode(KUBECONFIG.encode()).decode()
PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUPLANTkeybody0123456789abcdef\n"
       "-----END OPENSSH PRIVATE KEY-----")
PEM_B64 = base64.b64encode(PEM.encode()).decode()

# (free text holding a planted secret, the secret): every kind the issue names
PLANTED_TEXT = [
    ("GH_PAT=ghp_PLANT0123456789abcdefghijklmnopqrstuv", "ghp_PLANT0123456789abcdefghijklmnopqrstuv"),
    ("token gho_PLANT0123456789abcdefghijklmnopqrs used", "gho_PLANT0123456789abcdefghijklmnopqrs"),
    ("ghs_PLANT0123456789abcdefghijklmnopqrs", "ghs_PLANT0123456789abcdefghijklmnopqrs"),
    ("cloned with github_pat_11APLANT0123456789_abcdefghijklmnopqrstuvwxyz", "github_pat_11APLANT0123456789"),
    ("SLACK=https://hooks.slack.com/services/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", "PLANT"),
    ("notify https://hooks.slack.com/services/T0PLANT01/B0PLANT02/PLANTabc then", "PLANT"),
    ("bot xoxb-123456789012-PLANT0987654321-abcdef", "xoxb-123456789012-PLANT0987654321"),
    ("GET http://head:8000/v1/models?api-key=PLANTqs1 200", "PLANTqs1"),
    ("GET http://head:8000/v1/models?model=k3&api_key=PLANTqs2", "PLANTqs2"),
    ("https://x.invalid/hook?token=PLANTqs3&x=1", "PLANTqs3"),
    ("https://x.invalid/cb?access_token=PLANTqs4", "PLANTqs4"),
    ("https://b.s3.amazonaws.com/w.safetensors?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAPLANTAAAAAAAAAAA"
     "%2F20261206%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=PLANTsig0123456789abcdef", "PLANT"),
    ("https://acct.blob.core.windows.net/c/w?sv=2022-11-02&sig=PLANTazuresig%3D", "PLANTazuresig"),
    ("https://maps.invalid/api?signature=PLANTsig5", "PLANTsig5"),
    ("https://generativelanguage.invalid/v1?key=PLANTkey6", "PLANTkey6"),
    ("MY_CREDS=user:PLANTpass7", "PLANTpass7"),
    ("REGISTRY_LOGIN=deploy:PLANTpass8 more", "PLANTpass8"),
    ("vllm_base_url: http://admin:PLANTpass9@head/v1", "PLANTpass9"),
    ("KUBECONFIG_DATA=" + KUBECONFIG_B64, KUBECONFIG_B64[20:60]),
    ('{"kubeconfig": "' + KUBECONFIG_B64 + '"}', KUBECONFIG_B64[20:60]),
    ("SSH_KEY_B64=" + PEM_B64, PEM_B64[20:60]),
    ("key:\n" + PEM, "PLANTkeybody"),
    ('{"key": "' + PEM.replace("\n", "\\n") + '"}', "PLANTkeybody"),
    ("AWS_ACCESS_KEY_ID=AKIAPLANT0EXAMPLE0AB", "AKIAPLANT0EXAMPLE0AB"),
    ("id AKIAPLANT0EXAMPLE0AB in a log", "AKIAPLANT0EXAMPLE0AB"),
    ("downloading with hf_PLANTabcdefghijklmnopqrstuvwxyz", "hf_PLANTabcdefghijklmnopqrstuvwxyz"),
    ("curl -H 'Authorization: Bearer PLANT.bearer-0123456789'", "PLANT.bearer-0123456789"),
    ("curl -H \"authorization: bearer PLANTbearer01234\" x", "PLANTbearer01234"),
    ("sent Bearer PLANT0123456789abcdef to the gateway", "PLANT0123456789abcdef"),
    ("OPENAI=sk-proj-PLANT0123456789abcdefghij", "sk-proj-PLANT0123456789abcdefghij"),
]


@pytest.mark.parametrize(("text", "secret"), PLANTED_TEXT)
def test_every_planted_secret_is_masked_in_free_text(text: str, secret: str) -> None:
    shown = redact_text(text)
    assert secret not in shown and "PLANT" not in shown, shown
    assert REDACTED in shown


@pytest.mark.parametrize("text", [
    "image vllm/vllm-openai@sha256:" + "0123456789abcdef" * 4,
    "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/layers/fused_moe/fused_moe.py:123",
    "MASTER_ADDR=10.0.0.1:29500 NCCL_IB_HCA=mlx5_0:1 PATH=/usr/local/bin:/usr/bin",
    "env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,garbage_collection_threshold:0.6 vllm serve",
    "the server at http://head:8000/v1?model=k3 answered",
    "send the Bearer token in the Authorization header",
    "INFO 12-06 21:00:00 [loggers.py:123] Avg prompt throughput: 0.0 tokens/s",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host",
])
def test_what_is_no_secret_stays_readable(text: str) -> None:
    """The strengthened patterns leave digests, paths, host:port, a plain query and public keys as they are."""
    assert redact_text(text) == text


def test_an_env_dump_keeps_values_only_of_the_variables_the_checks_read() -> None:
    """`env` output: a variable no check reads is recorded by name only (a multi-line value's lines too); a read one
    keeps its value, redacted still (a VLLM_* URL with credentials, a secret-named NCCL_*); the launch's own
    names (`read`) are kept."""
    dump = "\n".join([
        "GH_PAT=ghp_PLANT0123456789abcdefghijklmnopqrstuv",
        "SLACK_WEBHOOK_URL=https://hooks.slack.com/services/T0PLANT/B0PLANT/PLANTxyz",
        "PRESIGNED=https://b.invalid/o?X-Amz-Signature=PLANTsig",
        "MY_CREDS=user:PLANTpass",
        "KUBE_B64=" + KUBECONFIG_B64,
        "AN_OPAQUE_VALUE=PLANTopaque",
        "DEPLOY_KEY=" + PEM.split("\n")[0], *PEM.split("\n")[1:],
        "NCCL_SOCKET_IFNAME=eth0",
        "NCCL_AUTH_CREDENTIAL=PLANTcred",
        "VLLM_REMOTE=http://admin:PLANTpw@head.invalid:8000/v1",
        "NVIDIA_VISIBLE_DEVICES=all",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "HOME=/root",
    ]) + "\n"
    kept = redact_env_text(dump, read={"PYTORCH_CUDA_ALLOC_CONF"})
    assert "PLANT" not in kept, kept
    assert redact_text(kept) == kept   # a later pass (a finding quoting the dump) leaves the names as they are
    lines = kept.splitlines()
    assert lines == sorted(lines)
    for name in ("GH_PAT", "SLACK_WEBHOOK_URL", "PRESIGNED", "MY_CREDS", "KUBE_B64", "AN_OPAQUE_VALUE", "DEPLOY_KEY",
                 "HOME"):
        assert f"{name}={NOT_RECORDED}" in lines
    assert "NCCL_SOCKET_IFNAME=eth0" in lines and "NVIDIA_VISIBLE_DEVICES=all" in lines
    assert f"NCCL_AUTH_CREDENTIAL={REDACTED}" in lines
    assert f"VLLM_REMOTE=http://{REDACTED}@head.invalid:8000/v1" in lines
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in lines
    assert not any(line.startswith(("b3Blb", "-----END")) for line in lines)  # the PEM's other lines went with it


def _names_read_in(path: Path) -> set[str]:
    """Environment names a module reads by literal: env.get("NAME"), env["NAME"], workaround_env {NAME: ...}."""
    text = path.read_text()
    return set(re.findall(r"""\benv(?:\.get\(|\[)\s*["']([A-Z][A-Z0-9_]+)["']""", text))


def test_the_allow_list_holds_every_variable_a_check_reads() -> None:
    """Derived from what the code reads, not guessed: every literal environment name the rules, parsers and the
    vLLM check read, every communication prefix interconnect.nccl_env judges, every known defect's workaround
    variable, and every launch variable the shipped profiles set that is not the node's own launch env, is kept."""
    read = set()
    for folder in ("rules", "parsers", "serve", "preflight"):
        for path in (SRC / folder).rglob("*.py"):
            read |= _names_read_in(path)
    assert {"CUDA_VERSION", "NV_CUDA_CUDART_VERSION", "HF_HUB_OFFLINE", "VLLM_USE_RUST_FRONTEND"} <= read
    defects = yaml.safe_load((SRC / "data" / "known_defects.yml").read_text())
    for defect in defects.values() if isinstance(defects, dict) else defects:
        items = defect.items() if isinstance(defect, dict) else []
        read |= {str(n) for k, v in items if k == "workaround_env" for n in (v or {})}
    dropped = sorted(n for n in read if not env_value_read(n))
    assert not dropped, f"checks read {dropped} but environment evidence would drop their values"
    assert all(p.startswith(ENV_READ_PREFIXES) for p in COMM_PREFIXES)
    assert "HF_HUB_OFFLINE" in ENV_READ_NAMES
    # a name nobody reads is not kept: the list is not everything
    assert not env_value_read("GH_PAT") and not env_value_read("HOME") and not env_value_read("AWS_SECRET_ACCESS_KEY")


def _framed(marker: str, records: dict[str, str]) -> str:
    """A node's answer in roles/preflight's frame (preflight/stage.py split_stream)."""
    out = "".join(f"{marker} begin {name} {json.dumps([name])}\n{stdout.rstrip(chr(10))}\n{marker} end {name} 0\n"
                  f"\n{marker} done {name}\n" for name, stdout in records.items())
    return out + f"{marker} fin\n"


def test_preflight_evidence_of_a_node_holds_no_planted_secret(tmp_path: Path) -> None:
    """A node's answer with secrets in its environment, in the serving process's environment and in the image's
    Env, as roles/preflight saves it: no planted value in any file; what the checks read is still there (the
    communication settings, the image's CUDA, the launch's own variable)."""
    marker = "@@preflight-test0123456789"
    env = ("GH_PAT=ghp_PLANT0123456789abcdefghijklmnopqrstuv\nMY_CREDS=user:PLANTpass\nNCCL_IB_HCA=mlx5_0\n"
           f"KUBECONFIG_DATA={KUBECONFIG_B64}\nSITE_VAR=plainPLANT\nVLLM_X=https://u:PLANTpw@h.invalid/x\n")
    live = {"pid": 4242, "port": 8000, "argv": ["vllm", "serve", "/models/k3", "--api-key", "PLANTapikey0123"],
            "env": {"NCCL_IB_HCA": "mlx5_0", "SITE_VAR": "plainPLANT", "SLACK": "https://hooks.slack.com/services/"
                    "T0/B0/PLANTx", "VLLM_API_KEY": "<redacted>",
                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            "source": "/proc/4242/environ"}
    image = [{"Id": "sha256:" + "ab" * 32, "RepoDigests": ["vllm/vllm-openai@sha256:" + "cd" * 32],
              "Config": {"Env": ["PATH=/usr/local/bin:/usr/bin", "CUDA_VERSION=12.9.1",
                                 "NV_CUDA_CUDART_VERSION=12.9.79", "BUILD_TOKEN_URL=https://ci.invalid/?token=PLANTbuild",
                                 "GH_PAT=ghp_PLANTimage0123456789ab"]}}]
    inputs = {"launch_env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_IB_HCA": "mlx5_0"}}
    stream = _framed(marker, {"env": env, "live_process": json.dumps(live), "image_inspect": json.dumps(image),
                              "inputs": json.dumps(inputs)})
    host = tmp_path / "evidence" / "preflight" / "gpu-01"
    host.mkdir(parents=True)
    save_node_stream(host, NodeStream(stdout=stream, stderr="", rc=0, marker=marker, inputs={}), [])
    for path in host.iterdir():
        assert "PLANT" not in path.read_text(), f"a planted secret in {path.name}: {path.read_text()}"
    dump = (host / "env.txt").read_text().splitlines()
    assert "NCCL_IB_HCA=mlx5_0" in dump and f"GH_PAT={NOT_RECORDED}" in dump and f"SITE_VAR={NOT_RECORDED}" in dump
    args, live_env, _ = live_launch((host / "live_process.txt").read_text()) or ([], {}, "")
    assert "/models/k3" in args and live_env["NCCL_IB_HCA"] == "mlx5_0"
    assert live_env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"   # the launch's own: read
    assert live_env["SITE_VAR"] == NOT_RECORDED and live_env["SLACK"] == NOT_RECORDED
    inspected = parse_image_inspect((host / "image_inspect.txt").read_text())
    assert inspected.cuda_version == "12.9.1"


def test_a_crictl_image_inspect_keeps_only_the_read_variables_of_its_env(tmp_path: Path) -> None:
    """`crictl inspecti -o json` (containerd): the image's environment is info.imageSpec.config.Env."""
    marker = "@@preflight-test0123456789"
    image = {"status": {"id": "sha256:" + "ab" * 32, "repoDigests": []},
             "info": {"imageSpec": {"config": {"Env": ["CUDA_VERSION=12.9.1", "GH_PAT=ghp_PLANTimage0123456789ab",
                                                         "BUILD_SECRET_URL=https://u:PLANTpw@ci.invalid/x"]}}}}
    stream = _framed(marker, {"image_inspect": json.dumps(image)})
    host = tmp_path / "gpu-01"
    host.mkdir()
    save_node_stream(host, NodeStream(stdout=stream, stderr="", rc=0, marker=marker, inputs={}), [])
    saved = json.loads((host / "image_inspect.txt").read_text())
    assert saved["info"]["imageSpec"]["config"]["Env"] == [
        "CUDA_VERSION=12.9.1", f"GH_PAT={NOT_RECORDED}", f"BUILD_SECRET_URL={NOT_RECORDED}"]
    assert saved["status"]["id"] == image["status"]["id"]


def test_redact_env_masks_a_read_variable_that_is_a_secret() -> None:
    kept = redact_env({"VLLM_API_KEY": "PLANTk", "NCCL_DEBUG": "INFO", "HF_TOKEN": "hf_PLANTabcdefghijklmnop"})
    assert kept == {"VLLM_API_KEY": REDACTED, "NCCL_DEBUG": "INFO", "HF_TOKEN": NOT_RECORDED}


def test_plan_prints_no_credential_of_the_server_url(tmp_path: Path) -> None:
    """issue 43: `plan` (text and --json) printed `http://admin:PASS@head/v1` and `?api_key=` as written."""
    inv = tmp_path / "site"
    shutil.copytree(REPO / "inventories" / "example-b300", inv)
    site = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())
    site.update({"vllm_serve_mode": "attach",
                 "vllm_base_url": "http://admin:PLANTpass@head.invalid:8000/v1?api_key=PLANTqkey&sig=PLANTsig"})
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    plan = planmod.build_plan(inv, vllm_python="none")
    shown = planmod.render_text(plan) + json.dumps(plan.to_dict())
    assert "PLANT" not in shown, shown
    assert "head.invalid:8000/v1" in shown


def test_progress_lines_and_events_are_redacted(tmp_path: Path) -> None:
    lines: list[str] = []
    progress = Progress(write=lines.append, events_path=tmp_path / "events.jsonl")
    progress.say("the server at http://admin:PLANTpass@head/v1?token=PLANTtok does not answer")
    progress.emit("failed", reason="GH_PAT=ghp_PLANT0123456789abcdefghijklmnopqrstuv in the log")
    assert lines and "PLANT" not in "\n".join(lines) and "head/v1" in lines[0]
    assert "PLANT" not in (tmp_path / "events.jsonl").read_text()


def test_redact_obj_reaches_every_string_of_a_record() -> None:
    record = {"inventory_vars": {"vllm_base_url": "http://u:PLANTpw@h/v1", "vllm_env": {"MY_CREDS": "a:PLANTb"}},
              "argv": ["--hf-token", "hf_PLANTabcdefghijklmnopqrs"], "note": "Bearer PLANT0123456789"}
    assert "PLANT" not in json.dumps(redact_obj(record))


def test_the_variables_the_run_profile_names_keep_their_values(tmp_path: Path) -> None:
    """`env` on a node of a run whose profile sets PYTORCH_CUDA_ALLOC_CONF in its launch (kimi-k3-h200): the value
    is kept (the profile names it), while a variable nobody names is not; without the run's profile, by name only."""
    from vllm_acceptance.core.rundir import PROFILE_EVIDENCE
    from vllm_acceptance.preflight.stage import save_node_streams

    marker = "@@preflight-test0123456789"
    env = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\nSITE_VAR=plainPLANT\nNCCL_DEBUG=INFO\n"
    node = NodeStream(stdout=_framed(marker, {"env": env}), stderr="", rc=0, marker=marker, inputs={})
    with_profile = tmp_path / "run"
    (with_profile / PROFILE_EVIDENCE).parent.mkdir(parents=True)
    shutil.copy(REPO / "profiles" / "kimi-k3-h200.yml", with_profile / PROFILE_EVIDENCE)
    bare = tmp_path / "bare"
    bare.mkdir()
    for run, kept in ((with_profile, True), (bare, False)):
        save_node_streams(run, {"gpu-01": node})
        dump = (run / "evidence" / "preflight" / "gpu-01" / "env.txt").read_text().splitlines()
        assert ("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in dump) is kept, dump
        assert f"SITE_VAR={NOT_RECORDED}" in dump and "NCCL_DEBUG=INFO" in dump
