"""Environment and versions of the run, summarised from the preflight stage's per-node facts."""

from __future__ import annotations

from typing import Any


def environment_summary(facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Values shared by every node, or the set of distinct values where nodes differ."""
    summary: dict[str, Any] = {}
    keys = sorted({k for f in facts.values() for k in f if k != "reachable"})
    for key in keys:
        values = sorted({str(f[key]) for f in facts.values() if f.get(key) is not None})
        if values:
            summary[key] = values[0] if len(values) == 1 else " | ".join(values)
    summary["nodes"] = len(facts)
    return summary
