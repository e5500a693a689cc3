"""The self-built image route's experimental profile: the base profile with its own image, CUDA major and
driver floor, `experimental: true` and the full lineage (owner, exit date, sources, build)."""

from __future__ import annotations

import copy
import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

from ...core.profile import ConfigError, Profile, validate_document

LINEAGE_KEYS = ("owner", "exit_date", "base_profile", "source_repo", "source_branch", "source_commit", "dockerfile",
                "dependency_sources", "lock_files", "compile_options", "patches", "build_log", "image_digest",
                "rollback_image", "inputs")


def experimental_profile(base: Profile, *, name: str, image_reference: str, image_digest: str | None,
                         cuda_major: int, lineage: Mapping[str, Any], driver_min_branch: int | None = None,
                         driver_min_version: str | None = None) -> dict[str, Any]:
    """The base profile turned into an experimental one for a self-built image: same model,
    contract and thresholds; its own image, CUDA major and driver floor; `experimental: true`
    and the full lineage (owner, exit date, source commit, lock files, patches, build log,
    digest, rollback image). The verdict never reports such a run as `release`."""
    owner, exit_date = str(lineage.get("owner") or ""), str(lineage.get("exit_date") or "")
    if not owner or not exit_date:
        raise ConfigError("a self-built image needs lineage.owner and lineage.exit_date (source 001: a "
                          "transitional route with a named owner and an exit date)")
    if dt.date.fromisoformat(exit_date) <= dt.datetime.now(dt.UTC).date():
        raise ConfigError(f"lineage.exit_date {exit_date} is not in the future: set a real exit date")
    data = copy.deepcopy(base.data)
    data["name"] = name
    data["description"] = (f"EXPERIMENTAL self-built image {image_reference} (CUDA {cuda_major}) of "
                           f"{base.name}; owner {owner}, exit {exit_date}. Never an acceptance of the official "
                           "image.")
    data["experimental"] = True
    data["lineage"] = {k: lineage[k] for k in LINEAGE_KEYS
                       if lineage.get(k) not in (None, "", []) or (k == "patches" and lineage.get(k) == [])}
    data["lineage"]["base_profile"] = base.name
    data["recipe"] = {**data.get("recipe", {}), "status": "experimental",
                      "notes": [*data.get("recipe", {}).get("notes", []),
                                f"self-built from {lineage.get('source_repo')}@{lineage.get('source_commit')}"]}
    image = data.setdefault("image", {})
    image["reference"] = image_reference
    image["digest"] = image_digest if image_digest and re.fullmatch(r"sha256:[0-9a-f]{64}", image_digest) else None
    image["cuda_major"] = int(cuda_major)
    tag = image_reference.rsplit("/", 1)[-1].partition(":")[2]
    image["forbidden_tag_suffixes"] = [s for s in image.get("forbidden_tag_suffixes", []) if not tag.endswith(s)]
    data["vllm"] = {**data.get("vllm", {}), "install_source": f"self-built {lineage.get('source_repo')}@"
                                                             f"{lineage.get('source_commit')}"}
    if driver_min_branch is not None or driver_min_version is not None:
        data["driver"] = {**data.get("driver", {}), "min_branch": driver_min_branch,
                          "min_version": driver_min_version}
    validate_document(data, "profile", f"experimental profile {name}")
    return data
