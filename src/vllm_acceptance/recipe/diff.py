"""`vllm-acceptance recipe diff OLD NEW --hardware H --strategy S`: what changed between two versions of a recipe
for one deployment: each launch argument and variable (value and the recipe field it comes from), the image,
the minimum vLLM version, the node layout, and whether the recipe still supports the combination. A change
here reopens acceptance (report/reopen.py, trigger `recipe`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .generate import Facts, image_of, load_facts
from .reader import RecipeBundle, load_bundle
from .resolve import Deployment, RecipeRefusal, Selection, resolve


def snapshot(bundle: RecipeBundle, selection: Selection, facts: Facts | None) -> dict[str, Any]:
    """Everything the deployment takes from one recipe version, as (value, source) pairs by name."""
    try:
        deployment: Deployment = resolve(bundle, selection)
    except RecipeRefusal as exc:         # bad input (unknown names) propagates: exit 2, never "no change"
        return {"refused": str(exc)}
    image, image_source = image_of(bundle, deployment, facts)
    out: dict[str, Any] = {"support": ("supported", f"compatible_strategies / strategy_hardware.{selection.strategy}")}
    for arg in deployment.args:
        out[f"arg {arg.flag}"] = (arg.value if arg.value is not None else "(set)", arg.source)
    for flag, why in deployment.left_out.items():      # in the recipe, left out of the launch (resolve.py)
        source, _, reason = why.partition(": ")
        out[f"arg {flag}"] = (f"(set in the recipe; {reason.split(':', 1)[0]})", source)
    for name, (value, source) in {**deployment.env, **deployment.site_env}.items():
        out[f"env {name}"] = (value, source)
    out["image"] = (image, image_source)
    out["min_vllm_version"] = (str((bundle.data.get("model") or {}).get("min_vllm_version")), "model.min_vllm_version")
    out["layout"] = (f"{deployment.nodes} node(s) x {deployment.gpus_per_node} GPUs, "
                     + ", ".join(f"{k} {v}" for k, v in deployment.parallel.items()), "strategy_min_gpus, strategies")
    out["model"] = (deployment.model_id, "model.model_id / variants")
    return out


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    if "refused" in old or "refused" in new:
        if "refused" in old and "refused" in new:
            return []                    # refused by both: no deployment to change (the reasons may differ)
        return [{"name": "support", "was": old.get("refused", "supported"), "now": new.get("refused", "supported"),
                 "was_source": None, "now_source": None}]
    changes = []
    for name in list(old) + [n for n in new if n not in old]:
        was, now = old.get(name), new.get(name)
        if was is None or now is None or was[0] != now[0]:
            changes.append({"name": name, "was": was[0] if was else None, "now": now[0] if now else None,
                            "was_source": was[1] if was else None, "now_source": now[1] if now else None})
    return changes


def source_of(bundle: RecipeBundle) -> dict[str, Any]:
    return {"file": str(bundle.path), "sha256": bundle.sha256, "commit": bundle.commit}


def diff_recipes(old_path: str | Path, new_path: str | Path, selection: Selection,
                 facts_path: str | Path | None = None) -> dict[str, Any]:
    facts = load_facts(facts_path)
    old, new = load_bundle(old_path), load_bundle(new_path)
    before, after = snapshot(old, selection, facts), snapshot(new, selection, facts)
    return {"selection": {"hardware": selection.hardware, "strategy": selection.strategy,
                          "variant": selection.variant, "features": list(selection.features)},
            "old": {**source_of(old), "refused": before.get("refused")},
            "new": {**source_of(new), "refused": after.get("refused")},
            "changes": compare(before, after)}


def render_changes(result: dict[str, Any]) -> str:
    sel = result["selection"]
    head = (f"recipe diff for {sel['hardware']} / {sel['strategy']} / {sel['variant']}: "
            f"{result['old']['commit'] or result['old']['sha256'][:12]} -> "
            f"{result['new']['commit'] or result['new']['sha256'][:12]}")
    if not result["changes"]:
        refused = result["new"].get("refused")
        return head + "\n" + (f"no deployment in either version: {refused}" if refused
                               else "no change for this deployment")
    lines = [head, f"{len(result['changes'])} change(s): acceptance of a profile from the old recipe reopens"]
    for change in result["changes"]:
        was, now = (_side(change["was"], change["was_source"]), _side(change["now"], change["now_source"]))
        lines.append(f"  {change['name']}: {was} -> {now}")
    return "\n".join(lines)


def _side(value: Any, source: str | None) -> str:
    if value is None:
        return "absent"
    return f"{value} ({source})" if source else str(value)
