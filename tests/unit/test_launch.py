"""Multi-node launch commands: golden per profile and layout, checked against vLLM 0.32's own parser."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.serve.launch import layout, main, node_commands

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "launch_golden"
K3 = load_profile(REPO / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
LAB_PYTHON = REPO / ".venv-lab" / "bin" / "python"
DIGEST = "sha256:" + "0123456789abcdef" * 4
TWO = {"head": "gb300-a01", "workers": ["gb300-a02"], "image_digest": DIGEST,
       "addresses": {"gb300-a01": "10.40.1.11", "gb300-a02": "10.40.1.12"}}

# (golden name, profile, inventory facts): the layouts the recipe names (TP, TP x PP, DEP) per interconnect
CASES = {
    "kimi-k3-single-tp8": (K3, {"head": "gb300-a01", "image_digest": DIGEST}),
    "kimi-k3-tp8-pp2-nvl": (K3, {**TWO, "parallel": {"pipeline": 2}}),
    "kimi-k3-tp16-rdma-dmabuf": (K3, {**TWO, "parallel": {"tensor": 16}, "interconnect": "rdma",
                                      "dmabuf_workaround": True}),
    "kimi-k3-dep16-rdma": (K3, {**TWO, "parallel": {"tensor": 1, "data": 16, "expert": True},
                                "interconnect": "rdma"}),
}


def _golden_view(profile, facts) -> dict:
    return {host: {"role": c.role, "rank": c.rank, "argv": c.argv, "env": c.env}
            for host, c in node_commands(profile, facts).items()}


@pytest.mark.parametrize("name", list(CASES))
def test_commands_match_golden(name: str) -> None:
    profile, facts = CASES[name]
    got = _golden_view(profile, facts)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(path.read_text()), f"differs from {path}; review, then UPDATE_GOLDEN=1 to rewrite"


def test_recipe_environment_per_interconnect() -> None:
    nvl = node_commands(K3, {**TWO, "parallel": {"pipeline": 2}})
    rdma = node_commands(K3, {**TWO, "parallel": {"pipeline": 2}, "interconnect": "rdma"})
    for cmd in nvl.values():
        assert {"NCCL_MNNVL_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"} <= set(cmd.env)
        assert "--all2all-backend=flashinfer_nvlink_one_sided" in cmd.serve_args
        assert "UCX_TLS" not in cmd.env and "NCCL_DMABUF_ENABLE" not in cmd.env
    for cmd in rdma.values():
        assert cmd.env["UCX_TLS"] == "rc,cuda_copy" and "NCCL_MNNVL_ENABLE" not in cmd.env
        assert "--all2all-backend=deepep_v2" in cmd.serve_args
        assert "NCCL_DMABUF_ENABLE" not in cmd.env          # only after the triage saw mlx5dv_reg_dmabuf_mr
        assert "-e=UCX_TLS" in cmd.argv and "rc,cuda_copy" not in " ".join(cmd.argv)   # values stay out of argv


def test_single_node_has_no_multinode_flags() -> None:
    (cmd,) = node_commands(K3, {"head": "n1", "image_digest": DIGEST}).values()
    joined = " ".join(cmd.serve_args)
    for flag in ("--nnodes", "--headless", "--all2all-backend", "--data-parallel"):
        assert flag not in joined
    assert "NCCL_MNNVL_ENABLE" not in cmd.env


def test_replica_ranks_and_headless_workers() -> None:
    cmds = node_commands(K3, {**TWO, "workers": ["w1", "w2", "w3"], "parallel": {"tensor": 8, "pipeline": 4}})
    assert [c.rank for c in cmds.values()] == [0, 1, 2, 3]
    for cmd in cmds.values():
        assert "--nnodes=4" in cmd.serve_args and f"--node-rank={cmd.rank}" in cmd.serve_args
        assert "--master-addr=10.40.1.11" in cmd.serve_args
        assert ("--headless" in cmd.serve_args) == (cmd.rank > 0)
        assert ("--port" in cmd.serve_args) == (cmd.rank == 0)
        assert sum(a.startswith("--tensor-parallel-size") for a in cmd.serve_args) == 1   # profile's replaced


def test_dp_start_ranks() -> None:
    cmds = node_commands(K3, {**TWO, "workers": ["w1", "w2", "w3"], "parallel": {"tensor": 1, "data": 32,
                                                                                 "expert": True}})
    starts = [next((a for a in c.serve_args if a.startswith("--data-parallel-start-rank=")), None)
              for c in cmds.values()]
    assert starts == [None, "--data-parallel-start-rank=8", "--data-parallel-start-rank=16",
                      "--data-parallel-start-rank=24"]
    assert all("--data-parallel-size-local=8" in c.serve_args for c in cmds.values())


@pytest.mark.parametrize(("facts", "message"), [
    ({**TWO, "image_digest": None, "parallel": {"pipeline": 2}}, "pinned by digest"),
    ({**TWO, "parallel": {"tensor": 8}}, "must fill each node"),
    ({**TWO, "parallel": {"tensor": 32}}, "needs 16 GPUs per node"),
    ({**TWO, "parallel": {"tensor": 1, "data": 3}}, "does not divide"),
    ({**TWO, "interconnect": "none", "parallel": {"pipeline": 2}}, "needs rdma, nvlink or nvl"),
    ({**TWO, "runtime": "process", "parallel": {"pipeline": 2}}, "docker or podman"),
    ({**TWO, "head": None}, "vllm_head"),
    ({**TWO, "workers": ["gb300-a01"]}, "both head and worker"),
])
def test_bad_layouts_are_refused_with_the_reason(facts: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        node_commands(K3, facts)


def test_layout_override_from_inventory() -> None:
    lay = layout(K3, {**TWO, "parallel": {"pipeline": 2}})
    assert (lay.kind, lay.world, lay.nodes) == ("replica", 16, 2)


def test_gpus_per_node_from_the_inventory_sets_what_a_replica_fills() -> None:
    """vllm_gpus_per_node (the role's facts.gpus_per_node): tensor 2 over two nodes uses one GPU of each."""
    lay = layout(K3, {**TWO, "parallel": {"tensor": 2}, "gpus_per_node": 1})
    assert (lay.kind, lay.world, lay.gpus_per_node) == ("replica", 2, 1)
    cmds = node_commands(K3, {**TWO, "parallel": {"tensor": 2}, "gpus_per_node": 1})
    assert [c.serve_args.count("--tensor-parallel-size=2") for c in cmds.values()] == [1, 1]
    assert "--headless" in cmds["gb300-a02"].serve_args and "--headless" not in cmds["gb300-a01"].serve_args
    with pytest.raises(ConfigError, match="vllm_gpus_per_node"):
        layout(K3, {**TWO, "parallel": {"tensor": 2}, "gpus_per_node": None})


def test_cli_prints_plan_and_refuses_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", K3.source,
                 "--facts", json.dumps({**TWO, "parallel": {"pipeline": 2}})]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["order"] == ["gb300-a01", "gb300-a02"] and plan["layout"]["kind"] == "replica"
    assert plan["ready_timeout_s"] == 3600
    assert main(["plan", "--profile", K3.source, "--facts", json.dumps(TWO)]) == 2
    assert "must fill each node" in capsys.readouterr().err


PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
keys = ("model_tag", "nnodes", "node_rank", "master_addr", "headless", "data_parallel_size",
        "data_parallel_size_local", "data_parallel_start_rank", "data_parallel_address",
        "enable_expert_parallel", "all2all_backend", "tensor_parallel_size", "pipeline_parallel_size")
out = []
for args in json.load(sys.stdin):
    ns = parser.parse_args(args)
    out.append({k: getattr(ns, k) for k in keys})
print(json.dumps(out, default=str))
"""


@pytest.mark.lab
def test_vllm_032_parser_accepts_every_golden_command() -> None:
    """The commands are vLLM's own multi-node mechanism: its real 0.32 CLI parser reads them back."""
    if not LAB_PYTHON.exists():
        pytest.skip("no lab vLLM environment: make lab-venv")
    commands = [c for profile, facts in CASES.values() for c in node_commands(profile, facts).values()]
    proc = subprocess.run([str(LAB_PYTHON), "-c", PARSE], input=json.dumps([c.serve_args for c in commands]),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    for cmd, ns in zip(commands, parsed, strict=True):
        assert ns["headless"] == (cmd.rank > 0)
        if "--nnodes=2" in cmd.serve_args:
            assert (ns["nnodes"], ns["node_rank"], ns["master_addr"]) == (2, cmd.rank, "10.40.1.11")
        if any(a.startswith("--data-parallel-size=16") for a in cmd.serve_args):
            assert (ns["data_parallel_size"], ns["data_parallel_size_local"]) == (16, 8)
            assert ns["data_parallel_start_rank"] == (8 if cmd.rank else None)
            assert ns["enable_expert_parallel"] is True and ns["all2all_backend"] == "deepep_v2"


def test_node_logs_saved_as_redacted_evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "a01.log"
    log.write_text("INFO started with key sk-live-0123456789abcdef\n")
    monkeypatch.setenv("VLLM_API_KEY", "sk-live-0123456789abcdef")
    assert main(["evidence", "--run-dir", str(tmp_path / "run"), f"gb300-a01={log}",
                 f"gb300-a02={tmp_path / 'absent.log'}"]) == 0
    saved = (tmp_path / "run" / "evidence" / "serve" / "nodes" / "gb300-a01.log").read_text()
    assert "sk-live-0123456789abcdef" not in saved and "started with key" in saved
    assert "missing" in (tmp_path / "run" / "evidence" / "serve" / "nodes" / "gb300-a02.log").read_text()
    assert main(["evidence", "--run-dir", str(tmp_path / "run"), f"../x={log}"]) == 2
