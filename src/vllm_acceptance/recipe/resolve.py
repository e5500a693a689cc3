"""One deployment of a recipe (hardware x strategy x variant x features): its launch arguments and
environment, each with the recipe field it came from, or the recipe's own reason to refuse it.

The layering follows the recipe site's command builder at the vendored commit (recipes/vllm-project/SOURCE.yml,
`semantics`): base_args, variant, strategy (+ its parallel flag), strategy_overrides, then hardware overrides
(a strategy's override for the generation REPLACES the recipe's generation block; an exact-GPU one adds to it),
then the features; a flag given twice keeps its last value (last-wins dedupe). The node count is the recipe's
floor (strategy_min_gpus over the taxonomy's gpu_count, the builder's nodesForStrategy) unless the selection names
one (`--nodes`): a multi-node strategy scales out to the builder's MAX_NODES, a single-node one runs on one node.
pd_cluster (two pools, two commands, a router) is one deployment profile with a `pd` section (recipe/pools.py);
asked for as one server it is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..core.profile import ConfigError
from .reader import RecipeBundle

# Flags the launch sets per node from the layout (serve/launch.py _LAYOUT_FLAGS): never in a profile's args.
RENDEZVOUS_FLAGS = ("--nnodes", "--node-rank", "--master-addr", "--headless", "--data-parallel-address",
                    "--data-parallel-start-rank", "--data-parallel-size-local", "--data-parallel-rpc-port")
_PARALLEL_KEYS = {"--tensor-parallel-size": "tensor", "--pipeline-parallel-size": "pipeline",
                  "--data-parallel-size": "data"}
# Flags the recipe gives that the launch across nodes leaves out, with why (serve/launch.py PER_NODE_BALANCING).
# The launch of a multi-node data-parallel strategy uses vLLM's internal load balancing: the head's API server fronts
# every engine of every node and the workers run --headless (serve/launch.py _layout_args), so the load and the
# probes reach the whole deployment through the head. --data-parallel-hybrid-lb gives each node its own API server
# for its local engines only (vllm/entrypoints/cli/serve.py ServeSubcommand.cmd) and vLLM refuses it beside
# --headless (run_headless: "data_parallel_hybrid_lb is not applicable in headless mode").
LEFT_OUT_ACROSS_NODES = {
    "--data-parallel-hybrid-lb": (
        "left out of the launch: each node's API server would front only its own engines and vLLM refuses it beside "
        "--headless; the launch uses vLLM's internal load balancing (the head's API server fronts every engine, "
        "the workers run --headless), so the load and the probes reach every engine through the head"),
}
# The builder's most nodes for one deployment, and per PD pool (command-synthesis.js MAX_NODES; SOURCE.yml).
MAX_NODES = 16
# The site's precision rule (command builder PRECISION_HARDWARE_CONSTRAINTS): these run on NVIDIA Blackwell only.
_BLACKWELL_ONLY_PRECISIONS = ("nvfp4", "fp4")


@dataclass(frozen=True)
class Arg:
    flag: str
    value: str | None
    source: str

    def render(self) -> str:
        return self.flag if self.value is None else f"{self.flag}={self.value}"


@dataclass(frozen=True)
class Selection:
    hardware: str
    strategy: str
    variant: str = "default"
    features: tuple[str, ...] = ()        # opt-in features asked for (the recipe's default ones are always on)
    nodes: int | None = None              # the nodes asked for (`--nodes`); None: the recipe's floor
    pool: str | None = None               # pd_cluster: the pool this profile serves (prefill | decode)


@dataclass
class Deployment:
    selection: Selection
    brand: str
    generation: str
    gpus_per_node: int
    nodes: int
    min_gpus: int
    parallel: dict[str, Any]
    args: list[Arg]
    env: dict[str, tuple[str, str]]                 # name -> (value, source)
    site_env: dict[str, tuple[str, str]]            # placeholders ($IFACE_NAME): the site sets them
    replaced: dict[str, list[str]] = field(default_factory=dict)   # flag -> "value (source)" it replaced
    left_out: dict[str, str] = field(default_factory=dict)         # flag -> "source: why the launch leaves it out"
    features: tuple[str, ...] = ()
    skipped_features: dict[str, str] = field(default_factory=dict)
    model_id: str = ""
    variant: dict[str, Any] = field(default_factory=dict)
    port: tuple[int, str] | None = None     # a pool's own HTTP port (value, recipe field), set as launch.port

    def arg(self, flag: str) -> Arg | None:
        return next((a for a in self.args if a.flag == flag), None)


class RecipeRefusal(ConfigError):
    """The recipe itself does not support this combination (its reason in the message); other ConfigErrors are
    bad input (an unknown hardware, strategy, variant or feature)."""


def refuse(selection: Selection, reason: str) -> RecipeRefusal:
    return RecipeRefusal(f"recipe refuses hardware {selection.hardware!r} with strategy {selection.strategy!r}: "
                       f"{reason}")


def hardware_profile(bundle: RecipeBundle, selection: Selection) -> dict[str, Any]:
    profiles = bundle.hardware_profiles
    listed = (bundle.data.get("meta") or {}).get("hardware") or {}
    if selection.hardware not in profiles:
        raise ConfigError(f"--hardware {selection.hardware!r}: not a hardware id of the recipe taxonomy "
                          f"(known: {', '.join(sorted(profiles))})")
    if listed and listed.get(selection.hardware) is None:
        raise refuse(selection, f"meta.hardware does not list {selection.hardware} "
                                f"(listed: {', '.join(f'{k} {v}' for k, v in listed.items())})")
    return dict(profiles[selection.hardware])


def keyed(mapping: Any, hw: str, generation: str, brand: str) -> tuple[str, Any] | None:
    """A hardware-keyed map's entry: exact GPU id > generation > brand > default (the builder's order)."""
    if not isinstance(mapping, dict):
        return None
    for key in (hw, generation, brand.lower(), "default"):
        if key in mapping:
            return key, mapping[key]
    return None


def check_supported(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any]) -> None:
    """The recipe's strategy gate: compatible_strategies, opened or closed per hardware by strategy_hardware."""
    strategy = selection.strategy
    if strategy not in bundle.strategies:
        raise ConfigError(f"--strategy {strategy!r}: not a strategy of the recipe repository "
                          f"(known: {', '.join(sorted(bundle.strategies))})")
    if bundle.strategies[strategy].get("deploy_type") == "pd_cluster" and selection.pool is None:
        raise refuse(selection, "pd_cluster runs two pools (prefill and decode) with their own commands behind a "
                                "router, not one server: `vllm-acceptance profile from-recipe ... --strategy "
                                "pd_cluster` writes its deployment profile (`pd`: both pools and the router, "
                                "recipe/pools.py)")
    gate_map = (bundle.data.get("strategy_hardware") or {}).get(strategy)
    gate = keyed(gate_map, selection.hardware, str(hw.get("generation")), str(hw.get("brand", "")))
    listed = strategy in (bundle.data.get("compatible_strategies") or [])
    if gate is not None:
        if gate[1] == "unsupported":
            raise refuse(selection, f"strategy_hardware.{strategy}.{gate[0]} is `unsupported`")
        return
    if not listed:
        grants = [k for k, v in (gate_map or {}).items() if v == "supported"]
        raise refuse(selection, f"{strategy} is not in compatible_strategies"
                     + (f"; strategy_hardware.{strategy} grants it only to {', '.join(grants)}" if grants else ""))


def min_gpus(bundle: RecipeBundle, strategy: str, hw_id: str) -> int:
    """strategy_min_gpus: the strategy's floor, raised by an exact-GPU block (a number or a per-strategy map)."""
    cfg = bundle.data.get("strategy_min_gpus")
    if cfg is None:
        return 0
    if isinstance(cfg, int):
        return cfg

    def block(value: Any) -> int:
        if value is None:
            return 0
        return int(value) if isinstance(value, int) else int(value.get(strategy, 0) or 0)
    return max(block(cfg), block(cfg.get(hw_id)))


def floor_nodes(floor: int, gpus_per_node: int) -> int:
    """Nodes needed to clear a GPU floor (the builder's nodesForStrategy)."""
    return max(1, math.ceil(floor / max(1, gpus_per_node)))


def node_count(bundle: RecipeBundle, selection: Selection, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPU floor): the nodes asked for when the recipe allows them, else the floor's nodes."""
    floor = min_gpus(bundle, selection.strategy, selection.hardware)
    deploy = bundle.strategies[selection.strategy].get("deploy_type", "single_node")
    asked = selection.nodes
    if asked is not None and asked < 1:
        raise ConfigError(f"--nodes {asked}: a deployment runs on 1 node or more")
    if deploy != "multi_node":
        if floor > gpus_per_node:
            raise refuse(selection, f"{selection.strategy} needs {floor} GPUs (strategy_min_gpus) and a "
                                    f"{selection.hardware} node has {gpus_per_node} (taxonomy gpu_count): "
                                    "choose a multi-node strategy")
        if asked not in (None, 1):
            raise refuse(selection, f"{selection.strategy} is a single-node strategy (deploy_type {deploy}): it runs "
                                    f"on 1 node, not {asked}")
        return 1, floor
    need = floor_nodes(floor, gpus_per_node)
    if asked is None:
        return need, floor
    if asked < need:
        raise refuse(selection, f"{selection.strategy} needs {floor} GPUs (strategy_min_gpus): {need} "
                                f"{selection.hardware} nodes of {gpus_per_node} GPUs at least, not {asked}")
    if asked > MAX_NODES:
        raise refuse(selection, f"the recipe's builder scales a deployment out to {MAX_NODES} nodes, not {asked}")
    return asked, floor


def select_variant(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any]) -> dict[str, Any]:
    variants = bundle.data.get("variants") or {"default": {}}
    if selection.variant not in variants:
        raise ConfigError(f"--variant {selection.variant!r}: the recipe's variants are {', '.join(variants)}")
    variant = dict(variants[selection.variant] or {})
    precision = str(variant.get("precision", ""))
    if precision in _BLACKWELL_ONLY_PRECISIONS and hw.get("generation") != "blackwell":
        raise refuse(selection, f"variant {selection.variant} ({precision}) runs on NVIDIA Blackwell only, "
                                f"{selection.hardware} is {hw.get('generation')}")
    return variant


def enabled_features(bundle: RecipeBundle, selection: Selection) -> tuple[list[str], dict[str, str]]:
    """The recipe's default features (not opt-in) plus the opt-ins asked for; a feature the recipe scopes to
    other strategies is refused when asked for, and left out (with the reason) when it is a default one."""
    features = bundle.data.get("features") or {}
    opt_in = set(bundle.data.get("opt_in_features") or [])
    for name in selection.features:
        if name not in features:
            raise ConfigError(f"--feature {name!r}: the recipe's features are {', '.join(features)}")
    chosen = [f for f in features if f not in opt_in or f in selection.features]
    on, skipped = [], {}
    for name in chosen:
        allowed = (features[name] or {}).get("strategies") or []
        if allowed and selection.strategy not in allowed:
            reason = f"features.{name}.strategies lists {', '.join(allowed)}"
            if name in selection.features:
                raise refuse(selection, f"feature {name}: {reason}")
            skipped[name] = reason
            continue
        if (features[name] or {}).get("modes"):
            raise ConfigError(f"feature {name}: features with `modes` are not read by this generator yet")
        on.append(name)
    return on, skipped


class _Tokens:
    """The builder's token stream, each token with the recipe field it came from."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, values: Any, source: str) -> None:
        for value in values or []:
            self.items.append((str(value), source))

    def units(self) -> list[Arg]:
        out: list[Arg] = []
        i = 0
        while i < len(self.items):
            token, source = self.items[i]
            nxt = self.items[i + 1][0] if i + 1 < len(self.items) else None
            if token.startswith("-") and nxt is not None and not nxt.startswith("-"):
                out.append(Arg(token, nxt, source))
                i += 2
            else:
                out.append(Arg(token, None, source))
                i += 1
        return out


def dedupe(units: list[Arg]) -> tuple[list[Arg], dict[str, list[str]]]:
    """Last occurrence of each flag wins, at its own position; what it replaced is kept for the record."""
    last = {u.flag: i for i, u in enumerate(units)}
    replaced: dict[str, list[str]] = {}
    for i, u in enumerate(units):
        if last[u.flag] != i:
            replaced.setdefault(u.flag, []).append(f"{u.value if u.value is not None else '(set)'} ({u.source})")
    return [u for i, u in enumerate(units) if last[u.flag] == i], replaced


def layout(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any], nodes: int,
           variant: dict[str, Any]) -> list[tuple[str, str]]:
    """The parallel flags the builder emits for this strategy and node count (rendezvous flags excluded)."""
    strategy = bundle.strategies[selection.strategy]
    gpn = int(hw.get("gpu_count") or 1)
    flag = str(strategy.get("parallel_flag") or "--tensor-parallel-size")
    kind = strategy.get("parallelism")
    if strategy.get("deploy_type") == "multi_node" and nodes > 1:
        if flag == "--data-parallel-size":
            return [(flag, str(gpn * nodes))]
        if kind == "tp_pp":
            return [("--tensor-parallel-size", str(gpn)), ("--pipeline-parallel-size", str(nodes))]
        if kind == "tp_dp":
            return [("--tensor-parallel-size", str(gpn)), ("--data-parallel-size", str(nodes))]
        return [(flag, str(gpn * nodes))]
    return [(flag, str(single_node_tp(bundle, selection, hw, variant) if selection.strategy == "single_node_tp"
                       else gpn))]


def single_node_tp(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any], variant: dict[str, Any]) -> int:
    """variant.tp > strategy_overrides.single_node_tp.tp > 1 when the weights fit one GPU > the whole node."""
    gpn = int(hw.get("gpu_count") or 1)
    generation, brand = str(hw.get("generation")), str(hw.get("brand", ""))
    declared = variant.get("tp")
    if isinstance(declared, dict):
        found = keyed(declared, selection.hardware, generation, brand)
        declared = found[1] if found else None
    if not isinstance(declared, int):
        declared = ((bundle.data.get("strategy_overrides") or {}).get("single_node_tp") or {}).get("tp")
    if isinstance(declared, int) and declared > 0:
        return min(declared, gpn)
    per_gpu = float(hw.get("vram_gb") or 0) / gpn
    need = variant.get("vram_minimum_gb")
    return 1 if need and per_gpu and float(need) <= per_gpu else gpn


def _generation_block(mapping: Any, hw_id: str, generation: str, brand: str) -> tuple[str, Any] | None:
    """A generation's block, with the brand-wide `nvidia` block as the fallback (the builder's rule)."""
    if not isinstance(mapping, dict):
        return None
    if generation in mapping:
        return generation, mapping[generation]
    if brand == "NVIDIA" and "nvidia" in mapping:
        return "nvidia", mapping["nvidia"]
    return None


def _hardware_layers(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any],
                     variant: dict[str, Any], kind: str) -> list[tuple[Any, str]]:
    """(values, source) of the hardware-override layers, `kind` extra_args or extra_env, in builder order."""
    so_name = selection.strategy
    so = (bundle.data.get("strategy_overrides") or {}).get(so_name) or {}
    generation, brand = str(hw.get("generation")), str(hw.get("brand", ""))
    layers: list[tuple[Any, str]] = []
    strategy_gen = _generation_block(so.get("hardware_overrides"), selection.hardware, generation, brand)
    if strategy_gen:
        layers.append(((strategy_gen[1] or {}).get(kind),
                       f"strategy_overrides.{so_name}.hardware_overrides.{strategy_gen[0]}"))
    else:
        recipe_gen = _generation_block(bundle.data.get("hardware_overrides"), selection.hardware, generation, brand)
        if recipe_gen:
            layers.append(((recipe_gen[1] or {}).get(kind), f"hardware_overrides.{recipe_gen[0]}"))
        variant_gen = _generation_block(variant.get("hardware_overrides"), selection.hardware, generation, brand)
        if variant_gen:
            layers.append(((variant_gen[1] or {}).get(kind),
                           f"variants.{selection.variant}.hardware_overrides.{variant_gen[0]}"))
    exact = (so.get("hardware_overrides") or {}).get(selection.hardware)
    if exact:
        layers.append((exact.get(kind), f"strategy_overrides.{so_name}.hardware_overrides.{selection.hardware}"))
    return layers


def leave_out(args: list[Arg], nodes: int) -> tuple[list[Arg], dict[str, str]]:
    """The recipe's flags the launch across nodes cannot run (LEFT_OUT_ACROSS_NODES), out of the args, each with the
    recipe field it came from and why."""
    if nodes < 2:
        return args, {}
    gone = {a.flag: f"{a.source}: {LEFT_OUT_ACROSS_NODES[a.flag]}" for a in args if a.flag in LEFT_OUT_ACROSS_NODES}
    return [a for a in args if a.flag not in gone], gone


def build_args(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any], variant: dict[str, Any],
               nodes: int, features: list[str]) -> tuple[list[Arg], dict[str, list[str]]]:
    tokens = _Tokens()
    tokens.add((bundle.data.get("model") or {}).get("base_args"), "model.base_args")
    tokens.add(variant.get("extra_args"), f"variants.{selection.variant}")
    tokens.add(((variant.get("hardware_overrides") or {}).get(selection.hardware) or {}).get("extra_args"),
               f"variants.{selection.variant}.hardware_overrides.{selection.hardware}")
    strategy = bundle.strategies[selection.strategy]
    tokens.add(strategy.get("vllm_args"), f"strategies/{selection.strategy}.yaml vllm_args")
    for flag, value in layout(bundle, selection, hw, nodes, variant):
        tokens.add([flag, value], f"strategies/{selection.strategy}.yaml layout: {nodes} node(s) x "
                                  f"{hw.get('gpu_count')} GPUs")
    so = (bundle.data.get("strategy_overrides") or {}).get(selection.strategy) or {}
    tokens.add(so.get("extra_args"), f"strategy_overrides.{selection.strategy}")
    tokens.add(so.get("vllm_args"), f"strategy_overrides.{selection.strategy}")
    for values, source in _hardware_layers(bundle, selection, hw, variant, "extra_args"):
        tokens.add(values, source)
    return feature_args(tokens, bundle, selection, hw, features)


def feature_args(tokens: _Tokens, bundle: RecipeBundle, selection: Selection, hw: dict[str, Any],
                 features: list[str]) -> tuple[list[Arg], dict[str, list[str]]]:
    """The enabled features' args (a generation's hardware override first) added last, then the args deduplicated
    without the rendezvous flags the launch sets itself: the end of build_args here and of a pool's args (pools.py)."""
    generation, brand = str(hw.get("generation")), str(hw.get("brand", ""))
    for name in features:
        feat = (bundle.data.get("features") or {}).get(name) or {}
        block = _generation_block(feat.get("hardware_overrides"), selection.hardware, generation, brand)
        if block and (block[1] or {}).get("args") is not None:
            tokens.add(block[1]["args"], f"features.{name}.hardware_overrides.{block[0]}")
        else:
            tokens.add(feat.get("args"), f"features.{name}")
    kept, replaced = dedupe(tokens.units())
    return [a for a in kept if a.flag not in RENDEZVOUS_FLAGS], replaced


def build_env(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any],
              variant: dict[str, Any]) -> dict[str, tuple[str, str]]:
    env: dict[str, tuple[str, str]] = {}

    def add(values: Any, source: str) -> None:
        for key, value in (values or {}).items():
            env[str(key)] = (str(value), source)
    add((bundle.data.get("model") or {}).get("base_env"), "model.base_env")
    add(variant.get("extra_env"), f"variants.{selection.variant}")
    add(((variant.get("hardware_overrides") or {}).get(selection.hardware) or {}).get("extra_env"),
        f"variants.{selection.variant}.hardware_overrides.{selection.hardware}")
    add(bundle.strategies[selection.strategy].get("env"), f"strategies/{selection.strategy}.yaml env")
    so = (bundle.data.get("strategy_overrides") or {}).get(selection.strategy) or {}
    add(so.get("env"), f"strategy_overrides.{selection.strategy}.env")
    add(so.get("extra_env"), f"strategy_overrides.{selection.strategy}")
    for values, source in _hardware_layers(bundle, selection, hw, variant, "extra_env"):
        add(values, source)
    return env


def resolve(bundle: RecipeBundle, selection: Selection) -> Deployment:
    """The deployment the recipe gives for this selection, or ConfigError with the recipe's reason."""
    hw = hardware_profile(bundle, selection)
    check_supported(bundle, selection, hw)
    if selection.pool is not None:
        raise ConfigError(f"pool {selection.pool}: a pd_cluster pool is resolved by recipe/pools.py deployment()")
    variant = select_variant(bundle, selection, hw)
    gpn = int(hw.get("gpu_count") or 1)
    nodes, floor = node_count(bundle, selection, gpn)
    features, skipped = enabled_features(bundle, selection)
    args, replaced = build_args(bundle, selection, hw, variant, nodes, features)
    args, left_out = leave_out(args, nodes)
    env_all = build_env(bundle, selection, hw, variant)
    return assemble(bundle, selection, hw, variant, (gpn, nodes, floor), args,
                    {"env": env_all, "replaced": replaced, "left_out": left_out, "features": features,
                     "skipped": skipped})


def assemble(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any], variant: dict[str, Any],
             shape: tuple[int, int, int], args: list[Any], parts: dict[str, Any],
             port: tuple[int, str] | None = None) -> Deployment:
    """The Deployment of resolved args and env (resolve() here, a pd_cluster pool in pools.py): the parallel
    sizes read from the args, the env the site must set (a `$` value) kept apart. `shape`: (GPUs per node,
    nodes, the recipe's GPU floor); `parts`: env, replaced, left_out, features, skipped."""
    gpn, nodes, floor = shape
    env_all: dict[str, Any] = parts["env"]
    site_env = {k: v for k, v in env_all.items() if v[0].startswith("$")}
    parallel: dict[str, Any] = {"tensor": 1, "pipeline": 1, "data": 1,
                                "expert": any(a.flag == "--enable-expert-parallel" for a in args)}
    for arg in args:
        if arg.flag in _PARALLEL_KEYS and arg.value is not None:
            parallel[_PARALLEL_KEYS[arg.flag]] = int(arg.value)
    model_id = str(variant.get("model_id") or (bundle.data.get("model") or {}).get("model_id") or "")
    return Deployment(selection=selection, brand=str(hw.get("brand", "")), generation=str(hw.get("generation")),
                      gpus_per_node=gpn, nodes=nodes,
                      min_gpus=max(floor, parallel["tensor"] * parallel["pipeline"] * parallel["data"]),
                      parallel=parallel, args=args,
                      env={k: v for k, v in env_all.items() if k not in site_env}, site_env=site_env,
                      replaced=parts["replaced"], left_out=parts["left_out"], features=tuple(parts["features"]),
                      skipped_features=parts["skipped"], model_id=model_id, variant=variant, port=port)


def structured_image(bundle: RecipeBundle, deployment: Deployment) -> tuple[str, str] | None:
    """The image the recipe names in its structured fields (variant, then model `docker_image`), if any."""
    brand = "amd" if deployment.brand == "AMD" else "nvidia"
    for owner, raw in ((f"variants.{deployment.selection.variant}", deployment.variant.get("docker_image")),
                       ("model", (bundle.data.get("model") or {}).get("docker_image"))):
        if isinstance(raw, str) and brand == "nvidia":
            return raw, f"{owner}.docker_image"
        if isinstance(raw, dict):
            value = raw.get(brand, raw if brand == "nvidia" else None)
            if isinstance(value, str):
                return value, f"{owner}.docker_image.{brand}"
            if isinstance(value, dict):
                for cuda in ("cu130", "cu129"):
                    if isinstance(value.get(cuda), str):
                        return value[cuda], f"{owner}.docker_image.{brand}.{cuda}"
    return None
