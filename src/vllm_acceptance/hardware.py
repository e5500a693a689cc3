"""The hardware table (src/vllm_acceptance/data/hardware.yml): the node shape of each hardware class
the recipe verifies, with its public sources (docs/sources.md#hardware-table).

A profile names its row with `hardware.class`; without it the rules keep the profile's own
`hardware.gpus_per_node` and thresholds (docs/checks.md, compat.gpu_visibility, interconnect.*).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

NVLINK_DOMAINS = ("mnnvl", "nvswitch", "none")
FABRIC_MANAGER_PLACES = ("node", "switch_tray", "none")


@dataclass(frozen=True)
class FabricThreshold:
    """All-reduce bus bandwidth over one fabric (GB/s): the published baseline, warn below, fail below, and
    the shape it was published for (ranks, message size in bytes; None where the source does not say)."""

    fabric: str
    expected: float | None
    warn: float | None
    fail: float | None
    ranks: int | None = None
    bytes: int | None = None

    def scaled(self, factor: float) -> FabricThreshold:
        """The same bounds at another message size (factor: the size curve's ratio, rules/interconnect.py)."""
        def times(value: float | None) -> float | None:
            return None if value is None else round(value * factor, 1)
        return FabricThreshold(self.fabric, times(self.expected), times(self.warn), times(self.fail), self.ranks,
                               self.bytes)


@dataclass(frozen=True)
class SizeCurve:
    """A published all-reduce run's bus bandwidth per message size over one fabric (data/hardware.yml)."""

    fabric: str
    points: tuple[tuple[int, float], ...]      # (bytes, busbw GB/s), ascending
    source: str

    def at(self, size: int) -> float | None:
        """Bus bandwidth at `size`: interpolated on log2(size) between points, the last point past the largest
        size, None below the smallest (the curve says nothing there)."""
        if not self.points or size < self.points[0][0]:
            return None
        for (s0, b0), (s1, b1) in zip(self.points, self.points[1:], strict=False):
            if s0 <= size <= s1:
                t = (math.log2(size) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
                return b0 + t * (b1 - b0)
        return self.points[-1][1]

    def ratio(self, measured: int, published: int) -> float | None:
        """busbw(measured size) / busbw(published size), capped at 1; None where the curve does not reach."""
        low, high = self.at(measured), self.at(published)
        if low is None or not high:
            return None
        return min(1.0, low / high)


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_bytes(value: Any) -> int | None:
    """'16G', '512M', 1073741824 -> bytes (binary units, as nccl-tests' -b/-e read them); None for null."""
    if value is None:
        return None
    text = str(value).strip().upper()
    if text[-1:] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


@dataclass(frozen=True)
class HardwareClass:
    key: str
    vendor: str
    gpu_name: str
    platform: str
    gpus_per_node: int
    gpu_memory_gb: float | None
    cpu_arch: str
    nvlink_domain: str
    gpus_per_nvlink_domain: int
    rdma_ports_per_node: int | None
    fabric_manager: str
    fabrics: dict[str, FabricThreshold] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    @property
    def multi_node_nvlink(self) -> bool:
        """True where one NVLink domain spans several nodes (NVL72 trays)."""
        return self.nvlink_domain == "mnnvl"

    def threshold(self, fabric: str) -> FabricThreshold | None:
        return self.fabrics.get(fabric)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _row(key: str, raw: dict[str, Any]) -> HardwareClass:
    domain = str(raw["nvlink_domain"])
    manager = str(raw["fabric_manager"])
    if domain not in NVLINK_DOMAINS:
        raise ValueError(f"hardware.yml {key}: nvlink_domain {domain!r} not in {NVLINK_DOMAINS}")
    if manager not in FABRIC_MANAGER_PLACES:
        raise ValueError(f"hardware.yml {key}: fabric_manager {manager!r} not in {FABRIC_MANAGER_PLACES}")
    if not raw.get("sources"):
        raise ValueError(f"hardware.yml {key}: a row without a public source")
    fabrics = {name: FabricThreshold(name, _number(t.get("expected")), _number(t.get("warn")), _number(t.get("fail")),
                                     None if t.get("ranks") is None else int(t["ranks"]), size_bytes(t.get("bytes")))
               for name, t in (raw.get("fabrics") or {}).items()}
    ports = raw.get("rdma_ports_per_node")
    return HardwareClass(
        key=key, vendor=str(raw["vendor"]), gpu_name=str(raw["gpu_name"]), platform=str(raw["platform"]),
        gpus_per_node=int(raw["gpus_per_node"]), gpu_memory_gb=_number(raw.get("gpu_memory_gb")),
        cpu_arch=str(raw["cpu_arch"]), nvlink_domain=domain,
        gpus_per_nvlink_domain=int(raw["gpus_per_nvlink_domain"]),
        rdma_ports_per_node=None if ports is None else int(ports), fabric_manager=manager,
        fabrics=fabrics, sources=tuple(str(s) for s in raw["sources"]))


@lru_cache(maxsize=1)
def load_hardware_table() -> dict[str, HardwareClass]:
    """Every row of data/hardware.yml by its class key (h200, b200, b300, gb200, gb300, mi355x)."""
    text = resources.files("vllm_acceptance.data").joinpath("hardware.yml").read_text()
    raw = yaml.safe_load(text) or {}
    return {str(key): _row(str(key), row) for key, row in (raw.get("classes") or {}).items()}


@lru_cache(maxsize=1)
def load_size_curves() -> dict[str, SizeCurve]:
    """The published bus-bandwidth-per-size curve of each fabric (data/hardware.yml size_curves)."""
    text = resources.files("vllm_acceptance.data").joinpath("hardware.yml").read_text()
    raw = yaml.safe_load(text) or {}
    curves = {}
    for fabric, entry in (raw.get("size_curves") or {}).items():
        if not entry.get("source"):
            raise ValueError(f"hardware.yml size_curves.{fabric}: a curve without a public source")
        points = sorted((size_bytes(k) or 0, float(v)) for k, v in (entry.get("points") or {}).items())
        curves[str(fabric)] = SizeCurve(str(fabric), tuple(points), str(entry["source"]).strip())
    return curves


def hardware_class(key: str | None) -> HardwareClass | None:
    """The table's row for a profile's `hardware.class`, or None (no class, or one the table lacks)."""
    if not key:
        return None
    return load_hardware_table().get(str(key).lower())


# --- what a profile's hardware section means, with the table behind it ---------------------------

def profile_class(profile: Any) -> HardwareClass | None:
    """The hardware table's row named by the profile's `hardware.class` (None without one)."""
    return hardware_class(profile.model.hardware.class_)


def nvlink_domain_of(profile: Any) -> str:
    """mnnvl | nvswitch | none: the profile's `hardware.nvlink_domain`, else its class's, else
    nvswitch where the profile says `hardware.nvswitch` (today's behaviour without a class)."""
    explicit = profile.model.hardware.nvlink_domain
    if explicit:
        return str(explicit)
    row = profile_class(profile)
    if row is not None:
        return row.nvlink_domain
    return "nvswitch" if profile.model.hardware.nvswitch else "none"


def fabric_manager_of(profile: Any) -> str:
    """node | switch_tray | none: where Fabric Manager runs (`hardware.fabric_manager`, else the
    class's, else node where the profile says `hardware.nvswitch`)."""
    explicit = profile.model.hardware.fabric_manager
    if explicit:
        return str(explicit)
    row = profile_class(profile)
    if row is not None:
        return row.fabric_manager
    return "node" if profile.model.hardware.nvswitch else "none"


# --- vLLM's default batch sizes on this hardware ---------------------------------------------------------------
# vLLM 0.32 EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py; docs/sources.md#vllm-argument-checks):
# the OpenAI API server's --max-num-batched-tokens default is chosen from the GPU's total memory as torch reports it
# (GiB): >= 160 GiB 16384; >= 70 GiB and not an A100 8192; else 2048; on CPU 2048 x (tensor x pipeline). Throughput
# mode (--performance-mode throughput) doubles it; batched data-parallel MoE (--all2all-backend deepep_low_latency or
# nixl_ep with expert parallel and data parallel > 1) sets
# SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP, 256. The table's gpu_memory_gb is decimal GB:
# converted to GiB.
GIB = 2 ** 30
API_SERVER_BATCHED_TOKENS = ((160, 16384), (70, 8192), (0, 2048))
LARGEST_GPU_DEFAULT = 16384
BATCHED_DP_MOE_BACKENDS = ("deepep_low_latency", "nixl_ep")


def _flag(args: list[str], name: str) -> str | None:
    """The last value of `--name=V` / `--name V` in argv (hardware.py imports nothing of core)."""
    value = None
    for index, arg in enumerate(args):
        if arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
        elif arg == name and index + 1 < len(args):
            value = args[index + 1]
    return value


def vllm_batched_tokens_default(profile: Any, extra_args: list[str] | None = None) -> tuple[int | None, str]:
    """(vLLM's default --max-num-batched-tokens for the API server on this profile's hardware, how it was read);
    None where the GPU's memory is unknown (no hardware.class row): the caller decides, never a pass."""
    args = [str(a) for a in [*profile.model.launch.args, *(extra_args or [])]]
    parallel = profile.model.at("parallel") or {}
    where = "vllm/engine/arg_utils.py get_batch_defaults"
    backend = _flag(args, "--all2all-backend")
    expert = "--enable-expert-parallel" in args or bool(parallel.get("expert"))
    if backend in BATCHED_DP_MOE_BACKENDS and expert and int(parallel.get("data") or 1) > 1:
        return 256, (f"batched data-parallel MoE ({backend}): "
                     "SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP")
    factor = 2 if _flag(args, "--performance-mode") == "throughput" else 1
    mode = " x 2 (--performance-mode throughput)" if factor == 2 else ""
    if str(profile.model.hardware.accelerator or "none") == "none":
        world = int(parallel.get("tensor") or 1) * int(parallel.get("pipeline") or 1)
        return 2048 * world * factor, f"{where}: CPU, 2048 x tensor x pipeline ({world}){mode}"
    row = profile_class(profile)
    if row is None or row.gpu_memory_gb is None:
        return None, "the GPU's memory is unknown (no hardware.class row with gpu_memory_gb)"
    gib = row.gpu_memory_gb * 1e9 / GIB
    for floor, tokens in API_SERVER_BATCHED_TOKENS:
        if gib >= floor and not (tokens == 8192 and "a100" in row.gpu_name.lower()):
            return tokens * factor, f"{where}: {row.gpu_name} {row.gpu_memory_gb:g} GB = {gib:.0f} GiB{mode}"
    return 2048 * factor, f"{where}{mode}"
