"""report.md: the acceptance result as text for a change request.

Verdict and reasons first, then the traffic gates and limits, failing findings before passing
ones (with links to their evidence, relative to the run directory), then the sign-off block.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.stage_details import AgentDetails, StageDetails
from . import views
from .checklist import SOURCES, coverage, coverage_groups, coverage_summary
from .render_html import (
    VERDICT_TITLES,
    evidence_href,
    evidence_path,
    finding_id,
    fmt,
    fmt_pct,
    limit_rows,
    signoff_rows,
    sorted_findings,
)
from .signoff import sign_command

BLOCKING = ("fail", "missing", "inconclusive", "warn")
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")


def cell(value: Any, limit: int = 240) -> str:
    """Markdown table cell: one line, pipes escaped, long values cut with a marker."""
    text = fmt(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ")
    # Markdown, not HTML: `>=` stays `>=`; only a `<` that could open an HTML tag is escaped, the Markdown way.
    text = _TAG_OPEN.sub(r"\\<", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _contract_state(row: dict[str, Any]) -> str:
    """as contracted (and why, when the tested figure is not the profile's), differs (and how), or a dash."""
    if row["ok"]:
        return "as contracted" + (f": {cell(row['why'])}" if row.get("why") else "")
    return "**differs**: " + cell(row["note"]) if row["ok"] is False else "—"


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
    off_recipe = [d for d in report.get("recipe_deviations") or [] if isinstance(d, dict)]
    if off_recipe:
        out += [f"> **Not the recipe's image and minimums.** Profile `{fmt(report.get('profile'))}`: " + "; ".join(
            f"`{fmt(d.get('field'))}` {fmt(d.get('profile'))} (official {fmt(d.get('official'))}, "
            f"{fmt(d.get('source'))})" for d in off_recipe) + ": never an acceptance of the recipe's deployment; "
                "judged on the experimental route (release only on the image's own experimental profile, with its "
                "lineage).", ""]
    other = report.get("official_image")
    if isinstance(other, dict):
        out += [f"> **Not the official image.** {fmt(', '.join(other.get('reference') or []))} is not profile "
                f"`{fmt(other.get('profile'))}`'s image `{fmt(other.get('official_reference'))}` "
                f"({fmt('; '.join(other.get('why') or []))}): never an acceptance of `{fmt(other.get('profile'))}`; "
                "judged on the experimental route (release only on the image's own experimental profile, with its "
                "lineage).", ""]
    if report.get("experimental"):
        lineage = report.get("lineage") or {}
        out += ["> **Experimental (self-built) image.** Never an acceptance of the official profile. "
                f"Owner: {fmt(lineage.get('owner'))}; exit date: {fmt(lineage.get('exit_date'))}; "
                f"base profile: {fmt(lineage.get('base_profile'))}.", ""]
        if verdict == "release":
            out += [f"> **EXPERIMENTAL release on the profile `{report.get('profile')}` only**; it never stands "
                    f"for the official profile `{fmt(lineage.get('base_profile'))}`.", ""]
        out += [f"- `{c.get('check')}` **{c.get('status')}**: {cell(c.get('reason'), 400)}"
                for c in (report.get("lineage_checks") or {}).values()] + [""]
    out += [f"- Profile: `{report.get('profile')}`; started {fmt(report.get('started'))}; "
            f"finished {fmt(report.get('finished'))}"]
    if isinstance(report.get("server"), dict):
        out += [f"- Server: {report['server'].get('text')}"]
    out += first_screen(report)
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
    out += remediation_decision_md(report.get("remediation_decision"))
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
    out += agent_case_set_md(report)
    rows = coverage(report)
    counts = coverage_summary(rows)
    out += ["", "## Checklist coverage (source articles)", "",
            ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items()), "",
            "Sources (the repository's docs/sources.md): "
            + "; ".join(f"{code} = {title} (docs/sources.md#a{code})" for code, title in SOURCES.items()) + "."]
    for group in coverage_groups(rows):
        shown = [r for r in group["rows"] if group["key"] != "run" or r.status not in ("pass", "not_applicable")]
        out += ["", f"### {group['title']} ({len(group['rows'])})", ""]
        if not shown:
            out.append("All passed." if group["rows"] else "None.")
            continue
        out += ["| Line | Checklist item | Status | Detail |", "| --- | --- | --- | --- |"]
        out += [f"| {r.item.label} | {cell(r.item.text)} | {r.status.replace('_', ' ')} | {cell(r.detail, 160)} |"
                for r in shown]
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


def agent_case_set_md(report: dict[str, Any]) -> list[str]:
    """The agent case set per class, as the HTML shows it (views.agent_class_rows): cases, defects, the rate
    and its one-sided 95 % bound, alone and under load when measured, and the worst cases with their evidence."""
    agent = StageDetails.of(report).agent
    rows = views.agent_class_rows(agent)
    if not rows:
        return []
    rates = agent.rates
    loaded = rates.get("under_load") if isinstance(rates.get("under_load"), dict) else {}
    n = loaded.get("concurrency")
    head = "| Class | Cases | Defects | Rate | 95% upper bound | Chose otherwise |"
    rule = "| --- | --- | --- | --- | --- | --- |"
    if n:
        head += f" Under load ({cell(n)} in flight): defects / cases | Rate | 95% upper bound |"
        rule += " --- | --- | --- |"
    out = ["", "## Agent case set by class", "", head + " Worst cases |", rule + " --- |"]
    for r in rows:
        line = (f"| `{cell(r['class'])}` | {cell(r['cases'])} | {cell(r['defects'])} | {fmt_pct(r['rate'])} "
                f"| {fmt_pct(r['bound'])} | {cell(r['misses'])}"
                + (f" (abstained {cell(r['abstained'])})" if r.get("abstained") is not None else "") + " |")
        if n:
            line += (f" {cell(r['load_defects'])} / {cell(r['load_cases'])} | {fmt_pct(r['load_rate'])} "
                     f"| {fmt_pct(r['load_bound'])} |")
        # failed alone first; then the cases that broke only under load (a case failing both is named once)
        worst = [(c, False) for c in r["failed"]] + [(c, True) for c in r["load_failed"] if c not in r["failed"]]
        out.append(line + " " + ("<br>".join(_worst_case_md(agent, c, under_load) for c, under_load in worst[:5])
                                 or "—") + " |")
    root = str(agent.evidence_root or "")
    files = [evidence_path(root, name) for name, kept in (("cases.json", True), ("cases-under-load.json", bool(n)),
                                                          ("reference.json", bool(rates.get("reference"))))
             if kept]
    out += ["", f"{cell(rates.get('assumptions'), 600) if rates.get('assumptions') else ''} Every request body and "
            f"raw response: {', '.join(evidence_md([f]) for f in files)}.".strip()]
    return out


def _worst_case_md(agent: AgentDetails, case: Any, under_load: bool) -> str:
    """A failing case and where its request and raw response are: its own file when the probe kept one
    (agent.py keep: `cases/NN-<case>.json`), else the case set's file."""
    root = str(agent.evidence_root or "")
    own = None if under_load else next(
        (ex.get("evidence") for ex in agent.exchanges if isinstance(ex, dict)
         and str(ex.get("case", "")).split("-", 1)[-1] == str(case) and ex.get("evidence")), None)
    path = evidence_path(root, own or ("cases-under-load.json" if under_load else "cases.json"))
    return f"`{cell(case)}`{' under load only' if under_load else ''}: {evidence_md([path])}"


def first_screen(report: dict[str, Any]) -> list[str]:
    """Sign-off state, reopen check, what blocks, the contract tested, what could not be proved."""
    out: list[str] = [""]
    signed = report.get("signed") if isinstance(report.get("signed"), dict) else None
    if signed:
        out.append(f"**Signed:** {signed.get('decision')} by {signed.get('reviewer')} at {signed.get('signed_at')}"
                   + (f"; limits {', '.join(signed['limits'])}" if signed.get("limits") else ""))
        if signed.get("override"):
            out.append(f"> **OVERRIDE** of the verdict {signed.get('verdict')}: {signed.get('override_reason')}")
        if not signed.get("report_intact"):
            out.append("> **report.json changed after signing**: this signature no longer covers it; sign again.")
    elif report.get("verdict") == "incomplete":
        out.append("**Cannot be signed:** the verdict is incomplete; collect the missing evidence and re-run "
                   "(`vllm-acceptance sign` refuses every decision on this run).")
    else:
        out.append(f"**Not signed yet.** `{sign_command(report)}` (the reviewer is an SRE or platform lead, not the "
                   "person who ran the acceptance; run it from the directory holding `reports/`)")
    reopen = report.get("reopen") if isinstance(report.get("reopen"), dict) else None
    out.append("")
    if reopen and reopen.get("fired"):
        base = reopen.get("baseline") or {}
        out.append(f"**Acceptance reopened:** since the last signed acceptance {base.get('run_id')} "
                   f"({base.get('decision')} by {base.get('reviewer')}):")
        out += [f"- **{t['title']}**: {'; '.join(t['changed'])}" for t in reopen["fired"]]
    elif reopen and reopen.get("status") == "unchanged":
        out.append(f"**No reopen trigger fired** since the last signed acceptance "
                   f"{(reopen.get('baseline') or {}).get('run_id')}.")
    elif reopen:
        out.append(f"**Reopen check:** {reopen.get('note')}")
    blockers = views.blockers(report)
    out += ["", f"## What blocks release ({len(blockers)})", ""]
    out += [f"- **{b['status']}** `{b['id']}`: {cell(b['observed'], 120)}; action: {cell(b['action'], 160)}; "
            f"owner {cell(b['owner'])}, re-check {cell(b['recheck'])}" for b in blockers] or ["Nothing."]
    rows = views.contract_rows(report)
    if rows:
        out += ["", "## Contract tested", "", "| What | Profile | Tested | |", "| --- | --- | --- | --- |"]
        out += [f"| {c['item']} | {cell(c['profile'])} | {cell(c['tested'])} | "
                f"{_contract_state(c)} |"
                for c in rows]
    unproven, na = views.unproven(report), views.not_provable(report)
    out += ["", "## What this run could not prove", ""]
    if views.no_gpu(report):
        out.append("CPU lab: no GPU, driver, CUDA or interconnect here; every GPU check is not provable here, "
                   "never a pass.")
        out.append("")
    out += [f"- evidence {u['status']}: `{u['id']}` {cell(u['reason'], 140)}" for u in unproven]
    out += [f"- not provable here: {cell(g['reason'], 140)}: {', '.join(g['checks'])}" for g in na]
    if not unproven and not na:
        out.append("Nothing.")
    return out


def remediation_decision_md(decision: Any) -> list[str]:
    """The decision after remediation (rebuild/decision.py): the four signs and the choice."""
    if not isinstance(decision, dict):
        return []
    choice = decision.get("choice")
    out = ["", f"## Decision after remediation: {decision.get('title')}", "",
           f"**Choice: `{choice or 'none'}`** (route {fmt(decision.get('route'))}; re-run "
           f"{fmt((decision.get('after') or {}).get('run'))}, before {fmt((decision.get('before') or {}).get('run'))})"]
    if decision.get("failed_checks"):
        out.append("**Failed:** " + ", ".join(f"`{c}`" for c in decision["failed_checks"]))
    out += ["", "| Sign | Status | Why |", "| --- | --- | --- |"]
    for name, sign in (decision.get("signs") or {}).items():
        out.append(f"| {cell(name.replace('_', ' '))} (`{cell(sign.get('check'))}`) | **{cell(sign.get('status'))}** "
                   f"| {cell(sign.get('reason'))} |")
    out += [""] + [f"- {cell(r, 400)}" for r in decision.get("reasons") or []]
    terms = decision.get("terms") or {}
    if terms and choice:
        out += [f"- {k.replace('_', ' ')}: {fmt(terms.get(k))}" for k in ("owner", "review_date", "move_back_criteria")]
    return out
