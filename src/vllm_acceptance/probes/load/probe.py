"""The capacity stage's first call (run_load_probe): the KV readout, the stages in order, the limit verified
against the running server or left pending for a relaunch (pending_limit), the loadgen agents connected."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...load.agent import AgentPool
from ...parsers.startup_log import scan_startup_log
from ...rules import registry
from ...runtime.metrics import MetricsError, MetricsSource, Snapshot, cache_config, cache_configs
from . import rules
from .conclude import Progress, conclude
from .config import LoadProbeConfig
from .run import LoadRun, _path
from .soak import stage_soak
from .stages import stage_context_contract, stage_long_prompt, stage_mixed, stage_ramp, stage_verify


def run_load_probe(base_url: str, source: MetricsSource, cfg: LoadProbeConfig, store: EvidenceStore, *,
                   relaunch: bool = False) -> tuple[list[Finding], dict[str, Any]]:
    """The capacity stage. With ``relaunch`` (the caller launched the server and can launch it again), a
    contract that does not hold stops after the ramp with a ``relaunch_point``: the caller relaunches the
    server with each proposed limit's flags in turn and calls :func:`run_load_limit`; otherwise a limit
    is verified by driving the client at it against the server as it runs."""
    run = LoadRun(base_url, source, cfg, store)
    try:
        first = source.snapshot()
    except MetricsError as exc:
        ev = store.write_text("metrics-error.txt", str(exc))
        return [registry.get("capacity.metrics").missing(None, str(exc), evidence=[ev])], {}
    with agents(run):
        return _run_load_probe(run, first, relaunch)


@contextlib.contextmanager
def agents(run: LoadRun) -> Iterator[None]:
    """The loadgen hosts' agents for this call (load/agent.py), connected and clock-checked; a host that does
    not answer raises LoadgenDown, which stops the probe naming it (the stage is missing)."""
    cfg = run.cfg
    if not cfg.agent_hosts:
        yield
        return
    run.pool = AgentPool(cfg.agent_endpoints, cfg.agent_hosts, cfg.agent_token or "")
    try:
        connected = run.pool.connect()
        run.store.append_jsonl("loadgen_agents.jsonl", {"t": time.time(), "agents": connected})
        yield
    finally:
        run.pool.close()


def _run_load_probe(run: LoadRun, first: Snapshot, relaunch: bool) -> tuple[list[Finding], dict[str, Any]]:
    cfg = run.cfg
    run.healthy_at_start = run.healthy()
    progress = Progress(initial_preemptions=first.value("vllm:num_preemptions"))
    progress.kv_ev = read_kv(run, first)
    run.sampler.start()
    t0 = time.time()
    late: list[Finding] = []
    try:
        progress.early += stage_long_prompt(run)
        if not run.crashed:
            progress.early.append(stage_context_contract(run))
        if not run.crashed:
            progress.steps = stage_ramp(run)
            progress.summary = rules.ramp_summary(progress.steps, cfg.contract_concurrency, cfg.ramp_bound)
        if not run.crashed and progress.steps:
            # No limit is proposed from an inconclusive step: the ramp's knee is unknown there, not low.
            knee = cfg.contract_concurrency if progress.summary.get("inconclusive_at") is not None \
                else progress.summary["knee"]
            progress.proposed = rules.propose_limits(run.readout, knee, cfg.contract_concurrency,
                                                     cfg.context_tokens, cfg.max_output_tokens,
                                                     min_context_tokens=cfg.prompt_tokens)
        if relaunch and cfg.verify_limit and progress.proposed:
            progress.seconds_before = time.time() - t0
            return pending_limit(run, progress)
        if cfg.verify_limit:
            progress.attempts = stage_verify(run, progress.proposed)
        verified, limit = judge_limit(run, progress)
        late = stage_at_limit(run, limit)
    finally:
        run.sampler.stop()
    progress.seconds_before = time.time() - t0
    return conclude(run, progress, verified, limit, late)


def read_kv(run: LoadRun, first: Snapshot) -> str:
    """The KV cache as the server reads it out (startup log, cache_config_info): kept as evidence."""
    cfg = run.cfg
    run.cache_cfg = cache_config(first)
    log_text = _path(cfg.server_log).read_text(errors="replace") if cfg.server_log and Path(
        cfg.server_log).is_file() else ""
    run.scan = scan_startup_log(log_text) if log_text else None
    # Each data-parallel engine has its own cache: the capacity is summed over them (each share stated).
    run.readout = rules.kv_readout_engines(run.scan.kv_cache_tokens if run.scan else None,
                                           run.scan.max_concurrency if run.scan else None,
                                           run.scan.max_concurrency_len if run.scan else None,
                                           cache_configs(first), first.engines())
    return run.store.write_json("kv_capacity.json", {"readout": run.readout.to_dict(),
                                                     "cache_config_info": run.cache_cfg,
                                                     "startup_log": cfg.server_log})


def judge_limit(run: LoadRun, progress: Progress) -> tuple[Finding, dict[str, Any]]:
    store = run.store
    ev = [store.write_json("verified_limit.json", {"proposed": progress.proposed, "attempts": progress.attempts})]
    return rules.judge_verified_limit(progress.proposed, progress.attempts, evidence=ev + [
        f"records/{a['stage']}.jsonl" for a in progress.attempts
        if a.get("stage") and store.path(f"records/{a['stage']}.jsonl").exists()])


def stage_at_limit(run: LoadRun, limit: dict[str, Any]) -> list[Finding]:
    """The mixed stream and the soak, at the verified limit when there is one, else at the contract."""
    concurrency = int(limit.get("client_concurrency", run.cfg.contract_concurrency))
    context = int(limit.get("context_tokens", run.cfg.context_tokens))
    late: list[Finding] = []
    if not run.crashed:
        late.append(stage_mixed(run, concurrency, context))
    if not run.crashed:
        late.append(stage_soak(run, concurrency))
    return late


def pending_limit(run: LoadRun, progress: Progress) -> tuple[list[Finding], dict[str, Any]]:
    """The stage as far as it went, waiting for the relaunch at each proposed limit: the limit, the mixed
    stream and the soak are inconclusive until a later call (run_load_limit) replaces them, so a run
    that stops here never passes on them."""
    why = "waiting for the server to be relaunched with the proposed limit's flags"
    verified = registry.get("capacity.verified_limit").inconclusive(
        reason=f"{why}: {'; '.join(' '.join(rules.limit_flags(s)) for s in progress.proposed)}",
        expected="a limited run that holds", action="relaunch the server with the limit's flags (playbooks/probes.yml)")
    late = [registry.get(check).inconclusive(reason=f"not run yet: {why}", expected="run at the verified limit",
                                             action="relaunch the server with the limit's flags (playbooks/probes.yml)")
            for check in ("capacity.mixed", "capacity.soak")]
    findings, details = conclude(run, progress, verified, {}, late)
    details["relaunch_point"] = {"settings": [{**s, "flags": rules.limit_flags(s)} for s in progress.proposed],
                                 "next": len(progress.attempts)}
    return findings, details
