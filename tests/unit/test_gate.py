"""The gate (src/vllm_acceptance/gate.py; issue 43 item 1) on inputs as the validate play hands them over (Inputs),
without ansible-inventory: what it refuses names the field and the fix; a healthy copy of the example passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.core.variables import misspelt_prefix
from vllm_acceptance.gate import GateRefused, Inputs, check

REPO = Path(__file__).resolve().parents[2]
TRAYS = {"gb300-tray01": "10.40.1.11", "gb300-tray02": "10.40.1.12"}
SITE: dict[str, Any] = {
    "acceptance_profile": "kimi-k3", "acceptance_owner": "ml-platform-oncall", "acceptance_reviewer": "sre-lead",
    "vllm_image_digest": "sha256:" + "5" * 64, "vllm_serve_mode": "launch", "vllm_interconnect": "nvl",
    "vllm_serve_multinode_env": {"GLOO_SOCKET_IFNAME": "enP5p9s0", "NCCL_SOCKET_IFNAME": "enP5p9s0"},
    "acceptance_vllm_check_python": "none", "ansible_user": "acceptance"}


def inputs(site: dict[str, Any] | None = None, trays: dict[str, str] = TRAYS, **host: Any) -> Inputs:
    site = {**SITE, **(site or {})}
    names = list(trays)
    return Inputs(source="inventory /site", site=site,
                  hostvars={h: {**site, "ansible_host": a, **(host if h == names[0] else {})}
                            for h, a in trays.items()},
                  groups={"all": ["localhost", *names], "gpu_nodes": names, "vllm_head": names[:1],
                          "vllm_workers": names[1:]})


def refusal(given: Inputs) -> str:
    with pytest.raises(GateRefused) as info:
        check(given, REPO)
    return " ".join(str(info.value).split())


def test_a_healthy_copy_passes_and_the_gate_returns_its_plan() -> None:
    gated = check(inputs(), REPO)
    assert gated.profile.name == "kimi-k3" and [n.host for n in gated.plan.nodes] == list(TRAYS)


@pytest.mark.parametrize(("name", "meant"), [("acceptence_owner", "acceptance_owner"),
                                             ("vlm_serve_port", "vllm_serve_port"),
                                             ("preflght_pull_image", "preflight_pull_image")])
def test_a_misspelt_prefix_is_refused_with_the_name_meant(name: str, meant: str) -> None:
    assert misspelt_prefix(name) is not None
    out = refusal(inputs({name: "x"}))
    assert f"unknown variable `{name}`: did you mean `{meant}`?" in out
    # on one host only (host_vars) the host is named
    out = refusal(inputs(**{name: "x"}))
    assert f"host gb300-tray01: unknown variable `{name}`" in out


@pytest.mark.parametrize("name", ["ansible_host", "ansible_ssh_common_args", "inventory_hostname", "playbook_dir",
                                  "group_names", "ansible_python_interpreter", "node_name_x"])
def test_ansibles_own_names_are_not_taken_for_a_misspelt_prefix(name: str) -> None:
    assert misspelt_prefix(name) is None


def test_the_placeholders_of_the_example_are_refused_naming_the_fix() -> None:
    out = refusal(inputs({"vllm_image_digest": "sha256:" + "0" * 64}))
    assert "field `vllm_image_digest` (group_vars) is the example's placeholder" in out and "imagetools" in out
    out = refusal(inputs({"vllm_serve_multinode_env": {"GLOO_SOCKET_IFNAME": "<interface>"}}))
    assert "needs GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME" in out and "vllm_serve_multinode_env: {" in out
    # attached, nothing is launched across the nodes: the interface is not the launch's to set
    attached = inputs({"vllm_serve_mode": "attach", "vllm_base_url": "http://10.40.1.11:8000/v1",
                       "vllm_serve_multinode_env": {}})
    assert check(attached, REPO).plan.nodes == []


def test_the_plans_refusal_is_the_gates_naming_the_inventory() -> None:
    trays = {f"gb300-tray0{i}": f"10.40.1.1{i}" for i in range(1, 5)}
    out = refusal(inputs(trays=trays))
    assert out.startswith("inventory /site: the plan refuses it: a replica across nodes must fill each node: 2 of 4")
    assert check(inputs({"vllm_parallel": {"tensor": 16}}, trays=trays), REPO).plan.gpus == 16


def test_the_plan_bugs_of_issue_43_are_refused_not_printed() -> None:
    assert "field `vllm_serve_port`" in refusal(inputs({"vllm_serve_port": "eighty"}))
    assert "vllm_base_url is required because vllm_serve_mode is attach" in refusal(
        inputs({"vllm_serve_mode": "attach"}))
    assert "vllm_serve_multinode_env" in refusal(inputs({"vllm_serve_multinode_env": "enP5p9s0"}))
    no_gpu_nodes = inputs()
    no_gpu_nodes.groups["gpu_nodes"] = []
    assert "group `gpu_nodes` is missing or empty" in refusal(no_gpu_nodes)
    empty = inputs()
    empty.groups = {"all": []}
    assert "holds no host" in refusal(empty)


def test_a_secret_in_a_refusal_is_redacted() -> None:
    out = refusal(inputs({"vllm_serve_mode": "attach", "vllm_base_url": "ftp://admin:PLANTEDpw@head/v1"}))
    assert "PLANTEDpw" not in out
