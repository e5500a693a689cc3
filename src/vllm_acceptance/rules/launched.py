"""The launched plan: what the serve stage really starts, the profile with the inventory's overrides.

The layout checks (startup-log world size, GPUs per node, cluster GPU count) and the interconnect
checks (all-to-all backend, UCX/NCCL environment) judge this plan, not the profile's own layout: an
inventory that sets vllm_parallel tensor 8 x pipeline 2 over two nodes is launched with a world of 16,
and its log must say 16. Read from the inventory variables recorded in run.json
(`inventory_vars`: vllm_parallel, vllm_interconnect, vllm_serve_multinode_env,
vllm_nccl_dmabuf_workaround, vllm_nccl_dmabuf_evidence), the same ones roles/vllm_serve launches with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.profile import Profile
from ..core.rundir import RunDir
from ..hardware import nvlink_domain_of

LAYOUT_KEYS = ("tensor", "pipeline", "data")


@dataclass(frozen=True)
class LaunchedPlan:
    tensor: int = 1
    pipeline: int = 1
    data: int = 1
    expert: bool = False
    interconnect: str | None = None
    env: dict[str, str] = field(default_factory=dict)      # the inventory's extra launch environment
    dmabuf_workaround: bool = False
    dmabuf_evidence: str | None = None                    # a startup log that showed mlx5dv_reg_dmabuf_mr
    source: str = "profile"                               # "profile" or "profile + inventory"

    @property
    def world(self) -> int:
        """GPUs of the whole deployment: tensor x pipeline x data."""
        return self.tensor * self.pipeline * self.data

    @property
    def engine_world(self) -> int:
        """vLLM's world_size of one engine (its startup log): tensor x pipeline."""
        return self.tensor * self.pipeline

    def layout(self) -> dict[str, Any]:
        return {"tensor": self.tensor, "pipeline": self.pipeline, "data": self.data, "expert": self.expert,
                "source": self.source}


def _int(value: Any, default: int = 1) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return default


def launched_plan(profile: Profile, inventory_vars: Mapping[str, Any] | None = None) -> LaunchedPlan:
    """The profile's parallel layout and interconnect, overridden by the inventory's."""
    inv = dict(inventory_vars or {})
    parallel = {**(profile.model.at("parallel") or {}), **(inv.get("vllm_parallel") or {})}
    overridden = bool(inv.get("vllm_parallel") or inv.get("vllm_interconnect") or inv.get("vllm_serve_multinode_env")
                      or inv.get("vllm_nccl_dmabuf_workaround"))
    return LaunchedPlan(
        tensor=_int(parallel.get("tensor")), pipeline=_int(parallel.get("pipeline")), data=_int(parallel.get("data")),
        expert=bool(parallel.get("expert", False)),
        interconnect=str(inv.get("vllm_interconnect") or profile.model.hardware.interconnect or "") or None,
        env={str(k): str(v) for k, v in (inv.get("vllm_serve_multinode_env") or {}).items()},
        dmabuf_workaround=str(inv.get("vllm_nccl_dmabuf_workaround", False)).lower() in ("true", "1", "yes"),
        dmabuf_evidence=inv.get("vllm_nccl_dmabuf_evidence") or None,
        source="profile + inventory" if overridden else "profile")


def mnnvl_hardware(profile: Profile) -> bool:
    """One NVLink domain spans the nodes (GB200/GB300 NVL trays: hardware.nvlink_domain, else the hardware table's
    class), as rules/fabric.py and roles/preflight's preflight_mnnvl decide it: the launch asks for an IMEX channel."""
    return nvlink_domain_of(profile) == "mnnvl"


def run_inventory_vars(run_dir: Path) -> dict[str, Any]:
    return RunDir(Path(run_dir)).inventory_vars()


def plan_of_run(run_dir: Path, profile: Profile) -> LaunchedPlan:
    return launched_plan(profile, run_inventory_vars(run_dir))
