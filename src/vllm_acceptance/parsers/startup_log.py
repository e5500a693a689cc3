"""Scan of a vLLM startup log (vLLM 0.32 message texts), from the first line to ready or exit.

Read out: version, served model, non-default args, platform and device/backend initialisation,
the parallel layout, KV cache size and maximum concurrency; listed: every WARNING, every backend
fallback, NCCL errors (with the `mlx5dv_reg_dmabuf_mr` signature), CUDA/driver incompatibility,
missing kernel images and OOM. The scan states facts; rules/compat.py judges them.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from .base import Parsed

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# (APIServer pid=12) INFO 08-28 10:00:01 [api_utils.py:286] message
_PREFIX = re.compile(
    r"^(?:\S*\s)?\((?P<proc>[\w.-]+) pid=(?P<pid>\d+)\)\s+(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)\s+\[(?P<src>[^\]]*)\]\s?(?P<msg>.*)$")
_PLAIN_LEVEL = re.compile(r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)"
                          r"\s+\[(?P<src>[^\]]*)\]\s?(?P<msg>.*)$")

_VERSION_PATTERNS = [
    re.compile(r"vLLM server version (\S+), serving model (.+)$"),
    re.compile(r"^\s*\S*\s*\S*\s*█.*\bversion\s+(\S+)\s*$"),         # logo line: "... █  version 0.32.0"
    re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\) with config"),
    re.compile(r"vLLM API server version (\S+)"),                      # older releases
]
_LOGO_MODEL = re.compile(r"█.*\bmodel\s+(\S+)\s*$")
_KV = re.compile(r"(?P<pool>[A-Za-z][\w +]*?) KV cache size: (?P<tokens>[\d,]+) tokens")
_CONC = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
_PLATFORM = re.compile(r"Automatically detected platform (\w+)")
_ATTN = re.compile(r"Using (\S+) attention backend")
_ALL2ALL = re.compile(r"Using (\S+) all2all manager")
_NCCL_VER = re.compile(r"vLLM is using nccl==(\S+)")
_DIST = re.compile(r"world_size=(\d+) rank=(\d+) local_rank=(\d+) distributed_init_method=\S+ backend=(\w+)")
_RANKS = re.compile(r"rank (\d+) in world size (\d+) is assigned as DP rank (\d+), PP rank (\d+), "
                    r"(?:PCP rank \d+, )?TP rank (\d+)(?:, (?:ETP rank \d+, )?EP rank (\d+))?")
_LOAD = re.compile(r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds")
_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_READY = re.compile(r"Starting vLLM server on |Application startup complete|Uvicorn running on")
_FALLBACK = re.compile(r"\bfall(?:ing|s)?[ -]?back\b", re.IGNORECASE)
_NCCL_ERROR = re.compile(r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
                         r"ncclRemoteError|DistBackendError|unhandled system error|NCCL WARN", re.IGNORECASE)
_DMABUF = re.compile(r"mlx5dv_reg_dmabuf_mr")
_ERRNO = re.compile(r"errno\s*:?\s*(\d+)", re.IGNORECASE)
_DRIVER_TOO_OLD = re.compile(
    r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver|"
    r"The NVIDIA driver on your system is too old|unsatisfied condition: cuda>=|"
    r"system has unsupported display driver / cuda driver combination|"
    r"forward compatibility was attempted on non supported HW|CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE")
_NO_KERNEL = re.compile(r"no kernel image is available for execution on the device|"
                        r"cudaErrorNoKernelImageForDevice")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks|"
                  r"KV cache is needed, which is larger than the available KV cache memory|"
                  r"Cannot allocate memory|\bout of memory\b", re.IGNORECASE)
_BACKEND_WORDS = re.compile(r"backend|kernel|attention|all2all|nccl|flashinfer|triton|cutlass|deep_?gemm|"
                            r"deepep|\bmoe\b|marlin|cuda graph|dtype|b?float\d+|\bfp\d|pytorch-native|eager",
                            re.IGNORECASE)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
_ENGINE_FAILED = re.compile(r"EngineCore failed to start|Engine core initialization failed")


@dataclass
class LogLine:
    number: int          # 1-based line number in the log
    level: str | None
    process: str | None
    text: str            # the message (prefix removed), or the whole raw line


@dataclass
class StartupScan(Parsed):
    lines: int = 0
    version: str | None = None
    model: str | None = None
    non_default_args: dict[str, Any] | None = None
    platform: str | None = None
    attention_backends: list[str] = field(default_factory=list)
    all2all: list[str] = field(default_factory=list)
    nccl_version: str | None = None
    dist_backend: str | None = None
    world_size: int | None = None
    tp_ranks: set[int] = field(default_factory=set)
    pp_ranks: set[int] = field(default_factory=set)
    dp_ranks: set[int] = field(default_factory=set)
    kv_cache_pool: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    model_load_gib: float | None = None
    model_load_s: float | None = None
    weights_load_s: float | None = None
    engine_init_s: float | None = None
    ready: bool = False
    warnings: list[LogLine] = field(default_factory=list)
    error_lines: list[LogLine] = field(default_factory=list)
    fallbacks: list[LogLine] = field(default_factory=list)
    nccl_errors: list[LogLine] = field(default_factory=list)
    dmabuf_errors: list[LogLine] = field(default_factory=list)
    dmabuf_errno: int | None = None
    driver_incompatible: list[LogLine] = field(default_factory=list)
    no_kernel_image: list[LogLine] = field(default_factory=list)
    oom: list[LogLine] = field(default_factory=list)
    traceback: bool = False
    engine_failed: bool = False

    @property
    def backend_fallbacks(self) -> list[LogLine]:
        """Fallback lines that replace a compute or communication backend (docs/acceptance.md: none allowed);
        other fallbacks (serialisation, file I/O) are only listed."""
        return [line for line in self.fallbacks if _BACKEND_WORDS.search(line.text)]

    @property
    def kv_cache_initialised(self) -> bool:
        return self.kv_cache_tokens is not None and self.max_concurrency is not None

    def failure_class(self) -> str | None:
        """Source 001's fork: 'environment' (CUDA/driver/kernel image before the model loads),
        'communication' (NCCL), 'capacity' (memory after CUDA initialised), 'other' (failed,
        cause elsewhere: model name, weights, auth, layout), None (no failure seen)."""
        if self.driver_incompatible or self.no_kernel_image:
            return "environment"
        if self.nccl_errors or self.dmabuf_errors:
            return "communication"
        if self.oom:
            return "capacity"
        if self.traceback or self.engine_failed or any(e.level == "CRITICAL" for e in self.error_lines):
            return "other"
        return None

    def summary(self) -> dict[str, Any]:
        def texts(items: list[LogLine]) -> list[str]:
            return [f"{i.number}: {i.text[:300]}" for i in items]

        return {
            "lines": self.lines, "version": self.version, "model": self.model, "platform": self.platform,
            "non_default_args": self.non_default_args, "attention_backends": self.attention_backends,
            "all2all": self.all2all, "nccl_version": self.nccl_version, "dist_backend": self.dist_backend,
            "world_size": self.world_size, "tp_size": len(self.tp_ranks) or None,
            "pp_size": len(self.pp_ranks) or None, "dp_size": len(self.dp_ranks) or None,
            "kv_cache_pool": self.kv_cache_pool, "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency, "max_concurrency_len": self.max_concurrency_len,
            "model_load_gib": self.model_load_gib, "model_load_s": self.model_load_s,
            "weights_load_s": self.weights_load_s, "engine_init_s": self.engine_init_s, "ready": self.ready,
            "failure_class": self.failure_class(), "warnings": texts(self.warnings),
            "errors": texts(self.error_lines), "fallbacks": texts(self.fallbacks),
            "nccl_errors": texts(self.nccl_errors), "dmabuf_errors": texts(self.dmabuf_errors),
            "dmabuf_errno": self.dmabuf_errno, "driver_incompatible": texts(self.driver_incompatible),
            "no_kernel_image": texts(self.no_kernel_image), "oom": texts(self.oom),
            "parse_errors": self.errors,
        }


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _split(raw: str, number: int) -> LogLine:
    match = _PREFIX.match(raw) or _PLAIN_LEVEL.match(raw)
    if match:
        groups = match.groupdict()
        return LogLine(number=number, level=groups["level"], process=groups.get("proc"), text=groups["msg"])
    return LogLine(number=number, level=None, process=None, text=raw.strip())


def _non_default_args(text: str) -> dict[str, Any] | None:
    _, _, literal = text.partition("non-default args: ")
    try:
        value = ast.literal_eval(literal.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return None
    return value if isinstance(value, dict) else None


def scan_startup_log(text: str) -> StartupScan:
    scan = StartupScan()
    raw_lines = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    scan.lines = sum(1 for line in raw_lines if line.strip())
    if scan.lines == 0:
        scan.errors.append("empty startup log")
        return scan
    for number, raw in enumerate(raw_lines, start=1):
        if raw.strip():
            _scan_line(scan, _split(raw, number))
    if scan.version is None:
        scan.errors.append("no vLLM version line (log does not start at the container's first line?)")
    return scan


def _scan_line(scan: StartupScan, line: LogLine) -> None:  # noqa: C901 - one table of patterns
    msg = line.text
    if line.level == "WARNING":
        scan.warnings.append(line)
    elif line.level in ("ERROR", "CRITICAL"):
        scan.error_lines.append(line)
    if scan.version is None:
        for pattern in _VERSION_PATTERNS:
            found = pattern.search(msg)
            if found:
                scan.version = found.group(1).lstrip("v")
                if found.re.groups >= 2:
                    scan.model = found.group(2).strip()
                break
    if scan.model is None and (logo_model := _LOGO_MODEL.search(msg)):
        scan.model = logo_model.group(1)
    if "non-default args: " in msg and scan.non_default_args is None:
        scan.non_default_args = _non_default_args(msg)
        if scan.non_default_args is None:
            scan.errors.append(f"line {line.number}: unreadable non-default args")
    simple = [(_PLATFORM, "platform"), (_NCCL_VER, "nccl_version")]
    for pattern, attr in simple:
        if getattr(scan, attr) is None and (found := pattern.search(msg)):
            setattr(scan, attr, found.group(1).rstrip("."))
    if (attn := _ATTN.search(msg)) and attn.group(1) not in scan.attention_backends:
        scan.attention_backends.append(attn.group(1))
    if (a2a := _ALL2ALL.search(msg)) and a2a.group(1) not in scan.all2all:
        scan.all2all.append(a2a.group(1))
    if dist := _DIST.search(msg):
        scan.world_size, scan.dist_backend = int(dist.group(1)), dist.group(4)
    if ranks := _RANKS.search(msg):
        scan.world_size = int(ranks.group(2))
        scan.dp_ranks.add(int(ranks.group(3)))
        scan.pp_ranks.add(int(ranks.group(4)))
        scan.tp_ranks.add(int(ranks.group(5)))
    if kv := _KV.search(msg):
        scan.kv_cache_pool = kv.group("pool").strip().split()[-1] if kv.group("pool") else None
        scan.kv_cache_tokens = _int(kv.group("tokens"))
    if conc := _CONC.search(msg):
        scan.max_concurrency_len = _int(conc.group("len"))
        scan.max_concurrency = float(conc.group("x"))
    if load := _LOAD.search(msg):
        scan.model_load_gib, scan.model_load_s = float(load.group(1)), float(load.group(2))
    if weights := _WEIGHTS.search(msg):
        scan.weights_load_s = float(weights.group(1))
    if init := _INIT.search(msg):
        scan.engine_init_s = float(init.group(1))
    if _READY.search(msg):
        scan.ready = True
    if _FALLBACK.search(msg) and line.level in ("WARNING", "ERROR", "CRITICAL", "INFO", None):
        scan.fallbacks.append(line)
    if _DMABUF.search(msg):
        scan.dmabuf_errors.append(line)
        if errno := _ERRNO.search(msg):
            scan.dmabuf_errno = int(errno.group(1))
    elif _NCCL_ERROR.search(msg):
        scan.nccl_errors.append(line)
    if _DRIVER_TOO_OLD.search(msg):
        scan.driver_incompatible.append(line)
    if _NO_KERNEL.search(msg):
        scan.no_kernel_image.append(line)
    if _OOM.search(msg):
        scan.oom.append(line)
    if _TRACEBACK.match(msg):
        scan.traceback = True
    if _ENGINE_FAILED.search(msg):
        scan.engine_failed = True
