"""The recipe's layouts on the user's nodes (issue 43 item 5), through the real CLI (`vllm-acceptance profile
from-recipe --nodes N`, `profile layouts`, `plan`, `validate`): TP16 over 2 x B300 is generated, a strategy the
recipe does not allow on N nodes is refused with what it allows there, the plan's refusal on 4 GB300 trays offers
the recipe's 16-GPU layouts (following one books and uses all 16 GPUs), and pd_cluster writes one valid profile per
pool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.cli import main
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.recipe.generate import generate
from vllm_acceptance.recipe.layouts import layouts
from vllm_acceptance.recipe.official import recipe_deviations
from vllm_acceptance.recipe.reader import load_bundle
from vllm_acceptance.recipe.resolve import RecipeRefusal, Selection, resolve
from vllm_acceptance.serve.launch import node_commands

from support.examples import fill_placeholders

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "vllm-project" / "Kimi-K3.yaml"
DIGEST = "sha256:" + "1" * 64


def from_recipe(*words: str) -> int:
    return main(["profile", "from-recipe", str(RECIPE), *words])


def test_tp16_over_two_b300_nodes_is_generated_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tp16.yml"
    assert from_recipe("--hardware", "b300", "--strategy", "multi_node_tp", "--nodes", "2", "--out", str(out)) == 0
    said = capsys.readouterr().out
    assert "multi_node_tp on 2 x b300" in said and "tensor 16" in said and "16 GPUs" in said
    profile = load_profile(out)
    assert profile.get("parallel") == {"tensor": 16, "pipeline": 1, "data": 1, "expert": False}
    assert (profile.get("hardware.min_nodes"), profile.get("hardware.min_gpus")) == (2, 16)
    assert "--nodes 2" in out.read_text().splitlines()[2]          # the header's command regenerates it
    commands = node_commands(profile, {"head": "n1", "workers": ["n2"], "image_digest": DIGEST})
    for rank, host in enumerate(("n1", "n2")):
        assert {"--tensor-parallel-size=16", "--nnodes=2", f"--node-rank={rank}"} <= set(commands[host].serve_args)
    assert recipe_deviations(profile.data) == []


def test_without_nodes_the_multi_node_strategy_says_it_wrote_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert from_recipe("--hardware", "b300", "--strategy", "multi_node_tp") == 0
    err = capsys.readouterr().err
    assert "multi_node_tp on 1 x b300" in err and "tensor 8" in err and "--nodes N" in err


@pytest.mark.parametrize("strategy,nodes,reason,offered", [
    ("multi_node_dep", "1", "multi_node_dep needs 16 GPUs (strategy_min_gpus): 2 b300 nodes of 8 GPUs at least",
     "single_node_tp: TP8 over 1 x b300 (all 8 GPUs)"),
    ("single_node_tp", "2", "single_node_tp is a single-node strategy", "multi_node_tp: TP16 over 2 x b300"),
    ("multi_node_tp_dp", "2", "grants it only to h200, gb200, gb300", "multi_node_dep: DEP16 over 2 x b300"),
    # past the builder's 16 nodes only the two pools of pd_cluster fit (16 decode nodes + 1 prefill node)
    ("multi_node_tp", "17", "scales a deployment out to 16 nodes",
     "pd_cluster: prefill TEP8 on 1 + decode DEP128 on 16 over 17 x b300 (all 136 GPUs)"),
])
def test_a_combination_the_recipe_does_not_allow_is_refused_with_what_it_allows(
        strategy: str, nodes: str, reason: str, offered: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.yml"
    assert from_recipe("--hardware", "b300", "--strategy", strategy, "--nodes", nodes, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert not out.exists() and reason in err and offered in err


def test_the_layouts_on_four_gb300_trays_use_all_sixteen_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    found = layouts(RECIPE, "gb300", 4)
    assert {lay.sizes for lay in found.allowed} == {"TP16", "TEP16", "TP4 x PP4", "DEP16", "TP4 x DP4"}
    assert all(lay.gpus == 16 for lay in found.allowed)
    assert "6 in all, not 4" in found.refused["pd_cluster"]                   # prefill 2 trays + decode 4
    assert "a gb300 node has 4" in found.refused["single_node_tp"]
    assert main(["profile", "layouts", str(RECIPE), "--hardware", "gb300", "--nodes", "4", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    dep = next(lay for lay in listed["allowed"] if lay["strategy"] == "multi_node_dep")
    assert (dep["data"], dep["expert"], dep["gpus"]) == (16, True, 16)
    assert "--nodes 4" in dep["command"]


def test_every_layout_offered_is_what_from_recipe_generates() -> None:
    """The sizes a layout states are the generated profile's: no listing of its own arithmetic."""
    for nodes in (1, 2, 4):
        for lay in layouts(RECIPE, "gb300" if nodes == 4 else "b300", nodes).allowed:
            if lay.pools:
                continue
            profile, _ = generate(RECIPE, Selection(lay.hardware, lay.strategy, nodes=nodes))
            par = profile["parallel"]
            assert (par["tensor"], par["pipeline"], par["data"], par["expert"]) == \
                (lay.tensor, lay.pipeline, lay.data, lay.expert)
            assert profile["hardware"]["min_gpus"] == lay.gpus and profile["hardware"]["min_nodes"] == nodes


def _four_trays(tmp_path: Path) -> Path:
    """inventories/example-gb300 as a newcomer copies it for 4 GB300 trays: the flagship profile, 4 nodes."""
    inventory = tmp_path / "four-trays"
    shutil.copytree(ROOT / "inventories" / "example-gb300", inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    groups = hosts["all"]["children"]
    for tray in ("gb300-tray03", "gb300-tray04"):
        groups["gpu_nodes"]["hosts"][tray] = {"ansible_host": f"10.40.1.{10 + int(tray[-1])}"}
        groups["vllm_workers"]["hosts"][tray] = None
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    fill_placeholders(inventory / "group_vars" / "all.yml")   # the site's digest and interface (gate.py)
    return inventory


def test_the_plan_on_four_trays_offers_the_recipes_sixteen_gpu_layouts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_acceptance.plan import build_plan

    inventory = _four_trays(tmp_path)
    assert main(["plan", "-i", str(inventory), "--project-dir", str(ROOT), "--vllm-python", "none"]) == 2
    err = capsys.readouterr().err
    assert "a replica across nodes must fill each node: 2 of 4 GPUs per node" in err
    assert "set vllm_gpus_per_node to the GPUs each node is meant to use" not in err    # the advice that halved it
    for offered in ("multi_node_tp: TP16 over 4 x gb300 (all 16 GPUs)", "DEP16 over 4 x gb300 (all 16 GPUs)"):
        assert offered in err
    # the recipe allows TP4 x DP4 here, but each engine would hold ~1,680 GB on 4 x 288 GB: not offered (plan.py
    # holds_weights, as model_fit judges a launch)
    assert "TP4 x DP4" not in err
    assert "of 16 GPUs" not in err                          # nothing offered that leaves GPUs idle
    command = next(line.strip() for line in err.splitlines() if "--strategy multi_node_dep --nodes 4" in line)
    # following the advice: the command it gives, then the profile it names: all 16 GPUs booked and used
    out = tmp_path / "dep16.yml"
    words = command.split()
    assert words[:3] == ["vllm-acceptance", "profile", "from-recipe"]
    words[words.index("--out") + 1] = str(out)
    words[3] = str(ROOT / words[3])
    assert main(words[1:]) == 0
    plan = build_plan(inventory, str(out), ROOT, vllm_python="none")
    assert plan.gpus == 16 and len(plan.nodes) == 4
    for node in plan.nodes:
        assert {"--data-parallel-size=16", "--data-parallel-size-local=4"} <= set(node.argv)


def test_a_profile_without_a_recipe_gets_no_recipe_offer() -> None:
    from vllm_acceptance.recipe.layouts import suggestions

    assert suggestions(None, None, None, 4) == ""
    assert "allows no layout on 1 x gb300" in suggestions("recipes/vllm-project/Kimi-K3.yaml", "gb300", None, 1)


@pytest.mark.parametrize("hardware,prefill,decode", [("gb300", (8, 1, 2), (1, 16, 4)), ("b300", (8, 1, 1), (1, 16, 2))])
def test_pd_cluster_writes_one_deployment_profile(hardware: str, prefill: tuple[int, int, int],
                                                  decode: tuple[int, int, int], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pd.yml"
    assert from_recipe("--hardware", hardware, "--strategy", "pd_cluster", "--out", str(out)) == 0
    said = capsys.readouterr().out
    assert "one P/D deployment" in said and not (tmp_path / "pd-prefill.yml").exists()
    profile = load_profile(out)
    assert profile.get("recipe.pool") is None and profile.get("pd.connector") == "NixlConnector"
    # the entry point is the router the recipe site writes (command-synthesis.js pd_cluster routerLines)
    assert profile.get("pd.router.program") == "vllm-router" and profile.get("pd.router.policy") == "round_robin"
    assert profile.get("pd.router.args") == ["--vllm-pd-disaggregation", "--intra-node-data-parallel-size", "1"]
    assert profile.get("launch.port") == profile.get("pd.router.port") and profile.get("launch.args") == []
    assert profile.get("hardware.min_nodes") == prefill[2] + decode[2]
    for pool, (tensor, data, nodes), port, role in (("prefill", prefill, 8001, "kv_producer"),
                                                    ("decode", decode, 8002, "kv_consumer")):
        assert profile.get(f"pd.{pool}.inventory_group") == f"{pool}_nodes"
        assert profile.get(f"pd.{pool}.launch.port") == port and profile.get(f"pd.{pool}.nodes") == nodes
        assert profile.get(f"pd.{pool}.parallel") == {"tensor": tensor, "pipeline": 1, "data": data, "expert": True}
        args = profile.get(f"pd.{pool}.launch.args")
        transfer = json.loads(next(a for a in args if a.startswith("--kv-transfer-config=")).split("=", 1)[1])
        assert transfer == {"kv_connector": "NixlConnector", "kv_role": role, "kv_load_failure_policy": "fail"}
        assert profile.get(f"pd.{pool}.kv_transfer_config") == transfer
        assert not any(a.startswith("--port") for a in args)           # launch.port: the launch passes it
        # each pool's launch is exactly the one its own pool profile (--pool) carries
        alone = generate(RECIPE, Selection(hardware, "pd_cluster", pool=pool))[0]
        assert profile.get(f"pd.{pool}.launch") == alone["launch"]
    # the header's command regenerates the file byte for byte
    assert generate(RECIPE, Selection(hardware, "pd_cluster"), name=profile.name)[1] == out.read_text()
    assert main(["validate", "--profile", str(out), "--vllm-python", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    decode_args = profile.get("pd.decode.launch.args")
    assert "--no-enable-prefix-caching" in decode_args            # the recipe's decode side
    assert ("--moe-backend=deep_gemm_mega_moe" in decode_args) is (hardware == "gb300")


def test_pd_profile_refuses_pools_on_different_connectors() -> None:
    from vllm_acceptance.core.profile_model import Pd

    pool = {"inventory_group": "g", "parallel": {"tensor": 1}, "launch": {"runtime": "process", "args": []}}
    Pd.model_validate({"connector": "NixlConnector", "prefill": {**pool, "kv_transfer_config": {
        "kv_connector": "NixlConnector"}}, "decode": pool})
    with pytest.raises(ValueError, match="pd.decode.kv_transfer_config.kv_connector 'ExampleConnector'"):
        Pd.model_validate({"connector": "NixlConnector", "prefill": pool, "decode": {**pool, "kv_transfer_config": {
            "kv_connector": "ExampleConnector"}}})


def test_pd_cluster_pools_are_sized_and_refused_by_the_recipe(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pd.yml"
    assert from_recipe("--hardware", "gb300", "--strategy", "pd_cluster", "--decode-nodes", "8",
                       "--out", str(out)) == 0
    assert load_profile(out).get("pd.decode.parallel.data") == 32
    assert "--decode-nodes 8 --name" in out.read_text().splitlines()[2]     # the header regenerates it
    capsys.readouterr()
    assert from_recipe("--hardware", "gb300", "--strategy", "pd_cluster", "--decode-nodes", "2",
                       "--out", str(tmp_path / "small.yml")) == 2
    assert "the decode pool (dep) needs 16 GPUs" in capsys.readouterr().err
    assert not (tmp_path / "small.yml").exists()                     # nothing written when a pool is refused
    assert "pd" in generate(RECIPE, Selection("gb300", "pd_cluster"))[0]      # one deployment profile
    with pytest.raises(RecipeRefusal, match="two pools"):                    # never one server's resolve
        resolve(load_bundle(RECIPE), Selection("gb300", "pd_cluster"))
    with pytest.raises(ConfigError, match="has no pools"):
        generate(RECIPE, Selection("gb300", "multi_node_tp", pool="prefill"))
