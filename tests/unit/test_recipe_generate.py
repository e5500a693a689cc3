"""Profiles generated from the vendored official recipe (recipes/vllm-project/Kimi-K3.yaml): the shipped ones are
byte-identical to a fresh generation, every launch argument and variable names its recipe field, the recipe's
unsupported combinations are refused with its reason, and a site profile layers on a generated one (extends)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.cli import main
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.recipe.generate import generate
from vllm_acceptance.recipe.resolve import Selection

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "vllm-project" / "Kimi-K3.yaml"

# Every shipped profile generated from the recipe: (profile, hardware, strategy). Regenerate one with
# `vllm-acceptance profile from-recipe recipes/vllm-project/Kimi-K3.yaml --hardware H --strategy S --name P
#  --out profiles/P.yml` (the command is also the first line of each file).
SHIPPED = [
    ("kimi-k3", "gb300", "multi_node_tp"),            # the flagship: GB300 NVL72, two 4-GPU trays, TP8 across
    ("kimi-k3-gb300", "gb300", "multi_node_tp"),
    ("kimi-k3-b300", "b300", "single_node_tp"),
    ("kimi-k3-gb300-dep16", "gb300", "multi_node_dep"),
    ("kimi-k3-h200", "h200", "single_node_tp"),
]


@pytest.mark.parametrize("name,hardware,strategy", SHIPPED)
def test_shipped_profile_is_what_the_recipe_gives(name: str, hardware: str, strategy: str) -> None:
    _profile, text = generate(RECIPE, Selection(hardware, strategy), name=name)
    shipped = (ROOT / "profiles" / f"{name}.yml").read_text()
    assert shipped == text, (f"profiles/{name}.yml differs from the recipe: regenerate it with the command on its "
                             "first line (never edit a generated profile; site values go in a profile that extends it)")
    assert load_profile(ROOT / "profiles" / f"{name}.yml").name == name


@pytest.mark.parametrize("name,hardware,strategy", SHIPPED)
def test_every_argument_and_variable_names_its_recipe_field(name: str, hardware: str, strategy: str) -> None:
    profile = load_profile(ROOT / "profiles" / f"{name}.yml")
    provenance = profile.get("launch.provenance")
    flags = [a.split("=", 1)[0] for a in profile.get("launch.args")]
    assert sorted(provenance["args"]) == sorted(flags)
    assert set(profile.get("launch.env")) <= set(provenance["env"])
    assert profile.get("recipe.commit") == "6f19519bb680e870356b72a06d2638d6efc6da70"
    assert profile.get("recipe.sha256") == __import__("hashlib").sha256(RECIPE.read_bytes()).hexdigest()


def test_hopper_takes_the_recipes_hopper_overrides_over_its_base_args() -> None:
    profile, _ = generate(RECIPE, Selection("h200", "single_node_tp"))
    args, why = profile["launch"]["args"], profile["launch"]["provenance"]["args"]
    assert "--moe-backend=marlin" in args and "--max-model-len=32768" in args and "--max-num-seqs=5" in args
    assert "--gpu-memory-utilization=0.97" in args and "--gpu-memory-utilization=0.95" not in args
    assert why["--gpu-memory-utilization"] == "hardware_overrides.hopper (replaces 0.95 (model.base_args))"
    assert "--kv-cache-dtype=fp8" not in args          # a Blackwell override
    assert profile["model"]["max_model_len"] == 32768
    # the default contract could never fit the recipe's 32,768 tokens and 5 sequences: shrunk, and said so
    assert profile["contract"]["context_tokens"] + profile["contract"]["max_output_tokens"] == 32768
    assert profile["contract"]["concurrency"] == 5
    assert any("--max-num-seqs 5" in note for note in profile["recipe"]["notes"])


def test_gb300_dep16_takes_the_strategys_gb300_moe_backend_on_four_trays() -> None:
    profile, _ = generate(RECIPE, Selection("gb300", "multi_node_dep"))
    assert profile["launch"]["provenance"]["args"]["--moe-backend"] == \
        "strategy_overrides.multi_node_dep.hardware_overrides.gb300"
    assert profile["parallel"] == {"tensor": 1, "pipeline": 1, "data": 16, "expert": True}
    hardware = profile["hardware"]
    assert (hardware["gpus_per_node"], hardware["min_nodes"], hardware["min_gpus"]) == (4, 4, 16)
    assert (hardware["nvlink_domain"], hardware["interconnect"]) == ("mnnvl", "nvl")
    assert profile["launch"]["site_env"] == {"GLOO_SOCKET_IFNAME": "$IFACE_NAME", "NCCL_SOCKET_IFNAME": "$IFACE_NAME"}
    assert "GLOO_SOCKET_IFNAME" not in profile["launch"]["env"]      # a placeholder is never passed as written
    # the same strategy on B300 leaves --moe-backend to vLLM (no gb300 block, no blackwell block)
    b300, _ = generate(RECIPE, Selection("b300", "multi_node_dep"))
    assert not any(a.startswith("--moe-backend") for a in b300["launch"]["args"])


@pytest.mark.parametrize("hardware,strategy,reason", [
    ("h200", "multi_node_dep", "strategy_hardware.multi_node_dep.h200 is `unsupported`"),
    ("b300", "multi_node_tp_dp", "grants it only to h200, gb200, gb300"),
    ("gb300", "single_node_tp", "single_node_tp needs 8 GPUs (strategy_min_gpus) and a gb300 node has 4"),
])
def test_the_recipes_unsupported_combination_is_refused_with_its_reason(
        hardware: str, strategy: str, reason: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "p.yml"
    code = main(["profile", "from-recipe", str(RECIPE), "--hardware", hardware, "--strategy", strategy,
                 "--out", str(out)])
    assert code == 2 and not out.exists()
    assert reason in capsys.readouterr().err


def test_an_opt_in_feature_scoped_to_another_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match="features.decode_context_parallelism.strategies lists single_node_tp"):
        generate(RECIPE, Selection("gb300", "multi_node_tp", features=("decode_context_parallelism",)))
    profile, _ = generate(RECIPE, Selection("b300", "single_node_tp", features=("decode_context_parallelism",)))
    assert profile["launch"]["provenance"]["args"]["--attention-config"].startswith(
        "features.decode_context_parallelism (replaces")


def test_a_prose_fact_the_recipe_no_longer_states_stops_generation(tmp_path: Path) -> None:
    edited = tmp_path / "Kimi-K3.yaml"
    edited.write_text(RECIPE.read_text().replace("Use the vllm/vllm-openai:kimi-k3 docker",
                                                 "Use the vllm/vllm-openai:kimi-k3-v2 docker"))
    with pytest.raises(ConfigError, match=r"guide\.image\.nvidia"):
        generate(edited, Selection("b300", "single_node_tp"))


def test_an_edited_recipe_copy_is_not_credited_to_the_vendored_commit(tmp_path: Path) -> None:
    copy = tmp_path / "Kimi-K3.yaml"
    copy.write_text(RECIPE.read_text().replace('"0.95"', '"0.93"'))
    shutil.copy(RECIPE.parent / "SOURCE.yml", tmp_path / "SOURCE.yml")
    profile, _ = generate(copy, Selection("b300", "single_node_tp"))
    assert profile["recipe"]["commit"] is None and "--gpu-memory-utilization=0.93" in profile["launch"]["args"]


def test_a_site_profile_extends_a_generated_one_and_is_validated_after_merging(tmp_path: Path) -> None:
    site = tmp_path / "site.yml"
    site.write_text(yaml.safe_dump({
        "name": "site-b300", "extends": str(ROOT / "profiles" / "kimi-k3-b300.yml"),
        "contract": {"concurrency": 32, "context_tokens": 131072},
        "launch": {"args": [*load_profile(ROOT / "profiles" / "kimi-k3-b300.yml").get("launch.args"),
                            "--max-num-seqs=32"]}}))
    profile = load_profile(site)
    assert profile.name == "site-b300" and profile.extends == (str(ROOT / "profiles" / "kimi-k3-b300.yml"),)
    assert profile.get("contract.concurrency") == 32 and profile.get("contract.max_output_tokens") == 4096
    assert profile.get("recipe.commit") == "6f19519bb680e870356b72a06d2638d6efc6da70"
    assert profile.get("launch.provenance.args")["--max-num-seqs"] == f"site profile {site}"
    assert profile.get("launch.provenance.args")["--max-model-len"] == "hardware_overrides.blackwell"
    site.write_text(yaml.safe_dump({"name": "site-b300", "extends": "kimi-k3-b300",
                                    "contract": {"concurrency": "many"}}))
    with pytest.raises(ConfigError, match=r"merged over .*kimi-k3-b300.yml\): field `contract.concurrency`"):
        load_profile(site)


def test_extends_refuses_a_missing_parent_and_a_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("name: a\nextends: b\n")
    (tmp_path / "b.yml").write_text("name: b\nextends: a\n")
    with pytest.raises(ConfigError, match="leads back to itself"):
        load_profile(tmp_path / "a.yml")
    (tmp_path / "c.yml").write_text("name: c\nextends: no-such-profile\n")
    with pytest.raises(ConfigError, match="field `extends`: 'no-such-profile' not found"):
        load_profile(tmp_path / "c.yml")


def test_the_example_inventories_launch_the_recipes_layouts(tmp_path: Path) -> None:
    """inventories/example-gb300: two 4-GPU GB300 trays, one TP8 replica across them over multi-node NVLink;
    inventories/example-b300: one 8-GPU node, TP8 inside it. Copied, the placeholder digest is refused (gate.py,
    issue 43); with the site's digest the copy validates."""
    import shutil

    from vllm_acceptance.plan import build_plan

    site = tmp_path / "b300"
    shutil.copytree(ROOT / "inventories" / "example-b300", site)
    assert main(["validate", "-i", str(site), "--project", str(ROOT), "--vllm-python", "none"]) == 2
    group_vars = site / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text().replace("sha256:" + "0" * 64, "sha256:" + "5" * 64))
    assert main(["validate", "-i", str(site), "--project", str(ROOT)]) == 0
    trays = build_plan(ROOT / "inventories" / "example-gb300", vllm_python="none").nodes
    assert [n.role for n in trays] == ["head", "worker"]
    for rank, node in enumerate(trays):
        assert {"--tensor-parallel-size=8", "--nnodes=2", f"--node-rank={rank}"} <= set(node.argv)
        assert node.env["NCCL_MNNVL_ENABLE"] == "1"                        # the recipe's MNNVL environment
        assert "--all2all-backend=flashinfer_nvlink_one_sided" in node.argv
    (single,) = build_plan(ROOT / "inventories" / "example-b300", vllm_python="none").nodes
    assert "--tensor-parallel-size=8" in single.argv and "--nnodes=2" not in " ".join(single.argv)


def test_the_gb300_dep16_profile_launches_four_trays_of_four_ranks() -> None:
    from vllm_acceptance.serve.launch import node_commands

    profile = load_profile(ROOT / "profiles" / "kimi-k3-gb300-dep16.yml")
    trays = ["t1", "t2", "t3", "t4"]
    commands = node_commands(profile, {"head": "t1", "workers": trays[1:], "image_digest": "sha256:" + "0" * 64})
    for rank, host in enumerate(trays):
        args = commands[host].serve_args
        assert {"--data-parallel-size=16", "--data-parallel-size-local=4"} <= set(args)
        assert "--moe-backend=deep_gemm_mega_moe" in args
        assert args.count("--enable-expert-parallel") == 1          # the recipe's strategy flag, once
        assert (f"--data-parallel-start-rank={rank * 4}" in args) is (rank > 0)


def test_the_nvfp4_variant_serves_its_own_checkpoint_on_blackwell_only() -> None:
    profile, _ = generate(RECIPE, Selection("b300", "single_node_tp", variant="nvfp4"))
    assert profile["model"]["name"] == "RedHatAI/Kimi-K3-NVFP4" and profile["hardware"]["memory_estimate_gb"] == 1650
    with pytest.raises(ConfigError, match="variant nvfp4 \\(nvfp4\\) runs on NVIDIA Blackwell only, h200 is hopper"):
        generate(RECIPE, Selection("h200", "single_node_tp", variant="nvfp4"))


@pytest.mark.parametrize("name,hardware,strategy", SHIPPED)
def test_the_agent_case_set_is_also_sent_at_the_contract_concurrency(name: str, hardware: str, strategy: str) -> None:
    """agent.under_load follows contract.concurrency, also where --max-num-seqs shrinks it (h200: 5)."""
    profile, _ = generate(RECIPE, Selection(hardware, strategy), name=name)
    assert profile["agent"]["under_load"] == profile["contract"]["concurrency"] > 0
