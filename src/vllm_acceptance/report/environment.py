"""Environment and versions per node, read back from the preflight evidence for the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.profile import Profile
from ..preflight.stage import node_contexts
from ..rules.compat import host_driver_version


def node_facts(run_dir: Path, profile: Profile, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """The versions a sign-off names: driver, GPUs, CUDA runtime in the image, torch, vLLM, image."""
    facts: dict[str, dict[str, Any]] = {}
    for ctx in node_contexts(run_dir, profile, hosts):
        if not ctx.evidence.dir_exists:
            facts[ctx.host] = {"reachable": False}
            continue
        gpus, probe, inspect = ctx.gpus(), ctx.probe(), ctx.inspect()
        names = sorted({g.name for g in gpus.gpus if g.name}) if gpus else []
        facts[ctx.host] = {
            "driver_version": host_driver_version(ctx),
            "gpu_count": len(gpus.gpus) if gpus else None,
            "gpu_name": ", ".join(names) or None,
            "cuda_runtime": (probe.cuda_json_version or probe.torch_cuda) if probe else None,
            "torch_version": probe.torch_version if probe else None,
            "vllm_version": probe.vllm_version if probe else None,
            "image": ctx.image_ref if ctx.containerised else None,
            "image_digest": (inspect.repo_digests[0] if inspect and inspect.repo_digests else None),
        }
    return facts


def environment_summary(facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Values shared by every node, or the set of distinct values where nodes differ."""
    summary: dict[str, Any] = {}
    keys = sorted({k for f in facts.values() for k in f if k != "reachable"})
    for key in keys:
        values = sorted({str(f[key]) for f in facts.values() if f.get(key) is not None})
        if values:
            summary[key] = values[0] if len(values) == 1 else " | ".join(values)
    summary["nodes"] = len(facts)
    return summary
