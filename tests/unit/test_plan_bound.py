"""Issue 43 item 4: the plan is a bound, and says what fits (docs/plan.md). Each figure here is derived again from
the files (profiles, inventories, data/hardware.yml, the recipe) or from the code the run executes, never from a
shape written in the test."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance import plan as planmod
from vllm_acceptance.core.bounds import ramp_bound, request_bound_s
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.hardware import load_hardware_table
from vllm_acceptance.probes.load import stages as load_stages
from vllm_acceptance.probes.load.config import LoadProbeConfig
from vllm_acceptance.progress import stage_bounds
from vllm_acceptance.recipe.generate import generate
from vllm_acceptance.recipe.resolve import Selection

from support.examples import fill_placeholders

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = REPO / "inventories" / "example-gb300"
ONE_NODE = REPO / "inventories" / "example-b300"
RECIPE = REPO / "recipes" / "vllm-project" / "Kimi-K3.yaml"


def _plan(inventory: Path, **kw: Any) -> planmod.Plan:
    return planmod.build_plan(inventory, vllm_python="none", **kw)


def _profile(name: str) -> dict[str, Any]:
    return yaml.safe_load((REPO / "profiles" / f"{name}.yml").read_text())


# --- the plan's steps are the run's ---------------------------------------------------------------------------


class _Run:
    """What stage_ramp reads of a LoadRun: its settings and whether the server crashed."""

    def __init__(self, cfg: LoadProbeConfig) -> None:
        self.cfg, self.crashed = cfg, None


def test_the_plan_counts_the_ramp_steps_the_run_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's own stage_ramp (probes/load/stages.py), each step meeting its SLO and no time passing (so every
    step past the contract starts), walks exactly the steps the plan bounds; the run's progress line says the same
    count and bound (old main: the plan showed 4 steps, the progress line 5, stage_ramp walks 7)."""
    plan = _plan(FLAGSHIP)
    ramp = next(s for s in plan.stages if s.name == "ramp")
    profile = load_profile(REPO / "profiles" / "kimi-k3.yml")
    cfg = LoadProbeConfig.from_profile(profile, {}, model="m")
    walked: list[int] = []

    def step(_run: Any, _stage: str, concurrency: int, _context: int, _seed: int) -> dict[str, Any]:
        walked.append(concurrency)
        return {"meets_slo": True}

    monkeypatch.setattr(load_stages, "run_step", step)
    monkeypatch.setattr(load_stages.time, "time", lambda: 0.0)
    load_stages.stage_ramp(_Run(cfg))  # type: ignore[arg-type]
    assert [s["concurrency"] for s in ramp.steps] == walked
    assert ramp.requests == sum(s["requests"] for s in ramp.steps)
    line = stage_bounds(_profile("kimi-k3"))["load"]
    assert f"({len(walked)} steps)" in line
    hours, minutes = divmod(int(round(ramp.wall_s)) // 60, 60)
    assert f"the ramp at most {hours} h {minutes} min" in line


def test_a_contract_wave_counts_its_output_tokens_at_the_itl_slo() -> None:
    """The flagship contract forces 4,096 output tokens at 0.1 s per token: a contract-shaped request may take
    TTFT + 410 s, not the 120 s e2e SLO (old main counted every wave at the e2e SLO)."""
    profile = _profile("kimi-k3")
    slo, out = profile["contract"]["slo"], profile["contract"]["max_output_tokens"]
    one = slo["ttft_p95_s"] + out * slo["itl_p95_s"]
    assert out == 4096 and one > slo["e2e_p95_s"] * 3
    stage = {s.name: s for s in _plan(FLAGSHIP).stages}
    assert stage["long_prompt"].wall_s == pytest.approx(one)
    assert stage["context_contract"].wall_s == pytest.approx(stage["context_contract"].requests * one)
    contract = profile["contract"]["concurrency"]
    at_contract = next(s for s in stage["ramp"].steps if s["concurrency"] == contract)
    assert at_contract["bound_s"] == pytest.approx(-(-at_contract["requests"] // contract) * one)
    assert "4,096 output tokens x ITL 0.1 s" in stage["ramp"].basis


def test_a_request_never_counts_past_its_timeout_and_a_step_past_its_deadline() -> None:
    assert request_bound_s({"ttft_p95_s": 10, "itl_p95_s": 0.1}, 4096, 900)[0] == pytest.approx(419.6)
    capped, how = request_bound_s({"ttft_p95_s": 10, "itl_p95_s": 0.1}, 20_000, 900)
    assert capped == 900 and "request timeout 900 s" in how
    # without an ITL SLO nothing bounds a request but its timeout
    assert request_bound_s({"e2e_p95_s": 120}, 4096, 900)[0] == 900
    # a step of 128 requests at concurrency 1 is 128 waves, cut at the step's deadline
    assert ramp_bound([1], 1, 1, 128, 100.0, 7200, 300).bound_s == 7200
    # past the contract a step starts only while the ramp is under its budget: the steps up to the contract, or
    # the budget + the longest later step, whichever is longer
    two = ramp_bound([1, 2], 1, 4, 4, 10.0, 1000, 5)
    assert two.always == [1] and two.budgeted == [2, 4] and two.bound_s == pytest.approx(max(40, 5 + 20))


# --- what fits --------------------------------------------------------------------------------------------------


def _one_node_with(tmp_path: Path, profile: str | Path) -> Path:
    inv = tmp_path / "site"
    shutil.copytree(ONE_NODE, inv)
    site = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())
    site["acceptance_profile"] = str(profile)
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    fill_placeholders(inv / "group_vars" / "all.yml")      # the site's digest: the gate refuses the placeholder
    return inv


def _refusal(inventory: Path) -> str:
    with pytest.raises(ConfigError) as refused:
        _plan(inventory)
    return str(refused.value)


def test_k3_weights_are_refused_on_one_h200_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """profiles/kimi-k3-h200.yml (the recipe's single_node_tp on 8 x H200): 1,680 GB of weights, 8 x 141 GB."""
    data = _profile("kimi-k3-h200")
    h200 = load_hardware_table()["h200"]
    weights, gpus = data["model"]["weights_gb"], data["parallel"]["tensor"]
    text = _refusal(_one_node_with(tmp_path, "kimi-k3-h200"))
    assert "does not fit" in text and f"{weights:,} GB of weights" in text
    assert f"on {gpus} x H200 = {gpus * h200.gpu_memory_gb:,.0f} GB" in text        # 8 x 141 = 1,128 GB
    assert f"{weights / gpus:,.0f} GB per GPU needed" in text
    assert "at least 2 node(s) of h200" in text and "b300 (8 x B300" in text
    # the recipe's layouts on those 2 nodes that hold the weights, each with the command that writes its profile
    assert "TP16 over 2 x h200 (all 16 GPUs)" in text
    assert "--hardware h200 --strategy multi_node_tp --nodes 2" in text
    # the CLI: exit 2 with the same reason, before anything is touched
    assert cli.main(["plan", "-i", str(_one_node_with(tmp_path / "cli", "kimi-k3-h200")),
                     "--vllm-python", "none"]) == 2
    assert "does not fit" in capsys.readouterr().err


def test_k3_weights_are_refused_on_one_b200_node(tmp_path: Path) -> None:
    """The recipe's single_node_tp generated for B200 (from-recipe --hardware b200): 8 x 180 GB = 1,440 GB."""
    profile, text = generate(RECIPE, Selection(hardware="b200", strategy="single_node_tp"), name="k3-b200")
    path = tmp_path / "k3-b200.yml"
    path.write_text(text)
    b200 = load_hardware_table()["b200"]
    gpus = int(profile["parallel"]["tensor"])
    refused = _refusal(_one_node_with(tmp_path, path))
    assert f"on {gpus} x B200 = {gpus * b200.gpu_memory_gb:,.0f} GB" in refused and "1,440 GB" in refused
    assert f"{profile['model']['weights_gb']:,} GB of weights" in refused
    assert "at least 2 node(s) of b200" in refused


def test_k3_on_one_b300_node_fits_and_says_so() -> None:
    plan = _plan(ONE_NODE)
    assert plan.fit and "8 x B300" in plan.fit[0] and "KV cache for the contract" in plan.fit[1]
    assert "KV cache for the contract" in planmod.render_text(plan)


# --- GPUs booked = GPUs the launch holds -------------------------------------------------------------------------


def _four_trays(tmp_path: Path, **site_vars: Any) -> Path:
    inv = tmp_path / "four"
    shutil.copytree(FLAGSHIP, inv)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    groups = hosts["all"]["children"]
    for n in (3, 4):
        groups["gpu_nodes"]["hosts"][f"gb300-tray0{n}"] = {"ansible_host": f"10.40.1.1{n}"}
        groups["vllm_workers"]["hosts"][f"gb300-tray0{n}"] = None
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    site = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())
    site.update(site_vars)
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    return inv


def test_gpus_booked_are_the_gpus_each_container_holds(tmp_path: Path) -> None:
    """The flagship on 4 trays with vllm_gpus_per_node: 2 (the layout's advice): `--gpus all` still hands each
    tray's 4 GPUs to its container, so 16 GPUs are booked, not 4 x 2 (old main booked 8 and halved GPU-hours)."""
    plan = _plan(_four_trays(tmp_path, vllm_gpus_per_node=2))
    tray = load_hardware_table()["gb300"].gpus_per_node
    assert all(n.argv[n.argv.index("--gpus") + 1] == "all" for n in plan.nodes)
    assert plan.gpus == 4 * tray == sum(plan.gpus_by_node.values())
    soak = next(s for s in plan.stages if s.name == "soak")
    assert soak.gpu_hours == pytest.approx(soak.wall_s * 4 * tray / 3600)
    assert f"4 gpu_nodes x {tray} = {4 * tray}" in planmod.render_text(plan)


def test_a_container_given_fewer_gpus_books_those() -> None:
    assert planmod.held_gpus(["docker", "run", "--gpus", "all"], 8) == 8
    assert planmod.held_gpus(["docker", "run", "--gpus=2"], 8) == 2
    assert planmod.held_gpus(["docker", "run", "--gpus", '"device=0,1,2"'], 8) == 3
    assert planmod.held_gpus(["podman", "run", "--device", "nvidia.com/gpu=all"], 4) == 4
    assert planmod.held_gpus(["docker", "run", "--ipc", "host"], 4) == 4   # no GPU flag: the node is held


# --- the README's table is the plan's ----------------------------------------------------------------------------


def test_the_readme_cost_table_is_the_plans() -> None:
    text = planmod.README.read_text()
    assert text == planmod.render_readme(text, planmod.readme_plan()), (
        "README.md's plan table is stale: run python -m vllm_acceptance.plan readme")
    plan = planmod.readme_plan()
    assert f"**{plan.total_s / 3600:.2f} h** | **{plan.total_gpu_hours:.2f}**" in text
