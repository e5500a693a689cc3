"""Tool-call parse failures in a vLLM server log, over a window (the day-N re-check's server window, docs/recheck.md).

vLLM's logger writes `[PREFIX](PROCESS pid=PID) LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE` (vllm/logger.py _FORMAT
and _DATE_FORMAT; releases before the process name write `LEVEL MM-DD HH:MM:SS [FILE:LINE] MESSAGE`), one line per
line of the message, a traceback's lines under the same prefix. A tool parser that cannot parse a model's answer logs
one ERROR from its own module (`vllm/tool_parsers/*_tool_parser.py`: "Error in extracting tool call from response.",
"Error trying to handle streaming tool call.", ...), then the traceback: each failure is counted once, by its
message line, never by its traceback's lines. Fixtures: tests/fixtures/real/tool-parse-log/ (SOURCES.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

LINE = re.compile(r"^(?:\S*?\((?P<process>[^)]*?)\s+pid=\d+\)\s+)?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
                  r"(?P<month>\d{2})-(?P<day>\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2})(?:\.\d+)?\s+"
                  r"\[(?P<file>[^\]:]+):(?P<line>\d+)\]\s?(?P<message>.*)$")
# The opening words of the failures vLLM's tool parsers log (vllm/tool_parsers/*_tool_parser.py, vLLM 0.32).
FAILURE_OPENINGS = ("Error in extracting tool call", "Error trying to handle streaming tool call",
                    "Error in streaming tool call extraction", "Error extracting", "Failed to extract tool call",
                    "Error in Apertus streaming tool call extraction")
STREAMING_WORDS = ("streaming",)


@dataclass
class ToolParseWindow:
    """The failures found, the lines read inside the window, and the first few failures as they were logged."""

    failures: int = 0
    streaming: int = 0
    lines_in_window: int = 0
    first: str | None = None
    last: str | None = None
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"failures": self.failures, "streaming": self.streaming, "lines_in_window": self.lines_in_window,
                "first": self.first, "last": self.last, "examples": list(self.examples)}


def stamp(match: re.Match[str]) -> str:
    """MM-DD HH:MM:SS, comparable as text within one year."""
    return f"{match['month']}-{match['day']} {match['time']}"


def is_failure(match: re.Match[str]) -> bool:
    return (match["level"] in ("ERROR", "CRITICAL") and match["file"].endswith("tool_parser.py")
            and match["message"].startswith(FAILURE_OPENINGS))


def tool_parse_failures(text: str, since: str | None = None, until: str | None = None) -> ToolParseWindow:
    """The tool-call parse failures logged in [since, until] (MM-DD HH:MM:SS, vLLM's own stamp; None: open)."""
    out = ToolParseWindow()
    for raw in text.splitlines():
        match = LINE.match(raw.strip())
        if match is None:
            continue
        when = stamp(match)
        if (since and when < since) or (until and when > until):
            continue
        out.lines_in_window += 1
        if not is_failure(match):
            continue
        out.failures += 1
        if any(w in match["message"].lower() for w in STREAMING_WORDS):
            out.streaming += 1
        out.first = out.first or when
        out.last = when
        if len(out.examples) < 5:
            out.examples.append(raw.strip()[:300])
    return out
