"""The layouts a recipe allows on N nodes of one hardware: each strategy the recipe opens for that hardware
(compatible_strategies, strategy_hardware), laid out on exactly those nodes as `profile from-recipe --nodes N`
generates it (recipe/resolve.py: strategy_min_gpus, the builder's MAX_NODES, a single-node strategy on one node),
with its TP/PP/DP/EP sizes, the GPUs it uses and the command that writes its profile. A pd_cluster recipe is
offered where its two pools fit the nodes (recipe/pools.py). What the recipe refuses on those nodes is kept with
its reason. `vllm-acceptance profile layouts` prints them; the plan's layout refusal (plan.py) offers them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.profile import ConfigError
from .generate import default_name, relative
from .official import recipe_path
from .pools import deployment as resolve_any
from .reader import RecipeBundle, load_bundle
from .resolve import Deployment, RecipeRefusal, Selection, resolve


@dataclass(frozen=True)
class RecipeLayout:
    """One strategy on N nodes: its parallel sizes, the GPUs it uses, and how to get its profile."""

    strategy: str
    hardware: str
    nodes: int
    gpus_per_node: int
    tensor: int
    pipeline: int
    data: int
    expert: bool
    command: str
    name: str = ""                   # the profile `command` writes (profiles/<name>.yml)
    pools: tuple[RecipeLayout, ...] = field(default_factory=tuple)
    pool: str | None = None

    @property
    def gpus(self) -> int:
        if self.pools:
            return sum(p.gpus for p in self.pools)
        return self.tensor * self.pipeline * self.data

    @property
    def sizes(self) -> str:
        """TP16, TEP16, DEP16, TP4 x DP4, TP8 x PP2 (EP: the experts over every GPU of the replica or ranks)."""
        if self.pools:
            return " + ".join(f"{p.pool} {p.sizes} on {p.nodes}" for p in self.pools)
        if self.expert and self.tensor == 1 and self.pipeline == 1 and self.data > 1:
            return f"DEP{self.data}"
        parts = [f"{'TEP' if self.expert else 'TP'}{self.tensor}"]
        parts += [f"PP{self.pipeline}"] if self.pipeline > 1 else []
        parts += [f"DP{self.data}"] if self.data > 1 else []
        return " x ".join(parts)

    def describe(self) -> str:
        total = self.nodes * self.gpus_per_node
        use = f"{self.gpus} of {total} GPUs" if self.gpus != total else f"all {total} GPUs"
        return f"{self.strategy}: {self.sizes} over {self.nodes} x {self.hardware} ({use})"

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "hardware": self.hardware, "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node, "gpus": self.gpus, "sizes": self.sizes,
                "tensor": self.tensor, "pipeline": self.pipeline, "data": self.data, "expert": self.expert,
                "command": self.command, **({"pools": [p.to_dict() for p in self.pools]} if self.pools else {})}


@dataclass
class Layouts:
    hardware: str
    nodes: int
    allowed: list[RecipeLayout]
    refused: dict[str, str]          # strategy -> the recipe's reason on these nodes

    def render(self, indent: str = "  ") -> str:
        head = f"the recipe allows on {self.nodes} x {self.hardware}:"
        if not self.allowed:
            head = f"the recipe allows no layout on {self.nodes} x {self.hardware}"
        lines = [head] + [f"{indent}{lay.describe()}\n{indent}  {lay.command}" for lay in self.allowed]
        return "\n".join(lines)


def offered_strategies(bundle: RecipeBundle) -> list[str]:
    """compatible_strategies plus the strategies strategy_hardware grants somewhere (the builder's
    effectiveCompatibleStrategies), in the recipe's order."""
    listed = [str(s) for s in bundle.data.get("compatible_strategies") or []]
    grants = [str(s) for s, gate in (bundle.data.get("strategy_hardware") or {}).items()
              if s not in listed and isinstance(gate, dict) and "supported" in gate.values()]
    return [s for s in listed + grants if s in bundle.strategies]


def from_recipe_command(recipe: str, selection: Selection, name: str, extra: tuple[str, ...] = ()) -> str:
    words = ["vllm-acceptance profile from-recipe", recipe, "--hardware", selection.hardware,
             "--strategy", selection.strategy]
    if selection.variant != "default":
        words += ["--variant", selection.variant]
    if selection.nodes is not None:
        words += ["--nodes", str(selection.nodes)]
    return " ".join([*words, *extra, "--out", f"profiles/{name}.yml"])


def _layout(deployment: Deployment, command: str, name: str) -> RecipeLayout:
    sel, par = deployment.selection, deployment.parallel
    return RecipeLayout(strategy=sel.strategy, hardware=sel.hardware, nodes=deployment.nodes,
                        gpus_per_node=deployment.gpus_per_node, tensor=int(par["tensor"]),
                        pipeline=int(par["pipeline"]), data=int(par["data"]), expert=bool(par["expert"]),
                        command=command, name=name, pool=sel.pool)


def pd_layout(bundle: RecipeBundle, recipe: str, hardware: str, nodes: int, variant: str) -> RecipeLayout:
    """The pd_cluster pools on `nodes` nodes: the prefill pool at its floor, the decode pool on the rest (it
    scales out); RecipeRefusal when the two floors do not fit."""
    prefill = resolve_any(bundle, Selection(hardware, "pd_cluster", variant, pool="prefill"))
    decode_floor = resolve_any(bundle, Selection(hardware, "pd_cluster", variant, pool="decode"))
    if prefill.nodes + decode_floor.nodes > nodes:
        raise RecipeRefusal(f"pd_cluster: the prefill pool needs {prefill.nodes} node(s) and the decode pool "
                            f"{decode_floor.nodes}, {prefill.nodes + decode_floor.nodes} in all, not {nodes}")
    decode = resolve_any(bundle, Selection(hardware, "pd_cluster", variant, pool="decode",
                                       nodes=nodes - prefill.nodes))
    base = Selection(hardware, "pd_cluster", variant)
    name = default_name(bundle, base)
    command = from_recipe_command(recipe, base, name, ("--prefill-nodes", str(prefill.nodes),
                                                       "--decode-nodes", str(decode.nodes)))
    pools = (_layout(prefill, command, f"{name}-prefill"), _layout(decode, command, f"{name}-decode"))
    return RecipeLayout(strategy="pd_cluster", hardware=hardware, nodes=nodes, gpus_per_node=prefill.gpus_per_node,
                        tensor=1, pipeline=1, data=1, expert=prefill.parallel["expert"] or decode.parallel["expert"],
                        command=command, name=name, pools=pools)


def layouts(recipe: str | Path, hardware: str, nodes: int, variant: str = "default") -> Layouts:
    """Every layout the recipe allows on `nodes` x `hardware`, and each strategy it refuses there with why.
    A hardware or variant the recipe does not know is a ConfigError."""
    if nodes < 1:
        raise ConfigError(f"--nodes {nodes}: a deployment runs on 1 node or more")
    bundle = load_bundle(recipe)
    shown = relative(Path(recipe))
    allowed: list[RecipeLayout] = []
    refused: dict[str, str] = {}
    for strategy in offered_strategies(bundle):
        try:
            if bundle.strategies[strategy].get("deploy_type") == "pd_cluster":
                allowed.append(pd_layout(bundle, shown, hardware, nodes, variant))
                continue
            selection = Selection(hardware, strategy, variant, nodes=nodes)
            deployment = resolve(bundle, selection)
        except RecipeRefusal as exc:
            refused[strategy] = str(exc)
            continue
        if deployment.nodes * deployment.gpus_per_node != deployment.min_gpus and nodes > 1:
            refused[strategy] = f"{strategy} would use {deployment.min_gpus} of {nodes * deployment.gpus_per_node} GPUs"
            continue
        name = default_name(bundle, selection)
        allowed.append(_layout(deployment, from_recipe_command(shown, selection, name), name))
    return Layouts(hardware=hardware, nodes=nodes, allowed=allowed, refused=refused)


def suggestions(file: str | None, hardware: str | None, variant: str | None, nodes: int,
                keep: Callable[[RecipeLayout], bool] | None = None) -> str:
    """For a layout refusal on `nodes` nodes of a profile generated from `file` for `hardware` (its recipe.file,
    recipe.hardware, recipe.variant): the layouts the recipe allows there that use every GPU, each with the command
    that writes its profile and the acceptance_profile to set; or why none can be offered. '' for a profile that
    names no recipe (a lab or hand-written profile). `keep` leaves out the layouts it rejects (the plan's: those
    whose GPUs cannot hold the weights)."""
    if not file or not hardware:
        return ""
    try:
        found = layouts(recipe_path(file), hardware, nodes, variant or "default")
    except (ConfigError, OSError) as exc:
        return f"the recipe {file} cannot list its layouts here ({exc})"
    full = [lay for lay in found.allowed if lay.gpus == nodes * lay.gpus_per_node]
    if not full:
        return (f"the recipe {file} allows no layout on {nodes} x {hardware} that uses every GPU (the node counts "
                f"it allows: `vllm-acceptance profile layouts {file} --hardware {hardware} --nodes N`)")
    if keep is not None and not (full := [lay for lay in full if keep(lay)]):
        return (f"no layout the recipe {file} allows on {nodes} x {hardware} holds the model's weights (the node "
                f"counts it allows: `vllm-acceptance profile layouts {file} --hardware {hardware} --nodes N`)")
    lines = [f"the recipe ({file}) allows on {nodes} x {hardware} nodes ({nodes * full[0].gpus_per_node} GPUs); "
             "write the profile, then set acceptance_profile to its name:"]
    for lay in full:
        names = " and ".join(f"acceptance_profile: {p.name} (the {p.pool} pool's inventory)" for p in lay.pools)
        lines.append(f"  {lay.describe()}:\n    {lay.command}\n    then {names or f'acceptance_profile: {lay.name}'}")
    return "\n".join(lines)
