"""The serve stage, judged on the controller: the server came up, its startup log and its actual
configuration (not the command line) match the profile, and how long the model took to load."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.evidence import EvidenceStore
from ..core.findings import Consequence, Finding, Status, write_findings
from ..core.profile import Profile
from ..core.rundir import RunDir
from ..parsers.causal import causal_line
from ..parsers.live import live_launch
from ..parsers.node_evidence import load_node_evidence
from ..parsers.startup_log import StartupScan, scan_startup_log
from ..rules import registry
from ..rules.launch_triage import launch_findings
from ..rules.launched import LaunchedPlan, plan_of_run
from ..rules.registry import missing
from ..rules.serve import ServerReports, check_actual_config, check_startup_log, flag_readings
from ..rules.served_model import CheckpointConfig, check_served_model
from ..rules.transport import check_allreduce_path
from ..runtime.client import OpenAIClient, ServerUnreachable
from ..runtime.metrics import DirectMetrics, MetricsError, cache_config, server_root
from .log_identity import check_log_identity, read_live_identity


@dataclass
class ServeFacts:
    base_url: str
    host: str | None = None
    mode: str = "launch"
    launch_command: str | None = None
    startup_log: str | None = None          # text of the full startup log, if captured
    ready_s: float | None = None
    launch_error: str | None = None
    process_args: list[str] | None = None
    metrics_url: str | None = None
    api_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # attach: where the operator's startup log came from ("the file ...", "the command `...` on HOST"); such a
    # log is used only when it is this server's (serve/log_identity.py)
    startup_log_source: str | None = None
    startup_log_error: str | None = None    # attach: why the operator's log command gave no log
    # A P/D deployment (serve/pools.py serve_record): base_url is its router; each pool's instances
    pools: dict[str, list[dict[str, str]]] = field(default_factory=dict)


def judge_serve(run_dir: Path, profile: Profile, facts: ServeFacts) -> list[Finding]:
    if profile.model.pd is not None and facts.pools:
        # A P/D deployment: the server whose startup log, flags and /metrics are judged here is the decode pool's
        # (roles/vllm_serve tasks/pools.yml hands them over); the router is only the URL (serve/pools.py).
        from .pools import pool_profile

        profile = pool_profile(profile, "decode")
    store = EvidenceStore(run_dir, "evidence/serve", secrets=[facts.api_key] if facts.api_key else [])
    findings: list[Finding] = []
    argv_from = _attached_argv(run_dir, facts)
    if facts.mode == "attach" and facts.startup_log is not None and facts.launch_error is None:
        findings.append(_operator_log(store, facts))
    elif facts.mode == "attach" and facts.startup_log_error:
        findings.append(registry.get("compat.startup_log_identity").missing(
            facts.host, f"{facts.startup_log_error}: no startup log of this server (run the command on the head as the "
                        "inventory user to see why)"))
    log_ev = [store.write_text("startup.log", facts.startup_log)] if facts.startup_log is not None else []
    for finding in findings:     # the accepted operator log is the evidence of its identity
        if finding.check == "compat.startup_log_identity" and not finding.evidence:
            finding.evidence = list(log_ev)
    cmd_ev = [store.write_text("launch-command.txt", facts.launch_command + "\n")] if facts.launch_command else []
    scan = scan_startup_log(facts.startup_log) if facts.startup_log is not None else None
    plan = plan_of_run(run_dir, profile)
    findings.append(check_startup_log(scan, profile, facts.host, log_ev, plan))
    findings.append(check_allreduce_path(facts.startup_log, profile, facts.host, log_ev, plan))
    findings.append(model_load(facts, log_ev + cmd_ev))
    details: dict[str, Any] = {"base_url": facts.base_url, "mode": facts.mode, "launch_command": facts.launch_command,
                               "ready_s": facts.ready_s, "launch_error": facts.launch_error,
                               "process_args_from": argv_from,
                               # judged right after ready: the end of the model-load memory window
                               "judged_at": time.time()}
    if facts.pools:      # the P/D record the probes read (ProbeOptions.pools; serve/pools.py serve_record)
        details.update({"entry_point": facts.base_url, "pools": facts.pools})
    if scan is not None:
        details.update(scan.summary() if hasattr(scan, "summary") else {})
    if facts.launch_error is None:
        findings += actual_config(store, profile, facts, details, scan, log_ev, plan)
    else:
        findings.append(missing("compat.actual_config", facts.host, "the server did not come up",
                                evidence=log_ev))
        findings += _triage(run_dir, profile, facts, log_ev, findings, details)
    write_findings(RunDir(run_dir).findings_path("serve"), findings)
    RunDir(run_dir).stages_dir.mkdir(exist_ok=True)
    EvidenceStore(run_dir, "stages").write_json("serve.json", details)
    return findings


def _attached_argv(run_dir: Path, facts: ServeFacts) -> str | None:
    """Where the running server's argv comes from: the pid the operator named (read by the serve role), else, when
    attached, the process the preflight found listening on the server's port on this node (its live_process
    record: roles/preflight/files/live_process.py, read as root or the pid's own user); None when neither is read.
    The URL is bound to that node by compat.server_location (docs/checks.md), so its argv is this server's."""
    if facts.process_args is not None:
        return "vllm_serve_pid (/proc/PID/cmdline)"
    if facts.mode != "attach" or not facts.host:
        return None
    record = load_node_evidence(run_dir, facts.host).get("live_process")
    live = live_launch(record.stdout) if record.present and record.rc == 0 else None
    if live is None:
        return None
    facts.process_args = live[0]
    return f"the preflight's live_process record on {facts.host}: {live[2]}"


def _operator_log(store: EvidenceStore, facts: ServeFacts) -> Finding:
    """compat.startup_log_identity: an operator-named log is used only when it is this server's; else it is kept
    as startup-log-rejected.log and `facts.startup_log` is cleared (compat.startup_log is then missing)."""
    text = facts.startup_log or ""
    live = read_live_identity(facts.base_url, facts.api_key, facts.metrics_url)
    source = facts.startup_log_source or "the operator"
    finding = check_log_identity(scan_startup_log(text), live, source, facts.host, [], facts.process_args)
    if finding.status != Status.PASS:
        finding.evidence = [store.write_text("startup-log-rejected.log", text)]
        facts.startup_log = None
    return finding


def _triage(run_dir: Path, profile: Profile, facts: ServeFacts, log_ev: list[str], findings: list[Finding],
            details: dict[str, Any]) -> list[Finding]:
    """Launch triage (triage.py): evidence groups and the failure class; model_load takes the class's
    consequence, so a capacity failure is not reported as an environment rebuild."""
    evidence, verdict = launch_findings(run_dir, profile, facts.host, facts.startup_log, log_ev, facts.launch_command)
    details["triage"] = {"class": (verdict.observed or {}).get("class"), "check": verdict.check,
                         "status": verdict.status.value}
    for finding in findings:
        if finding.check == "capacity.model_load" and verdict.status == Status.FAIL:
            finding.consequence, finding.action = verdict.consequence, verdict.action
    return [evidence, verdict]


def model_load(facts: ServeFacts, evidence: list[str]) -> Finding:
    """capacity.model_load: time to ready and load errors (a failure here is never prefix caching)."""
    if facts.mode == "attach":
        return Finding(check="capacity.model_load", status=Status.NOT_APPLICABLE, host=facts.host,
                       reason="attached to a running server: load time not observed", evidence=evidence,
                       consequence=Consequence.EXPAND, action="launch through vllm_serve to measure model load")
    ok = facts.launch_error is None and facts.ready_s is not None
    cause = causal_line(facts.launch_error) if facts.launch_error else ""
    return Finding(
        check="capacity.model_load", status=Status.PASS if ok else Status.FAIL, host=facts.host,
        observed={"ready_s": facts.ready_s, "error": facts.launch_error}, expected="ready within the timeout",
        reason=cause,
        evidence=evidence, consequence=Consequence.EXPAND if ok else Consequence.REBUILD,
        rule="the server answers /health after loading the model",
        action="read the startup log: weights, parallel layout, container dependencies or base memory "
               "(never prefix caching); do not tune launch flags for an environment error")


def actual_config(store: EvidenceStore, profile: Profile, facts: ServeFacts, details: dict[str, Any],
                  scan: StartupScan | None = None, log_ev: list[str] | None = None,
                  plan: LaunchedPlan | None = None) -> list[Finding]:
    """The running server's own reports (/v1/models, /metrics cache_config_info, its startup log), saved
    as evidence and judged flag by flag; the argv is saved as what was asked."""
    reports = ServerReports(startup=scan, process_args=facts.process_args, log_evidence=list(log_ev or []))
    client = OpenAIClient(facts.base_url, api_key=facts.api_key, timeout_s=30)
    try:
        reports.models = client.models()
        reports.models_evidence.append(store.write_json("v1-models.json", reports.models))
    except ServerUnreachable as exc:
        reports.models_evidence.append(store.write_text("v1-models.error.txt", str(exc)))
    finally:
        client.close()
    headers = {"Authorization": f"Bearer {facts.api_key}"} if facts.api_key else {}
    try:
        snap = DirectMetrics(facts.metrics_url or server_root(facts.base_url) + "/metrics", headers=headers).snapshot()
        reports.metrics_evidence.append(store.write_text("metrics-at-ready.prom", snap.raw))
        reports.cache_config = cache_config(snap)
        reports.engines = snap.engines()
    except MetricsError as exc:
        reports.metrics_evidence.append(store.write_text("metrics.error.txt", str(exc)))
    if facts.process_args is not None:
        reports.argv_evidence.append(store.write_text("process-args.json", json.dumps(facts.process_args, indent=2)))
    details["cache_config"] = reports.cache_config
    details["flags"] = [reading.to_dict() for reading in flag_readings(reports, profile)]
    if reports.models and reports.models.get("data"):
        details["model"] = reports.models["data"][0].get("id")
        details["max_model_len"] = reports.models["data"][0].get("max_model_len")
    served = check_served_model(reports, profile, facts.host, checkpoint_config(reports, facts.base_url), plan)
    return [*check_actual_config(reports, profile, facts.host, plan), served]


LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def checkpoint_config(reports: ServerReports, base_url: str) -> CheckpointConfig | None:
    """The served checkpoint's config.json hash (compat.served_model records it), where this machine can read it:
    a server on this machine (loopback URL) whose /v1/models root is a directory here. None elsewhere (a remote
    node's path is not this machine's)."""
    host = urlsplit(base_url).hostname or ""
    cards = (reports.models or {}).get("data") if isinstance(reports.models, dict) else None
    roots = [str(c.get("root")) for c in cards or [] if isinstance(c, dict) and c.get("root") and not c.get("parent")]
    if host not in LOOPBACK or not roots:
        return None
    config = Path(roots[0]).expanduser() / "config.json"
    if not config.is_file():
        return None
    try:
        return CheckpointConfig(path=str(config), sha256=hashlib.sha256(config.read_bytes()).hexdigest())
    except OSError as exc:
        return CheckpointConfig(path=str(config), error=str(exc))
