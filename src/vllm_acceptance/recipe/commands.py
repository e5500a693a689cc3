"""The `profile` and `recipe` subcommands of vllm-acceptance (registered by cli.py):

    vllm-acceptance profile from-recipe RECIPE.yaml --hardware H --strategy S [--variant V] [--feature F ...]
                                        [--name NAME] [--facts FILE] [--out FILE]
    vllm-acceptance recipe diff OLD.yaml NEW.yaml --hardware H --strategy S [--variant V] [--feature F ...] [--json]

Exit 0 done (diff: no change), 1 diff found changes, 2 bad input or a combination the recipe refuses (its reason
on stderr)."""

from __future__ import annotations

import argparse
import json
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
    gen.add_argument("--name", help="the profile's name (default <slug>-<hardware>-<strategy>)")
    gen.add_argument("--facts", type=Path, help="acceptance facts and defaults "
                                                "(default recipes/kimi-k3.acceptance.yml)")
    gen.add_argument("--out", type=Path, help="write here (default: standard output)")
    recipe = sub.add_parser("recipe", help="the official recipe as data")
    recipe_sub = recipe.add_subparsers(dest="recipe_command", required=True)
    diff = recipe_sub.add_parser("diff", help="what changed between two recipe versions for one deployment "
                                              "(arguments, environment, image, minimum vLLM version)")
    diff.add_argument("old", type=Path)
    diff.add_argument("new", type=Path)
    _selection_arguments(diff)
    diff.add_argument("--facts", type=Path, help="acceptance facts (the image where the recipe names none)")
    diff.add_argument("--json", action="store_true", help="print the changes as JSON")


def _selection(args: argparse.Namespace):  # noqa: ANN202 - Selection, imported lazily
    from .resolve import Selection

    return Selection(hardware=args.hardware, strategy=args.strategy, variant=args.variant,
                     features=tuple(args.feature))


def cmd_profile(args: argparse.Namespace) -> int:
    from .generate import generate

    _profile, text = generate(args.recipe, _selection(args), name=args.name, facts_path=args.facts)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


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
