"""The `profile` and `recipe` subcommands of vllm-acceptance (registered by cli.py):

    vllm-acceptance profile from-recipe RECIPE.yaml --hardware H --strategy S [--nodes N] [--variant V]
                                        [--feature F ...] [--name NAME] [--facts FILE] [--out FILE]
    vllm-acceptance profile from-recipe RECIPE.yaml --hardware H --strategy pd_cluster [--prefill-nodes P]
                                        [--decode-nodes D] [--out FILE]     (one P/D deployment profile)
    vllm-acceptance profile layouts RECIPE.yaml --hardware H --nodes N [--variant V] [--json]
    vllm-acceptance recipe diff OLD.yaml NEW.yaml --hardware H --strategy S [--variant V] [--feature F ...] [--json]

Exit 0 done (diff: no change), 1 diff found changes, 2 bad input or a combination the recipe refuses (its reason
on stderr)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..core.profile import ConfigError

COMMANDS = ("profile", "recipe")


def _selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", required=True, help="the recipe's hardware id: h200, b200, b300, gb200, gb300")
    parser.add_argument("--strategy", required=True,
                        help="the recipe's strategy: single_node_tp, multi_node_tp, multi_node_dep, ...")
    parser.add_argument("--variant", default="default", help="the recipe's variant (default: default)")
    parser.add_argument("--feature", action="append", default=[], metavar="F",
                        help="an opt-in feature to turn on (repeatable); the recipe's default features are always on")


def add_arguments(sub: argparse._SubParsersAction) -> None:
    profile = sub.add_parser("profile", help="profiles generated from the official recipe")
    profile_sub = profile.add_subparsers(dest="profile_command", required=True)
    gen = profile_sub.add_parser("from-recipe", help="write a complete profile for one hardware and strategy of a "
                                                     "recipe, every launch argument with its recipe field")
    gen.add_argument("recipe", type=Path, help="the recipe file, e.g. recipes/vllm-project/Kimi-K3.yaml")
    _selection_arguments(gen)
    gen.add_argument("--nodes", type=int, metavar="N",
                     help="the nodes the deployment runs on (default: the fewest the recipe's strategy_min_gpus "
                          "allows); refused, with the layouts the recipe allows there, when the strategy cannot run "
                          "on N nodes (`profile layouts` lists them)")
    gen.add_argument("--pool", choices=("prefill", "decode"),
                     help="pd_cluster: write this pool's profile only (--nodes: the pool's nodes)")
    gen.add_argument("--prefill-nodes", type=int, metavar="P", help="pd_cluster: the prefill pool's nodes "
                                                                     "(default: the fewest the recipe allows)")
    gen.add_argument("--decode-nodes", type=int, metavar="D", help="pd_cluster: the decode pool's nodes "
                                                                    "(default: the fewest the recipe allows)")
    gen.add_argument("--name", help="the profile's name (default <slug>-<hardware>-<strategy>[-<N>nodes]; "
                                    "pd_cluster: <slug>-<hardware>-pd-cluster, one profile for both pools)")
    gen.add_argument("--facts", type=Path, help="acceptance facts and defaults "
                                                "(default recipes/kimi-k3.acceptance.yml)")
    gen.add_argument("--out", type=Path, help="write here (default: standard output)")
    lay = profile_sub.add_parser("layouts", help="the layouts (strategy, TP/PP/DP/EP sizes, GPUs) the recipe allows "
                                                 "on N nodes of one hardware, each with its from-recipe command")
    lay.add_argument("recipe", type=Path, help="the recipe file, e.g. recipes/vllm-project/Kimi-K3.yaml")
    lay.add_argument("--hardware", required=True, help="the recipe's hardware id: h200, b200, b300, gb200, gb300")
    lay.add_argument("--nodes", type=int, required=True, metavar="N", help="the nodes you have")
    lay.add_argument("--variant", default="default", help="the recipe's variant (default: default)")
    lay.add_argument("--json", action="store_true", help="print the layouts as JSON")
    recipe = sub.add_parser("recipe", help="the official recipe as data")
    recipe_sub = recipe.add_subparsers(dest="recipe_command", required=True)
    diff = recipe_sub.add_parser("diff", help="what changed between two recipe versions for one deployment "
                                              "(arguments, environment, image, minimum vLLM version)")
    diff.add_argument("old", type=Path)
    diff.add_argument("new", type=Path)
    _selection_arguments(diff)
    diff.add_argument("--facts", type=Path, help="acceptance facts (the image where the recipe names none)")
    diff.add_argument("--json", action="store_true", help="print the changes as JSON")


def _selection(args: argparse.Namespace, **change: object):  # noqa: ANN202 - Selection, imported lazily
    from dataclasses import replace

    from .resolve import Selection

    selection = Selection(hardware=args.hardware, strategy=args.strategy, variant=args.variant,
                          features=tuple(args.feature), nodes=getattr(args, "nodes", None),
                          pool=getattr(args, "pool", None))
    return replace(selection, **change) if change else selection


def wrote(profile: dict, where: str) -> str:
    """One line that says what was written: strategy (and pool), parallel sizes, nodes, GPUs."""
    par, hw, rec = profile["parallel"], profile["hardware"], profile["recipe"]
    sizes = f"tensor {par['tensor']}, pipeline {par['pipeline']}, data {par['data']}, " \
            f"expert {'on' if par['expert'] else 'off'}"
    pool = f" {rec['pool']} pool" if rec.get("pool") else ""
    return (f"wrote {where}: {profile['name']}: {rec['strategy']}{pool} on {hw['min_nodes']} x {rec['hardware']} "
            f"({hw['gpus_per_node']} GPUs each), {sizes}: {hw['min_gpus']} GPUs")


def _deploy_type(args: argparse.Namespace) -> str:
    from .reader import load_bundle

    strategy = load_bundle(args.recipe).strategies.get(args.strategy) or {}
    return str(strategy.get("deploy_type") or "single_node")


def cmd_pools(args: argparse.Namespace) -> int:
    """pd_cluster without --pool: ONE deployment profile (both pools and the router, `pd`; docs/profiles.md
    "Disaggregated prefill/decode"), to --out or standard output."""
    if args.nodes is not None:
        raise ConfigError("--nodes: a pd_cluster deployment sizes each pool: --prefill-nodes P --decode-nodes D "
                          "(or --pool prefill|decode --nodes N for one pool)")
    from .generate import generate

    profile, text = generate(args.recipe, _selection(args), name=args.name, facts_path=args.facts,
                             pool_nodes={"prefill": args.prefill_nodes, "decode": args.decode_nodes})
    said = wrote(profile, str(args.out) if args.out else "standard output")
    said += (" (one P/D deployment: inventory groups prefill_nodes, decode_nodes under gpu_nodes and router; "
             "docs/profiles.md \"Disaggregated prefill/decode\")")
    return emit(args, text, said)


def emit(args: argparse.Namespace, text: str, said: str) -> int:
    """The profile to --out (and what was written on stdout), or on stdout (and what was written on stderr)."""
    if args.out:
        args.out.write_text(text)
        print(said)
    else:
        print(text, end="")
        print(said, file=sys.stderr)
    return 0


def _generate(args: argparse.Namespace, selection, name: str | None):  # noqa: ANN001, ANN202
    """generate(), a refusal on --nodes completed with the layouts the recipe allows on those nodes."""
    from .generate import generate
    from .layouts import layouts
    from .resolve import RecipeRefusal

    try:
        return generate(args.recipe, selection, name=name, facts_path=args.facts)
    except RecipeRefusal as exc:
        if selection.nodes is None or selection.pool is not None:
            raise
        found = layouts(args.recipe, selection.hardware, selection.nodes, selection.variant)
        raise RecipeRefusal(f"{exc}\n{found.render()}") from exc


def cmd_profile(args: argparse.Namespace) -> int:
    if args.profile_command == "layouts":
        return cmd_layouts(args)
    for option in ("nodes", "prefill_nodes", "decode_nodes"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise ConfigError(f"--{option.replace('_', '-')} {value}: a deployment runs on 1 node or more")
    deploy = _deploy_type(args)
    if args.pool is None and deploy == "pd_cluster":
        return cmd_pools(args)
    if args.prefill_nodes is not None or args.decode_nodes is not None:
        raise ConfigError("--prefill-nodes / --decode-nodes: for --strategy pd_cluster only (use --nodes)")
    profile, text = _generate(args, _selection(args), args.name)
    said = wrote(profile, str(args.out) if args.out else "standard output")
    if args.nodes is None and deploy == "multi_node":
        said += (" (the fewest nodes the recipe allows; --nodes N lays the strategy over N nodes, "
                 f"`vllm-acceptance profile layouts {args.recipe} --hardware {args.hardware} --nodes N` lists them)")
    return emit(args, text, said)


def cmd_layouts(args: argparse.Namespace) -> int:
    from .layouts import layouts

    found = layouts(args.recipe, args.hardware, args.nodes, args.variant)
    if args.json:
        print(json.dumps({"hardware": found.hardware, "nodes": found.nodes,
                          "allowed": [lay.to_dict() for lay in found.allowed], "refused": found.refused}, indent=1))
    else:
        print(found.render())
        for strategy, why in found.refused.items():
            print(f"  not {strategy}: {why}")
    return 0 if found.allowed else 2


def cmd_recipe(args: argparse.Namespace) -> int:
    from .diff import diff_recipes, render_changes

    changes = diff_recipes(args.old, args.new, _selection(args), facts_path=args.facts)
    print(json.dumps(changes, indent=1) if args.json else render_changes(changes))
    return 1 if changes["changes"] else 0


def run(args: argparse.Namespace) -> int:
    if args.command == "profile":
        return cmd_profile(args)
    if args.command == "recipe":
        return cmd_recipe(args)
    raise ConfigError(f"unknown command {args.command!r}")
