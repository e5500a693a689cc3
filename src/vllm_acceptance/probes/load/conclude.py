"""What the stages found (Progress) turned into the stage's findings and details: the KV capacity, the ramp,
the verified limit, the crash findings, and a saturated client's stage overruled to inconclusive."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.findings import Finding
from ...rules import loadgen as loadgen_rules
from ...rules import registry
from . import rules
from .crash import crash_finding
from .run import LoadRun


@dataclass
class Progress:
    """What the stages before the verified limit found: all a later call needs to conclude the stage
    after the server was relaunched with a limit's flags (run_load_limit)."""

    early: list[Finding] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    proposed: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    kv_ev: str = "kv_capacity.json"
    initial_preemptions: float | None = None
    seconds_before: float = 0.0
    memory: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    workload: list[dict[str, Any]] = field(default_factory=list)


def conclude(run: LoadRun, progress: Progress, verified_finding: Finding, limit: dict[str, Any],
             late: list[Finding]) -> tuple[list[Finding], dict[str, Any]]:
    """The stage's findings and details from what was measured (probes/load/rules.py judges)."""
    cfg, store = run.cfg, run.store
    steps, summary, proposed = progress.steps, progress.summary, progress.proposed
    verified = bool(limit) if proposed else None
    findings = list(progress.early)
    if steps:
        ev = [store.write_json("ramp.json", {"summary": summary, "steps": steps})] + [
            f"records/ramp_c{s['concurrency']}.jsonl" for s in steps
            if store.path(f"records/ramp_c{s['concurrency']}.jsonl").exists()]
        findings.append(rules.judge_ramp(steps, summary, evidence=ev, verified=verified,
                                         request_timeout_s=cfg.request_timeout_s,
                                         max_preemptions=cfg.max_preemptions))
    if steps or proposed:
        findings.append(verified_finding)
    findings += late
    findings.insert(0, rules.judge_kv_capacity(run.readout, cfg.contract_concurrency, cfg.context_tokens,
                                               cfg.max_output_tokens, evidence=[progress.kv_ev], verified=verified))
    workload = progress.workload + run.workload
    store.write_json("workload.json", {"tokenize": run.prompts.available, "tokenize_calls": run.prompts.calls,
                                       "contract_share": cfg.contract_share, "requests": workload})
    ev_samples = [p for p in ("samples.jsonl", "memory.jsonl") if store.path(p).exists()]
    if run.crashed:
        findings += crash_findings(run, findings, ev_samples)
    findings = [saturated_overrule(f, run, steps) for f in findings]
    client_ev = store.write_json("client.json", [{"label": label, **c} for label, c in run.client_checks])
    findings.append(loadgen_rules.loadgen_finding(run.client_checks, [client_ev]))
    details = {"contract_concurrency": cfg.contract_concurrency, "knee": summary.get("knee"),
               "headroom": summary.get("headroom"), "broke_on": summary.get("broke_on"),
               "knee_text": summary.get("text"), "ramp_summary": summary, "steps": steps,
               "kv_readout": run.readout.to_dict(), "proposed_limits": proposed, "limit_attempts": progress.attempts,
               "memory_timeline": progress.memory + run.sampler.memory, "stage_bounds": run.bounds, "limits": limit,
               "samples": len(progress.metrics) + len(run.sampler.samples), "crash": run.crashed,
               "seconds": round(progress.seconds_before, 1), "initial_preemptions": progress.initial_preemptions,
               # For the report's KV / queue timeline plot; the full rows are evidence (samples.jsonl).
               "metrics_timeline": progress.metrics + [
                   {k: s.get(k) for k in ("t", "stage", "running", "waiting", "kv_usage", "preemptions")}
                   for s in run.sampler.samples],
               # The workload actually sent, beside the contract it stands for (the report flags differences):
               # the contract's share of every step at the contracted context and maximum output.
               "workload": {"tokenize": run.prompts.available, "contract_share": cfg.contract_share,
                            "ramp": cfg.ramp, "requests_per_step": cfg.requests_per_step,
                            "prompt_tokens": cfg.prompt_tokens,
                            "ramp_context_tokens": cfg.context_tokens if cfg.contract_share > 0 else cfg.prompt_tokens,
                            "output_tokens": cfg.max_output_tokens if cfg.contract_share > 0 else cfg.output_tokens,
                            "long_prompt_tokens": cfg.long_prompt_tokens, "context_tokens": cfg.context_tokens,
                            "soak_s": cfg.soak_s},
               "client": {label: c for label, c in run.client_checks}}
    return findings, details


def crash_findings(run: LoadRun, findings: list[Finding], ev_samples: list[str]) -> list[Finding]:
    crashed = run.crashed or {}
    ev = run.store.write_json("oom_record.json", crashed)
    out = [crash_finding(crashed, [ev] + ev_samples)]
    done = {f.check for f in findings}
    for check in ("capacity.context_contract", "capacity.ramp", "capacity.mixed", "capacity.soak"):
        if check not in done:
            out.append(registry.get(check).missing(
                None, f"not run: the server died in stage {crashed.get('probe_stage') or crashed.get('stage')}"))
    return out


STAGE_LABELS = {"capacity.long_prompt": "long_prompt", "capacity.ramp": "ramp_c", "capacity.mixed": "mixed",
                "capacity.soak": "soak"}


def saturated_overrule(finding: Finding, run: LoadRun, steps: list[dict[str, Any]]) -> Finding:
    """A stage whose client was saturated is inconclusive (rules/loadgen.py), never a capacity verdict."""
    prefix = STAGE_LABELS.get(finding.check)
    if prefix is None:
        return finding
    checks = [(label, c) for label, c in run.client_checks if label.startswith(prefix)]
    trusted = finding.check == "capacity.ramp" and loadgen_rules.first_break_trusted(steps)
    return loadgen_rules.overrule(finding, checks, trusted_failure=trusted)
