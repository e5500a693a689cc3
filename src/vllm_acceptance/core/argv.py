"""A vLLM argv read as argparse reads it: the flags of a launch line, a profile's launch.args or a
running process's command line (rules/flag_readings.py, core/contract.py)."""

from __future__ import annotations

from typing import Any


def parse_flags(args: list[str]) -> dict[str, Any]:
    """argv -> {flag_with_underscores: value}; the last occurrence wins (argparse semantics); --no-x
    sets x False; ``--x=v`` and ``--x v`` both give v."""
    flags: dict[str, Any] = {}
    index = 0
    while index < len(args):
        arg = str(args[index])
        index += 1
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        key = name.replace("-", "_")
        if not sep and index < len(args) and not str(args[index]).startswith("--"):
            value, sep = str(args[index]), "="
            index += 1
        if sep:
            flags[key] = value
        elif key.startswith("no_"):
            flags[key[3:]] = False
        else:
            flags[key] = True
    return flags
