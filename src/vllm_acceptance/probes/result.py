"""A probe's result.json and exit code (docs/acceptance.md "Contracts", 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.evidence import EvidenceStore
from ..core.findings import Finding, Status

EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_INCONCLUSIVE = 0, 1, 2, 3


def overall_status(findings: list[Finding]) -> str:
    """fail if anything failed; inconclusive if anything is unknown; else pass (warn passes, flagged)."""
    statuses = {f.status for f in findings}
    if Status.FAIL in statuses:
        return "fail"
    if not findings or statuses & {Status.INCONCLUSIVE, Status.MISSING}:
        return "inconclusive"
    return "pass"


def exit_code(status: str) -> int:
    return {"pass": EXIT_PASS, "fail": EXIT_FAIL, "inconclusive": EXIT_INCONCLUSIVE}.get(status, EXIT_USAGE)


def write_result(out_dir: Path, probe: str, findings: list[Finding], details: dict[str, Any],
                 secrets: list[str] | None = None) -> str:
    """Write DIR/result.json; evidence paths in it are relative to DIR."""
    status = overall_status(findings)
    EvidenceStore(out_dir, secrets=secrets).write_json("result.json", {
        "probe": probe, "status": status, "findings": [f.to_dict() for f in findings], "details": details,
    })
    return status


def rebase_evidence(findings: list[Finding], prefix: str) -> list[Finding]:
    """Probe evidence is relative to the probe DIR; the report wants it relative to the run dir."""
    for finding in findings:
        finding.evidence = [f"{prefix.rstrip('/')}/{p}" for p in finding.evidence]
    return findings
