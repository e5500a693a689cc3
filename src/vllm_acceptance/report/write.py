"""Write the four report documents of a run: report.json, report.html, report.md, junit.xml.

The dict is validated against the shipped schema (contract 2) before anything is written, so a
malformed report never lands on disk looking valid. Each file is written beside its target and
moved into place with os.replace: a reader (CI, the `latest` link, a browser) never sees half a file.
"""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from ..core.redact import redact_obj
from ..core.rundir import RunDir, bind_report, bind_verdict, check_run_files, verdict_record
from .render_html import render_html
from .render_junit import render_junit
from .render_md import render_markdown


class ReportInvalid(ValueError):
    """The report dict breaks contract 2; the message lists each field and what is wrong."""


@cache
def report_schema() -> dict[str, Any]:
    text = resources.files("vllm_acceptance.schemas").joinpath("report.schema.json").read_text()
    return json.loads(text)


def report_errors(report: Any) -> list[str]:
    """Every schema violation as 'field: message', empty when the report satisfies contract 2."""
    validator = jsonschema.Draft202012Validator(report_schema())
    errors = sorted(validator.iter_errors(report), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}" for e in errors]


def validate_report(report: Any) -> None:
    errors = report_errors(report)
    if errors:
        raise ReportInvalid("report.json does not satisfy its schema (report.schema.json):\n  "
                            + "\n  ".join(errors[:20]))


def evidence_errors(run_dir: Path, report: dict[str, Any]) -> list[str]:
    """Contract 2: every evidence path exists inside the run directory."""
    root = run_dir.resolve()
    errors = []
    for f in report.get("findings") or []:
        for p in f.get("evidence") or []:
            target = RunDir(run_dir).at(p).resolve()
            if not target.is_relative_to(root) or not target.exists():
                errors.append(f"{f.get('check')}@{f.get('host')}: evidence {p!r} is not a file of the run directory")
    return errors


def atomic_write_text(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_reports(run_dir: Path, report: dict[str, Any]) -> list[Path]:
    """Validate, render all four documents, then write them; returns the written paths.

    Rendering happens before the first write, so a rendering bug leaves the previous files intact
    rather than a report.json without its HTML.
    """
    run_dir = Path(run_dir)
    report = redact_obj(report)  # whatever a stage quoted, no secret reaches the four documents
    validate_report(report)
    lost = evidence_errors(run_dir, report)
    if lost:
        raise ReportInvalid("evidence paths that do not exist:\n  " + "\n  ".join(lost[:20]))
    judged, run_files = verdict_files(run_dir)
    report = {**report, "run_files": run_files}
    documents = {
        "report.json": json.dumps(report, indent=2, default=str, ensure_ascii=False) + "\n",
        "report.html": render_html(report),
        "report.md": render_markdown(report),
        "junit.xml": render_junit(report),
    }
    if judged:
        bind_verdict(run_dir, judged)    # run.json: the files this verdict judged (core/rundir.py)
    written = []
    for name, text in documents.items():
        atomic_write_text(RunDir(run_dir).report_file(name), text)
        written.append(RunDir(run_dir).report_file(name))
    if judged:
        bind_report(run_dir)    # run.json holds the sha256 of the report.json a reviewer signs
    return written


def verdict_files(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The verdict is taken on these files: refuse a run whose bound files changed (core/rundir.py); the record of
    what is judged, for run.json ({} on a run opened before the binding), and report.json's `run_files`."""
    binding = check_run_files(run_dir, "report", include_report=False)
    if binding.state == "unbound":
        return {}, {**binding.summary(), "note": "opened before a run's files were bound: readable, but its files "
                                                 "cannot be proven to be the judged ones, so it cannot be signed"}
    record = verdict_record(run_dir)
    return record, {"state": "bound", "intact": True, "profile_sha256": binding.profile_sha256,
                    "files": len(record.get("manifest") or {})}
