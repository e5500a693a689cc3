"""A node check that is one file (rules/node/): its commands reach the preflight template through the filter
for the switches they need, its evidence is read by name, and its rule is judged with the others
(docs/architecture.md "Adding a node check"; the worked example is rules/node/imex.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_acceptance.parsers.node_evidence import load_node_evidence
from vllm_acceptance.rules import compat
from vllm_acceptance.rules import node as nodes
from vllm_acceptance.rules.node.imex import check_imex

ROOT = Path(__file__).resolve().parents[2]


def test_the_imex_check_is_one_registered_unit_judged_over_the_trays() -> None:
    checks = {c.check_id: c for c in nodes.node_checks()}
    imex = checks["interconnect.imex"]
    assert imex.cluster_rule is check_imex and imex.node_rule is None
    assert check_imex in compat.CLUSTER_FABRIC_RULES
    assert [c.name for c in imex.commands] == ["imex_active", "imex_nodes"]


@pytest.mark.parametrize(("switches", "expected"), [
    ({"gpu_checks": True, "mnnvl": True}, ["imex_active", "imex_nodes", "imex_channels_host"]),
    ({"gpu_checks": True, "mnnvl": False, "nvswitch": True}, []),     # an HGX node runs no IMEX command
    ({"gpu_checks": False, "mnnvl": True}, []),                       # the CPU lab runs no GPU command
    ({}, []),
])
def test_commands_run_only_with_every_switch_they_need(switches: dict, expected: list[str]) -> None:
    assert [c["name"] for c in nodes.node_commands(switches)] == expected


def test_the_filter_gives_the_template_the_same_commands_and_refuses_a_non_dict() -> None:
    import importlib.util

    from ansible.errors import AnsibleFilterError

    path = ROOT / "plugins" / "filter" / "node_commands.py"
    spec = importlib.util.spec_from_file_location("node_commands_filter", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    got = module.FilterModule().filters()["acceptance_node_commands"]({"gpu_checks": True, "mnnvl": True})
    assert got == [{"name": "imex_active", "argv": ["systemctl", "is-active", "nvidia-imex"]},
                   {"name": "imex_nodes", "argv": ["nvidia-imex-ctl", "-N"]},
                   {"name": "imex_channels_host", "argv": ["ls", "-1", "/dev/nvidia-caps-imex-channels"]}]
    with pytest.raises(AnsibleFilterError, match="dictionary"):
        module.acceptance_node_commands(["mnnvl"])


def test_a_registered_command_is_read_on_demand_and_shown_by_its_argv(tmp_path: Path) -> None:
    base = tmp_path / "evidence" / "preflight" / "tray0"
    base.mkdir(parents=True)
    (base / "imex_nodes.txt").write_text("")
    (base / "imex_nodes.json").write_text(json.dumps({"cmd": ["nvidia-imex-ctl", "-N"], "rc": 1, "stderr": "no"}))
    record = load_node_evidence(tmp_path, "tray0").get("imex_nodes")
    assert record.present and record.rc == 1 and record.paths
    assert record.why_not() == "`nvidia-imex-ctl -N` exited 1: no"


def test_a_check_needs_one_rule_known_switches_and_its_own_command_names() -> None:
    nodes.node_checks()
    with pytest.raises(ValueError, match="exactly one"):
        nodes.register_node_check("interconnect.imex", ())
    with pytest.raises(ValueError, match="unknown switch"):
        nodes.NodeCommand("x", ("true",), needs=("gpus",))
    with pytest.raises(KeyError, match="compat.no_such_check"):
        nodes.register_node_check("compat.no_such_check", (), node_rule=lambda ctx: None)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="already registered"):
        nodes.register_node_check("compat.peermem", (nodes.NodeCommand("imex_nodes", ("true",)),),
                                  node_rule=lambda ctx: None)  # type: ignore[arg-type, return-value]
