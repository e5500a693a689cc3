"""compat.known_defects: component versions inside the image with a published defect for this model
(src/vllm_acceptance/data/known_defects.yml, docs/sources.md#known-defects; docs/checks.md compat.known_defects).

The NCCL version is read where the workload runs: the in-image probe (torch.cuda.nccl.version()), the in-image
all-reduce's JSON, or NCCL's own `NCCL version X.Y.Z` INFO line in an all-reduce log. A listed version is a
warning (limited_observation) naming the defect, its source and its fix; an unknown version is inconclusive.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import yaml

from ..core.findings import Consequence, Finding, Status
from .context import NodeContext, finding, gpu_profile_na, why_missing
from .interconnect import launch_settings
from .registry import missing

_NCCL_INFO = re.compile(r"NCCL INFO NCCL version (\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class KnownDefect:
    id: str
    component: str
    affected: tuple[str, ...]
    symptom: str
    fix: str
    source: str
    workaround_env: dict[str, str] = field(default_factory=dict)


@lru_cache(maxsize=1)
def known_defects() -> tuple[KnownDefect, ...]:
    raw = yaml.safe_load(resources.files("vllm_acceptance.data").joinpath("known_defects.yml").read_text()) or {}
    out = []
    for entry in raw.get("defects") or []:
        if not entry.get("source") or not entry.get("affected"):
            raise ValueError(f"known_defects.yml {entry.get('id')}: every entry needs its source and affected versions")
        out.append(KnownDefect(id=str(entry["id"]), component=str(entry["component"]),
                               affected=tuple(str(v) for v in entry["affected"]), symptom=" ".join(
                                   str(entry["symptom"]).split()), fix=" ".join(str(entry["fix"]).split()),
                               source=str(entry["source"]),
                               workaround_env={str(k): str(v) for k, v in (entry.get("workaround_env") or {}).items()}))
    return tuple(out)


def nccl_versions(ctx: NodeContext) -> dict[str, str]:
    """Where the image's NCCL version was read -> the version."""
    found: dict[str, str] = {}
    probe = ctx.probe()
    if probe is not None and probe.nccl_version:
        found["in-image probe (torch.cuda.nccl.version())"] = probe.nccl_version
    for name in ("nccl_allreduce_image", "nccl_allreduce"):
        record = ctx.rec(name)
        if not record.present:
            continue
        for line in reversed(record.stdout.strip().splitlines()):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            if isinstance(data, dict) and data.get("nccl_version"):
                found[f"{name} (JSON)"] = str(data["nccl_version"])
            break
        if info := _NCCL_INFO.search(record.stdout + "\n" + record.stderr):
            found[f"{name} (NCCL INFO)"] = info.group(1)
    return found


def check_known_defects(ctx: NodeContext) -> Finding:
    check = "compat.known_defects"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    evidence = ctx.paths("image_probe", "nccl_allreduce_image", "nccl_allreduce")
    versions = nccl_versions(ctx)
    if not versions and not ctx.evidence.dir_exists:
        return missing(check, ctx.host, why_missing(ctx), evidence=evidence)
    if not versions:
        return finding(check, Status.INCONCLUSIVE, ctx.host, evidence=evidence,
                       reason="no NCCL version read inside the image (" + why_missing(ctx, "image_probe") + ")",
                       action="see compat.container_cuda: the in-image probe reads torch.cuda.nccl.version()")
    _, env, source, _ = launch_settings(ctx)
    hits = [(d, where, v) for d in known_defects() if d.component == "nccl"
            for where, v in versions.items() if v in d.affected]
    observed = {"nccl": versions, "defects_checked": [d.id for d in known_defects()], "launch": source}
    if not hits:
        return finding(check, Status.PASS, ctx.host, observed=observed, evidence=evidence,
                       reason=f"NCCL {', '.join(sorted(set(versions.values())))}: no published defect listed for it")
    seen: dict[str, str] = {}
    for defect, where, version in hits:
        mitigated = defect.workaround_env and all(env.get(k) == v for k, v in defect.workaround_env.items())
        note = f"; the launch sets the reported workaround {defect.workaround_env}" if mitigated else ""
        seen[defect.id] = f"NCCL {version} ({where}): {defect.symptom} [{defect.source}]{note}"
    fixes = "; ".join(dict.fromkeys(f"{d.id}: {d.fix}" for d, _, _ in hits))
    return finding(check, Status.WARN, ctx.host, observed={**observed, "defects": list(seen)}, evidence=evidence,
                   consequence=Consequence.LIMIT, reason="; ".join(seen.values()),
                   action=f"use an image whose NCCL the sources report working ({fixes}), then re-run preflight")
