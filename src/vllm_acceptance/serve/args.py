"""Server argument lists: a launch's arguments with some flags set to new values (a relaunch at a
verified limit, docs/checks.md capacity.verified_limit)."""

from __future__ import annotations

from collections.abc import Sequence


def flag_names(flags: Sequence[str]) -> set[str]:
    """The option names in a flag list (``--max-num-seqs 4``, ``--max-model-len=2048``)."""
    return {f.split("=", 1)[0] for f in flags if f.startswith("--")}


def with_flags(args: Sequence[str], flags: Sequence[str]) -> list[str]:
    """``args`` without any value of the options named in ``flags`` (both ``--opt V`` and ``--opt=V``),
    then ``flags``: the launch as it was, at the new values."""
    names = flag_names(flags)
    out: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            if not arg.startswith("--"):
                continue
        name = arg.split("=", 1)[0]
        if name in names:
            skip_value = "=" not in arg
            continue
        out.append(arg)
    return out + list(flags)
