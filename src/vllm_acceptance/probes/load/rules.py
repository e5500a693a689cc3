"""Capacity under load: the pure judgement of the load stages (docs/acceptance.md "Capacity under load").

The probe (probes/load/) sends the traffic and measures; every decision is here, one small
function per check id, so that each can be tested on recorded numbers:

- ``capacity.kv_capacity``: the KV cache read out at start-up (startup log, ``cache_config_info``)
  must hold the contract: concurrency x (context + max output) tokens.
- ``capacity.ramp``: the knee (largest concurrency meeting the SLO with no KV saturation, no
  preemption past the threshold, no errors), its headroom over the contract, and what broke first.
- ``capacity.verified_limit``: a proposed limit is re-tested at that limit before it is recommended;
  two admissible settings that both fail mean ``expand_capacity``.
- ``capacity.context_contract``: only a context-length rejection passes the over-contract request.
- ``capacity.mixed`` / ``capacity.soak``: the repeated requests' hit ratio and the queue trend; restarts,
  preemptions and communication errors over the soak window.
- the OOM / crash record: its stage classified from evidence, and the action for that stage.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.bounds import ramp_plan as ramp_plan  # the ramp the load probe runs (core/bounds.py)
from ...core.findings import Consequence, Finding
from ...rules import registry

# What broke first, in the order a step is read: errors, then the cache, then latency.
BREAK_ORDER = ("errors", "kv_saturated", "preemptions", "queue_p95", "ttft_p95", "itl_p95", "e2e_p95")
SLO_KEYS = {"ttft_p95": "ttft_p95_s", "itl_p95": "itl_p95_s", "e2e_p95": "e2e_p95_s", "queue_p95": "queue_p95_s"}
KV_FULL = 0.99


# --- capacity.kv_capacity ---------------------------------------------------------------------

@dataclass
class KvReadout:
    """The KV cache as the server reports it: the smallest size any source states decides."""

    tokens: int | None = None
    sources: dict[str, int] = field(default_factory=dict)
    block_size: int | None = None
    gpu_blocks: int | None = None
    log_max_concurrency: float | None = None
    log_max_concurrency_len: int | None = None
    # Data parallel / DEP: each engine's share of ``tokens`` (the sum over the engines serving the contract).
    engine_tokens: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        value = float(labels.get(key, ""))
    except ValueError:
        return None
    return int(value) if value > 0 else None


def kv_readout(log_tokens: int | None, log_max_concurrency: float | None, log_max_concurrency_len: int | None,
               cache_config: dict[str, str] | None) -> KvReadout:
    """Combine the startup log's readout and ``vllm:cache_config_info`` labels (block size x GPU blocks,
    ``kv_cache_size_tokens`` where the release has it). A GPU-block override shows only in the labels,
    so the smallest stated size is the one that holds."""
    labels = cache_config or {}
    out = KvReadout(block_size=_int_label(labels, "block_size"), gpu_blocks=_int_label(labels, "num_gpu_blocks"),
                    log_max_concurrency=log_max_concurrency, log_max_concurrency_len=log_max_concurrency_len)
    if log_tokens:
        out.sources["startup_log"] = int(log_tokens)
    if out.block_size and out.gpu_blocks:
        out.sources["cache_config_info blocks x block_size"] = out.block_size * out.gpu_blocks
    if size := _int_label(labels, "kv_cache_size_tokens"):
        out.sources["cache_config_info kv_cache_size_tokens"] = size
    if log_max_concurrency and log_max_concurrency_len:
        out.sources["startup_log max concurrency x tokens per request"] = int(log_max_concurrency
                                                                             * log_max_concurrency_len)
    out.tokens = min(out.sources.values()) if out.sources else None
    return out


def kv_readout_engines(log_tokens: int | None, log_max_concurrency: float | None,
                       log_max_concurrency_len: int | None, configs: dict[str, dict[str, str]],
                       engines: Sequence[str]) -> KvReadout:
    """The KV cache of a server with several engines (data parallel, DEP): each engine holds its own cache,
    and its readout (startup log line, its ``vllm:cache_config_info`` series, else the first engine's) is
    that engine's alone, so the server's capacity is the sum over the engines, each engine's share stated.
    An engine without a readout leaves the whole size unread (None), never a smaller sum."""
    first = next(iter(configs.values()), None)
    if len(engines) <= 1:
        return kv_readout(log_tokens, log_max_concurrency, log_max_concurrency_len,
                          configs.get(engines[0], first) if engines else first)
    per = {e: kv_readout(log_tokens, log_max_concurrency, log_max_concurrency_len, configs.get(e, first))
           for e in engines}
    out = per[engines[0]]
    out.engine_tokens = {e: r.tokens for e, r in per.items() if r.tokens is not None}
    out.tokens = sum(out.engine_tokens.values()) if len(out.engine_tokens) == len(engines) else None
    return out


def engine_split(readout: KvReadout) -> str:
    """`` (engine 0: 524288, engine 1: 524288)`` for a server of several engines, else ""."""
    if len(readout.engine_tokens) < 2:
        return ""
    return " (" + ", ".join(f"engine {e}: {t}" for e, t in readout.engine_tokens.items()) + ")"


def engine_share(kv_tokens: int, engines: int, engine: str, shares: dict[str, int] | None) -> int:
    """One engine's KV tokens: its stated share, else an even split of the server's sum."""
    return int((shares or {}).get(engine) or kv_tokens // max(1, engines))


def tokens_per_session(context_tokens: int, max_output_tokens: int) -> int:
    return context_tokens + max_output_tokens


def max_concurrency_at(kv_tokens: int, context_tokens: int, max_output_tokens: int) -> int:
    """Whole sessions at the contracted context (context + max output) the KV cache holds at once."""
    return kv_tokens // tokens_per_session(context_tokens, max_output_tokens)


def context_limit_at(kv_tokens: int, concurrency: int, max_output_tokens: int, block_size: int | None) -> int:
    """The largest context (prompt tokens) that ``concurrency`` sessions fit in, whole blocks each."""
    per = kv_tokens // max(1, concurrency)
    if block_size:
        per = per // block_size * block_size
    return max(0, per - max_output_tokens)


def kv_bound(sample: dict[str, Any], kv_tokens: int | None, session_tokens: int, block_size: int | None,
             engine_tokens: dict[str, int] | None = None) -> bool:
    """A sample where requests wait while the free KV cache cannot take one more session of the step's
    shape: admission is bound by the cache (vLLM queues rather than preempts when a prompt does not fit)."""
    if not kv_tokens or not sample.get("waiting") or sample.get("kv_usage") is None:
        return False
    engines = sample.get("engines") or {}
    if len(engines) > 1:   # per engine: requests wait on an engine whose own cache cannot take one more session
        return any((row.get("waiting") or 0) > 0 and row.get("kv_usage") is not None
                   and (1.0 - row["kv_usage"]) * engine_share(kv_tokens, len(engines), e, engine_tokens)
                   < blocks_of(session_tokens, block_size)
                   for e, row in engines.items())
    return (1.0 - sample["kv_usage"]) * kv_tokens < blocks_of(session_tokens, block_size)


def blocks_of(tokens: int, block_size: int | None) -> int:
    """Tokens rounded up to whole KV blocks (vLLM allocates a request's cache in blocks)."""
    return -(-tokens // block_size) * block_size if block_size else tokens


def peak_inflight_tokens(records: Sequence[dict[str, Any]], block_size: int | None) -> int:
    """The most KV tokens the client's requests held at once: over the answered requests' send-to-end
    intervals, the sum of (prompt + completion) tokens, in whole blocks, of those in flight together."""
    events: list[tuple[float, int]] = []
    for rec in records:
        if rec.get("status") != "ok" or rec.get("sent") is None or rec.get("end") is None:
            continue
        need = blocks_of(int(rec.get("prompt_tokens") or 0) + int(rec.get("completion_tokens") or 0), block_size)
        events += [(float(rec["sent"]), need), (float(rec["end"]), -need)]
    peak = held = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a send at the same instant
        held += change
        peak = max(peak, held)
    return peak


def kv_saturated(samples: Sequence[dict[str, Any]], preemptions: float | None, kv_tokens: int | None,
                 session_tokens: int, block_size: int | None, *, demand_tokens: int | None = None,
                 queued_s: float | None = None, engine_tokens: dict[str, int] | None = None) -> dict[str, Any]:
    """The step's KV cache was full: a preemption (vLLM preempts only when no block can be allocated),
    usage at 100%, requests seen waiting for want of free blocks, or (read without sampling, so that a
    short step cannot slip between two scrapes) the client held more tokens in flight than the cache
    has while the server's queue-time histogram grew: requests were admitted one cache-full at a time."""
    peak = max((s.get("kv_usage") or 0 for s in samples), default=0)
    bound = sum(kv_bound(s, kv_tokens, session_tokens, block_size, engine_tokens) for s in samples)
    over = bool(kv_tokens and demand_tokens and demand_tokens > kv_tokens and (queued_s or 0) > 0)
    return {"kv_saturated": bool(preemptions) or peak >= KV_FULL or bound > 0 or over, "kv_bound_samples": bound,
            "inflight_tokens_peak": demand_tokens, "kv_demand_over_capacity": over}


def judge_kv_capacity(readout: KvReadout, concurrency: int, context_tokens: int, max_output_tokens: int, *,
                      evidence: Sequence[str], verified: bool | None) -> Finding:
    """contracted concurrency x (context + max output) <= KV cache tokens; a fail states the numbers,
    and is a limit only when a limited run held (``verified``), else ``expand_capacity``."""
    check = registry.get("capacity.kv_capacity")
    need = concurrency * tokens_per_session(context_tokens, max_output_tokens)
    rule = (f"contracted concurrency {concurrency} x (context {context_tokens} + max output {max_output_tokens})"
            f" = {need} tokens <= KV cache tokens")
    if readout.tokens is None:
        return check.missing(None, "no KV cache size read out: neither the startup log (KV cache size / "
                             "maximum concurrency) nor vllm:cache_config_info (block_size, num_gpu_blocks)",
                             evidence=evidence)
    max_conc = max_concurrency_at(readout.tokens, context_tokens, max_output_tokens)
    observed = {"kv_cache_tokens": readout.tokens, "needed_tokens": need, "readout": readout.to_dict(),
                "max_concurrency_at_contract": max_conc, "contract_concurrency": concurrency,
                "tokens_per_session": tokens_per_session(context_tokens, max_output_tokens)}
    if need <= readout.tokens:
        return check.passed(observed=observed, expected=f">= {need} tokens", evidence=evidence, rule=rule)
    ctx = context_limit_at(readout.tokens, concurrency, max_output_tokens, readout.block_size)
    observed["context_limit_at_contract_concurrency"] = ctx
    return check.fail(
        observed=observed, expected=f">= {need} tokens", evidence=evidence, rule=rule,
        consequence=Consequence.LIMIT if verified else Consequence.EXPAND,
        reason=f"the KV cache holds {readout.tokens} tokens{engine_split(readout)}: {max_conc} session(s) at the "
               f"contracted context, not {concurrency} ({need} tokens needed)",
        action=(f"cap --max-num-seqs / client concurrency at {max_conc}, or the context at {ctx} tokens for "
                f"{concurrency} sessions (verified in this run)" if verified else
                f"expand capacity (more KV memory: --gpu-memory-utilization, fewer weights per GPU, more "
                f"GPUs) or lower the contract: {max_conc} session(s) at the contracted context fit"))


# --- capacity.ramp ------------------------------------------------------------------------------


def breaches(row: dict[str, Any], slo: dict[str, float], max_preemptions: int) -> list[str]:
    """Which limits a step broke, in BREAK_ORDER; an unmeasured preemption count is a breach, except where
    the step's metrics scrape failed (``missing_samples``): then it is unread, the step inconclusive."""
    broken = []
    scrape_failed = bool(row.get("missing_samples"))
    if row.get("ok", 0) == 0 or (row.get("error_rate") or 0) > slo.get("max_error_rate", 0.0):
        broken.append("errors")
    if row.get("kv_saturated"):
        broken.append("kv_saturated")
    if (row.get("preemptions") is None and not scrape_failed) or (row.get("preemptions") or 0) > max_preemptions:
        broken.append("preemptions")
    for metric in ("queue_p95", "ttft_p95", "itl_p95", "e2e_p95"):
        key = SLO_KEYS[metric]
        if metric == "queue_p95" and (metric not in row or (row[metric] is None and scrape_failed)):
            continue  # merged loadgen steps carry no server queue figure; an unread one is missing, not broken
        if key in slo and (row.get(metric) is None or row[metric] > slo[key]):
            broken.append(metric)
    return [b for b in BREAK_ORDER if b in broken]


def knee_of(steps: Sequence[dict[str, Any]]) -> int | None:
    """Largest concurrency meeting the SLO, counting only up to the first step that breaks it."""
    knee = None
    for row in sorted(steps, key=lambda r: r["concurrency"]):
        if not row["meets_slo"]:
            break
        knee = row["concurrency"]
    return knee


def ramp_summary(steps: Sequence[dict[str, Any]], contract: int, max_step: int) -> dict[str, Any]:
    """Knee, headroom (knee / contract), the first step that broke and what it broke first."""
    knee = knee_of(steps)
    ordered = sorted(steps, key=lambda r: r["concurrency"])
    first_bad = next((r for r in ordered if not r["meets_slo"]), None)
    broke_on = first_bad["breaches"][0] if first_bad and first_bad.get("breaches") else None
    top = ordered[-1]["concurrency"] if ordered else None
    # A step whose metrics scrape failed and that broke nothing else is inconclusive: the knee stops there,
    # but nothing broke (never a breach, never a pass).
    unread = first_bad if first_bad is not None and not first_bad.get("breaches") and first_bad.get(
        "inconclusive") else None
    text = knee_text(knee, contract, broke_on, first_bad is None, top)
    if unread is not None:
        text = (f"inconclusive at concurrency {unread['concurrency']}: "
                + "; ".join(unread.get("missing_samples") or []))
    return {"knee": knee, "contract": contract, "headroom": round(knee / contract, 2) if knee else 0.0,
            "broke_at": first_bad["concurrency"] if first_bad and unread is None else None, "broke_on": broke_on,
            "bounded": first_bad is None, "top_step": top, "max_step": max_step,
            "inconclusive_at": unread["concurrency"] if unread is not None else None,
            "missing_samples": list(unread.get("missing_samples") or []) if unread is not None else [],
            "text": text}


def knee_text(knee: int | None, contract: int, broke_on: str | None, bounded: bool, top: int | None) -> str:
    head = f"knee {knee if knee is not None else 'none'}, contract {contract}"
    room = f", headroom {knee / contract:.2g}x" if knee else ""
    if bounded:
        return f"{head}{room} (>=: no limit broke up to the ramp bound {top})"
    return f"{head}{room}, broke on {broke_on}"


def judge_ramp(steps: Sequence[dict[str, Any]], summary: dict[str, Any], *, evidence: Sequence[str],
               verified: bool | None, request_timeout_s: float, max_preemptions: int) -> Finding:
    check = registry.get("capacity.ramp")
    contract = summary["contract"]
    observed = {**{k: summary[k] for k in ("knee", "contract", "headroom", "broke_at", "broke_on", "bounded",
                                           "top_step", "text")},
                "steps": [{k: s.get(k) for k in ("concurrency", "ok", "errors", "timeouts", "timed_out", "ttft_p95",
                                                 "e2e_p95", "queue_p95", "max_running", "max_waiting",
                                                 "queue_time_mean_s", "max_kv_usage", "kv_usage_by_engine",
                                                 "kv_saturated",
                                                 "kv_bound_samples", "preemptions", "peak_memory_bytes", "breaches",
                                                 "meets_slo", "inconclusive", "missing_samples")} for s in steps]}
    common = {"observed": observed, "evidence": evidence,
              "expected": f"SLO met up to the contracted concurrency {contract}",
              "rule": "knee = largest concurrency meeting the SLO (latency, queue) with no errors, no KV "
                      f"saturation and preemptions <= {max_preemptions}; the ramp goes past the contract"}
    if not any(s["concurrency"] == contract for s in steps):
        return check.inconclusive(reason="the ramp did not reach the contracted concurrency",
                                  action="add the contracted concurrency to load.ramp", **common)
    knee = summary["knee"]
    if knee is not None and knee >= contract:
        return check.passed(reason=summary["text"], **common)
    if summary.get("inconclusive_at") is not None:
        return check.inconclusive(reason=f"the ramp is {summary['text']}",
                                  action="make the server's metrics readable for the whole ramp (a failed scrape "
                                         "is neither a breach nor a pass) and re-run the load stage", **common)
    hung = "".join(f"; {s['timeouts']} request(s) hung at concurrency {s['concurrency']} (past "
                   f"{request_timeout_s:g} s): {', '.join(s['timed_out'])}" for s in steps if s.get("timeouts"))
    consequence = Consequence.LIMIT if verified else Consequence.EXPAND
    if knee is not None:
        return check.fail(consequence=consequence, reason=f"stable only up to concurrency {knee}: {summary['text']}"
                          f"{hung}", action=("cap --max-num-seqs / client concurrency at the verified limit; write "
                                             "it into config and alerts, owner and re-check date" if verified else
                                             "expand capacity or change topology: the limited run did not hold"),
                          **common)
    return check.fail(consequence=Consequence.EXPAND, reason=f"no step of the ramp meets the SLO: {summary['text']}"
                      f"{hung}", action="expand capacity or change topology; adjust limits first", **common)


# --- capacity.verified_limit ----------------------------------------------------------------------

def propose_limits(readout: KvReadout, knee: int | None, concurrency: int, context_tokens: int,
                   max_output_tokens: int, min_context_tokens: int) -> list[dict[str, Any]]:
    """Admissible settings to verify, in order: fewer sessions at the contracted context, then the
    contracted sessions at a shorter context. Empty when the contract holds."""
    kv_conc = max_concurrency_at(readout.tokens, context_tokens, max_output_tokens) if readout.tokens else None
    holds_kv = kv_conc is None or kv_conc >= concurrency
    holds_ramp = knee is not None and knee >= concurrency
    if holds_kv and holds_ramp:
        return []
    out: list[dict[str, Any]] = []
    conc = min(c for c in (knee if knee is not None else 0, kv_conc if kv_conc is not None else concurrency))
    if 1 <= conc < concurrency:
        out.append({"kind": "concurrency", "max_num_seqs": conc, "client_concurrency": conc,
                    "context_tokens": context_tokens})
    if readout.tokens:
        ctx = min(context_tokens, context_limit_at(readout.tokens, concurrency, max_output_tokens,
                                                   readout.block_size))
        if min_context_tokens <= ctx < context_tokens:
            out.append({"kind": "context", "max_num_seqs": concurrency, "client_concurrency": concurrency,
                        "context_tokens": ctx, "max_model_len": ctx + max_output_tokens})
    return out


def limit_flags(setting: dict[str, Any]) -> list[str]:
    """The serving flags of a proposed limit: what the config snippet says and what a relaunch adds."""
    flags = ["--max-num-seqs", str(setting["max_num_seqs"])]
    if setting.get("max_model_len"):
        flags += ["--max-model-len", str(setting["max_model_len"])]
    return flags


def judge_verified_limit(proposed: Sequence[dict[str, Any]], attempts: Sequence[dict[str, Any]], *,
                         evidence: Sequence[str]) -> tuple[Finding, dict[str, Any]]:
    """The first attempted limit that held is the recommendation; every admissible setting run and
    failed -> expand_capacity. A setting whose server could not be relaunched with its flags was not
    tested: with no limit held, that leaves the question open (inconclusive), never a verdict."""
    check = registry.get("capacity.verified_limit")
    if not proposed:
        return check.not_applicable(None, "the contract holds: no limit to verify"), {}
    held = next((a for a in attempts if a["held"]), None)
    observed = {"proposed": list(proposed), "attempts": [dict(a) for a in attempts]}
    rule = "a proposed limit is re-run at that limit in the same run; it is recommended only if it holds"
    if held:
        limit = {k: v for k, v in held["setting"].items() if k != "kind"}
        limit["reason"] = (f"verified: {held['setting']['kind']} limit held at concurrency "
                           f"{held['setting']['client_concurrency']}, context {held['setting']['context_tokens']}"
                           + (f" ({held['mode']})" if held.get("mode") else ""))
        limit["serving_flags"] = " ".join(limit_flags(held["setting"]))  # the config snippet; alerts: max_num_seqs
        return check.passed(observed=observed, expected="a limited run that holds", evidence=evidence, rule=rule,
                            reason=limit["reason"]), limit
    if not attempts:
        return check.inconclusive(observed=observed, expected="a limited run", evidence=evidence, rule=rule,
                                  reason="no limited run could be made"), {}
    untested = [a for a in attempts if a.get("relaunch_error")]
    if untested:
        return check.inconclusive(
            observed=observed, expected="a limited run", evidence=evidence, rule=rule,
            reason="; ".join(f"{a['setting']['kind']} limit not tested: the server did not come back with "
                             f"{' '.join(limit_flags(a['setting']))}: {a['relaunch_error']}" for a in untested),
            action="read the relaunch's log (the limit's flags may be refused by this vLLM), fix and re-run"), {}
    unread = [a for a in attempts if a.get("missing_samples") and not a.get("breaches")]
    if unread:   # a failed scrape decides nothing: the limit is neither held nor broken
        return check.inconclusive(
            observed=observed, expected="a limited run", evidence=evidence, rule=rule,
            reason="; ".join(f"{a['setting']['kind']} limit not judged: " + "; ".join(a["missing_samples"])
                             for a in unread),
            action="make the server's metrics readable during the limited run and re-run the load stage"), {}
    broke = "; ".join(f"{a['setting']['kind']} (concurrency {a['setting']['client_concurrency']}, context "
                      f"{a['setting']['context_tokens']}) broke on {', '.join(a['breaches']) or 'errors'}"
                      for a in attempts)
    return check.fail(observed=observed, expected="a limited run that holds", evidence=evidence, rule=rule,
                      consequence=Consequence.EXPAND,
                      reason=f"{len(attempts)} admissible setting(s) failed: {broke}",
                      action="expand capacity: limits do not hold either; if adding GPUs does not move the "
                             "bottleneck, change the topology (split prefill/decode, another interconnect)"), {}


# --- capacity.context_contract ------------------------------------------------------------------

_CONTEXT_REJECTION = re.compile(r"maximum context length|max_model_len|context length|input_tokens|"
                                r"too long|exceeds|longer than", re.IGNORECASE)
_NOT_A_VERDICT = {401: "unauthorised (API key)", 403: "forbidden", 404: "not found (URL or model name)",
                  429: "rate limited (a gateway or quota, not the context)"}


def judge_context_contract(at: dict[str, Any], over: dict[str, Any], healthy_after: bool, context_tokens: int,
                           max_output_tokens: int, *, evidence: Sequence[str], served_max_model_len: int | None = None,
                           over_served: dict[str, Any] | None = None) -> Finding:
    """At the contracted context a request succeeds; just over it, only a context-length rejection passes, the
    server healthy after. Where the server serves more than the contract (``served_max_model_len``, from the
    server itself), the limit that must hold is the served one: a request over it (``over_served``) is rejected
    for its length, and an over-contract request it serves is a warning that nothing enforces the contract
    (issue 31, item 6), not a failure."""
    check = registry.get("capacity.context_contract")
    limit = tokens_per_session(context_tokens, max_output_tokens)
    wide = served_max_model_len is not None and served_max_model_len > limit
    observed = {"at_contract": at, "over_contract": over, "healthy_after": healthy_after,
                "contract_window_tokens": limit, "served_max_model_len": served_max_model_len}
    if wide:
        observed["over_served"] = over_served
    expected = (f"a request of {limit} tokens succeeds; one over the served max_model_len {served_max_model_len} is "
                "rejected for its length (4xx); one over the contract is rejected or warned as unenforced"
                if wide else f"a request of {limit} tokens succeeds; one just over is rejected for its length (4xx)")
    common = {"observed": observed, "evidence": evidence, "expected": expected}
    if not healthy_after:
        return check.fail(reason="the server is not healthy after the over-context request" + ("s" if wide else ""),
                          consequence=Consequence.EXPAND,
                          action="an over-contract request must be rejected before the GPUs are exhausted: set "
                                 f"--max-model-len {limit}", **common)
    if wide:
        return _judge_wide_contract(check, at, over, over_served or {}, limit, int(served_max_model_len or 0), common)
    status = over.get("http_status") or 0
    if status in _NOT_A_VERDICT:
        return check.inconclusive(reason=f"over-contract request answered HTTP {status}: {_NOT_A_VERDICT[status]}",
                                  action="fix access (key, URL, model, rate limit) and re-run", **common)
    if 200 <= status < 300:
        return check.fail(reason=f"a request over the contracted context ({over.get('prompt_tokens')} prompt + "
                                 f"{over.get('max_tokens')} output tokens) was accepted", consequence=Consequence.LIMIT,
                          action=f"enforce the contract: --max-model-len {limit} (or reject at the gateway)",
                          **common)
    if not _length_rejection(over):
        return check.fail(reason=f"over-contract request answered HTTP {status}, not a context-length rejection",
                          consequence=Consequence.EXPAND, action=f"set --max-model-len {limit}; a 5xx or a lost "
                          "connection here means the server was exhausted", **common)
    return _judge_at_contract(check, at, limit, common) or check.passed(**common)


def _length_rejection(answer: dict[str, Any]) -> bool:
    status = answer.get("http_status") or 0
    return 400 <= status < 500 and bool(_CONTEXT_REJECTION.search(str(answer.get("body") or "")))


def _judge_at_contract(check: registry.Check, at: dict[str, Any], limit: int,
                       common: dict[str, Any]) -> Finding | None:
    if at.get("http_status") == 200:
        return None
    if at.get("http_status") in _NOT_A_VERDICT:
        return check.inconclusive(reason=f"at-contract request answered HTTP {at.get('http_status')}",
                                  action="fix access and re-run", **common)
    return check.fail(reason=f"a request at the contracted context failed: HTTP {at.get('http_status')}",
                      consequence=Consequence.EXPAND, action=f"raise --max-model-len to {limit} or lower the "
                      "contracted context", **common)


def _judge_wide_contract(check: registry.Check, at: dict[str, Any], over: dict[str, Any],
                         over_served: dict[str, Any], limit: int, served: int, common: dict[str, Any]) -> Finding:
    """The server serves ``served`` > the contract's ``limit`` tokens (a recipe --max-model-len above the site
    contract): over the served limit a request is rejected for its length; over the contract it may be served."""
    for name, answer in (("over-served", over_served), ("over-contract", over), ("at-contract", at)):
        status = answer.get("http_status") or 0
        if status in _NOT_A_VERDICT:
            return check.inconclusive(reason=f"{name} request answered HTTP {status}: {_NOT_A_VERDICT[status]}",
                                      action="fix access (key, URL, model, rate limit) and re-run", **common)
    if not over_served:
        return check.inconclusive(reason=f"no request over the served max_model_len {served} was sent",
                                  action="re-run the load probe (its context stage sends one)", **common)
    counted = over_served.get("prompt_tokens")
    if not isinstance(counted, int) or counted <= served:
        return check.inconclusive(reason=f"the request meant to exceed the served max_model_len {served} counted "
                                         f"{counted} prompt tokens (not counted over it by /tokenize)",
                                  action="give the server /tokenize (or fix the prompt builder) and re-run", **common)
    status = over_served.get("http_status") or 0
    if 200 <= status < 300:
        return check.fail(reason=f"a request over the served max_model_len {served} "
                                 f"({over_served.get('prompt_tokens')} prompt tokens) was accepted",
                          consequence=Consequence.LIMIT, action=f"the server does not enforce its own limit: launch "
                          f"with --max-model-len {limit} or reject at the gateway", **common)
    if not _length_rejection(over_served):
        return check.fail(reason=f"a request over the served max_model_len {served} answered HTTP {status}, not a "
                                 "context-length rejection", consequence=Consequence.EXPAND,
                          action=f"set --max-model-len {limit}; a 5xx or a lost connection here means the server was "
                                 "exhausted", **common)
    failed_at = _judge_at_contract(check, at, limit, common)
    if failed_at is not None:
        return failed_at
    over_status = over.get("http_status") or 0
    if 200 <= over_status < 300:
        return check.warn(reason=f"nothing enforces the contract: a request over it ({over.get('prompt_tokens')} "
                                 f"prompt + {over.get('max_tokens')} output tokens) was served, the server accepting "
                                 f"up to {served} tokens (its max_model_len) and rejecting more",
                          action=f"enforce the contract of {limit} tokens with --max-model-len {limit} or a gateway "
                                 "limit on prompt + max_tokens; an over-contract request is otherwise served at "
                                 "capacity nobody measured", **common)
    if not _length_rejection(over):
        return check.fail(reason=f"over-contract request answered HTTP {over_status}, not a context-length rejection",
                          consequence=Consequence.EXPAND, action=f"set --max-model-len {limit}; a 5xx or a lost "
                          "connection here means the server was exhausted", **common)
    return check.passed(**common)


# --- capacity.mixed / capacity.soak -------------------------------------------------------------

def judge_mixed(rows: Sequence[dict[str, Any]], contract: int, *, evidence: Sequence[str]) -> Finding:
    """The repeated requests' hit ratio over the windows (measured on a lone repeated request after each
    window) must hold, the queue must not grow window over window, no errors."""
    check = registry.get("capacity.mixed")
    errors = sum(r["errors"] for r in rows)
    ratios = [r["repeated_hit_ratio"] for r in rows if r.get("repeated_hit_ratio") is not None]
    waits = [r["queue_time_mean_s"] for r in rows if r.get("queue_time_mean_s") is not None]
    evicted = len(ratios) >= 2 and ratios[-1] < 0.5 * max(ratios[:-1])
    no_reuse = bool(ratios) and max(ratios) == 0
    queue_grows = len(waits) >= 3 and all(b > a * 1.5 for a, b in zip(waits, waits[1:], strict=False)) \
        and waits[-1] > 0.5
    bad = [text for text, hit in (("errors", errors), ("shared prefix evicted by long sessions", evicted),
                                  ("repeated requests never hit the cache", no_reuse),
                                  ("queue time grows window over window", queue_grows)) if hit]
    common = {"observed": {"windows": list(rows), "repeated_hit_ratios": ratios, "queue_time_mean_s": waits},
              "evidence": evidence, "expected": "no errors; the repeated requests' hit ratio holds over time; "
              "queue time does not grow window over window"}
    if bad:
        return check.fail(reason="; ".join(bad), **common)
    if len(ratios) < 2:
        return check.inconclusive(reason="fewer than two measured hit ratios of the repeated requests "
                                  "(prefix-cache counters absent?)", **common)
    return check.passed(**common)


# The server's own memory: a local pid's RSS, the RSS its /metrics exports, or its container's cgroup (sampled on
# the node, judged after the probes: probes/after.py). GPU memory alone never stands in for it.
MEMORY_UNSEEN = ("memory growth (under 4 memory samples of the server's own memory: no local pid, no "
                 "process_resident_memory_bytes in its /metrics (several API servers export none), no container "
                 "cgroup read on its node)")


def judge_soak(obs: dict[str, Any], memory_growth_limit_pct: float, max_preemptions: int, *,
               evidence: Sequence[str], configuration: dict[str, Any], request_timeout_s: float) -> Finding:
    """Errors, hangs, memory growth, restarts, preemptions and communication errors over the window."""
    check = registry.get("capacity.soak")
    bad = []
    if not obs["requests"]:
        bad.append("no request completed")
    if obs["errors"]:
        bad.append(f"{obs['errors']} error(s)")
    if obs.get("timeouts"):
        bad.append(f"{obs['timeouts']} request(s) hung past {request_timeout_s:g} s: " + ", ".join(obs["timed_out"]))
    growth = obs.get("memory_growth_pct")
    if growth is not None and growth > memory_growth_limit_pct:
        bad.append(f"memory grows {growth:.1f}%" + (f" ({obs['memory_source']})" if obs.get("memory_source") else ""))
    if obs.get("restarts"):
        bad.append("server restarted: " + "; ".join(obs["restarts"]))
    if obs.get("preemptions") is not None and obs["preemptions"] > max_preemptions:
        bad.append(f"{obs['preemptions']:g} preemption(s)")
    if obs.get("comm_errors"):
        bad.append(f"{len(obs['comm_errors'])} communication error line(s) in the log")
    common = {"observed": obs, "evidence": evidence, "configuration": configuration,
              "expected": f"no errors, hangs, restarts, communication errors; preemptions <= {max_preemptions}; "
                          f"memory growth <= {memory_growth_limit_pct}%",
              "rule": "a steady memory rise, a restart or communication errors block release",
              "action": "look for leaks, fragmentation, eviction and link errors; re-run the soak for the agreed time"}
    if bad:
        return check.fail(reason="; ".join(bad), **common)
    unknown = [what for what, seen in ((MEMORY_UNSEEN, growth is not None),
                                       ("preemptions (counter absent)", obs.get("preemptions") is not None),
                                       ("restarts (no process start time)", obs.get("start_times_seen")),
                                       ("communication errors (the server log did not grow over the window)",
                                        obs.get("log_observed"))) if not seen]
    obs["not_observed"] = unknown
    if unknown:
        return check.inconclusive(reason="not observed: " + "; ".join(unknown), **common)
    return check.passed(**common)


# --- the OOM / crash record -------------------------------------------------------------------

OOM_STAGES = ("load", "long_prefill", "decode", "concurrency", "kv_growth")
OOM_ACTIONS = {
    "load": "at model load with a compatible chain: check the weight distribution and the parallel layout, then "
            "the topology (expand_capacity); never prefix caching",
    "long_prefill": "one long prefill: check --max-model-len against the contracted context, the cache format "
                    "(--kv-cache-dtype) and --max-num-batched-tokens (chunked prefill); then one profile's capacity",
    "decode": "during decode: KV growth of running sequences; lower max output or --max-num-seqs, check "
              "--gpu-memory-utilization headroom",
    "concurrency": "under concurrency: adjust limits first (--max-num-seqs, client concurrency, context) and "
                   "re-verify; expand only when the adjusted profile still fails",
    "kv_growth": "KV growth over time: context, concurrency, cache retention and prefill/decode balance; adjust "
                 "limits first; if adding GPUs does not move the bottleneck, change the topology (split "
                 "prefill/decode, another interconnect), not the GPU count",
}


def kv_trend(samples: Sequence[dict[str, Any]]) -> str:
    values = [s["kv_usage"] for s in samples if s.get("kv_usage") is not None]
    if len(values) < 2:
        return "unknown"
    if values[-1] >= KV_FULL and values[0] < KV_FULL:
        return "rising to full"
    if values[-1] - values[0] > 0.1:
        return "rising"
    return "flat" if abs(values[-1] - values[0]) <= 0.1 else "falling"


def classify_oom_stage(model_loaded: bool, probe_stage: str, concurrency: int,
                       in_flight: Sequence[dict[str, Any]], trend: str) -> tuple[str, str]:
    """The stage of an OOM or crash (docs/acceptance.md: load, long prefill, decode, concurrency, KV growth
    over time), with the evidence that placed it there."""
    if not model_loaded:
        return "load", "the model never finished loading (no ready line, no answered request)"
    if probe_stage.startswith(("soak", "mixed")) and trend.startswith("rising"):
        return "kv_growth", f"stage {probe_stage} under steady load with KV usage {trend}"
    prefill = [r for r in in_flight if not r.get("first_token")]
    if concurrency <= 1:
        if prefill:
            longest = max((r.get("prompt_tokens") or 0) for r in prefill)
            return "long_prefill", f"one request in prefill (no first token yet; prompt ~{longest} tokens)"
        return "decode", "one request in decode (first token received, not finished)"
    if trend.startswith("rising"):
        return "kv_growth", f"{concurrency} concurrent requests with KV usage {trend}"
    return "concurrency", f"{concurrency} concurrent requests in flight ({len(prefill)} in prefill)"


def oom_action(stage: str) -> str:
    return OOM_ACTIONS.get(stage, OOM_ACTIONS["concurrency"])


OOM_RECORD_FIELDS = (
    "time", "kind", "probe_stage", "stage", "stage_evidence", "action", "model_loaded", "memory_timeline",
    "prompt_tokens", "max_output_tokens", "request_duration_s", "running", "waiting", "prefix_caching",
    "kv_offload", "cross_node_transfer", "max_model_len", "gpu_memory_utilization", "max_num_batched_tokens",
    "parallel_layout", "nodes", "interconnect", "log_tail", "oom_lines", "process_state")


def record_gaps(record: dict[str, Any]) -> list[str]:
    """Fields of the OOM record that are absent (None is stated, absence is a gap)."""
    return [f for f in OOM_RECORD_FIELDS if f not in record]


def stage_peaks(rows: Sequence[dict[str, Any]], ready_at: float | None,
                bounds: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Peak memory per series (per GPU) by stage: model load (from the sampler's start, before the launch,
    to the serve stage right after ready), then each load-probe stage window (ramp steps one by one)."""
    out: dict[str, dict[str, int]] = {}

    def peak(start: float | None, end: float | None) -> dict[str, int]:
        got: dict[str, int] = {}
        for r in rows:
            if (start is None or r["t"] >= start) and (end is None or r["t"] <= end):
                got[r["series"]] = max(got.get(r["series"], 0), r["bytes"])
        return got

    if ready_at is not None:
        out["model_load"] = peak(None, ready_at)
    for b in bounds:
        got = peak(b["start"], b["end"])
        if got:
            merged = out.setdefault(b["stage"], {})
            for series, value in got.items():
                merged[series] = max(merged.get(series, 0), value)
    return {k: v for k, v in out.items() if v}
