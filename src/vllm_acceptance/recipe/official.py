"""What the recipe a profile names generates, for the fields that make a deployment the recipe's (issue 42, item 2;
core/profile.py OFFICIAL_FIELDS): a profile that names a recipe (`recipe.file`, `hardware`, `strategy`, `variant`, as
`profile from-recipe` writes them) is compared with the profile that recipe generates; each differing field is
named. A recipe this checkout cannot regenerate proves nothing: that is named too (never taken as official)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from ..core.profile import ConfigError, deviations_from
from .generate import ROOT, generate
from .reader import load_bundle
from .resolve import Selection


@lru_cache(maxsize=32)
def _generated(path: str, hardware: str, strategy: str, variant: str,
               pool: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """(the generated profile, its recipe file's sha256), or (None, why it cannot be generated); `pool`: a
    pd_cluster pool's profile (recipe/pools.py)."""
    try:
        profile, _ = generate(path, Selection(hardware=hardware, strategy=strategy, variant=variant, pool=pool))
        return profile, load_bundle(path).sha256
    except (ConfigError, OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def recipe_path(file: str) -> Path:
    path = Path(file)
    return path if path.is_absolute() else ROOT / path


def recipe_deviations(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Where `data` (a whole profile, merged) differs from what its named recipe generates; [] for a profile that
    names no recipe file (a lab or hand-written profile does not claim to be the recipe's deployment)."""
    recipe = data.get("recipe") if isinstance(data.get("recipe"), dict) else {}
    file = recipe.get("file")
    if not file:
        return []
    hardware, strategy = recipe.get("hardware"), recipe.get("strategy")
    named = f"recipe {file}" + (f" at commit {recipe['commit']}" if recipe.get("commit") else "")
    if not hardware or not strategy:
        return [{"field": "recipe", "profile": {"file": file, "hardware": hardware, "strategy": strategy},
                 "official": None, "source": f"{named}: recipe.hardware and recipe.strategy are needed to regenerate "
                                             "it; nothing proves the image and minimums are the recipe's"}]
    generated, sha_or_why = _generated(str(recipe_path(str(file))), str(hardware), str(strategy),
                                       str(recipe.get("variant") or "default"),
                                       str(recipe["pool"]) if recipe.get("pool") else None)
    if generated is None:
        return [{"field": "recipe", "profile": str(file), "official": None,
                 "source": f"{named} cannot be regenerated here ({sha_or_why}); nothing proves the image and "
                           "minimums are the recipe's"}]
    source = f"{named}, generated for {hardware} {strategy}"
    if recipe.get("sha256") and recipe.get("sha256") != sha_or_why:
        source += (f" (the recipe file changed since this profile was generated: sha256 {sha_or_why}, the profile "
                   f"records {recipe.get('sha256')}; regenerate the profile)")
    return deviations_from(data, generated, source)
