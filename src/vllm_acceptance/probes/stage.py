"""A probe as a stage of a run: result.json under probes/KIND/, findings and details filed for the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.evidence import EvidenceStore
from ..core.findings import write_findings
from ..core.profile import load_profile
from .result import rebase_evidence
from .run import ProbeOptions, run_probe


def run_probe_stage(run_dir: Path, kind: str, *, profile_path: str, base_url: str, model: str,
                    **options: Any) -> tuple[str, dict[str, str], Path]:
    out_dir = run_dir / "probes" / kind
    opts = ProbeOptions(kind=kind, base_url=base_url, model=model, out_dir=out_dir,
                        profile=load_profile(profile_path), **options)
    status, findings, details = run_probe(opts)
    rebase_evidence(findings, f"probes/{kind}")
    if isinstance(details, dict):
        details.setdefault("evidence_root", f"probes/{kind}")  # evidence paths inside details are relative to it
    write_findings(run_dir / "findings" / f"{kind}.json", findings)
    EvidenceStore(run_dir, "stages", secrets=[opts.api_key] if opts.api_key else []).write_json(f"{kind}.json", details)
    return status, {f"{f.check}@{f.host}" if f.host else f.check: f.status.value for f in findings}, \
        out_dir / "result.json"
