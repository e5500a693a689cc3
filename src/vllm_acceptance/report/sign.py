"""Signing a run and re-rendering its report: the writers of report/signoff.py's record.

`sign_run` writes signoff.json beside report.json and renders report.html and report.md again with the record
attached; `rerender` does the second half alone (after a restore rehearsal is recorded, or by hand). report.json is
never rewritten, so the sha256 the sign-off holds stays checkable.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.redact import redact_obj
from ..core.rundir import RunBinding, RunDir, RunFilesChanged, check_run_files
from .render_html import render_html
from .render_md import render_markdown
from .reopen import SIGNOFF_FILE, read_signoff
from .signoff import SignRefused, attachments, build_signoff, load_run_report
from .write import atomic_write_text


def rerender(run_dir: Path) -> list[Path]:
    """report.html and report.md again, with the sign-off and rehearsal attached; report.json untouched."""
    run = RunDir(Path(run_dir))
    report = {**load_run_report(run.path), **attachments(run.path)}
    written = []
    for name, text in (("report.html", render_html(report)), ("report.md", render_markdown(report))):
        target = run.report_file(name)
        atomic_write_text(target, text)
        written.append(target)
    return written


def unchanged_files(run_dir: Path) -> RunBinding:
    """SignRefused when a file the run bound changed since (core/rundir.py, issue 42 item 7)."""
    try:
        return check_run_files(run_dir, "sign")
    except RunFilesChanged as exc:
        raise SignRefused(str(exc).removeprefix("sign: refused: ")) from exc


def proven_files(run_dir: Path, binding: RunBinding) -> dict[str, Any]:
    """A run is signed only on files proven to be the ones its verdict judged: SignRefused for a run opened before
    the binding existed, or whose verdict recorded no files (nothing proves them). Returns what the sign-off
    records of the binding."""
    if binding.state != "bound":
        why = ("it was opened before a run's files were bound (run.json records no profile_sha256 and no "
               "judged_files)" if binding.state == "unbound" else
               "its verdict never recorded the files it judged (run.json has no judged_files: the report stage did "
               "not finish)")
        raise SignRefused(f"run {run_dir} cannot be proven: {why}, so nothing shows that its evidence/profile.yml "
                          "and evidence are the ones judged; re-run the acceptance and sign the new run")
    return {"profile_sha256": binding.profile_sha256, "files": binding.files}


def sign_run(run_dir: Path, *, replace: bool = False, **kwargs: Any) -> dict[str, Any]:
    """Write signoff.json for the run and re-render its report; returns the record."""
    run_dir = Path(run_dir)
    binding = unchanged_files(run_dir)      # first: a relabelled profile is named as the edit it is
    report = load_run_report(run_dir)
    bound = proven_files(run_dir, binding)
    existing = read_signoff(run_dir)
    if existing and not replace:
        raise SignRefused(f"{run_dir.name} is already signed ({existing.get('decision')} by "
                          f"{existing.get('reviewer')} at {existing.get('signed_at')}); give --replace to sign again")
    record = {**build_signoff(run_dir, report, **kwargs), "run_files": bound}
    record = redact_obj(record)  # a note or a confirmation never carries a secret to disk
    if existing:
        record["replaces"] = {k: existing.get(k) for k in ("decision", "reviewer", "signed_at", "report_sha256")}
    atomic_write_text(RunDir(run_dir).report_file(SIGNOFF_FILE),
                      json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    rerender(run_dir)
    return record
