"""Is the startup log the running process's start? Its non-default args against the live argv (issue 42 item 3).

vLLM logs `non-default args: {...}` once per start: every argument whose parsed value differs from the parser's
default (vLLM 0.32 `get_non_default_args`, entrypoints/serve/utils/api_utils.py: `parse_args([])` compared field by
field). Those values come from the command line (or a `--config` file), so the running process's argv
(/proc/PID/cmdline) must show them, each with the same value. A log from an earlier start of the same vLLM version
with other flags (a stale file, a journal before a restart) differs on some flag:

- a flag both name, with another value: a difference, both values named;
- a non-default arg in the log that the argv does not pass: a difference (the process runs it at its default),
  unless the argv has a `--config` file or short options (`-tp 8`, `-q fp8`: aliases this reader does not map),
  which may carry it: then not compared;
- a flag the argv passes that the log does not show: at its default (vLLM omits it), read from the engine config line
  where that line prints it (rules/flag_readings.py `read_from_startup_log`), else not compared.

The values vLLM redacts in the log (`***`) and our own redaction are never compared.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.argv import parse_flags
from ..core.redact import REDACTED
from ..parsers.startup_log import StartupScan
from ..rules.flag_readings import DIFFERS, MATCH, flag_name, lookup, read_from_startup_log

# vLLM 0.32 _SENSITIVE_ARG_FIELDS (entrypoints/serve/utils/api_utils.py): logged as "***".
SENSITIVE = frozenset({"api_key", "hf_token", "watermark_config"})
# Set by `vllm serve MODEL` (the positional) rather than by a flag.
POSITIONAL = ("model_tag", "model")
_SHORT = re.compile(r"^-[A-Za-z][A-Za-z0-9.=]*$")


def server_args(argv: list[str]) -> list[str]:
    """The server's own arguments: after `serve` (`vllm serve`), else after the API server module
    (`python -m vllm.entrypoints.openai.api_server`), else after the program."""
    for i, token in enumerate(argv):
        if token == "serve" or token.startswith("vllm.entrypoints"):
            return argv[i + 1:]
    return argv[1:]


def positional_model(argv: list[str]) -> str | None:
    """The MODEL of `vllm serve MODEL ...` (the first token after `serve` that is no option); None otherwise."""
    for i, token in enumerate(argv[:-1]):
        if token == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def long_options(args: list[str]) -> list[str]:
    """The arguments less short options and their values (`-tp 8`), which parse_flags would read as values."""
    out, skip = [], False
    for i, token in enumerate(args):
        if skip:
            skip = False
            continue
        if _SHORT.match(token):
            skip = "=" not in token and i + 1 < len(args) and not args[i + 1].startswith("-")
            continue
        out.append(token)
    return out


def _values(args: list[str], key: str) -> list[str]:
    """Every value after the last `--flag` of `key` (an argument that takes several: `--served-model-name a b`)."""
    name = flag_name(key)
    at = [i for i, token in enumerate(args) if token == name]
    if not at:
        return []
    out = []
    for token in args[at[-1] + 1:]:
        if token.startswith("-"):
            break
        out.append(token)
    return out


def _hidden(value: Any) -> bool:
    return isinstance(value, str) and (value in ("***", "<redacted>") or REDACTED in value)


def argv_differences(scan: StartupScan, argv: list[str]) -> tuple[list[str], list[str]]:
    """(differences naming the flag and both values, what could not be compared) between the log's non-default
    args and the running process's argv. Only the differences decide; the rest is recorded."""
    logged = scan.non_default_args
    if logged is None:
        return [], ["the log has no readable non-default args line to compare the running argv with"]
    own = server_args(argv)
    flags = parse_flags(long_options(own))
    differ, unknown = [], []
    model = positional_model(argv)
    if model is not None:
        flags.setdefault("model", model)
    for key, value in sorted(flags.items()):
        if key in SENSITIVE or _hidden(value) or key == "config":
            continue
        found, shown = lookup(logged, key)
        if found and isinstance(shown, list):      # nargs="+" (--served-model-name a b): every value given
            value = _values(own, key) or value
        reading = read_from_startup_log(key, value, scan, {})
        if reading.state == DIFFERS:
            differ.append(f"{flag_name(key)} {shown if found else reading.shown!r} in the log "
                          f"({reading.source}), {value} on the running server")
        elif reading.state != MATCH:
            unknown.append(f"{flag_name(key)} {value} on the running server: {reading.source}")
    loose = "config" in flags or any(_SHORT.match(token) for token in own)
    for key, value in sorted(logged.items()):
        if key in flags or key in SENSITIVE or _hidden(value) or (key == "model_tag" and model is not None):
            continue
        if key in POSITIONAL and model is None and "model" in flags:
            continue
        if loose:
            unknown.append(f"{flag_name(key)} {value!r} in the log: the argv's --config or short options may set it")
            continue
        differ.append(f"{flag_name(key)} {value!r} in the log, not passed on the running server (it runs at "
                      "the default)")
    return differ, unknown
