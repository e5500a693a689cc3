"""Each recipe flag against what the running server reports about itself (never what it was asked).

The server states its configuration in three places; a flag is read from the first that covers it:
1. ``vllm:cache_config_info`` on /metrics: the KV-cache configuration in effect after vLLM and the platform
   adjusted it (``cache_dtype``, ``block_size``, ``enable_prefix_caching``, ``gpu_memory_utilization``, ...);
2. ``/v1/models``: ``max_model_len``;
3. the startup log's ``non-default args: {...}`` line: every argument vLLM parsed to a non-default value,
   reprs included (``AttentionConfig(...)``, enum members; see parsers/pyrepr.py);
4. the startup log's engine config line (``Initializing a V1 LLM engine (vX) with config: ...``,
   parsers/engine_config.py): resolved values, defaults included. A recipe flag at that version's default
   is absent from (3) and read here; shown nowhere, it is unverifiable, never failed for its absence.
The process argv (``docker inspect .Args``, ``/proc/PID/cmdline``) is what was *asked*: kept beside each
reading, never the reason a flag passes.

A reading is ``match``, ``differs`` or ``unverifiable`` (no source shows the flag's value, or the report
that would show it is absent or unreadable: the line is quoted, never a silent pass). ``not_shown`` is kept
for readings recorded by earlier versions (absent from the non-default args was judged a failure).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from ..core.argv import parse_flags
from ..core.profile import Profile
from ..parsers.pyrepr import REPR_KEY
from ..parsers.startup_log import StartupScan

MATCH, DIFFERS, NOT_SHOWN, UNVERIFIABLE = "match", "differs", "not_shown", "unverifiable"

# CLI argument -> vllm:cache_config_info label, where the names differ (vLLM 0.32 CacheConfig fields).
CACHE_LABEL_ALIASES = {"kv_cache_dtype": "cache_dtype", "device_memory_utilization": "gpu_memory_utilization"}
# CacheConfig fields that vLLM 0.32 exports as vllm:cache_config_info labels and takes as launch flags: such a
# flag is judged from the metric even when the metric could not be read (then it is unverifiable).
CACHE_FIELDS = frozenset({
    "block_size", "gpu_memory_utilization", "kv_cache_memory_bytes", "cache_dtype", "num_gpu_blocks_override",
    "prefix_caching_hash_algo", "prefix_cache_retention_interval", "kv_cache_dtype_skip_layers",
    "kv_sharing_fast_prefill", "swa_bounded_replay", "mamba_cache_dtype", "mamba_ssm_cache_dtype",
    "mamba_block_size", "prefix_match_unit", "mamba_cache_mode", "enable_mamba_shared_prefix_checkpoint",
    "replayssm_buffer_len", "use_replayssm", "kv_offloading_size", "kv_offloading_backend"})
_ENUM_MEMBER = re.compile(r"[A-Za-z_][\w.]*\.(?P<member>[A-Z][A-Z0-9_]*)")
# Flags with a check of their own (compat.actual_config.prefix_caching / .max_model_len).
OWN_CHECK = ("enable_prefix_caching", "max_model_len")


@dataclass
class FlagReading:
    flag: str                      # as on the command line: --kv-cache-dtype
    requested: Any
    state: str
    shown: Any = None
    source: str | None = None      # where the server showed it (or why it could not)
    argv: Any = None               # what the process argv asked, for the record

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        text = (self.flag if self.requested is True else "--no-" + self.flag[2:] if self.requested is False
                else f"{self.flag}={_short(self.requested)}")
        if self.state == DIFFERS:
            return f"{text}: the server shows {_short(self.shown)} ({self.source})"
        if self.state == NOT_SHOWN:
            return f"{text}: not shown by the server ({self.source})"
        if self.state == UNVERIFIABLE:
            return f"{text}: unverifiable ({self.source})"
        return f"{text}: shown ({self.source})"


LAYOUT_FLAGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local")


def requested_flags(profile: Profile, plan: Any = None) -> dict[str, Any]:
    """The recipe's flags: launch.args, launch.required_flags (on) and the model's parsers; with the
    launched plan (rules/launched.py), the parallel layout is the plan's, not the profile's own."""
    wanted = parse_flags(list(profile.model.launch.args))
    if plan is not None:
        # The layout the run launched replaces the profile's; a size of 1 is vLLM's default, which its
        # non-default args never show, so it is asked for only where the profile or the plan sets another.
        layout = {"tensor_parallel_size": plan.tensor, "pipeline_parallel_size": plan.pipeline,
                  "data_parallel_size": plan.data}
        asked = {k for k in LAYOUT_FLAGS if k in wanted}
        wanted = {k: v for k, v in wanted.items() if k not in LAYOUT_FLAGS}
        wanted.update({k: v for k, v in layout.items() if k in asked or int(v) != 1})
    for flag in profile.model.launch.required_flags:
        wanted.setdefault(str(flag), True)
    for key in ("tool_call_parser", "reasoning_parser"):
        if value := getattr(profile.model.model, key):
            wanted.setdefault(key, value)
    return wanted


def cache_label(key: str) -> str:
    return CACHE_LABEL_ALIASES.get(key, key)


def cache_flags(wanted: dict[str, Any], info: dict[str, Any] | None) -> list[str]:
    """Requested flags that vllm:cache_config_info reports (by label name), own-check flags excluded.
    Without the metric, the flags that vLLM keeps in its CacheConfig by the same name are still known."""
    labels = set(info or {}) | CACHE_FIELDS
    return [key for key in wanted if key not in OWN_CHECK and cache_label(key) in labels]


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def read_from_cache_config(key: str, want: Any, info: dict[str, Any] | None, argv: dict[str, Any]) -> FlagReading:
    label = cache_label(key)
    reading = FlagReading(flag=flag_name(key), requested=want, state=UNVERIFIABLE, argv=argv.get(key))
    if info is None:
        reading.source = "no vllm:cache_config_info from /metrics"
        return reading
    if label not in info:
        reading.source = f"vllm:cache_config_info has no label {label}"
        return reading
    reading.shown, reading.source = info[label], f'vllm:cache_config_info {label}="{info[label]}"'
    reading.state = MATCH if matches(want, info[label]) else DIFFERS
    return reading


def read_from_startup_log(key: str, want: Any, scan: StartupScan | None, argv: dict[str, Any]) -> FlagReading:
    """The non-default args line first; a flag absent there runs at that vLLM version's default (or was not
    passed), which that line never prints (issue 31, item 7): it is then read from the engine config line,
    else it is unverifiable, never a failure for its absence alone."""
    reading = FlagReading(flag=flag_name(key), requested=want, state=UNVERIFIABLE, argv=argv.get(key))
    if scan is None or scan.lines == 0:
        reading.source = "no startup log captured"
        return reading
    line = scan.non_default_args_line
    if scan.non_default_args is None:
        absent = (f"startup log line {line.number} unreadable: {line.text[:400]}" if line is not None
                  else "the startup log has no 'non-default args' line")
        return _read_from_engine_config(reading, key, want, scan, absent)
    where = f"startup log non-default args, line {line.number}" if line is not None else "startup log"
    found, shown = lookup(scan.non_default_args, key)
    if not found:
        asked = (" (the argv asked it: vLLM parsed it to its default)" if key in argv and matches(want, argv[key])
                 else "")
        return _read_from_engine_config(reading, key, want, scan, f"{where}: not among the server's non-default "
                                        f"args, so at this vLLM version's default or not passed{asked}")
    reading.shown, reading.source = shown, where
    reading.state = MATCH if matches(want, shown) else DIFFERS
    return reading


# CLI argument -> the engine config line's field, where the names differ (vLLM 0.2 to 0.32).
ENGINE_CONFIG_ALIASES = {"max_model_len": "max_seq_len", "enable_chunked_prefill": "chunked_prefill_enabled",
                         "device": "device_config"}


def _read_from_engine_config(reading: FlagReading, key: str, want: Any, scan: StartupScan,
                             before: str) -> FlagReading:
    line = scan.engine_config_line
    if scan.engine_config is None or line is None:
        reading.source = f"{before}; no engine config line ('Initializing ... LLM engine ... with config') shows it"
        return reading
    found, shown = lookup_engine_config(scan.engine_config, key)
    if not found:
        reading.source = f"{before}; the engine config (line {line.number}) does not show it"
        return reading
    where = f"startup log engine config, line {line.number}"
    reading.shown = shown
    if matches(want, shown) or _same_dtype(want, shown):
        reading.state, reading.source = MATCH, where
    elif str(want).strip().lower() == "auto":
        # the engine config prints what "auto" resolved to (dtype=torch.bfloat16): not comparable
        reading.source = f"{before}; {where} shows {_short(shown)}, what 'auto' resolved to"
    elif isinstance(shown, dict) and not isinstance(_json(want), dict):
        # a config object (device_config=device(type='cuda')) against a scalar flag: another shape, not a value
        reading.source = f"{before}; {where} shows {_short(shown)}, not comparable with {_short(want)}"
    else:
        reading.state, reading.source = DIFFERS, where
    return reading


_DTYPE_NAMES = {"half": "float16", "float": "float32"}


def _same_dtype(want: Any, shown: Any) -> bool:
    """``--dtype half`` / ``float16`` against the engine config's ``torch.float16``."""
    if not isinstance(shown, str) or not shown.startswith("torch."):
        return False
    wanted = str(want).strip().lower()
    return _DTYPE_NAMES.get(wanted, wanted) == shown.removeprefix("torch.")


def lookup_engine_config(config: dict[str, Any], key: str) -> tuple[bool, Any]:
    """A flag in the engine config: its own field (or alias), else the one nested config that holds a field
    of that name (``kernel_config=KernelConfig(..., moe_backend='auto')``); two holders are ambiguous."""
    name = ENGINE_CONFIG_ALIASES.get(key, key)
    found, shown = lookup(config, name)
    if found:
        return found, shown
    holders = [value[name] for value in config.values() if isinstance(value, dict) and name in value]
    return (True, holders[0]) if len(holders) == 1 else (False, None)


def lookup(args: dict[str, Any], key: str) -> tuple[bool, Any]:
    """``attention_config.backend`` (vLLM's dotted CLI form) reads a field of ``attention_config``."""
    if key in args:
        return True, args[key]
    head, sep, rest = key.partition(".")
    if sep and isinstance(args.get(head), dict):
        return lookup(args[head], rest)
    return False, None


def matches(want: Any, shown: Any) -> bool:  # noqa: C901 - one case per value shape vLLM prints
    """Does the server's value ``shown`` say what the recipe asked (``want``: a CLI string or a bool)?"""
    if isinstance(shown, dict):
        requested = _json(want)
        if not isinstance(requested, dict):
            return False
        return all(k in shown and matches(v, shown[k]) for k, v in requested.items() if k != REPR_KEY)
    if isinstance(shown, list):
        requested = _json(want)
        items = requested if isinstance(requested, list) else [want]
        return len(items) == len(shown) and all(matches(w, s) for w, s in zip(items, shown, strict=True))
    if isinstance(want, bool) or isinstance(shown, bool) or str(shown) in ("True", "False"):
        return _bool(want) is not None and _bool(want) == _bool(shown)
    if shown is None or str(shown) == "None":
        return str(want).lower() in ("none", "null", "auto")
    if isinstance(want, dict):
        return False
    if _number(want) is not None and _number(shown) is not None:
        return math.isclose(_number(want) or 0.0, _number(shown) or 0.0, rel_tol=1e-9)
    text, server = str(want), str(shown)
    if text == server:
        return True
    # enum members print as Enum.MEMBER; the CLI takes the member name in any case
    member = _ENUM_MEMBER.fullmatch(server)
    return member is not None and member.group("member").lower() == text.lower()


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text in ("true", "1", "yes", "on") else False if text in ("false", "0", "no", "off") else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."
