"""The traffic stages before the soak, each a function of a LoadRun: the long prompt, the context contract,
the concurrency ramp (run_step), the verification at a proposed limit and the mixed stream."""

from __future__ import annotations

import time
from typing import Any

import httpx

from ...core.bounds import step_requests
from ...core.findings import Finding
from ...load.engine import Record, RequestSpec
from ...load.prompts import filler
from ...rules import registry
from ...runtime.metrics import delta, histogram_delta, histogram_quantile_delta
from . import rules
from .run import LoadRun
from .steps import contract_shaped, hung_requests, missing_samples, step_row


def memory_split(run: LoadRun, rec: Record | None) -> dict[str, int | None]:
    """Peak memory of one request's prefill (sent -> first token) and of its decode (first token -> end)."""
    if rec is None or rec.sent is None:
        return {"prefill_peak_bytes": None, "decode_peak_bytes": None}
    cut = rec.first_token or rec.end or rec.sent
    pre = run.sampler.memory_window(rec.sent, cut)
    # Like the prefill's window, the decode's includes the sample taken right after it ends: a decode shorter than
    # a sample's own cost on a busy host would otherwise hold no sample at all.
    dec = run.sampler.memory_window(cut, rec.end or cut)
    return {"prefill_peak_bytes": max(pre) if pre else None, "decode_peak_bytes": max(dec) if dec else None}


def stage_long_prompt(run: LoadRun) -> list[Finding]:
    """One agent-like prompt at the contracted context (counted), concurrency 1; prefill vs decode memory."""
    cfg = run.cfg
    tokens = min(cfg.long_prompt_tokens, cfg.context_tokens)
    req = run.build(tokens, cfg.max_output_tokens, 1, "long")
    # One request's prefill can be shorter than the sampling interval (25 ms on the lab): sample its memory
    # every 5 ms while it runs, so its prefill and decode peaks are measured, not missed between two samples.
    run.sampler.fine_memory(min(0.005, cfg.sample_interval_s))
    try:
        records, start, end = run.send("long_prompt", [req], 1)
    finally:
        run.sampler.fine_memory(None)
    samples = run.sampler.window(start, end)
    rec = records[0] if records else None
    ok = rec is not None and rec.status == "ok"
    check = registry.get("capacity.long_prompt")
    observed = {"target_tokens": tokens, "prompt_tokens": rec.prompt_tokens if rec else None,
                "status": rec.status if rec else None, "request_id": rec.request_id if rec else None,
                "error": rec.error if rec else "no record", "e2e_s": rec.e2e if rec else None,
                "ttft_s": rec.ttft if rec else None, **memory_split(run, rec),
                "max_kv_usage": max((s["kv_usage"] or 0) for s in samples) if samples else None}
    common = {"observed": observed, "expected": f"one agent-like prompt of {tokens} tokens completes",
              "evidence": [p for p in ("records/long_prompt.jsonl", "memory.jsonl") if run.store.path(p).exists()]}
    if ok:
        return [check.passed(**common)]
    return [check.fail(action="a failure here points at max-model-len, the cache format or one profile's capacity",
                       reason=f"the long request ended {observed['status']}: {observed['error']}", **common)]


def _post(run: LoadRun, req: RequestSpec) -> dict[str, Any]:
    body = {"model": run.cfg.model, "messages": req.messages, "max_tokens": req.max_tokens, "temperature": 0.0}
    headers = {"Authorization": f"Bearer {run.cfg.api_key}"} if run.cfg.api_key else {}
    try:
        response = httpx.post(run.base_url.rstrip("/") + "/chat/completions", json=body,
                              timeout=run.cfg.request_timeout_s, headers=headers)
        return {"http_status": response.status_code, "body": response.text[:600]}
    except httpx.HTTPError as exc:
        return {"http_status": 0, "body": f"{type(exc).__name__}: {exc}"}


def served_max_model_len(run: LoadRun) -> int | None:
    """The context the server itself says it serves: /tokenize's max_model_len, else /v1/models' (never the
    profile's: a site contract below the recipe's --max-model-len is judged against the served one)."""
    if run.prompts.max_model_len:
        return int(run.prompts.max_model_len)
    headers = {"Authorization": f"Bearer {run.cfg.api_key}"} if run.cfg.api_key else {}
    try:
        data = httpx.get(run.base_url.rstrip("/") + "/models", timeout=10.0, headers=headers).json()
    except (httpx.HTTPError, ValueError):
        return None
    entries = data.get("data") if isinstance(data, dict) else None
    found = [e.get("max_model_len") for e in entries or [] if isinstance(e, dict) and e.get("id") == run.cfg.model]
    return found[0] if found and isinstance(found[0], int) else None


def stage_context_contract(run: LoadRun) -> Finding:
    """At the contracted context (context + max output) a request succeeds; one token over is rejected, or, where
    the server serves more than the contract, served with a warning while one over the served limit is rejected
    (probes/load/rules.py, judge_context_contract)."""
    cfg = run.cfg
    window = rules.tokens_per_session(cfg.context_tokens, cfg.max_output_tokens)
    run.sampler.stage = "context_contract"
    at_req = run.build(cfg.context_tokens, cfg.max_output_tokens, 3, "at-context")
    at = {**_post(run, at_req), "prompt_tokens": run.workload[-1]["counted_tokens"],
          "max_tokens": cfg.max_output_tokens}
    # The whole contracted window plus one token in the prompt alone: over the contract whatever max_tokens.
    over_req = run.build(window + 1, cfg.max_output_tokens, 2, "over-context", at_least=True)
    over = {**_post(run, over_req), "prompt_tokens": run.workload[-1]["counted_tokens"],
            "max_tokens": cfg.max_output_tokens}
    served = served_max_model_len(run)
    over_served = None
    if served is not None and served > window:
        # The served limit plus one token in the prompt alone: the server must refuse it for its length.
        served_req = run.build(served + 1, cfg.max_output_tokens, 4, "over-served", at_least=True)
        over_served = {**_post(run, served_req), "prompt_tokens": run.workload[-1]["counted_tokens"],
                       "max_tokens": cfg.max_output_tokens}
    healthy = run.healthy()
    ev = run.store.write_json("context_contract.json", {"contract_window_tokens": window, "at_contract": at,
                                                        "over_contract": over, "served_max_model_len": served,
                                                        "over_served": over_served, "healthy_after": healthy,
                                                        "counted_by": "/tokenize" if run.prompts.available
                                                        else "estimate"})
    return rules.judge_context_contract(at, over, healthy, cfg.context_tokens, cfg.max_output_tokens, evidence=[ev],
                                        served_max_model_len=served, over_served=over_served)


def run_step(run: LoadRun, stage: str, concurrency: int, context: int, seed0: int) -> dict[str, Any]:
    """One step at the contract's shape: the profile's share at ``context`` (+ max output), the rest short."""
    cfg = run.cfg
    n = step_requests(cfg.requests_per_step, concurrency)
    specs = [run.build(context, cfg.max_output_tokens, seed0 + i, f"{stage}-ctx")
             if contract_shaped(i, cfg.contract_share) else
             run.build(cfg.prompt_tokens, cfg.output_tokens, seed0 + i, f"{stage}-short") for i in range(n)]
    before = run.snapshot()
    records, start, end = run.send(stage, specs, concurrency)
    after = run.snapshot()
    have = before is not None and after is not None
    preempted = delta(before, after, "vllm:num_preemptions") if have else None
    count, total = histogram_delta(before, after, "vllm:request_queue_time_seconds") if have else (None, None)
    queue_p95 = histogram_quantile_delta(before, after, "vllm:request_queue_time_seconds", 0.95) if have else None
    mem = run.sampler.memory_window(start, end)
    samples = run.sampler.window(start, end)
    block = run.readout.block_size
    sat = rules.kv_saturated(samples, preempted, run.readout.tokens,
                             rules.tokens_per_session(context, cfg.max_output_tokens), block,
                             demand_tokens=rules.peak_inflight_tokens([r.to_dict() for r in records], block),
                             queued_s=total, engine_tokens=run.readout.engine_tokens)
    row = step_row(concurrency, records, samples, preempted, cfg, queue_p95=queue_p95,
                   queue_time_mean_s=(total / count) if count and total is not None else None, **sat,
                   peak_memory_bytes=max(mem) if mem else None, context_tokens=context, stage=stage,
                   seconds=round(end - start, 2),
                   missing_samples=missing_samples(before, after, run.sampler.failed_in(start, end), samples,
                                                   run.crashed is not None))
    row["client"] = run.last_client
    return row


def stage_ramp(run: LoadRun) -> list[dict[str, Any]]:
    """Step up through the profile's ramp to the contract, then past it (doubling, bounded by
    ``load.max_step`` and ``load.ramp_budget_s``) until a step breaks: the real knee."""
    cfg = run.cfg
    steps: list[dict[str, Any]] = []
    t0 = time.time()
    for concurrency in rules.ramp_plan(cfg.ramp, cfg.contract_concurrency, cfg.ramp_bound):
        if concurrency > cfg.contract_concurrency and time.time() - t0 > cfg.ramp_budget_s:
            break
        row = run_step(run, f"ramp_c{concurrency}", concurrency, cfg.context_tokens, 1000 * concurrency)
        steps.append(row)
        if run.crashed or (concurrency >= cfg.contract_concurrency and not row["meets_slo"]):
            break
    return steps


def stage_verify(run: LoadRun, proposed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Re-run at each proposed limit (client concurrency and context) until one holds, the server as it
    runs (an attached server is someone else's: it is never relaunched)."""
    attempts = []
    for setting in proposed:
        attempts.append(verify_one(run, setting, "client driven at the limit (server as launched)"))
        if run.crashed or attempts[-1]["held"]:
            break
    return attempts


def verify_one(run: LoadRun, setting: dict[str, Any], mode: str) -> dict[str, Any]:
    """One step at a proposed limit's client concurrency and context: held when it meets the SLO."""
    stage = f"verify_{setting['kind']}"
    row = run_step(run, stage, int(setting["client_concurrency"]), int(setting["context_tokens"]), 50_000)
    return {"setting": setting, "stage": stage, "held": row["meets_slo"] and not run.crashed,
            "breaches": row["breaches"], "mode": mode, "missing_samples": row.get("missing_samples") or [],
            "row": {k: row.get(k) for k in ("concurrency", "ok", "errors", "ttft_p95", "e2e_p95", "queue_p95",
                                             "max_waiting", "max_kv_usage", "preemptions", "kv_saturated")}}


SHARED_PREFIX = ("Shared agent system prompt. " + filler(300, 99) + " ")


def repeated_hit_ratio(run: LoadRun, probe: RequestSpec) -> float | None:
    """Send the repeated request alone and read its hit ratio from the counter deltas (no other traffic)."""
    before = run.snapshot()
    records, _, _ = run.send("mixed_repeated", [probe], 1)
    after = run.snapshot()
    if not before or not after or not records or records[0].status != "ok":
        return None
    hits = delta(before, after, "vllm:prefix_cache_hits")
    queries = delta(before, after, "vllm:prefix_cache_queries")
    return (hits / queries) if hits is not None and queries else None


MIXED_WINDOWS = 3   # the mixed stream's windows (probes/load/plan.py states the same)


def stage_mixed(run: LoadRun, concurrency: int, context: int, windows: int = MIXED_WINDOWS) -> Finding:
    """Short, long, cold and repeated requests together: the repeated requests' hit ratio after each
    window (a lone repeated request, counters), and the queue window over window."""
    cfg = run.cfg
    repeated = run.build(64, cfg.output_tokens, 7, "mixed-repeated", prefix=SHARED_PREFIX)
    warm = repeated_hit_ratio(run, repeated)  # the first send fills the cache
    rows = []
    for w in range(windows):
        specs = []
        for i in range(concurrency * 2):
            seed = 10_000 * (w + 1) + i
            kind = i % 4
            if kind == 0:
                specs.append(run.build(64, cfg.output_tokens, seed, "mixed-short"))
            elif kind == 1:
                specs.append(run.build(context, cfg.max_output_tokens, seed, "mixed-long"))
            elif kind == 2:
                specs.append(run.build(cfg.prompt_tokens, cfg.output_tokens, seed, "mixed-cold"))
            else:
                specs.append(repeated)
        before = run.snapshot()
        records, start, end = run.send("mixed", specs, concurrency)
        after = run.snapshot()
        count, total = histogram_delta(before, after, "vllm:request_queue_time_seconds") if before and after \
            else (None, None)
        samples = run.sampler.window(start, end)
        client_saturated = run.last_client.get("saturated")
        row = {"window": w + 1, "requests": len(records), "errors": sum(r.status != "ok" for r in records),
               "client_saturated": client_saturated,
               **hung_requests(records), "queue_time_mean_s": (total / count) if count and total is not None else None,
               "max_waiting": max((x["waiting"] or 0) for x in samples) if samples else None}
        if not run.crashed:
            row["repeated_hit_ratio"] = repeated_hit_ratio(run, repeated)
        rows.append(row)
        if run.crashed:
            break
    ev = [run.store.write_json("mixed.json", {"warm_hit_ratio": warm, "concurrency": concurrency,
                                              "context_tokens": context, "windows": rows})] + [
        p for p in ("records/mixed.jsonl", "records/mixed_repeated.jsonl") if run.store.path(p).exists()]
    finding = rules.judge_mixed(rows, cfg.contract_concurrency, evidence=ev)
    finding.configuration = {"concurrency": concurrency, "context_tokens": context}
    return finding
