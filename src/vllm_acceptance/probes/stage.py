"""A probe as a stage of a run: its evidence under probes/KIND/, its findings and details in the run's
stage files (findings/KIND.json, stages/KIND.json), written once, as every stage writes them; the cache
stage's request after a restart of the server is a second call that completes the first's files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.profile import load_profile
from ..core.rundir import RunDir
from .result import overall_status, rebase_evidence
from .run import ProbeOptions, run_cache_restart_probe, run_probe


def run_probe_stage(run_dir: Path, kind: str, *, profile_path: str, base_url: str, model: str,
                    **options: Any) -> tuple[str, dict[str, str], Path]:
    run = RunDir(Path(run_dir))
    opts = ProbeOptions(kind=kind, base_url=base_url, model=model, out_dir=run.path / "probes" / kind,
                        profile=load_profile(profile_path), **options)
    status, findings, details = run_probe(opts, write_result_json=False)
    rebase_evidence(findings, f"probes/{kind}")
    if isinstance(details, dict):
        details.setdefault("evidence_root", f"probes/{kind}")  # evidence paths inside details are relative to it
    run.write_findings(kind, findings)
    stage = run.write_stage(kind, {"status": status, **details}, [opts.api_key] if opts.api_key else None)
    return status, {f"{f.check}@{f.host}" if f.host else f.check: f.status.value for f in findings}, stage


def run_cache_restart_stage(run_dir: Path, *, profile_path: str, base_url: str, model: str,
                            restart_error: str | None = None, restart_log: str | None = None,
                            **options: Any) -> tuple[str, dict[str, str], Path]:
    """The cache stage's request after the server this run launched was restarted (playbooks/probes.yml):
    its `cache.restart` finding replaces the first call's, its request joins the stage's details."""
    run = RunDir(Path(run_dir))
    details = run.stage("cache") or {}
    findings = run.findings("cache")
    if findings is None:
        raise ValueError(f"no findings/cache.json in {run.path}: run the cache probe before its restart phase")
    opts = ProbeOptions(kind="cache", base_url=base_url, model=model, out_dir=run.path / "probes" / "cache",
                        profile=load_profile(profile_path), **options)
    finding, row = run_cache_restart_probe(opts, details, restart_error, restart_log)
    rebase_evidence([finding], "probes/cache")
    findings = [f for f in findings if f.check != "cache.restart"] + [finding]
    status = overall_status(findings)
    run.write_findings("cache", findings)
    stage = run.write_stage("cache", {**details, "status": status, "restart": row,
                                      "restart_error": restart_error}, [opts.api_key] if opts.api_key else None)
    return status, {f"{f.check}@{f.host}" if f.host else f.check: f.status.value for f in findings}, stage
