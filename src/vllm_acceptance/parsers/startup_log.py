"""Scan of a vLLM startup log, from the first line to ready or exit (vLLM 0.2 to 0.33 message texts).

Read out: version, served model, non-default args, platform and device/backend initialisation,
the parallel layout, the KV cache readout (V1 "GPU KV cache size: N tokens" and "Maximum concurrency
for N tokens per request: X.XXx", on one line or two; V0 "# GPU blocks: N, # CPU blocks: M"); listed:
every WARNING, every backend fallback, NCCL errors (the `mlx5dv_reg_dmabuf_mr` error form apart from
benign INFO mentions of the symbol), CUDA/driver incompatibility, missing kernel images, GPU
architectures the build lacks, no device platform, argparse usage errors and OOM.

Lines arrive wrapped in other tools' prefixes (docker compose `vllm-1  | `, journald, RFC 3339
timestamps of k8s and cloud logging, Ray `(RayWorkerWrapper pid=N, ip=A)`, `(APIServer pid=N)`,
terminal colour markup): vLLM's own record (`LEVEL MM-DD HH:MM:SS [file.py:N] msg`, or the older
`LEVEL MM-DD HH:MM:SS file.py:N] msg`) is searched for inside the line. The corpus of real logs in
tests/fixtures/real/vllm/ pins each format. The scan states facts; rules/compat.py judges them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .base import Parsed
from .engine_config import engine_config
from .pyrepr import ReprError, read_repr

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM's record inside whatever wraps it: "(APIServer pid=12) INFO 08-28 10:00:01 [api_utils.py:286] msg",
# "INFO 01-30 03:18:12 gpu_model_runner.py:848] msg" (before 0.8), behind compose/journald/k8s prefixes.
_PROC = r"\((?P<proc>[\w.-]+)(?:\s+rank=\d+)?\s+pid=(?P<pid>\d+)(?:,\s*ip=[^)]*)?\)"
_RECORD = re.compile(
    r"(?:" + _PROC + r"(?:</?\w+>)*\s+)?(?<![\w-])(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?\s+(?:\[(?P<src>[^\]]*)\]|(?P<src2>[\w./<>-]+:\d+)\])\s?(?P<msg>.*)$")
_PROC_ONLY = re.compile(_PROC + r"\s?(?P<msg>.*)$")
_BOX = re.compile(r"^\s*[│┃|]\s?|\s*[│┃]\s*$")   # terminal UIs that frame each line
# other tools' prefixes before a line that is not a vLLM record (a traceback, argparse, uvicorn):
# docker compose "svc-1  | ", RFC 3339 (k8s), journald "Aug 19 18:30:11 host unit[pid]: ", MPI/torchrun tags
_OUTER = re.compile(r"^(?:[\w.-]+\s+\|\s?|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?Z?\s+|"
                    r"\S+\s+\d{1,2}\s+\d\d:\d\d:\d\d\s+\S+\s+[\w.@/-]+\[\d+\]:\s+|\[rank\d+\]:\s?|"
                    r"\[\d+(?:,\d+)*\](?:<std(?:out|err)>:)?\s?)")

_VERSION_PATTERNS = [
    re.compile(r"vLLM server version (\S+), serving model (.+)$"),
    re.compile(r"^\s*\S*\s*\S*\s*█.*\bversion\s+(\S+)\s*$"),         # logo line: "... █  version 0.32.0"
    re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v([^)]+)\) with config"),
    re.compile(r"vLLM API server version (\S+)"),                      # older releases
]
_LOGO_MODEL = re.compile(r"█.*\bmodel\s+(\S+)\s*$")
_KV = re.compile(r"(?P<pool>[A-Za-z][\w +]*?) KV cache size: (?P<tokens>[\d,]+) tokens")
_CONC = re.compile(r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<x>[\d.]+)x")
# V0 and V1 before 0.7.3: "# GPU blocks: 1381", "# GPU blocks: 229, # CPU blocks: 512", "# cuda blocks: 7191, ..."
_BLOCKS = re.compile(r"(?:#\s*|\b)(?:GPU|cuda|gpu|xpu|hpu|npu|tpu|neuron) blocks:\s*(?P<n>[\d,]+)")
_CPU_BLOCKS = re.compile(r"#\s*CPU blocks:\s*(?P<n>[\d,]+)")
_NUM_GPU_BLOCKS = re.compile(r"cache_config_info with initialization after num_gpu_blocks is:\s*(?P<n>\d+)")
_PLATFORM = re.compile(r"Automatically detected platform (\w+)")
_ATTN = re.compile(r"Using (\S+) attention backend")
_ALL2ALL = re.compile(r"Using (\S+) all2all manager")
_NCCL_VER = re.compile(r"vLLM is using nccl==(\S+)")
_DIST = re.compile(r"world_size=(\d+) rank=(\d+) local_rank=(\d+) distributed_init_method=\S+ backend=(\w+)")
_RANKS = re.compile(r"rank (\d+) in world size (\d+) is assigned as DP rank (\d+), PP rank (\d+), "
                    r"(?:PCP rank \d+, )?TP rank (\d+)(?:, (?:ETP rank \d+, )?EP rank (\d+))?")
# "Model loading took 15.27 GiB memory and 7.87 seconds" (and without "memory"); before 0.8 only
# "Loading model weights took 67.7229 GB" (the number is GiB, printed as "GB")
_LOAD = re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) s(?:econds)?")
_LOAD_OLD = re.compile(r"Loading model weights took ([\d.]+) GB")
_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
# "Starting vLLM server on", "Starting vLLM API server 0 on", a redacted "Starting v<HOST> server on"
_READY = re.compile(r"Starting v\S*(?: API)? server(?: \d+)? on |Application startup complete|Uvicorn running on|"
                    r"Available routes are:")
# The socket bound and the app serving (uvicorn's lines): errors after it are the running server's, never startup's.
_SERVING = re.compile(r"Application startup complete|Uvicorn running on")
_FALLBACK = re.compile(r"\bfall(?:ing|s)?[ -]?back\b", re.IGNORECASE)
_NCCL_ERROR = re.compile(r"NCCL error|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|"
                         r"ncclRemoteError|DistBackendError|unhandled system error|NCCL WARN", re.IGNORECASE)
_DMABUF = re.compile(r"mlx5dv_reg_dmabuf_mr")
# The error form only (NCCL_DMABUF_ENABLE=0 is justified by it); "NCCL INFO dlvsym failed on
# mlx5dv_reg_dmabuf_mr" is a benign probe of an older libmlx5 that lacks the symbol.
_DMABUF_ERROR = re.compile(r"mlx5dv_reg_dmabuf_mr failed|NCCL WARN.*mlx5dv_reg_dmabuf_mr|mlx5dv_reg_dmabuf_mr.*errno")
_ERRNO = re.compile(r"errno\s*:?\s*(\d+)", re.IGNORECASE)
_DRIVER_TOO_OLD = re.compile(
    r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver|"
    r"The NVIDIA driver on your system is too old|unsatisfied condition: cuda>=|"
    r"system has unsupported display driver / cuda driver combination|"
    r"forward compatibility was attempted on non supported HW|CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE")
_NO_KERNEL = re.compile(r"no kernel image is available for execution on the device|"
                        r"cudaErrorNoKernelImageForDevice")
_UNSUPPORTED_ARCH = re.compile(r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation|"
                               r"Found GPU\d+ .+ which is of compute capability \(CC\) [\d.]+")
_NO_PLATFORM = re.compile(r"No platform detected, vLLM is running on UnspecifiedPlatform|Failed to infer device type")
# argparse exits 2 with one line and no traceback: "vllm serve: error: argument --x: invalid choice: ..."
_USAGE_ERROR = re.compile(r"^(?:vllm(?: serve)?|[\w-]+\.py): error: |"
                          r"you should provide the model as a positional argument")
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks|"
                  r"KV cache is needed, which is larger than the available KV cache memory|"
                  r"is larger than the maximum number of tokens that can be stored in KV cache|"
                  r"Cannot allocate memory|\bout of memory\b", re.IGNORECASE)
_BACKEND_WORDS = re.compile(r"backend|kernel|attention|all2all|nccl|flashinfer|triton|cutlass|deep_?gemm|"
                            r"deepep|\bmoe\b|marlin|cuda graph|dtype|b?float\d+|\bfp\d|pytorch-native|eager",
                            re.IGNORECASE)
_TRACEBACK = re.compile(r"(?:^|[\s:>)\]])Traceback \(most recent call last\):")
_DP_ENGINE = re.compile(r"EngineCore_DP(\d+)")
_ENGINE_FAILED = re.compile(r"EngineCore failed to start|Engine core initialization failed")
# A request the running server refused (vLLM's OpenAI layer, serving.py: "Error with model error=ErrorInfo(
# message='The model `x` does not exist. ...', type='NotFoundError', param='model', code=404)"): the client's
# error, logged at ERROR after the server became ready; never a startup failure.
_REQUEST_ERROR = re.compile(r"Error with model error=ErrorInfo\(.*\bcode=4\d\d\)")


@dataclass
class LogLine:
    number: int          # 1-based line number in the log
    level: str | None
    process: str | None
    text: str            # the message (prefix removed), or the whole raw line


@dataclass
class StartupScan(Parsed):
    lines: int = 0
    starts: int = 1                 # server starts the log holds (a journal across `Restart=`); the last is scanned
    start_line: int = 1             # the 1-based line the scanned (last) start begins at
    version: str | None = None
    model: str | None = None
    non_default_args: dict[str, Any] | None = None
    non_default_args_line: LogLine | None = None   # the line it came from (quoted when unreadable)
    engine_config: dict[str, Any] | None = None    # "... LLM engine ... with config: ..." (parsers/engine_config.py)
    engine_config_line: LogLine | None = None
    platform: str | None = None
    attention_backends: list[str] = field(default_factory=list)
    all2all: list[str] = field(default_factory=list)
    nccl_version: str | None = None
    dist_backend: str | None = None
    world_size: int | None = None
    tp_ranks: set[int] = field(default_factory=set)
    pp_ranks: set[int] = field(default_factory=set)
    dp_ranks: set[int] = field(default_factory=set)
    # data-parallel engines by their process prefix ("(EngineCore_DP1 pid=...)"): the CPU build's dense-model
    # engines each log "DP rank 0" in a world of 1, so the prefix is what tells two engines apart
    dp_engines: set[int] = field(default_factory=set)
    kv_cache_pool: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    kv_cache_gpu_blocks: int | None = None      # V0 / early V1 block count, or cache_config_info's num_gpu_blocks
    kv_cache_cpu_blocks: int | None = None      # V0 swap space blocks
    kv_cache_lines: list[LogLine] = field(default_factory=list)
    model_load_gib: float | None = None
    model_load_s: float | None = None
    weights_load_s: float | None = None
    engine_init_s: float | None = None
    ready: bool = False
    serving: bool = False
    warnings: list[LogLine] = field(default_factory=list)
    error_lines: list[LogLine] = field(default_factory=list)
    request_errors: list[LogLine] = field(default_factory=list)   # 4xx refusals after ready (clients' errors)
    # ERROR lines and tracebacks once the server is serving (_SERVING: a tool parser's traceback on one reply, a
    # request's failure): the running server's, listed, never a startup failure (the probes judge the requests).
    runtime_errors: list[LogLine] = field(default_factory=list)
    runtime_tracebacks: int = 0
    fallbacks: list[LogLine] = field(default_factory=list)
    nccl_errors: list[LogLine] = field(default_factory=list)
    dmabuf_errors: list[LogLine] = field(default_factory=list)
    dmabuf_errno: int | None = None
    dmabuf_mentions: list[LogLine] = field(default_factory=list)   # benign INFO lines naming the symbol
    driver_incompatible: list[LogLine] = field(default_factory=list)
    no_kernel_image: list[LogLine] = field(default_factory=list)
    oom: list[LogLine] = field(default_factory=list)
    unsupported_gpu_arch: list[LogLine] = field(default_factory=list)
    no_platform: list[LogLine] = field(default_factory=list)
    usage_errors: list[LogLine] = field(default_factory=list)
    traceback: bool = False
    engine_failed: bool = False

    @property
    def backend_fallbacks(self) -> list[LogLine]:
        """Fallback lines that replace a compute or communication backend (docs/acceptance.md: none allowed);
        other fallbacks (serialisation, file I/O) are only listed."""
        return [line for line in self.fallbacks if _BACKEND_WORDS.search(line.text)]

    @property
    def non_default_args_unreadable(self) -> bool:
        """The server printed its non-default args, but the line could not be read."""
        return self.non_default_args is None and self.non_default_args_line is not None

    @property
    def dp_size(self) -> int | None:
        """Data-parallel engines the log shows: its DP ranks or its engines' process prefixes, the more of the two."""
        return max(len(self.dp_ranks), len(self.dp_engines)) or None

    @property
    def kv_cache_initialised(self) -> bool:
        """The KV cache was allocated and read out: its size (tokens, or V0 blocks) and the concurrency."""
        return (self.kv_cache_tokens is not None or self.kv_cache_gpu_blocks is not None) \
            and self.max_concurrency is not None

    def failure_class(self) -> str | None:
        """The fork of docs/sources.md#a001: 'environment' (CUDA/driver/kernel image/GPU architecture/no device
        platform, before the model loads), 'communication' (NCCL), 'capacity' (memory after CUDA
        initialised), 'configuration' (the command line was refused: argparse usage error), 'other'
        (failed, cause elsewhere: model name, weights, auth, layout), None (no failure seen)."""
        if self.driver_incompatible or self.no_kernel_image or self.unsupported_gpu_arch or self.no_platform:
            return "environment"
        if self.nccl_errors or self.dmabuf_errors:
            return "communication"
        if self.oom:
            return "capacity"
        if self.usage_errors:
            return "configuration"
        if self.traceback or self.engine_failed or any(e.level in ("ERROR", "CRITICAL") for e in self.error_lines):
            return "other"
        return None

    def summary(self) -> dict[str, Any]:
        def texts(items: list[LogLine]) -> list[str]:
            return [f"{i.number}: {i.text[:300]}" for i in items]

        return {
            **({"starts": self.starts, "judged_from_line": self.start_line} if self.starts > 1 else {}),
            "lines": self.lines, "version": self.version, "model": self.model, "platform": self.platform,
            "non_default_args": self.non_default_args,
            "non_default_args_unreadable": (f"{self.non_default_args_line.number}: {self.non_default_args_line.text}"
                                            if self.non_default_args_unreadable and self.non_default_args_line
                                            else None),
            "attention_backends": self.attention_backends,
            "all2all": self.all2all, "nccl_version": self.nccl_version, "dist_backend": self.dist_backend,
            "world_size": self.world_size, "tp_size": len(self.tp_ranks) or None,
            "pp_size": len(self.pp_ranks) or None, "dp_size": self.dp_size,
            "kv_cache_pool": self.kv_cache_pool, "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrency": self.max_concurrency, "max_concurrency_len": self.max_concurrency_len,
            "kv_cache_gpu_blocks": self.kv_cache_gpu_blocks, "kv_cache_cpu_blocks": self.kv_cache_cpu_blocks,
            "kv_cache_lines": texts(self.kv_cache_lines),
            "model_load_gib": self.model_load_gib, "model_load_s": self.model_load_s,
            "weights_load_s": self.weights_load_s, "engine_init_s": self.engine_init_s, "ready": self.ready,
            "failure_class": self.failure_class(), "warnings": texts(self.warnings),
            "errors": texts(self.error_lines), "request_errors": texts(self.request_errors[:10]),
            "runtime_errors": texts(self.runtime_errors[:10]), "runtime_error_lines": len(self.runtime_errors),
            "runtime_tracebacks": self.runtime_tracebacks,
            "fallbacks": texts(self.fallbacks),
            "nccl_errors": texts(self.nccl_errors), "dmabuf_errors": texts(self.dmabuf_errors),
            "dmabuf_errno": self.dmabuf_errno, "driver_incompatible": texts(self.driver_incompatible),
            "no_kernel_image": texts(self.no_kernel_image), "oom": texts(self.oom),
            "unsupported_gpu_arch": texts(self.unsupported_gpu_arch), "no_platform": texts(self.no_platform),
            "usage_errors": texts(self.usage_errors), "dmabuf_mentions": texts(self.dmabuf_mentions),
            "parse_errors": self.errors,
        }


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _split(raw: str, number: int) -> LogLine:
    """vLLM's record found inside the line's prefixes; other lines keep their text (less a process tag)."""
    line = _BOX.sub("", raw)
    if match := _RECORD.search(line):
        groups = match.groupdict()
        return LogLine(number=number, level=groups["level"], process=groups.get("proc"), text=groups["msg"].rstrip())
    if match := _PROC_ONLY.search(line):
        return LogLine(number=number, level=None, process=match.group("proc"), text=match.group("msg").strip())
    return LogLine(number=number, level=None, process=None, text=_strip_outer(line))


def _strip_outer(line: str) -> str:
    text = line.strip()
    for _ in range(4):
        stripped = _OUTER.sub("", text, count=1)
        if stripped == text:
            break
        text = stripped
    return text.strip()


def _non_default_args(text: str) -> dict[str, Any] | None:
    """The dict vLLM prints after `non-default args: `, reprs included (parsers/pyrepr.py); None if unreadable."""
    _, _, literal = text.partition("non-default args: ")
    try:
        value = read_repr(literal.strip())
    except ReprError:
        return None
    return value if isinstance(value, dict) else None


# The banner each start of a vLLM API server prints once (docs/sources.md#vllm-log-starts): the logo's version line
# (0.2x on), "vLLM API server version X" (before), "vLLM server version X, serving model M". Not the engine's
# "Initializing ... LLM engine (vX)": a V1 server prints it again in its engine core, within one start.
_START_BANNER = (_VERSION_PATTERNS[0], _VERSION_PATTERNS[1], _VERSION_PATTERNS[3])
# systemd's own lines about the unit, which `journalctl -u UNIT` shows between two starts of its process:
# "vllm.service: Scheduled restart job, restart counter is at 1.", "Stopped ...", "Starting ...", "Started ...".
_UNIT_LINE = re.compile(r"\bsystemd\[\d+\]:\s+(?:\S+: Scheduled restart job|Stopp(?:ed|ing)\b|Start(?:ed|ing)\b|"
                        r"\S+: (?:Main process exited|Failed with result|Deactivated|Consumed))")
# What a start prints above its banner: the logo's other lines, its blank records, the platform detection.
_PREAMBLE = re.compile(r"^$|[█▀▄]|Automatically detected platform|No plugins for group|plugin \S+ loaded")


def split_starts(raw_lines: list[str]) -> list[int]:
    """0-based index of the first line of each server start in the log: at each start banner, moved up over that
    start's preamble, or to just below the last systemd unit line since the previous start (a journal)."""
    banners = [i for i, raw in enumerate(raw_lines)
               if raw.strip() and any(p.search(_split(raw, i + 1).text) for p in _START_BANNER)]
    firsts = []
    for n, banner in enumerate(banners):
        floor = firsts[-1] + 1 if firsts else 0
        unit = [i for i in range(floor, banner) if _UNIT_LINE.search(raw_lines[i])] if n else []
        first = banner
        if unit:
            first = unit[-1] + 1
        else:
            while first > floor and _PREAMBLE.search(_split(raw_lines[first - 1], first).text.strip()):
                first -= 1
        firsts.append(first if n else 0)     # the first start begins at the log's first line
    return firsts or [0]


def scan_startup_log(text: str) -> StartupScan:
    """The scan of the log's last server start: a log holding several (a journal of `Restart=`, `docker logs` of a
    restarted container) is cut to the last before it is read, line numbers kept (issue 42 item 3)."""
    scan = StartupScan()
    raw_lines = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    firsts = split_starts(raw_lines)
    scan.starts, scan.start_line = len(firsts), firsts[-1] + 1
    raw_lines = [""] * firsts[-1] + raw_lines[firsts[-1]:]
    scan.lines = sum(1 for line in raw_lines if line.strip())
    if scan.lines == 0:
        scan.errors.append("empty startup log")
        return scan
    for number, raw in enumerate(raw_lines, start=1):
        if raw.strip():
            _scan_line(scan, _split(raw, number))
    _scan_wrapped(scan, raw_lines)
    if scan.version is None:
        scan.errors.append("no vLLM version line (log does not start at the container's first line?)")
    return scan


def _scan_line(scan: StartupScan, line: LogLine) -> None:  # noqa: C901 - one table of patterns
    msg = line.text
    if line.process and (engine := _DP_ENGINE.fullmatch(line.process)):
        scan.dp_engines.add(int(engine.group(1)))
    if line.level == "WARNING":
        scan.warnings.append(line)
    elif line.level in ("ERROR", "CRITICAL"):
        if scan.ready and _REQUEST_ERROR.search(msg):
            scan.request_errors.append(line)
        else:
            (scan.runtime_errors if scan.serving else scan.error_lines).append(line)
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
    if "non-default args: " in msg and scan.non_default_args_line is None:
        scan.non_default_args_line = line
        scan.non_default_args = _non_default_args(msg)
        if scan.non_default_args is None:
            scan.errors.append(f"line {line.number}: unreadable non-default args: {msg[:300]}")
    if scan.engine_config_line is None and (config := engine_config(msg)) is not None:
        scan.engine_config, scan.engine_config_line = config, line
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
    _scan_blocks(scan, msg)
    if kv or conc or _BLOCKS.search(msg):
        scan.kv_cache_lines.append(line)
    if load := _LOAD.search(msg):
        scan.model_load_gib, scan.model_load_s = float(load.group(1)), float(load.group(2))
    elif (old_load := _LOAD_OLD.search(msg)) and scan.model_load_gib is None:
        scan.model_load_gib = float(old_load.group(1))
    if weights := _WEIGHTS.search(msg):
        scan.weights_load_s = float(weights.group(1))
    if init := _INIT.search(msg):
        scan.engine_init_s = float(init.group(1))
    if _READY.search(msg):
        scan.ready = True
    if _SERVING.search(msg):
        scan.serving = True
    if _FALLBACK.search(msg) and line.level in ("WARNING", "ERROR", "CRITICAL", "INFO", None):
        scan.fallbacks.append(line)
    if _DMABUF_ERROR.search(msg):
        scan.dmabuf_errors.append(line)
        if errno := _ERRNO.search(msg):
            scan.dmabuf_errno = int(errno.group(1))
    elif _DMABUF.search(msg):
        scan.dmabuf_mentions.append(line)
    elif _NCCL_ERROR.search(msg):
        scan.nccl_errors.append(line)
    if _DRIVER_TOO_OLD.search(msg):
        scan.driver_incompatible.append(line)
    if _NO_KERNEL.search(msg):
        scan.no_kernel_image.append(line)
    if _OOM.search(msg):
        scan.oom.append(line)
    for pattern, found in ((_UNSUPPORTED_ARCH, scan.unsupported_gpu_arch), (_NO_PLATFORM, scan.no_platform),
                           (_USAGE_ERROR, scan.usage_errors)):
        if pattern.search(msg):
            found.append(line)
    if _TRACEBACK.search(msg):
        if scan.serving:
            scan.runtime_tracebacks += 1
        else:
            scan.traceback = True
    if _ENGINE_FAILED.search(msg):
        scan.engine_failed = True


def _scan_blocks(scan: StartupScan, msg: str) -> None:
    """V0 / early V1 readouts in blocks; cache_config_info's count only when no block line came first."""
    if blocks := _BLOCKS.search(msg):
        scan.kv_cache_gpu_blocks = _int(blocks.group("n"))
    if cpu := _CPU_BLOCKS.search(msg):
        scan.kv_cache_cpu_blocks = _int(cpu.group("n"))
    if (num := _NUM_GPU_BLOCKS.search(msg)) and scan.kv_cache_gpu_blocks is None:
        scan.kv_cache_gpu_blocks = int(num.group("n"))


# A terminal or a paste tool that wraps long lines mid-word leaves the rest of a prefixed line on
# the next line without any prefix ("... (4.26 GiB KV cach" / "e is needed, ..."): such pairs are
# read joined, for the failure signatures only, when neither half matched alone.
_ANY_PREFIX = re.compile(_PROC + r"|(?<![\w-])(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|^\s|^\[")
_WRAPPED_SIGNATURES: tuple[tuple[re.Pattern[str], str], ...] = (
    (_OOM, "oom"), (_DRIVER_TOO_OLD, "driver_incompatible"), (_NO_KERNEL, "no_kernel_image"),
    (_UNSUPPORTED_ARCH, "unsupported_gpu_arch"), (_NO_PLATFORM, "no_platform"), (_DMABUF_ERROR, "dmabuf_errors"),
    (_NCCL_ERROR, "nccl_errors"))


def wrapped_pairs(raw_lines: list[str]) -> list[tuple[int, str, str]]:
    """(1-based number of the first line, first line, continuation) for lines a terminal wrapped."""
    pairs = []
    for i in range(len(raw_lines) - 1):
        first, rest = raw_lines[i].rstrip("\n"), raw_lines[i + 1]
        if len(first) >= 80 and _PROC_ONLY.search(first) and rest.strip() and not _ANY_PREFIX.search(rest):
            pairs.append((i + 1, first, rest.strip()))
    return pairs


def _scan_wrapped(scan: StartupScan, raw_lines: list[str]) -> None:
    for number, first, rest in wrapped_pairs(raw_lines):
        line = _split(first + rest, number)
        for pattern, attr in _WRAPPED_SIGNATURES:
            if pattern.search(line.text) and not pattern.search(first) and not pattern.search(rest):
                getattr(scan, attr).append(line)
