"""The two pools of a `pd_cluster` recipe deployment (prefill and decode), each one server with its own profile:
docs/profiles.md "Disaggregated prefill/decode: one deployment profile" (deployment_profile below joins them).

A pool is laid out as the recipe site's command builder lays it out (src/lib/command-synthesis.js, `pd_cluster`
branch of buildArgs/buildEnv; read at a later commit than the vendored one, recipes/vllm-project/SOURCE.yml):
- the pool's parallelism is `strategy_overrides.pd_cluster.<pool>.parallelism`, else the strategy file's, else tp;
  a tp/tep pool is one engine over all the pool's GPUs (`--tensor-parallel-size` = nodes x gpu_count, tep adds
  `--enable-expert-parallel`), a dep pool runs `<pool>.tp` (default 1) per rank and gpu_count / tp ranks per node
  (`--data-parallel-size` = nodes x that, `--enable-expert-parallel`, `--data-parallel-hybrid-lb` across nodes);
- its GPU floor is `strategy_min_gpus` for the mode (`dep` -> multi_node_dep, ...), "Applies to aggregated and PD
  pools" (the recipe's own comment); a pool owns whole nodes (CUDA_VISIBLE_DEVICES lists the node's GPUs) and
  one over 2+ nodes takes the socket-interface variables;
- the layers: base_args, variant, the pool's strategy args, the parallel flags, the recipe's pool overrides, the
  hardware overrides (a pd_cluster generation block replaces the recipe's), the exact-GPU pool override, features;
  the NVL4-only variables (NCCL_MNNVL_ENABLE, ...) are kept on GB200/GB300 trays only.
The pool's `--port` becomes the profile's launch.port (the launch passes --port itself)."""

from __future__ import annotations

from typing import Any

from ..core.profile import ConfigError
from .reader import RecipeBundle
from .resolve import (
    MAX_NODES,
    Arg,
    Deployment,
    Selection,
    _generation_block,
    _Tokens,
    assemble,
    check_supported,
    enabled_features,
    feature_args,
    floor_nodes,
    hardware_profile,
    leave_out,
    refuse,
    resolve,
    select_variant,
)

POOLS = ("prefill", "decode")
# command-synthesis.js NVL4_ONLY_ENV_KEYS / NVL4_HW_IDS: meaningful on GB200/GB300 NVL trays only.
NVL4_ONLY_ENV = ("VLLM_USE_NCCL_SYMM_MEM", "NCCL_CUMEM_ENABLE", "NCCL_MNNVL_ENABLE", "NCCL_NVLS_ENABLE",
                 "UCX_NET_DEVICES")
NVL4_HARDWARE = ("gb200", "gb300")


def pool_config(bundle: RecipeBundle, strategy: str, pool: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(the strategy file's pool block, the recipe's pool override, the pool's parallelism tp | tep | dep)."""
    if pool not in POOLS:
        raise ConfigError(f"pool {pool!r}: a pd_cluster pool is prefill or decode")
    role = dict(bundle.strategies[strategy].get(pool) or {})
    override = dict(((bundle.data.get("strategy_overrides") or {}).get(strategy) or {}).get(pool) or {})
    mode = str(override.get("parallelism") or role.get("parallelism") or "tp")
    if mode not in ("tp", "tep", "dep"):
        raise ConfigError(f"strategy_overrides.{strategy}.{pool}.parallelism {mode!r}: the builder knows tp, tep, dep")
    return role, override, mode


def pool_min_gpus(bundle: RecipeBundle, mode: str, hw_id: str) -> int:
    """strategy_min_gpus for a pool mode (the builder's minGpusForStrategy with a mode key: `dep` reads dep, then
    multi_node_dep, then single_node_dep), raised by an exact-GPU block."""
    cfg = bundle.data.get("strategy_min_gpus")
    if cfg is None:
        return 0
    if isinstance(cfg, int):
        return cfg

    def block(value: Any) -> int:
        if value is None:
            return 0
        if isinstance(value, int):
            return value
        for key in (mode, f"multi_node_{mode}", f"single_node_{mode}"):
            if value.get(key) is not None:
                return int(value[key])
        return 0
    return max(block(cfg), block(cfg.get(hw_id)))


def pool_nodes(bundle: RecipeBundle, selection: Selection, mode: str, gpn: int) -> tuple[int, int]:
    """(nodes, GPU floor) of the pool: the nodes asked for when they clear the floor, else the floor's nodes."""
    floor = pool_min_gpus(bundle, mode, selection.hardware)
    need = floor_nodes(floor, gpn)
    asked = selection.nodes
    if asked is None:
        return need, floor
    if asked < need:
        raise refuse(selection, f"the {selection.pool} pool ({mode}) needs {floor} GPUs (strategy_min_gpus): {need} "
                                f"{selection.hardware} nodes of {gpn} GPUs at least, not {asked}")
    if asked > MAX_NODES:
        raise refuse(selection, f"the recipe's builder sizes a pool up to {MAX_NODES} nodes, not {asked}")
    return asked, floor


def pool_layout(mode: str, nodes: int, gpn: int, tp: int | None) -> list[tuple[str, str]]:
    if mode == "dep":
        per_rank = tp or 1
        ranks = nodes * max(1, gpn // per_rank)
        flags = [("--tensor-parallel-size", str(tp))] if tp is not None else []
        flags.append(("--data-parallel-size", str(ranks)))
        if nodes > 1:
            flags.append(("--data-parallel-hybrid-lb", ""))
        return [*flags, ("--enable-expert-parallel", "")]
    flags = [("--tensor-parallel-size", str(nodes * gpn))]
    return flags + ([("--enable-expert-parallel", "")] if mode == "tep" else [])


def _hardware_layers(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any], variant: dict[str, Any],
                     override: dict[str, Any], kind: str) -> list[tuple[Any, str]]:
    name, pool = selection.strategy, selection.pool
    so = (bundle.data.get("strategy_overrides") or {}).get(name) or {}
    generation, brand = str(hw.get("generation")), str(hw.get("brand", ""))
    layers: list[tuple[Any, str]] = []
    strategy_gen = _generation_block(so.get("hardware_overrides"), selection.hardware, generation, brand)
    if strategy_gen:
        layers.append(((strategy_gen[1] or {}).get(kind), f"strategy_overrides.{name}.hardware_overrides."
                                                          f"{strategy_gen[0]}"))
    else:
        for owner, mapping in (("hardware_overrides", bundle.data.get("hardware_overrides")),
                               (f"variants.{selection.variant}.hardware_overrides", variant.get("hardware_overrides"))):
            block = _generation_block(mapping, selection.hardware, generation, brand)
            if block:
                layers.append(((block[1] or {}).get(kind), f"{owner}.{block[0]}"))
    exact = (so.get("hardware_overrides") or {}).get(selection.hardware)
    if exact:
        layers.append((exact.get(kind), f"strategy_overrides.{name}.hardware_overrides.{selection.hardware}"))
    role_exact = (override.get("hardware_overrides") or {}).get(selection.hardware)
    if role_exact:
        layers.append((role_exact.get(kind),
                       f"strategy_overrides.{name}.{pool}.hardware_overrides.{selection.hardware}"))
    return layers


def pool_args(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any], variant: dict[str, Any],
              features: list[str], role: dict[str, Any], override: dict[str, Any], mode: str,
              nodes: int) -> tuple[list[Arg], dict[str, list[str]]]:
    name, pool = selection.strategy, selection.pool
    gpn = int(hw.get("gpu_count") or 1)
    tokens = _Tokens()
    tokens.add((bundle.data.get("model") or {}).get("base_args"), "model.base_args")
    tokens.add(variant.get("extra_args"), f"variants.{selection.variant}")
    tokens.add(((variant.get("hardware_overrides") or {}).get(selection.hardware) or {}).get("extra_args"),
               f"variants.{selection.variant}.hardware_overrides.{selection.hardware}")
    tokens.add(role.get("vllm_args"), f"strategies/{name}.yaml {pool}.vllm_args")
    tp = override.get("tp", role.get("tp")) if mode == "dep" else None
    source = f"strategies/{name}.yaml {pool} pool layout ({mode}): {nodes} node(s) x {gpn} GPUs"
    for flag, value in pool_layout(mode, nodes, gpn, int(tp) if tp is not None else None):
        tokens.add([flag, value] if value else [flag], source)
    tokens.add(override.get("extra_args"), f"strategy_overrides.{name}.{pool}")
    tokens.add(override.get("vllm_args"), f"strategy_overrides.{name}.{pool}")
    for values, where in _hardware_layers(bundle, selection, hw, variant, override, "extra_args"):
        tokens.add(values, where)
    return feature_args(tokens, bundle, selection, hw, features)


def pool_env(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any], variant: dict[str, Any],
             role: dict[str, Any], override: dict[str, Any], nodes: int) -> dict[str, tuple[str, str]]:
    name, pool = selection.strategy, selection.pool
    gpn = int(hw.get("gpu_count") or 1)
    env: dict[str, tuple[str, str]] = {}

    def add(values: Any, source: str) -> None:
        for key, value in (values or {}).items():
            env[str(key)] = (str(value), source)
    add((bundle.data.get("model") or {}).get("base_env"), "model.base_env")
    add(variant.get("extra_env"), f"variants.{selection.variant}")
    add(((variant.get("hardware_overrides") or {}).get(selection.hardware) or {}).get("extra_env"),
        f"variants.{selection.variant}.hardware_overrides.{selection.hardware}")
    add(role.get("env"), f"strategies/{name}.yaml {pool}.env")
    pinned = f"strategies/{name}.yaml {pool} pool: the pool owns whole nodes"
    add({"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpn))}, pinned)
    if nodes > 1:
        add({"GLOO_SOCKET_IFNAME": "$IFACE_NAME", "NCCL_SOCKET_IFNAME": "$IFACE_NAME"},
            f"strategies/{name}.yaml {pool} pool over {nodes} nodes")
    so = (bundle.data.get("strategy_overrides") or {}).get(name) or {}
    add(so.get("env"), f"strategy_overrides.{name}.env")
    add(override.get("env"), f"strategy_overrides.{name}.{pool}.env")
    for values, source in _hardware_layers(bundle, selection, hw, variant, override, "extra_env"):
        add(values, source)
    if selection.hardware not in NVL4_HARDWARE:
        env = {k: v for k, v in env.items() if k not in NVL4_ONLY_ENV}
    return env


def take_port(args: list[Arg]) -> tuple[list[Arg], tuple[int, str] | None, dict[str, str]]:
    """The pool's --port out of the args, as (value, its recipe field) for launch.port."""
    port = next((a for a in args if a.flag == "--port" and a.value is not None), None)
    if port is None:
        return args, None, {}
    why = f"{port.source}: set as launch.port {port.value} (the launch passes --port itself)"
    return [a for a in args if a.flag != "--port"], (int(str(port.value)), port.source), {"--port": why}


def resolve_pool(bundle: RecipeBundle, selection: Selection, hw: dict[str, Any]) -> Deployment:
    """One pool of a pd_cluster deployment as a Deployment (one server), or the recipe's reason to refuse it."""
    if bundle.strategies[selection.strategy].get("deploy_type") != "pd_cluster":
        raise ConfigError(f"--pool {selection.pool}: strategy {selection.strategy} has no pools (only a pd_cluster "
                          "strategy has)")
    role, override, mode = pool_config(bundle, selection.strategy, str(selection.pool))
    variant = select_variant(bundle, selection, hw)
    gpn = int(hw.get("gpu_count") or 1)
    nodes, floor = pool_nodes(bundle, selection, mode, gpn)
    features, skipped = enabled_features(bundle, selection)
    args, replaced = pool_args(bundle, selection, hw, variant, features, role, override, mode, nodes)
    args, left_out = leave_out(args, nodes)
    args, port, port_note = take_port(args)
    env_all = pool_env(bundle, selection, hw, variant, role, override, nodes)
    return assemble(bundle, selection, hw, variant, (gpn, nodes, floor), args,
                    {"env": env_all, "replaced": replaced, "left_out": {**left_out, **port_note},
                     "features": features, "skipped": skipped}, port=port)


def deployment(bundle: RecipeBundle, selection: Selection) -> Deployment:
    """The deployment of a selection: one pd_cluster pool (`selection.pool`), else resolve.py's."""
    if selection.pool is None:
        return resolve(bundle, selection)
    hw = hardware_profile(bundle, selection)
    check_supported(bundle, selection, hw)
    return resolve_pool(bundle, selection, hw)


# --- one deployment profile for the whole pd_cluster deployment (issue 45 item 1) ---------------------------------
# The inventory names each pool's hosts by a group under gpu_nodes and the router's host by its own group
# (docs/profiles.md "Disaggregated prefill/decode"; inventories/lab-pd is the lab's example).
POOL_GROUPS = {"prefill": "prefill_nodes", "decode": "decode_nodes"}
ROUTER_GROUP = "router"
ROUTER_PROGRAM = "vllm-router"                   # command-synthesis.js pd_cluster branch: `vllm-router --policy ...`
ROUTER_SOURCE = "src/lib/command-synthesis.js pd_cluster routerLines"


def router_section(bundle: RecipeBundle, strategy: str, pools: dict[str, dict[str, Any]],
                   port: int) -> dict[str, Any]:
    """The router as the recipe site writes it: `vllm-router --policy P --vllm-pd-disaggregation --prefill URL ...
    --decode URL ... --host --port --intra-node-data-parallel-size N`; N is strategy_overrides.<s>.router.
    intra_node_data_parallel_size, else the larger of the pools' DP ranks per node (dep), else 1. --prefill/--decode,
    --host and --port come from the inventory at launch (serve/pools.py)."""
    policy = str((bundle.strategies[strategy].get("router") or {}).get("policy") or "round_robin")
    pinned = ((bundle.data.get("strategy_overrides") or {}).get(strategy) or {}).get("router") or {}
    ranks = [int(p["parallel"].get("data") or 0) // max(1, int(p["nodes"])) for p in pools.values()
             if p["parallel"].get("data")]
    intra = pinned.get("intra_node_data_parallel_size")
    intra_source = (f"strategy_overrides.{strategy}.router.intra_node_data_parallel_size" if intra is not None
                    else f"{ROUTER_SOURCE}: the pools' DP ranks per node (1 without DP)")
    intra = int(intra if intra is not None else max([*ranks, 1]))
    return {"program": ROUTER_PROGRAM, "policy": policy,
            "args": ["--vllm-pd-disaggregation", "--intra-node-data-parallel-size", str(intra)],
            "port": port, "inventory_group": ROUTER_GROUP,
            "provenance": {"program": ROUTER_SOURCE, "policy": f"strategies/{strategy}.yaml router.policy",
                           "--vllm-pd-disaggregation": ROUTER_SOURCE, "--intra-node-data-parallel-size": intra_source,
                           "--prefill/--decode": f"{ROUTER_SOURCE}: one per pool head (the inventory's "
                                                 f"{POOL_GROUPS['prefill']} / {POOL_GROUPS['decode']})"}}


def kv_transfer_config(args: list[str]) -> dict[str, Any]:
    """The --kv-transfer-config of a pool's rendered args (`--flag=value` or `--flag value`), parsed; {} if none."""
    import json

    for i, arg in enumerate(args):
        value = None
        if arg.startswith("--kv-transfer-config="):
            value = arg.split("=", 1)[1]
        elif arg == "--kv-transfer-config" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None:
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                raise ConfigError(f"--kv-transfer-config {value!r}: not JSON ({exc})") from exc
            return dict(parsed) if isinstance(parsed, dict) else {}
    return {}


def pool_section(profile: dict[str, Any], pool: str) -> dict[str, Any]:
    """A pool's part of the deployment profile, from the pool's own generated profile."""
    import copy

    launch = copy.deepcopy(profile["launch"])
    return {"inventory_group": POOL_GROUPS[pool], "nodes": int(profile["hardware"].get("min_nodes") or 1),
            "min_gpus": int(profile["hardware"].get("min_gpus") or 0), "parallel": copy.deepcopy(profile["parallel"]),
            "kv_transfer_config": kv_transfer_config(list(launch.get("args") or [])), "launch": launch}


def deployment_profile(pool_profiles: dict[str, dict[str, Any]], bundle: RecipeBundle, strategy: str,
                       name: str, port: int) -> dict[str, Any]:
    """One profile for the whole deployment: the decode pool's profile (model, image, contract: what users call
    answers as decode does) with both pools under `pd`, the router as the entry point: launch.port = `port` (the
    recipe leaves $ROUTER_PORT to the site; the acceptance defaults' launch.port)."""
    import copy

    pools = {pool: pool_section(pool_profiles[pool], pool) for pool in POOLS}
    connectors = {str(p["kv_transfer_config"].get("kv_connector")) for p in pools.values()}
    if len(connectors) != 1 or "None" in connectors:
        raise ConfigError(f"strategies/{strategy}.yaml: the pools name the connectors {sorted(connectors)}; a P/D "
                          "deployment needs one --kv-transfer-config kv_connector in both pools")
    profile = copy.deepcopy(pool_profiles["decode"])
    profile["name"] = name
    profile["description"] = profile["description"].replace(" decode pool", " prefill + decode pools behind the "
                                                            "router")
    profile["recipe"].pop("pool", None)
    hardware = profile["hardware"]
    hardware["min_gpus"] = sum(p["min_gpus"] for p in pools.values())
    hardware["min_nodes"] = sum(p["nodes"] for p in pools.values())
    base = profile["launch"]
    profile["launch"] = {key: base[key] for key in ("runtime", "ready_timeout_s") if key in base}
    profile["launch"].update({"port": port, "args": [], "env": {},
                              "required_flags": list(base.get("required_flags") or [])})
    keys = list(profile)
    at = keys.index("launch") + 1
    pd = {"connector": connectors.pop(), "router": router_section(bundle, strategy, pools, port), **pools}
    return {**{k: profile[k] for k in keys[:at]}, "pd": pd, **{k: profile[k] for k in keys[at:]}}
