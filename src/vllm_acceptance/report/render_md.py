"""report.md: the acceptance result as text for a change request.

Verdict and reasons first, then the traffic gates and limits, failing findings before passing
ones (with links to their evidence, relative to the run directory), then the sign-off block.
"""

from __future__ import annotations

from typing import Any

from .checklist import coverage, coverage_summary
from .render_html import (
    VERDICT_TITLES,
    evidence_href,
    finding_id,
    fmt,
    limit_rows,
    signoff_rows,
    sorted_findings,
)

BLOCKING = ("fail", "missing", "inconclusive", "warn")


def cell(value: Any, limit: int = 240) -> str:
    """Markdown table cell: one line, pipes escaped, long values cut with a marker."""
    text = fmt(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    text = text.replace("<", "&lt;").replace(">", "&gt;")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def evidence_md(paths: list[str]) -> str:
    links = []
    for p in paths or []:
        href = evidence_href(p)
        links.append(f"[{cell(p, 120)}]({href})" if href else cell(p, 120))
    return "<br>".join(links) or "—"


def findings_table(findings: list[dict[str, Any]]) -> list[str]:
    lines = ["| Status | Check | Observed | Expected | Action on deviation | Evidence | Owner | Re-check |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in findings:
        lines.append(f"| **{cell(f.get('status'))}** | `{cell(finding_id(f))}`"
                     f"{' (layer ' + cell(f.get('layer')) + ')' if f.get('layer') else ''} | {cell(f.get('observed'))} "
                     f"| {cell(f.get('expected'))} | {cell(f.get('action') or f.get('rule'))} "
                     f"| {evidence_md(f.get('evidence') or [])} | {cell(f.get('owner'))} "
                     f"| {cell(f.get('recheck_date'))} |")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    verdict = str(report.get("verdict") or "incomplete")
    out = [f"# Acceptance: {report.get('inventory')} / {report.get('run_id')}", "",
           f"**Verdict: `{verdict}` — {VERDICT_TITLES.get(verdict, verdict)}**", "",
           f"**Immediate action:** {fmt(report.get('immediate_action'))}", ""]
    if report.get("experimental"):
        lineage = report.get("lineage") or {}
        out += ["> **Experimental (self-built) image.** Never an acceptance of the official profile. "
                f"Owner: {fmt(lineage.get('owner'))}; exit date: {fmt(lineage.get('exit_date'))}; "
                f"base profile: {fmt(lineage.get('base_profile'))}.", ""]
    out += [f"- Profile: `{report.get('profile')}`; started {fmt(report.get('started'))}; "
            f"finished {fmt(report.get('finished'))}"]
    if isinstance(report.get("server"), dict):
        out += [f"- Server: {report['server'].get('text')}"]
    out += ["", "## Reasons", ""] + [f"- {r}" for r in report.get("verdict_reasons") or ["(none given)"]]
    if report.get("missing"):
        out += ["", "**Missing:** " + ", ".join(f"`{m}`" for m in report["missing"])]
    out += ["", "## Traffic gates", "", "| Traffic | Gate | Reason |", "| --- | --- | --- |"]
    for name, label in (("text", "plain text"), ("agent", "agent (tool calls)")):
        gate = (report.get("gates") or {}).get(name) or {}
        state = ("open, limited" if gate.get("limited") else "open") if gate.get("open") else (
            "blocked" if gate else "not stated")
        out.append(f"| {label} | **{state}** | {cell(gate.get('reason'))} |")
    remediation = report.get("remediation") or {}
    if remediation:
        out += ["", f"## Remediation route: {remediation.get('title') or remediation.get('name')}", ""]
        out += [f"- {r}" for r in remediation.get("reasons") or []]
        if remediation.get("command"):
            out += ["", f"Command: `{remediation['command']}`"]
        out += [f"- confirm first: {b}" for b in remediation.get("blocked_by") or []]
    limits = limit_rows(report)
    if limits:
        out += ["", "Limits (serving config and alerts):", ""] + [f"- `{k}`: {v}" for k, v in limits]
    findings = sorted_findings(list(report.get("findings") or []))
    open_ = [f for f in findings if f.get("status") in BLOCKING]
    rest = [f for f in findings if f.get("status") not in BLOCKING]
    out += ["", f"## Findings needing action ({len(open_)})", ""]
    out += findings_table(open_) if open_ else ["None."]
    out += ["", f"## Passed and not applicable ({len(rest)})", ""]
    out += findings_table(rest) if rest else ["None."]
    rows = coverage(report)
    counts = coverage_summary(rows)
    out += ["", "## Checklist coverage (source articles)", "",
            ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items()), ""]
    gaps = [r for r in rows if r.status not in ("pass", "not_applicable")]
    if gaps:
        out += ["| Line | Checklist item | Status |", "| --- | --- | --- |"]
        out += [f"| {r.item.ref} | {cell(r.item.text)} | {r.status.replace('_', ' ')} |" for r in gaps]
    out += ["", "## Reopen acceptance on", ""] + [f"- {t}" for t in report.get("reopen_triggers") or []]
    out += ["", "## Rollback triggers", ""] + [f"- {t}" for t in report.get("rollback_triggers") or []]
    out += ["", "## Sign-off", "", "| Field | Value |", "| --- | --- |"]
    for row in signoff_rows(report):
        value = "______________"  # an empty line to sign on
        if row["value"]:
            value = cell(row["value"]) + (" *(from evidence)*" if row["derived"] else "")
        out.append(f"| {row['label']} | {value} |")
    out.append(f"| Test time | {fmt(report.get('started'))} → {fmt(report.get('finished'))} |")
    out += ["", "Evidence paths are relative to this report's directory; `report.json` is the record.", ""]
    return "\n".join(out)
