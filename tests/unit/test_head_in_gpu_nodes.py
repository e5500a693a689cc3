"""Issue 41 item 9: a launch only on hosts of `gpu_nodes`. A `vllm_head` (or `vllm_workers` host) outside them passed
validation; the launch then ran on a node preflight never judged, and when that node was down the serve play ended
the run before the report (no verdict, exit 1). In launch mode it is refused before any node is touched (exit 2),
the message naming the host, the groups and the fix; attach mode launches nothing and is accepted (its head is
reached at preflight: tests/integration/test_unreachable_run.py).

Through the real entry point: `vllm-acceptance validate -i <inventory dir>` (ansible-inventory reads the groups), and
core/rundir.py open_run as the validate play calls it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.core.rundir import open_run, require_head_in_gpu_nodes

from support.examples import fill_placeholders

REPO = Path(__file__).resolve().parents[2]
GPU = {"gb300-a01": {"ansible_host": "10.40.1.11"}, "gb300-a02": {"ansible_host": "10.40.1.12"}}


def inventory(root: Path, *, head: str, workers: list[str], gpu_nodes: list[str], mode: str = "launch",
              head_vars: dict[str, Any] | None = None) -> Path:
    """The example GB300 inventory (its group_vars) with these groups; `bastion` is a host that is no GPU node."""
    shutil.copytree(REPO / "inventories" / "example-gb300" / "group_vars", root / "group_vars")
    group_vars = fill_placeholders(root / "group_vars" / "all.yml")
    text = group_vars.read_text().replace("vllm_serve_mode: launch", f"vllm_serve_mode: {mode}")
    if mode == "attach":
        text += "vllm_base_url: http://10.40.1.11:8000/v1\n"
    group_vars.write_text(text)
    every = {**GPU, "bastion": {"ansible_host": "10.40.9.9"}}
    children: dict[str, Any] = {"gpu_nodes": {"hosts": {h: every[h] for h in gpu_nodes}},
                                "vllm_head": {"hosts": {head: {**every[head], **(head_vars or {})}}},
                                "loadgen": {"hosts": {"localhost": None}}}
    if workers:
        children["vllm_workers"] = {"hosts": {w: every[w] for w in workers}}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "children": children, "vars": {"ansible_user": "acceptance"},
        "hosts": {"localhost": {"ansible_connection": "local"}}}}))
    return root


def validate(inv: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["validate", "-i", str(inv), "--project", str(REPO)])
    captured = capsys.readouterr()
    return code, " ".join((captured.out + captured.err).split())


def test_a_launch_head_outside_gpu_nodes_is_refused_naming_host_groups_and_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = inventory(tmp_path / "site", head="bastion", workers=["gb300-a02"], gpu_nodes=["gb300-a01", "gb300-a02"])
    code, out = validate(inv, capsys)
    assert code == 2, out
    assert "host `bastion` is in group `vllm_head` but not in `gpu_nodes` (gpu_nodes: gb300-a01, gb300-a02)" in out
    assert "in launch mode the run starts vLLM on the head" in out
    assert "add `bastion` under all.children.gpu_nodes.hosts, or put one of the gpu_nodes in `vllm_head`" in out


def test_a_launch_worker_outside_gpu_nodes_is_refused_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = inventory(tmp_path / "site", head="gb300-a01", workers=["gb300-a02"], gpu_nodes=["gb300-a01"])
    code, out = validate(inv, capsys)
    assert code == 2 and "host `gb300-a02` is in group `vllm_workers` but not in `gpu_nodes` (gpu_nodes: gb300-a01)" \
        in out, out


def test_the_same_shape_on_gpu_nodes_or_attached_is_accepted(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    on_nodes = inventory(tmp_path / "a", head="gb300-a01", workers=["gb300-a02"], gpu_nodes=["gb300-a01", "gb300-a02"])
    assert validate(on_nodes, capsys)[0] == 0
    # attach launches nothing: a head outside gpu_nodes (e.g. the host that reaches the server) is accepted
    attached = inventory(tmp_path / "b", head="bastion", workers=[], gpu_nodes=["gb300-a01", "gb300-a02"],
                         mode="attach")
    code, out = validate(attached, capsys)
    assert code == 0, out
    # the head's own vllm_serve_mode decides (host_vars over group_vars), as its serve play reads it
    own = inventory(tmp_path / "c", head="bastion", workers=[], gpu_nodes=["gb300-a01", "gb300-a02"],
                    head_vars={"vllm_serve_mode": "attach", "vllm_base_url": "http://10.40.1.11:8000/v1"})
    code, out = validate(own, capsys)
    assert code == 0, out


def test_validate_refuses_a_gpu_profile_without_gpu_nodes_as_the_run_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = inventory(tmp_path / "site", head="gb300-a01", workers=[], gpu_nodes=[])
    code, out = validate(inv, capsys)
    assert code == 2 and "group `gpu_nodes` is missing or empty" in out, out


def test_the_run_opens_nothing_for_such_a_head(tmp_path: Path) -> None:
    """open_run as the validate play calls it (groups given): refused before the run directory exists."""
    variables = {"acceptance_profile": "kimi-k3", "acceptance_owner": "ml-platform-oncall", "vllm_serve_mode": "launch",
                 "vllm_image_digest": "sha256:" + "0" * 64}
    groups = {"vllm_head": ["bastion"], "vllm_workers": []}
    with pytest.raises(ConfigError, match=r"host `bastion` is in group `vllm_head` but not in `gpu_nodes`"):
        open_run(project_dir=REPO, reports_dir=tmp_path / "reports", inventory="site", variables=variables,
                 hosts=["gb300-a01"], groups=groups, host_variables={})
    assert not (tmp_path / "reports").exists()
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path / "reports", inventory="site", variables=variables,
                          hosts=["gb300-a01"], groups={"vllm_head": ["gb300-a01"], "vllm_workers": []},
                          host_variables={})
    assert (run_dir / "run.json").is_file()


def test_a_profile_without_gpus_and_no_gpu_nodes_has_nothing_to_check() -> None:
    cpu = load_profile(REPO / "profiles" / "cpu-lab.yml")
    require_head_in_gpu_nodes(cpu, {"vllm_head": ["localhost"], "gpu_nodes": []}, {"vllm_serve_mode": "launch"}, {},
                              "inventory lab")
    with pytest.raises(ConfigError, match="host `other`"):       # gpu_nodes named: the launch is held to them
        require_head_in_gpu_nodes(cpu, {"vllm_head": ["other"], "gpu_nodes": ["localhost"]},
                                  {"vllm_serve_mode": "launch"}, {}, "inventory lab")
