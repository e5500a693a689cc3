"""What a person reads instead of JSON: the first screen, observed values as tables, the contract tested.

Pure functions over a (possibly partial) report dict; render_html.py and render_md.py show them.
Raw values stay in report.json and one click away (folded) in report.html.
"""

from __future__ import annotations

import json
from typing import Any

from ..core.stage_details import AgentDetails, ServeDetails, StageDetails, Workload
from ..rules.registry import warn_blocks

BLOCKING = ("fail", "warn")
UNPROVEN = ("missing", "inconclusive")
MAX_TABLE_ROWS = 12
MAX_TABLE_COLS = 8


def _fid(f: dict[str, Any]) -> str:
    return f"{f.get('check')}@{f['host']}" if f.get("host") else str(f.get("check"))


def scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def raw_json(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=str, ensure_ascii=False)


# --- observed values ------------------------------------------------------------------------------

def observed_view(f: dict[str, Any]) -> dict[str, Any]:
    """One finding's observed value for people: text, key/value pairs or a small table; raw JSON folded."""
    value = f.get("observed")
    check = str(f.get("check", ""))
    if scalar(value):
        return {"kind": "text", "value": value}
    special = SPECIAL.get(check)
    if special:
        view = special(value)
        if view:
            return {**view, "raw": raw_json(value)}
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        return {**table_of(value), "raw": raw_json(value)}
    if isinstance(value, dict):
        return {**pairs_of(value), "raw": raw_json(value)}
    if isinstance(value, list) and all(scalar(x) for x in value):
        return {"kind": "list", "items": value[:MAX_TABLE_ROWS], "more": max(0, len(value) - MAX_TABLE_ROWS),
                "raw": raw_json(value) if len(value) > MAX_TABLE_ROWS else None}
    return {"kind": "text", "value": "structured value", "raw": raw_json(value)}


def summarise(value: Any) -> Any:
    """A nested value in one cell: lists of scalars joined, small dicts as k=v, the rest counted."""
    if scalar(value):
        return value
    if isinstance(value, list):
        if all(scalar(x) for x in value):
            text = ", ".join("—" if x is None else str(x) for x in value[:6])
            return text + (f", … (+{len(value) - 6})" if len(value) > 6 else "") if value else "none"
        return f"{len(value)} items"
    if isinstance(value, dict):
        simple = [(k, v) for k, v in value.items() if scalar(v)]
        if len(simple) == len(value) and len(value) <= 8:
            return ", ".join(f"{k}={round(v, 4) if isinstance(v, float) else v}" for k, v in simple) or "none"
        return f"{len(value)} fields"
    return str(value)


def pairs_of(value: dict[str, Any]) -> dict[str, Any]:
    pairs = [(str(k), summarise(v)) for k, v in list(value.items())[:MAX_TABLE_ROWS]]
    return {"kind": "pairs", "pairs": pairs, "more": max(0, len(value) - MAX_TABLE_ROWS)}


def table_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cols: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k not in cols and (scalar(v) or isinstance(v, list)):
                cols.append(k)
    cols = cols[:MAX_TABLE_COLS]
    body = [[summarise(r.get(c)) for c in cols] for r in rows[:MAX_TABLE_ROWS]]
    return {"kind": "table", "cols": cols, "rows": body, "more": max(0, len(rows) - MAX_TABLE_ROWS)}


def _startup(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    serve = ServeDetails.read(value)
    pairs = startup_pairs(serve)
    warnings = [str(w) for w in serve.warnings]
    return {"kind": "pairs", "pairs": pairs, "more": 0, "folded": warnings,
            "folded_title": f"{len(warnings)} warnings in the startup log"}


def startup_pairs(serve: ServeDetails) -> list[tuple[str, Any]]:
    sizes = {"tp": serve.tp_size, "pp": serve.pp_size, "dp": serve.dp_size}
    layout = "  ".join(f"{k.upper()} {size}" for k, size in sizes.items() if size)
    kv, conc = serve.kv_cache_tokens, serve.max_concurrency
    pairs: list[tuple[str, Any]] = [
        ("vLLM version", serve.version),
        ("parallel layout", (layout + f" (world {serve.world_size})") if layout else serve.world_size),
        ("communication backend", serve.dist_backend or serve.nccl_version),
        ("KV cache", f"{kv:,} tokens, max concurrency {conc:g}"
         + (f" at {serve.max_concurrency_len} tokens" if serve.max_concurrency_len else "")
         if isinstance(kv, int) and isinstance(conc, int | float) else kv),
        ("warnings", len(serve.warnings)),
        ("errors / fallbacks / NCCL errors",
         f"{len(serve.errors)} / {len(serve.fallbacks)} / {len(serve.nccl_errors)}"),
    ]
    return [(k, v) for k, v in pairs if v is not None]


def _ramp(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("steps"), list):
        return None
    view = table_of([s for s in value["steps"] if isinstance(s, dict)])
    view["caption"] = f"knee {value.get('knee')}, contract {value.get('contract')}: full table in Capacity"
    return view


SPECIAL = {"compat.startup_log": _startup, "capacity.ramp": _ramp}


# --- first screen ---------------------------------------------------------------------------------

def blockers(report: dict[str, Any]) -> list[dict[str, Any]]:
    """What keeps this run from `release`: failing and warning findings, each with action and owner."""
    out = []
    for f in report.get("findings") or []:
        if f.get("status") == "warn" and not warn_blocks(str(f.get("check"))):
            continue                     # recorded, but does not block release (rules/catalog.py, warn_blocks)
        if f.get("status") in BLOCKING:
            out.append({"id": _fid(f), "status": f.get("status"), "title": f.get("title"),
                        "observed": short(f.get("observed")), "action": f.get("action") or f.get("rule"),
                        "owner": f.get("owner"), "recheck": f.get("recheck_date"),
                        "consequence": str(f.get("consequence") or "").replace("_", " ")})
    out.sort(key=lambda b: (b["status"] != "fail", b["id"]))
    return out


def short(value: Any, limit: int = 140) -> str:
    if value is None:
        return "—"
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unproven(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Missing or inconclusive evidence: what this run could not prove, though it should have."""
    errors = report.get("unreachable_errors") or {}
    hosts = [{"id": host, "status": "missing", "reason": "host unreachable: none of its checks ran"
              + (f" ({errors[host]})" if errors.get(host) else "")}
             for host in report.get("unreachable_hosts") or []]
    return hosts + [{"id": _fid(f), "status": f.get("status"), "reason": f.get("reason") or short(f.get("observed"))}
                    for f in report.get("findings") or [] if f.get("status") in UNPROVEN]


def not_provable(report: dict[str, Any]) -> list[dict[str, Any]]:
    """not_applicable findings grouped by their reason: what cannot be proved on this deployment."""
    groups: dict[str, dict[str, Any]] = {}
    for f in report.get("findings") or []:
        if f.get("status") != "not_applicable":
            continue
        reason = str(f.get("reason") or "not applicable")
        group = groups.setdefault(reason, {"reason": reason, "checks": {}})
        group["checks"].setdefault(str(f.get("check")), 0)
        group["checks"][str(f.get("check"))] += 1
    out = []
    for group in groups.values():
        checks = [f"{c} ×{n}" if n > 1 else c for c, n in sorted(group["checks"].items())]
        out.append({"reason": group["reason"], "checks": checks, "count": sum(group["checks"].values())})
    return sorted(out, key=lambda g: -g["count"])


def no_gpu(report: dict[str, Any]) -> bool:
    """The CPU lab (or any deployment whose profile has no accelerator): every GPU check is not provable."""
    return any("accelerator is none" in str(f.get("reason") or "") for f in report.get("findings") or [])


def _close_enough(sent: int | float | None, contracted: int | float) -> str:
    """Why a prompt a few tokens off the contract counts as the contracted context: the prompt is built to the
    contracted length and the server's tokenizer and chat template decide its exact count; at least 85 % counts."""
    if sent is None or sent == contracted:
        return ""
    return (f"{sent} of {contracted} ({sent / contracted:.0%}): built to the contracted length, counted by the "
            "server's tokenizer and chat template; at least 85 % counts as the contracted context")


def contract_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The contract the probes actually tested beside the profile's, each difference flagged."""
    contract = report.get("contract") if isinstance(report.get("contract"), dict) else {}
    stages = StageDetails.of(report)
    load, serve = stages.load, stages.serve
    work = load.workload or Workload()
    steps = [s for s in load.steps if isinstance(s, dict) and isinstance(s.get("concurrency"), int | float)]
    rows: list[dict[str, Any]] = []
    want_c = contract.get("concurrency")
    top = max((s["concurrency"] for s in steps), default=None)
    if want_c is not None or top is not None:
        ok = None if top is None or want_c is None else top >= want_c and load.contract_concurrency in (None, want_c)
        rows.append({"item": "concurrent sessions", "profile": want_c,
                     "tested": f"ramp up to {top}" if top is not None else "not run", "ok": ok,
                     "note": "" if ok is not False else "the ramp did not reach the contracted concurrency"})
    ctx = contract.get("context_tokens")
    long_tokens = next((f.get("observed", {}).get("prompt_tokens") for f in report.get("findings") or []
                        if f.get("check") == "capacity.long_prompt" and isinstance(f.get("observed"), dict)), None)
    if ctx is not None:
        ok_long = None if long_tokens is None else long_tokens >= 0.85 * ctx
        rows.append({"item": "context (one long prompt)", "profile": f"{ctx} tokens",
                     "tested": f"{long_tokens} prompt tokens sent" if long_tokens is not None else None, "ok": ok_long,
                     "why": _close_enough(long_tokens, ctx) if ok_long else "",
                     "note": "" if ok_long is not False else "the long prompt stayed below the contracted context"})
        ramp_prompt = work.ramp_context_tokens if work.has("ramp_context_tokens") else work.prompt_tokens
        if ramp_prompt is not None:
            ok_ramp = ramp_prompt >= 0.85 * ctx
            rows.append({"item": "context per ramp session", "profile": ctx, "tested": ramp_prompt, "ok": ok_ramp,
                         "note": "" if ok_ramp else "ramp sessions were shorter than the contracted context: the "
                                                    "ramp does not load the KV cache as the contract would"})
    out_tokens = contract.get("max_output_tokens")
    if out_tokens is not None and work.output_tokens is not None:
        ok_out = work.output_tokens >= out_tokens
        rows.append({"item": "output tokens per request", "profile": out_tokens, "tested": work.output_tokens,
                     "ok": ok_out, "note": "" if ok_out else "shorter answers than the contract's maximum"})
    served = serve.max_model_len
    if ctx is not None and served is not None:
        need = ctx + (out_tokens or 0)
        rows.append({"item": "served max_model_len", "profile": f">= {need}", "tested": served, "ok": served >= need,
                     "note": "" if served >= need else "the server cannot hold the contracted context"})
    if work.context_tokens is not None and ctx is not None and work.context_tokens != ctx:
        rows.append({"item": "probe's contract context", "profile": ctx, "tested": work.context_tokens, "ok": False,
                     "note": "the load probe ran with an overridden contract"})
    return rows


def startup_view(report: dict[str, Any]) -> dict[str, Any] | None:
    serve = StageDetails.of(report).serve
    if not any(serve.has(k) for k in ("version", "warnings", "kv_cache_tokens")):
        return None
    return {"pairs": startup_pairs(serve), "warnings": [str(w) for w in serve.warnings],
            "errors": [str(e) for e in serve.errors + serve.fallbacks + serve.nccl_errors]}


def agent_case_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per request the agent probe sent: finish reason, calls, valid, layer at fault, evidence."""
    agent = StageDetails.of(report).agent
    root = str(agent.evidence_root or "").rstrip("/")
    findings = [f for f in report.get("findings") or [] if str(f.get("check", "")).startswith("agent.")]
    rows = []
    for ex in agent.exchanges:
        if not isinstance(ex, dict):
            continue
        path = f"{root}/{ex.get('evidence')}" if root and ex.get("evidence") else ex.get("evidence")
        judged = [f for f in findings if path in (f.get("evidence") or [])]
        layer = next((f.get("layer") for f in judged if f.get("layer")), None)
        rank = {"fail": 0, "missing": 1, "inconclusive": 2, "warn": 3, "pass": 4, "not_applicable": 5}
        status = min((str(f.get("status")) for f in judged), key=lambda s: rank.get(s, 9), default=None)
        rows.append({"case": ex.get("case"), "finish_reason": ex.get("finish_reason"), "calls": ex.get("calls"),
                     "names": ", ".join(ex.get("names") or []), "valid": ex.get("valid"), "layer": layer,
                     "status": status, "checks": sorted({str(f.get("check")) for f in judged}),
                     "http_status": ex.get("http_status"), "timed_out": ex.get("timed_out"), "evidence": path})
    return rows


CASE_CLASSES = ("single", "parallel", "multi_turn", "irrelevance", "structured")


def agent_class_rows(agent: AgentDetails) -> list[dict[str, Any]]:
    """Per class of the case set: cases, defects and the defect rate's one-sided 95 % upper bound, served alone
    and under load (when measured), and the cases that chose otherwise than expected."""
    rates = agent.rates
    alone = rates.get("classes") if isinstance(rates.get("classes"), dict) else {}
    loaded = ((rates.get("under_load") or {}).get("classes") or {}) if isinstance(rates.get("under_load"), dict) \
        else {}
    rows = []
    for cls in [c for c in CASE_CLASSES if c in alone] + sorted(set(alone) - set(CASE_CLASSES)):
        a, b = alone.get(cls) or {}, loaded.get(cls) or {}
        rows.append({"class": cls, "cases": a.get("cases"), "defects": _defects(a), "rate": a.get("defect_rate"),
                     "bound": a.get("upper_95"), "misses": a.get("misses"), "abstained": a.get("abstained"),
                     "failed": a.get("failed") or [], "load_cases": b.get("cases"), "load_defects": _defects(b),
                     "load_rate": b.get("defect_rate"), "load_bound": b.get("upper_95"),
                     "load_failed": b.get("failed") or []})
    return rows


def _defects(row: dict[str, Any]) -> int | None:
    cases, ok = row.get("cases"), row.get("ok")
    return cases - ok if isinstance(cases, int) and isinstance(ok, int) else None
