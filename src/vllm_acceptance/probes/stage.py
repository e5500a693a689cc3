"""A probe as a stage of a run: its evidence under probes/KIND/, its findings and details in the run's
stage files (findings/KIND.json, stages/KIND.json), written once, as every stage writes them; the cache
stage's request after a restart of the server, and the load stage's run at each proposed limit after a
relaunch with its flags, are later calls that complete the first's files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.profile import load_profile
from ..core.rundir import RunDir
from ..core.stage_details import ServeDetails
from .result import overall_status, rebase_evidence
from .run import ProbeOptions, probe_secrets, run_cache_restart_probe, run_load_limit_probe, run_probe


def run_probe_stage(run_dir: Path, kind: str, *, profile_path: str, base_url: str, model: str,
                    **options: Any) -> tuple[str, dict[str, str], Path]:
    run = RunDir(Path(run_dir))
    options.setdefault("pools", serve_pools(run))
    if options["pools"]:
        options["metrics_url"] = pool_metrics_url(kind, options["pools"], options.get("metrics_url"))
    opts = ProbeOptions(kind=kind, base_url=base_url, model=model, out_dir=run.path / "probes" / kind,
                        profile=load_profile(profile_path), **options)
    status, findings, details = run_probe(opts, write_result_json=False)
    rebase_evidence(findings, f"probes/{kind}")
    if isinstance(details, dict):
        details.setdefault("evidence_root", f"probes/{kind}")  # evidence paths inside details are relative to it
    run.write_findings(kind, findings)
    stage = run.write_stage(kind, {"status": status, **details}, probe_secrets(opts) or None)
    return status, {f"{f.check}@{f.host}" if f.host else f.check: f.status.value for f in findings}, stage


def serve_pools(run: RunDir) -> dict[str, list[dict[str, str]]]:
    """ProbeOptions.pools of a run: the P/D deployment's instances the serve stage recorded (serve/pools.py
    serve_record; roles/vllm_serve tasks/pools.yml); {} for one engine."""
    return dict(ServeDetails.read(run.stage("serve") or {}).pools)


# A P/D deployment's entry point (the router) exports no engine counters: each probe reads the pool whose engine
# does what it measures (docs/profiles.md "Disaggregated prefill/decode"): prefix reuse happens where the prompt is
# computed, on the prefill pool (the recipe's decode pool runs without prefix caching); KV capacity, preemptions and
# generation on the decode pool. The quality probe reads every instance itself (ProbeOptions.pools).
POOL_OF_PROBE = {"cache": "prefill", "load": "decode", "agent": "decode", "metrics": "decode"}


def pool_metrics_url(kind: str, pools: dict[str, list[dict[str, str]]], metrics_url: str | None) -> str | None:
    """The /metrics a probe reads on a P/D deployment: its pool's, where that pool has one instance; else the one
    given (the entry point's), whose missing engine series the probe then reports as missing."""
    instances = pools.get(POOL_OF_PROBE.get(kind, "")) or []
    if len(instances) == 1 and instances[0].get("metrics_url"):
        return instances[0]["metrics_url"]
    return metrics_url


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


def run_load_limit_stage(run_dir: Path, *, profile_path: str, base_url: str, model: str,
                         relaunch_error: str | None = None, relaunch_log: str | None = None,
                         **options: Any) -> tuple[str, dict[str, str], Path, bool]:
    """The load stage's next proposed limit, on the server this run relaunched with its flags
    (playbooks/probes.yml): the stage's files are rewritten whole; the last value says whether another
    limit is still to be verified (the stage keeps a relaunch_point)."""
    run = RunDir(Path(run_dir))
    details = run.stage("load")
    prior = run.findings("load")
    if not details or prior is None or not details.get("relaunch_point"):
        raise ValueError(f"no load stage waiting for a relaunch in {run.path}: run the load probe with relaunch "
                         "first (it leaves a relaunch_point when the contract does not hold)")
    opts = ProbeOptions(kind="load", base_url=base_url, model=model, out_dir=run.path / "probes" / "load",
                        profile=load_profile(profile_path), **options)
    prefix = "probes/load/"
    for finding in prior:   # back to the probe's own paths, as the first call had them
        finding.evidence = [p[len(prefix):] if p.startswith(prefix) else p for p in finding.evidence]
    findings, details = run_load_limit_probe(opts, details, prior, relaunch_error, relaunch_log)
    rebase_evidence(findings, "probes/load")
    details.setdefault("evidence_root", "probes/load")
    status = overall_status(findings)
    run.write_findings("load", findings)
    stage = run.write_stage("load", {"status": status, **details}, [opts.api_key] if opts.api_key else None)
    return (status, {f"{f.check}@{f.host}" if f.host else f.check: f.status.value for f in findings}, stage,
            bool(details.get("relaunch_point")))
