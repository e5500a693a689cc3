"""A probe as a stage of a run: its evidence under probes/KIND/, its findings and details in the run's
stage files (findings/KIND.json, stages/KIND.json), written once, as every stage writes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.profile import load_profile
from ..core.rundir import RunDir
from .result import rebase_evidence
from .run import ProbeOptions, run_probe


def run_probe_stage(run_dir: Path, kind: str, *, profile_path: str, base_url: str, model: str,
                    **options: Any) -> tuple[str, dict[str, str], Path]:
    run = RunDir(Path(run_dir))
    opts = ProbeOptions(kind=kind, base_url=base_url, model=model, out_dir=run.path / "probes" / kind,
                        profile=load_profile(profile_path), **options)
    status, findings, details = run_probe(opts, write_result_json=False)
    rebase_evidence(findings, f"probes/{kind}")
    run.write_findings(kind, findings)
    stage = run.write_stage(kind, {"status": status, **details}, [opts.api_key] if opts.api_key else None)
    return status, {f"{f.check}@{f.host}" if f.host else f.check: f.status.value for f in findings}, stage
