"""The re-check's report (issue 46 item 3): recheck.json, recheck.html, recheck.md and junit.xml in today's re-check
run directory, and one line of lineage in the signed run's rechecks.jsonl (core/rundir.py RunDir.rechecks_log).

recheck.html is in the acceptance report's family: the same stylesheet (report/templates/report.css), self-contained
(inline CSS, no script, no external URL), the verdict and its exit code on the first screen, whether the signed
decision still holds, the baseline's value beside today's for every drift, and the previous re-checks of the
same signed run. Everything written passes through core/redact.py: a secret in an environment value or an argument
never reaches these files.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ..core.redact import redact_obj
from ..core.rundir import RunDir
from ..report.render_html import environment, fmt
from ..report.write import atomic_write_text
from .outcome import RecheckOutcome

SCHEMA_VERSION = "recheck/1"
VERDICT_TITLES = {
    "still_accepted": "Still accepted",
    "drifted": "Drifted",
    "reopen": "Reopen: a full acceptance is required",
    "incomplete": "Incomplete: the re-check cannot say",
}
ACTIONS = {
    "still_accepted": "none: the signed decision holds; the next re-check runs on schedule",
    "drifted": "review each drift below with the baseline beside today; where the signed decision no longer holds, "
               "restore the signed configuration or run a full acceptance",
    "reopen": "run a full acceptance (accept.yml) on the deployment as it is now, or restore the signed one",
    "incomplete": "collect what is missing (below) and re-check again; nothing is claimed until then",
}
# the verdict's colour class in report.css (.v-*)
VERDICT_CLASS = {"still_accepted": "release", "drifted": "limited_observation", "reopen": "rebuild_environment",
                 "incomplete": "incomplete"}


def recheck_record(outcome: RecheckOutcome) -> dict[str, Any]:
    """recheck.json: the outcome as recheck/outcome.py shapes it, with its schema version and exit code."""
    return redact_obj({"schema_version": SCHEMA_VERSION, **outcome.as_dict(), "exit_code": outcome.exit_code})


def lineage_line(today_dir: Path, outcome: RecheckOutcome) -> dict[str, Any]:
    return redact_obj({"recheck_id": outcome.recheck_id, "run_dir": str(Path(today_dir).resolve()),
                       "started": outcome.started, "finished": outcome.finished, "verdict": outcome.verdict,
                       "exit_code": outcome.exit_code, "signed_decision_holds": outcome.signed_decision_holds,
                       "drifts": [d.check + ": " + d.what for d in outcome.drifts],
                       "missing": len(outcome.missing)})


def read_lineage(baseline_dir: Path) -> list[dict[str, Any]]:
    """The previous re-checks of a signed run, oldest first (lines that are not JSON objects are skipped)."""
    path = RunDir(Path(baseline_dir)).rechecks_log
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def append_lineage(baseline_dir: Path, today_dir: Path, outcome: RecheckOutcome) -> Path:
    """One line per re-check in the signed run's rechecks.jsonl; a re-check written twice keeps one line."""
    path = RunDir(Path(baseline_dir)).rechecks_log
    kept = [x for x in read_lineage(baseline_dir) if x.get("recheck_id") != outcome.recheck_id]
    lines = [json.dumps(x, sort_keys=True) for x in [*kept, lineage_line(today_dir, outcome)]]
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def context(record: dict[str, Any], previous: list[dict[str, Any]]) -> dict[str, Any]:
    verdict = str(record["verdict"])
    drifts = record.get("drifts") or []
    return {"r": record, "verdict": verdict, "verdict_title": VERDICT_TITLES[verdict],
            "verdict_class": VERDICT_CLASS[verdict], "action": ACTIONS[verdict],
            "reopen": [d for d in drifts if d.get("consequence") == "reopen"],
            "drifted": [d for d in drifts if d.get("consequence") != "reopen"],
            "rates": (record.get("details") or {}).get("rates") or {},
            "relied_on": (record.get("details") or {}).get("relied_on") or [],
            "signed": (record.get("details") or {}).get("baseline_signed") or {},
            "previous": [p for p in previous if p.get("recheck_id") != record.get("recheck_id")]}


def render_recheck_html(record: dict[str, Any], previous: list[dict[str, Any]]) -> str:
    return environment().get_template("recheck.html.j2").render(**context(record, previous))


def render_recheck_md(record: dict[str, Any], previous: list[dict[str, Any]]) -> str:
    verdict = str(record["verdict"])
    holds = "yes" if record.get("signed_decision_holds") else "no"
    lines = [f"# Re-check {record.get('recheck_id')} of {record.get('baseline_run')}", "",
             f"**Verdict: {VERDICT_TITLES[verdict]}** (`{verdict}`, exit code {record.get('exit_code')})", "",
             f"Signed decision `{record.get('signed_decision')}` still holds: **{holds}**", "",
             f"Action: {ACTIONS[verdict]}", "", "## Why", ""]
    lines += [f"- {r}" for r in record.get("reasons") or []]
    if record.get("drifts"):
        lines += ["", "## Drifts (baseline beside today)", "",
                  "| check | what | baseline | today | consequence | why |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| `{d['check']}` | {_md(d['what'])} | {_md(fmt(d['baseline']))} | {_md(fmt(d['today']))} | "
                  f"{d['consequence']} | {_md(d['reason'])} |" for d in record["drifts"]]
    if record.get("missing"):
        lines += ["", "## Not shown today", ""] + [f"- {m}" for m in record["missing"]]
    prior = [p for p in previous if p.get("recheck_id") != record.get("recheck_id")]
    lines += ["", "## Previous re-checks of this signed run", ""]
    lines += [f"- {p.get('finished') or p.get('started')}: {p.get('recheck_id')} `{p.get('verdict')}`" for p in prior] \
        or ["- none: this is the first re-check"]
    return "\n".join(lines) + "\n"


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_recheck_junit(record: dict[str, Any]) -> str:
    """junit.xml: one test case per drift and per missing item, one passing case when nothing drifted."""
    drifts, missing = record.get("drifts") or [], record.get("missing") or []
    suite = ET.Element("testsuite", {"name": f"vllm-acceptance.recheck.{record.get('baseline_run')}",
                                     "tests": str(max(1, len(drifts) + len(missing))),
                                     "failures": str(len(drifts)), "errors": str(len(missing)), "skipped": "0",
                                     "timestamp": str(record.get("started") or "")})
    props = ET.SubElement(suite, "properties")
    for key in ("verdict", "exit_code", "recheck_id", "baseline_run", "signed_decision", "signed_decision_holds"):
        ET.SubElement(props, "property", {"name": key, "value": str(record.get(key))})
    for d in drifts:
        case = ET.SubElement(suite, "testcase", {"classname": "drift", "name": f"{d['check']}: {d['what']}",
                                                 "time": "0"})
        ET.SubElement(case, "failure", {"message": f"{d['consequence']}: baseline {fmt(d['baseline'])}; today "
                                                   f"{fmt(d['today'])}"[:500], "type": d["consequence"]}).text = \
            d["reason"]
    for m in missing:
        case = ET.SubElement(suite, "testcase", {"classname": "recheck", "name": str(m)[:200], "time": "0"})
        ET.SubElement(case, "error", {"message": str(m)[:500], "type": "incomplete"})
    if not drifts and not missing:
        ET.SubElement(suite, "testcase", {"classname": "recheck", "name": "still accepted", "time": "0"})
    root = ET.Element("testsuites", {"name": "vllm-acceptance-recheck", "tests": suite.get("tests", "0"),
                                     "failures": suite.get("failures", "0"), "errors": suite.get("errors", "0")})
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_recheck(baseline_dir: Path, today_dir: Path, outcome: RecheckOutcome) -> list[Path]:
    """recheck.json, recheck.html, recheck.md, junit.xml in today's run directory; the lineage line in the signed
    run's rechecks.jsonl. Returns the paths written."""
    baseline_dir, today_dir = Path(baseline_dir), Path(today_dir)
    record = recheck_record(outcome)
    previous = read_lineage(baseline_dir)
    today = RunDir(today_dir)
    written = []
    for name, text in (("recheck.json", json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n"),
                       ("recheck.html", render_recheck_html(record, previous)),
                       ("recheck.md", render_recheck_md(record, previous)),
                       ("junit.xml", render_recheck_junit(record))):
        target = today.report_file(name)
        atomic_write_text(target, text)
        written.append(target)
    written.append(append_lineage(baseline_dir, today_dir, outcome))
    return written
