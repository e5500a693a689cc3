"""The check catalog as a person or a program reads it: a table, JSON, or the Markdown of docs/checks.md."""

from __future__ import annotations

import json

from .registry import CATALOG_FAMILIES, CHECKS, Check, get

FAMILY_TITLES = {
    "compat": "Compatibility chain",
    "interconnect": "Interconnect",
    "cache": "Prefix-cache reuse",
    "agent": "Agent interface",
    "capacity": "Capacity under load",
    "drift": "Day-N re-check drift (recheck.json, not an acceptance report)",
}
DOC_PATH = "docs/checks.md"


def checks(family: str | None = None) -> list[Check]:
    get("compat.preflight")  # fills the registry
    rows = [c for c in CHECKS.values() if family is None or c.family == family]
    return sorted(rows, key=lambda c: CATALOG_FAMILIES.index(c.family))  # stable: pipeline order within a family


def as_json(family: str | None = None) -> str:
    return json.dumps([c.to_dict() for c in checks(family)], indent=2) + "\n"


def as_table(family: str | None = None) -> str:
    rows = checks(family)
    width = max((len(c.id) for c in rows), default=10)
    lines = [f"{'check':<{width}}  {'stage':<9}  {'on failure':<20}  title"]
    lines += [f"{c.id:<{width}}  {c.stage:<9}  {c.consequence.value:<20}  {c.title}" for c in rows]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def as_markdown() -> str:
    """docs/checks.md: generated, never edited by hand (a test compares it with this output)."""
    out = [
        "# Checks",
        "",
        "Generated from `src/vllm_acceptance/rules/catalog.py` by `vllm-acceptance checks --format md`; do not edit",
        "by hand (the test suite fails when this file is stale). Every finding in a report names one of these ids.",
        "",
        "Statuses: `pass`, `fail`, `warn`, `inconclusive`, `not_applicable`, `missing`. A `missing` or",
        "`inconclusive` finding never counts as a pass: it makes the run `incomplete` unless a failed",
        "compatibility chain already decides it. *On failure* is the consequence of a `fail` for the verdict",
        "(precedence: rebuild_environment > expand_capacity > limited_observation > release;",
        "`block_agent_traffic` closes the agent gate only).",
        "",
    ]
    for family in CATALOG_FAMILIES:
        rows = checks(family)
        if not rows:
            continue
        out += [f"## {FAMILY_TITLES.get(family, family)} (`{family}.`)", "",
                "| check | stage | title | pass rule | on failure | evidence | source |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        out += [f"| `{c.id}` | {c.stage} | {_cell(c.title)} | {_cell(c.rule)} | {c.consequence.value} | "
                f"{_cell(c.evidence)} | {_cell(c.source)} |" for c in rows]
        out.append("")
    return "\n".join(out)
