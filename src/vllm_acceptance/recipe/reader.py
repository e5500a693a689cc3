"""Reading a vendored recipe: the recipe file, and the recipe repository's taxonomy and strategies beside it
(recipes/vllm-project/SOURCE.yml). Nothing here interprets the recipe; see resolve.py."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.profile import ConfigError, parse_yaml


@dataclass(frozen=True)
class RecipeBundle:
    """One recipe file with the taxonomy and strategy definitions its command builder reads."""

    path: Path
    data: dict[str, Any]
    sha256: str
    commit: str | None
    source: dict[str, Any]          # the SOURCE.yml record of this file's content ({} when none matches)
    taxonomy: dict[str, Any]
    strategies: dict[str, dict[str, Any]]

    @property
    def hardware_profiles(self) -> dict[str, Any]:
        return dict(self.taxonomy.get("hardware_profiles") or {})


def _yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    try:
        data = parse_yaml(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read it ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: must be a mapping, got {type(data).__name__}")
    return data


def _support_dir(recipe_path: Path, support: Path | None) -> Path:
    """Where taxonomy.yaml and strategies/ are: the given folder, else the recipe's own folder, else the
    vendored copy (recipes/vllm-project/) of this checkout."""
    candidates = [support] if support else [recipe_path.parent, vendored_dir()]
    for folder in candidates:
        if folder and (folder / "taxonomy.yaml").is_file() and (folder / "strategies").is_dir():
            return folder
    raise ConfigError(f"recipe {recipe_path}: no taxonomy.yaml and strategies/ beside it nor in {vendored_dir()} "
                      "(copy them from the recipe repository at the recipe's commit, "
                      "see recipes/vllm-project/SOURCE.yml)")


def vendored_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "recipes" / "vllm-project"


def source_record(recipe_path: Path) -> dict[str, Any]:
    """The SOURCE.yml record (a `<name>.source.yml` beside the recipe, else the folder's SOURCE.yml) that
    lists this file with this content's sha256; {} when none does (an edited or unrecorded copy)."""
    digest = hashlib.sha256(recipe_path.read_bytes()).hexdigest()
    for candidate in (recipe_path.with_suffix(".source.yml"), recipe_path.parent / "SOURCE.yml"):
        if not candidate.is_file():
            continue
        source = yaml.safe_load(candidate.read_text()) or {}
        files = source.get("files") or {}
        entry = files.get(recipe_path.name) if isinstance(files, dict) else None
        if isinstance(entry, dict) and entry.get("sha256") == digest:
            return dict(source)
    return {}


def load_bundle(recipe_path: str | Path, support: str | Path | None = None) -> RecipeBundle:
    path = Path(recipe_path)
    data = _yaml_mapping(path, "recipe")
    for key in ("model", "compatible_strategies"):
        if key not in data:
            raise ConfigError(f"recipe {path}: field `{key}` missing: is this a vllm-project/recipes model file "
                              "(models/<org>/<model>.yaml)?")
    folder = _support_dir(path, Path(support) if support else None)
    taxonomy = _yaml_mapping(folder / "taxonomy.yaml", "recipe taxonomy")
    strategies = {p.stem: _yaml_mapping(p, "recipe strategy") for p in sorted((folder / "strategies").glob("*.yaml"))}
    source = source_record(path)
    return RecipeBundle(path=path, data=data, sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                        commit=str(source["commit"]) if source.get("commit") else None, source=source,
                        taxonomy=taxonomy, strategies=strategies)
