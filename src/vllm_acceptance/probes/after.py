"""After the probes: what the nodes recorded while the load ran, judged into the load stage's artefacts.

Two things the load probe cannot see from the controller are fetched from the nodes only once the probes
are done (playbooks/probes.yml): the per-GPU memory series sampled on every GPU node
(``evidence/memory/<host>.csv``, the gpu_memory_sampler role; with the server's container memory beside them,
``evidence/memory/cgroup/<host>.csv``) and the log of a server in a container or on
another node (``evidence/serve/after-probes/<host>.log``). This step judges them, once, into
``findings/load.json`` and ``stages/load.json`` (docs/checks.md ``capacity.soak``, ``capacity.crash``):

- the soak is judged on the per-GPU series too (one that passed on the server's own memory can fail on them);
  flat GPU series never stand in for the server's own memory (a local pid's RSS, the RSS its /metrics exports):
  vLLM preallocates its GPU memory, so a host-memory leak leaves them flat (issue 42). Its communication errors
  are read on the container logs: each node's whole log, read after the probes, spans the soak window;
- a crash the probe left without a signature becomes the OOM it was when the server's own log says so.

The report only assembles what the stages wrote; it does not judge these again.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from ..core.findings import Finding, Status
from ..core.rundir import RunDir
from ..parsers.causal import causal_line
from ..parsers.gpu_memory import CONTAINER_DIR, container_memory_rows, memory_rows
from ..parsers.startup_log import scan_startup_log
from .load.crash import OOM_MARKERS
from .load.rules import stage_peaks
from .load.soak import judge_soak_gpu_memory

STAGE = "load"
AFTER_PROBES_LOGS = "evidence/serve/after-probes"
MEMORY_DIR = "evidence/memory"
LOG_UNSEEN = "communication errors (the server log did not grow over the window)"


def judge_after_probes(run_dir: Path) -> dict[str, Any]:
    """Judge the nodes' memory series and the servers' logs into the load stage, once per run.

    Returns what was done (``status``: ``judged``, ``already_judged`` or ``no_load_stage``)."""
    run = RunDir.existing(run_dir)
    details, findings = run.stage(STAGE), run.findings(STAGE)
    if not isinstance(details, dict) or findings is None:
        return {"status": "no_load_stage", "changed": []}
    if details.get("after_probes"):
        return {"status": "already_judged", "changed": [], **details["after_probes"]}
    before = {f.check: f.status for f in findings}
    logs = server_logs(run.path)
    findings = soak_from_server_logs(run.path, findings, logs)
    rows = merge_gpu_memory(run.path, details)
    if rows:
        findings = soak_from_node_memory(findings, rows, details.get("memory_evidence") or [])
    findings = crash_from_server_logs(run.path, findings, logs)
    changed = sorted(f.check for f in findings if before.get(f.check) != f.status)
    details["after_probes"] = {"judged_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                               "memory_rows": len(rows), "server_logs": [str(p.relative_to(run.path)) for p in logs],
                               "changed": changed}
    run.write_findings(STAGE, findings)
    run.write_stage(STAGE, details)
    return {"status": "judged", **details["after_probes"]}


def merge_gpu_memory(run_dir: Path, details: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-GPU memory sampled on the nodes joins the load stage's timeline and its per-stage peaks."""
    rows = sorted(memory_rows(run_dir) + container_memory_rows(run_dir), key=lambda r: r["t"])
    if not rows:
        return []
    details["memory_timeline"] = list(details.get("memory_timeline") or []) + rows
    serve = RunDir.existing(run_dir).stage("serve")
    ready_at = serve.get("judged_at") if isinstance(serve, dict) else None
    details["memory_peaks_by_stage"] = stage_peaks(rows, ready_at, details.get("stage_bounds") or [])
    series = sorted(RunDir(run_dir).at(MEMORY_DIR).glob("*.csv"))
    containers = sorted(RunDir(run_dir).at(CONTAINER_DIR).glob("*.csv"))
    details["memory_evidence"] = [f"{MEMORY_DIR}/{p.name}" for p in series] + \
        [f"{CONTAINER_DIR}/{p.name}" for p in containers]
    return rows


def soak_from_node_memory(findings: list[Finding], rows: list[dict[str, Any]], evidence: list[str]) -> list[Finding]:
    """capacity.soak judged on the per-GPU series over its window, the series cited as its evidence."""
    judged = [judge_soak_gpu_memory(f, rows) if f.check == "capacity.soak" else f for f in findings]
    for finding in judged:
        if finding.check == "capacity.soak" and evidence:
            finding.evidence = sorted(set(finding.evidence) | set(evidence))
    return judged


def server_logs(run_dir: Path) -> list[Path]:
    folder = RunDir(run_dir).at(AFTER_PROBES_LOGS)
    return sorted(folder.glob("*.log")) if folder.is_dir() else []


def soak_from_server_logs(run_dir: Path, findings: list[Finding], logs: list[Path]) -> list[Finding]:
    """capacity.soak of a server in a container: the probes could not follow its log, so its communication
    errors are read from the container logs taken after the probes (playbooks/probes.yml reads each node's
    whole log, from the container's first line to after the soak: a span that holds the soak window). An
    NCCL or DMA-BUF error line in any of them fails the soak; none makes the errors observed."""
    if not logs:
        return findings
    for finding in findings:
        if finding.check != "capacity.soak" or finding.status != Status.INCONCLUSIVE:
            continue
        obs = dict(finding.observed or {})
        if LOG_UNSEEN not in (obs.get("not_observed") or []):
            continue
        cited = [str(p.relative_to(run_dir)) for p in logs]
        comm = []
        for path in logs:
            scan = scan_startup_log(path.read_text(errors="replace"))
            comm += [f"{path.name}:{x.number}: {x.text[:300]}" for x in scan.nccl_errors + scan.dmabuf_errors]
        unseen = [u for u in obs["not_observed"] if u != LOG_UNSEEN]
        finding.observed = {**obs, "log_observed": True, "logs_after_probes": cited, "comm_errors": comm,
                            "not_observed": unseen}
        finding.evidence = sorted(set(finding.evidence) | set(cited))
        if comm:
            finding.status = Status.FAIL
            finding.reason = f"{len(comm)} communication error line(s) in the log: {comm[0]}"
        elif unseen:
            finding.reason = "not observed: " + "; ".join(unseen)
        else:
            finding.status, finding.reason = Status.PASS, ""
    return findings


def crash_from_server_logs(run_dir: Path, findings: list[Finding], logs: list[Path]) -> list[Finding]:
    """A crash without a signature turns into the OOM it was when a server's own log has the OOM line
    (quoted, the log cited). No OOM line: the crash stays inconclusive, its reason quoting the line of the
    server's log that says why (parsers/causal.py), not only what the client saw."""
    oom = [(path, line.strip()) for path in logs for line in path.read_text(errors="replace").splitlines()
           if any(marker in line.lower() for marker in OOM_MARKERS)]
    if not oom:
        return [_with_causal_line(run_dir, f, logs) for f in findings]
    return _as_oom(run_dir, findings, oom)


def _with_causal_line(run_dir: Path, finding: Finding, logs: list[Path]) -> Finding:
    if finding.check != "capacity.crash" or finding.status != Status.INCONCLUSIVE:
        return finding
    for path in logs:
        line = causal_line(path.read_text(errors="replace"))
        if line and line not in finding.reason:
            finding.reason += f"; {path.name}: {line}"
            finding.evidence = sorted(set(finding.evidence) | {str(path.relative_to(run_dir))})
    return finding


def _as_oom(run_dir: Path, findings: list[Finding], oom: list[tuple[Path, str]]) -> list[Finding]:
    for finding in findings:
        if finding.check != "capacity.crash" or finding.status != Status.INCONCLUSIVE:
            continue
        finding.status = Status.FAIL
        finding.observed = {**(finding.observed or {}), "kind": "oom", "oom_lines": [line for _, line in oom[-3:]]}
        finding.reason = (f"OOM in stage {(finding.observed or {}).get('stage')} (server log after the probes): "
                          + oom[-1][1][:300])
        finding.evidence = sorted(set(finding.evidence) | {str(p.relative_to(run_dir)) for p, _ in oom})
    return findings
