"""The line that says why: a failure's cause out of a tool's stderr or a server's log tail.

Container runtimes end their error output with a hint (``Run 'docker run --help' for more
information``); vLLM ends a crash with shutdown noise. A reason quotes the line that names the cause
(``nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0``,
``torch.OutOfMemoryError: CUDA out of memory``), never the hint after it.
"""

from __future__ import annotations

import re

# Lines that are never the cause: usage hints and process-exit bookkeeping.
_HINTS = re.compile(r"run '.*--help'|see '.*--help'|for more information|^\s*$|^\s*\^+\s*$", re.IGNORECASE)
# Lines that say nothing about a failure when no line names one: an HTTP access line (uvicorn's
# ``INFO:     127.0.0.1:57614 - "GET /metrics HTTP/1.1" 200 OK``) and routine INFO/DEBUG output
# (newer vLLM prefixes it with "(APIServer pid=N)").
_ROUTINE = re.compile(r'"[A-Z]+ \S+ HTTP/[\d.]+" \d{3}|^(\(\w+ pid=\d+\)\s+)?(INFO|DEBUG)\b', re.IGNORECASE)
# Strongest first: a line matching an earlier pattern wins over a later one.
_CAUSES = (
    re.compile(r"unsatisfied condition|requirement error|out of memory|outofmemoryerror|oom-kill|killed process"
               r"|cannot allocate memory", re.IGNORECASE),
    re.compile(r"\b[A-Za-z_.]*(Error|Exception)\b:|\berror:|\bfatal\b", re.IGNORECASE),
    re.compile(r"error|failed|refused|denied", re.IGNORECASE),
)


def causal_line(text: str | None, limit: int = 300) -> str:
    """The most telling line of ``text`` (the last one of the strongest kind found), trimmed; "" for none."""
    lines = [line.strip() for line in (text or "").splitlines() if not _HINTS.search(line)]
    for pattern in _CAUSES:
        found = [line for line in lines if pattern.search(line)]
        if found:
            return found[-1][:limit]
    telling = [line for line in lines if not _ROUTINE.search(line)]
    return telling[-1][:limit] if telling else ""
