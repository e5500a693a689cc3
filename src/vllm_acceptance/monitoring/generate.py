"""Monitoring generated from the accepted run (SPEC "After release").

Pure functions of report.json and the profile:

    derive_thresholds(report, profile)   -> {key: Threshold}   every value with its source
    generate_rules(report, profile)      -> a Prometheus rule-file dict (recording + alerting rules)
    generate_promtool_tests(...)         -> a `promtool test rules` file for those rules (both name forms)
    generate_dashboard(report, profile)  -> a Grafana dashboard dict (current vLLM metric names)
    rollback_triggers(report, profile)   -> the rollback triggers, concrete: signal, alert, log pattern
    monitoring_summary(report, profile)  -> what report.json carries under "monitoring"
    write_monitoring(run_dir, report, profile) -> files written under run_dir/monitoring/

Thresholds come from the accepted figures of this run (the load step at the accepted concurrency,
the hot-request prefix hit ratio) and from this profile's contract: never from another model.

Metric names: vLLM exports `vllm:x`; prometheus_client >= 0.23 shows the same family as `vllm_x`
when Prometheus negotiates OpenMetrics. Every query therefore joins both forms with `or` after
aggregating (aggregation drops the name, so a window that holds both forms cannot make `rate()`
fail on duplicate label sets). OOM kills and NCCL errors have no vLLM metric: they are log-based,
said so in the annotations, and named with their log patterns in the rollback triggers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ..core.evidence import atomic_write
from ..core.profile import Profile
from ..parsers.startup_log import _NCCL_ERROR, _OOM
from ..verdict import ROLLBACK_TRIGGERS

FORMS = ("vllm:", "vllm_")
AGG = "job, instance, model_name"
ACCEPTED_VERDICTS = ("release", "limited_observation")
RULES_FILE = "vllm-acceptance.rules.yml"
DASHBOARD_FILE = "dashboard.json"
TESTS_FILE = "promtool-tests.yml"
SUMMARY_FILE = "monitoring.json"
KV_CEILING = 0.95          # above this vLLM starts preempting whatever was accepted
KV_HEADROOM = 0.10         # an accepted peak near zero still leaves room for ordinary variation
DEFAULT_MARGIN = 1.5       # latency drift allowed over the accepted p95 before a warning
DEFAULT_KV_MARGIN = 1.25
HIT_RATIO_FLOOR_FACTOR = 0.5
HIT_RATIO_COLLAPSE_FACTOR = 0.5


@dataclass(frozen=True)
class Threshold:
    key: str
    value: float
    source: str
    unit: str = ""


# ----------------------------------------------------------------------------------------------
# Accepted figures


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def accepted_slo(report: dict[str, Any], profile: Profile) -> dict[str, float]:
    """The profile's contracted SLO, overridden by the SLO the run's limits state (limited observation)."""
    slo = {k: float(v) for k, v in (profile.get("contract.slo", {}) or {}).items() if _num(v) is not None}
    limits_slo = (report.get("limits") or {}).get("slo") or {}
    slo.update({k: float(v) for k, v in limits_slo.items() if _num(v) is not None})
    return slo


def accepted_concurrency(report: dict[str, Any], profile: Profile) -> tuple[int | None, str]:
    """The concurrency traffic was accepted at: the run's limit when it set one, else the contract."""
    limits = report.get("limits") or {}
    for key in ("client_concurrency", "max_num_seqs"):
        if _num(limits.get(key)) is not None:
            return int(limits[key]), f"report limits.{key}"
    load = (report.get("stages") or {}).get("load") or {}
    if _num(load.get("contract_concurrency")) is not None:
        return int(load["contract_concurrency"]), "stages.load.contract_concurrency"
    if _num(profile.get("contract.concurrency")) is not None:
        return int(profile.get("contract.concurrency")), "profile contract.concurrency"
    return None, "no contracted concurrency"


def accepted_step(report: dict[str, Any], concurrency: int | None) -> dict[str, Any] | None:
    """The ramp step traffic was accepted at: the largest step <= the accepted concurrency that met the SLO."""
    steps = ((report.get("stages") or {}).get("load") or {}).get("steps") or []
    good = [s for s in steps if isinstance(s, dict) and s.get("meets_slo") and _num(s.get("concurrency")) is not None
            and (concurrency is None or s["concurrency"] <= concurrency)]
    return max(good, key=lambda s: s["concurrency"]) if good else None


def hot_hit_ratio(report: dict[str, Any]) -> tuple[float | None, str]:
    """Mean hits / prompt tokens of the clean hot requests of the cache stage (later sessions for hybrids)."""
    rows = ((report.get("stages") or {}).get("cache") or {}).get("requests") or []
    hot = [r for r in rows if isinstance(r, dict) and str(r.get("kind", "")).startswith("hot")
           and r.get("clean", True) and _num(r.get("hits")) is not None and _num(r.get("prompt_tokens"))]
    if not hot:
        return None, "no hot requests in stages.cache"
    later = [r for r in hot if (r.get("session") or 1) > 1]
    used = later or hot  # a hybrid model's first session may only create the retention
    ratio = sum(r["hits"] / r["prompt_tokens"] for r in used) / len(used)
    sessions = sorted({r.get("session") for r in used})
    return ratio, f"stages.cache: mean hits/prompt_tokens of {len(used)} hot requests (sessions {sessions})"


def derive_thresholds(report: dict[str, Any], profile: Profile, *, margin: float = DEFAULT_MARGIN,
                      kv_margin: float = DEFAULT_KV_MARGIN) -> dict[str, Threshold]:
    """Every alert threshold with the figure it comes from. A figure the run lacks yields no threshold."""
    out: dict[str, Threshold] = {}
    slo = accepted_slo(report, profile)
    slo_src = "report limits.slo" if (report.get("limits") or {}).get("slo") else "profile contract.slo"
    conc, conc_src = accepted_concurrency(report, profile)
    step = accepted_step(report, conc)
    at = f"stages.load.steps[concurrency={step['concurrency']}]" if step else ""

    def put(key: str, value: float | None, source: str, unit: str = "") -> None:
        if value is not None:
            out[key] = Threshold(key, round(float(value), 6), source, unit)

    for metric, slo_key in (("ttft", "ttft_p95_s"), ("e2e", "e2e_p95_s"), ("itl", "itl_p95_s")):
        slo_value = slo.get(slo_key)
        put(f"{metric}_p95_slo_s", slo_value, f"{slo_src}.{slo_key}", "s")
        figure = _num(step.get(f"{metric}_p95")) if step else None
        if figure is not None and figure > 0:
            drift = figure * margin
            # A drift warning only makes sense below the SLO: above it the SLO alert speaks.
            if slo_value is None or drift < slo_value:
                put(f"{metric}_p95_drift_s", drift, f"{at}.{metric}_p95={figure:.4g} s x margin {margin}", "s")
    put("queue_p95_slo_s", slo.get("queue_p95_s"),
        f"{slo_src}.queue_p95_s (the ramp records no per-step queue-time p95)", "s")
    put("error_ratio", max(slo.get("max_error_rate", 0.0), _num(step.get("error_rate")) or 0.0) if step
        else slo.get("max_error_rate"),
        f"max({slo_src}.max_error_rate, {at}.error_rate)" if step else f"{slo_src}.max_error_rate")
    if conc is not None:
        put("running_max", conc, f"accepted concurrency ({conc_src})")
    if step:
        put("waiting_max", _num(step.get("max_waiting")) or 0.0, f"{at}.max_waiting")
        peak = _num(step.get("max_kv_usage")) or 0.0
        put("kv_usage_max", min(KV_CEILING, max(peak * kv_margin, peak + KV_HEADROOM)),
            f"{at}.max_kv_usage={peak:.4g}: max(x {kv_margin}, + {KV_HEADROOM}), capped at {KV_CEILING}")
    allowed = _num(profile.get("thresholds.max_preemptions"))
    if allowed is not None:
        accepted = _num(step.get("preemptions")) if step else None
        put("preemptions_max", max(allowed, accepted or 0.0),
            f"profile thresholds.max_preemptions={allowed:g}"
            + (f"; {at}.preemptions={accepted:g}" if accepted is not None else ""))
    ratio, ratio_src = hot_hit_ratio(report)
    if ratio is not None and ratio > 0:
        put("hit_ratio_accepted", ratio, ratio_src)
        put("hit_ratio_min", ratio * HIT_RATIO_FLOOR_FACTOR, f"{ratio_src} x {HIT_RATIO_FLOOR_FACTOR}")
    fmt = _num(profile.get("thresholds.tool_format_error_rate"))
    agent_rate = _num((((report.get("stages") or {}).get("agent") or {}).get("rates") or {}).get("format_error_rate"))
    if fmt is not None:
        put("tool_retry_ratio", fmt, f"profile thresholds.tool_format_error_rate={fmt:g}"
            + (f" (accepted run: {agent_rate:g})" if agent_rate is not None else ""))
    return out


# ----------------------------------------------------------------------------------------------
# PromQL


def _sel(metric: str, matchers: str) -> str:
    return f"{metric}{{{matchers}}}" if matchers else metric


def either(template: str) -> str:
    """`template` names metrics as `vllm:NAME`; the result accepts the `vllm_NAME` form too."""
    return " or ".join(f"({template.replace('vllm:', form)})" for form in FORMS)


def q_sum(metric: str, m: str, agg: str = "sum") -> str:
    return either(f"{agg} by ({AGG}) ({_sel('vllm:' + metric, m)})")


def q_rate(metric: str, m: str, window: str, extra: str = "", offset: str = "") -> str:
    matchers = ", ".join(x for x in (m, extra) if x)
    shift = f" offset {offset}" if offset else ""
    return either(f"sum by ({AGG}) (rate({_sel('vllm:' + metric, matchers)}[{window}]{shift}))")


def q_increase(metric: str, m: str, window: str) -> str:
    return either(f"sum by ({AGG}) (increase({_sel('vllm:' + metric, m)}[{window}]))")


def q_quantile(q: float, histogram: str, m: str, window: str) -> str:
    inner = either(f"sum by (le, {AGG}) (rate({_sel('vllm:' + histogram + '_bucket', m)}[{window}]))")
    return f"histogram_quantile({q}, {inner})"


def q_ratio(num: str, den: str) -> str:
    return f"({num}) / ({den})"


def _duration(seconds: int) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m" if seconds and seconds % 60 == 0 else f"{seconds}s"


def _fmt(value: float) -> str:
    return f"{value:.6g}"


# ----------------------------------------------------------------------------------------------
# Rules


@dataclass
class AlertSpec:
    """One alert, and the series that must make it fire and keep it silent (for promtool tests)."""

    name: str
    expr: str
    for_s: int
    severity: str
    check: str
    summary: str
    description: str
    source: str
    rollback: bool = False
    # test data: metric (without prefix) -> series, one set that fires and one that stays silent
    fire: dict[str, str] | None = None
    quiet: dict[str, str] | None = None
    test_minutes: int = 0
    alert_labels: tuple[str, ...] = ("job", "instance", "model_name")


def _hist_series(metric: str, threshold: float, above: bool, minutes: int) -> dict[str, str]:
    """Bucket counters whose p95 sits at ~0.48 x threshold (quiet) or ~3.9 x threshold (fire)."""
    edges = [threshold * 0.5, threshold * 2, threshold * 4]
    target = 2 if above else 0
    series: dict[str, str] = {}
    for i, edge in enumerate([*edges, float("inf")]):
        le = "+Inf" if edge == float("inf") else _fmt(edge)
        slope = 10 if i >= target else 0
        series[f'{metric}_bucket{{le="{le}"}}'] = f"0+{slope}x{minutes}"
    series[f"{metric}_count"] = f"0+10x{minutes}"
    return series


def build_alerts(report: dict[str, Any], profile: Profile, thresholds: dict[str, Threshold], *,
                 for_s: int, window_s: int, matchers: str = "",
                 tool_retry_metrics: tuple[str, str] | None = None) -> list[AlertSpec]:
    t = thresholds
    w = _duration(window_s)
    m = matchers
    minutes = max(20, (2 * for_s + window_s) // 60 + 10)
    alerts: list[AlertSpec] = []

    def latency(metric_key: str, hist: str, what: str, stem: str, check: str) -> None:
        for kind, sev in (("slo", "critical"), ("drift", "warning")):
            key = f"{metric_key}_p95_{kind}_s"
            if key not in t:
                continue
            thr = t[key].value
            rollback = kind == "slo" and metric_key == "queue"
            sustained = for_s * 2 if rollback else for_s
            if kind == "slo":
                name, summary = f"{stem}P95AboveSlo", f"{what} p95 above the SLO ({_fmt(thr)} s)"
                why = ("Sustained queue time above the SLO is a rollback trigger: pause the ramp-up and roll back."
                       if rollback else "The contracted SLO is broken: compare running/waiting and KV usage with "
                       "the accepted step before changing anything.")
            else:
                name, summary = f"{stem}P95AboveAccepted", f"{what} p95 above the accepted figure ({_fmt(thr)} s)"
                why = ("Still within the SLO, but traffic no longer behaves as accepted: a concurrency or prompt "
                       "length above the accepted step explains it, a slower server does not."
                       + (" End-to-end latency grows with the output length: longer answers than the accepted "
                          "step's also raise it." if metric_key == "e2e" else ""))
            alerts.append(AlertSpec(
                name=name, expr=f"{q_quantile(0.95, hist, m, w)} > {_fmt(thr)}", for_s=sustained,
                severity=sev, check=check, rollback=rollback, summary=summary,
                description=f"{what} p95 over {w} stayed above {_fmt(thr)} s for {_duration(sustained)}. {why}",
                source=t[key].source, fire=_hist_series(hist, thr, True, minutes),
                quiet=_hist_series(hist, thr, False, minutes), test_minutes=minutes))

    latency("queue", "request_queue_time_seconds", "Queue time", "VllmQueueTime", "capacity.ramp")
    latency("ttft", "time_to_first_token_seconds", "Time to first token", "VllmTtft", "capacity.ramp")
    latency("e2e", "e2e_request_latency_seconds", "End-to-end latency", "VllmE2eLatency", "capacity.ramp")
    latency("itl", "inter_token_latency_seconds", "Inter-token latency", "VllmInterTokenLatency", "capacity.ramp")

    if "waiting_max" in t:
        thr = t["waiting_max"].value
        alerts.append(AlertSpec(
            name="VllmRequestsWaiting", expr=f"({q_sum('num_requests_waiting', m)}) > {_fmt(thr)}", for_s=for_s,
            severity="warning", check="capacity.ramp",
            summary=f"Requests waiting above the accepted peak ({_fmt(thr)})",
            description="More requests wait for scheduling than at the accepted step: the queue grows. "
                        "Check the client concurrency cap and KV usage; sustained growth means expand capacity.",
            source=t["waiting_max"].source, fire={"num_requests_waiting": f"{_fmt(thr + 5)}x{minutes}"},
            quiet={"num_requests_waiting": f"{_fmt(thr)}x{minutes}"}, test_minutes=minutes))
    if "running_max" in t:
        thr = t["running_max"].value
        limited = bool((report.get("limits") or {}).get("max_num_seqs"))
        alerts.append(AlertSpec(
            name="VllmRunningAboveAccepted", expr=f"({q_sum('num_requests_running', m)}) > {_fmt(thr)}",
            for_s=for_s, severity="critical" if limited else "warning", check="capacity.ramp",
            summary=f"Running requests above the accepted concurrency ({_fmt(thr)})",
            description=("The run was accepted only up to this concurrency (limited observation): enforce the "
                         "cap (--max-num-seqs, client concurrency) now." if limited else
                         "Traffic runs above the contracted concurrency the acceptance measured; its figures do "
                         "not cover this load."),
            source=t["running_max"].source, fire={"num_requests_running": f"{_fmt(thr + 4)}x{minutes}"},
            quiet={"num_requests_running": f"{_fmt(thr)}x{minutes}"}, test_minutes=minutes))
    if "kv_usage_max" in t:
        thr = t["kv_usage_max"].value
        alerts.append(AlertSpec(
            name="VllmKvCacheUsageHigh", expr=f"({q_sum('kv_cache_usage_perc', m, 'max')}) > {_fmt(thr)}",
            for_s=for_s, severity="warning", check="capacity.ramp",
            summary=f"KV cache usage above {_fmt(thr)}",
            description="KV cache usage is beyond what the accepted load needed; preemptions follow near 1.0. "
                        "Adjust context/concurrency limits or retention before adding GPUs.",
            source=t["kv_usage_max"].source, fire={"kv_cache_usage_perc": f"1x{minutes}"},
            quiet={"kv_cache_usage_perc": f"{_fmt(thr * 0.9)}x{minutes}"}, test_minutes=minutes))
    if "preemptions_max" in t:
        thr = t["preemptions_max"].value
        alerts.append(AlertSpec(
            name="VllmPreemptions", expr=f"({q_increase('num_preemptions_total', m, w)}) > {_fmt(thr)}",
            for_s=0, severity="warning", check="capacity.ramp",
            summary=f"Preemptions above the accepted {_fmt(thr)} per {w}",
            description="The scheduler evicts running requests for lack of KV blocks: the load exceeds what "
                        "was accepted. Repeated at nominal load it is expand_capacity.",
            source=t["preemptions_max"].source,
            fire={"num_preemptions_total": f"0+{_fmt(thr + 1)}x{minutes}"},
            quiet={"num_preemptions_total": f"0x{minutes}"}, test_minutes=minutes))
    if "error_ratio" in t:
        thr = t["error_ratio"].value
        errors = q_rate("request_success_total", m, w, 'finished_reason="error"')
        alerts.append(AlertSpec(
            name="VllmRequestErrors", expr=f"{q_ratio(errors, q_rate('request_success_total', m, w))} > {_fmt(thr)}",
            for_s=for_s, severity="critical", check="capacity.ramp",
            summary=f"Request error ratio above {_fmt(thr)}",
            description="Requests finish with finished_reason=error beyond the contracted error rate.",
            source=t["error_ratio"].source,
            fire={'request_success_total{finished_reason="error"}': f"0+10x{minutes}",
                  'request_success_total{finished_reason="stop"}': f"0+1x{minutes}"},
            quiet={'request_success_total{finished_reason="error"}': f"0x{minutes}",
                   'request_success_total{finished_reason="stop"}': f"0+10x{minutes}"}, test_minutes=minutes))
    alerts.append(AlertSpec(
        name="VllmAdmissionRejections", expr=f"({q_increase('admission_rejections_total', m, w)}) > 0",
        for_s=0, severity="warning", check="capacity.context_contract",
        summary="Requests rejected by a queue limit",
        description="vLLM refused requests at admission (max_num_queued_reqs/tokens): clients see errors.",
        source="any rejection: the acceptance admits every request at the contracted load",
        fire={"admission_rejections_total": f"0+2x{minutes}"}, quiet={"admission_rejections_total": f"0x{minutes}"},
        test_minutes=minutes))
    if "hit_ratio_min" in t:
        hits = q_rate("prefix_cache_hits_total", m, w)
        queries = q_rate("prefix_cache_queries_total", m, w)
        ratio = q_ratio(hits, queries)
        floor = t["hit_ratio_min"].value
        acc = t["hit_ratio_accepted"].value
        alerts.append(AlertSpec(
            name="VllmPrefixCacheHitRatioLow", expr=f"{ratio} < {_fmt(floor)}", for_s=for_s * 2,
            severity="warning", check="cache.hot_reuse",
            summary=f"Prefix-cache hit ratio below {_fmt(floor)} (accepted hot ratio {_fmt(acc)})",
            description="The accepted ratio is that of requests repeating the shared prefix; mixed traffic sits "
                        "lower. Far below it, the shared prefix is no longer byte-identical or is evicted.",
            source=t["hit_ratio_min"].source,
            fire={"prefix_cache_hits_total": f"0+{_fmt(floor * 50)}x{minutes}",
                  "prefix_cache_queries_total": f"0+100x{minutes}"},
            quiet={"prefix_cache_hits_total": f"0+{_fmt(acc * 100)}x{minutes}",
                   "prefix_cache_queries_total": f"0+100x{minutes}"}, test_minutes=minutes))
        before = q_ratio(q_rate("prefix_cache_hits_total", m, w, offset="1h"),
                         q_rate("prefix_cache_queries_total", m, w, offset="1h"))
        hi, lo, long = 90, 10, 100
        alerts.append(AlertSpec(
            name="VllmPrefixCacheHitRatioCollapse",
            expr=f"({ratio}) < {HIT_RATIO_COLLAPSE_FACTOR} * ({before})", for_s=for_s, severity="critical",
            check="cache.hot_reuse", rollback=True,
            summary=f"Prefix-cache hit ratio fell below {HIT_RATIO_COLLAPSE_FACTOR} x its value an hour ago",
            description="A collapse of the hit ratio (typically after a system-prompt or tool-schema change) is a "
                        "rollback trigger: pause the ramp-up, restore the previous prompt or image.",
            source=f"relative to the ratio an hour earlier; accepted hot ratio {_fmt(acc)} "
                   f"({t['hit_ratio_accepted'].source})",
            fire={"prefix_cache_hits_total": f"0+{hi}x{long - 30} {hi * (long - 30) + lo}+{lo}x29",
                  "prefix_cache_queries_total": f"0+100x{long}"},
            quiet={"prefix_cache_hits_total": f"0+{hi}x{long}", "prefix_cache_queries_total": f"0+100x{long}"},
            test_minutes=long))
    if tool_retry_metrics and "tool_retry_ratio" in t:
        retries, calls = tool_retry_metrics
        thr = t["tool_retry_ratio"].value
        rate_r = f"sum by ({AGG}) (rate({_sel(retries, m)}[{w}]))"
        rate_c = f"sum by ({AGG}) (rate({_sel(calls, m)}[{w}]))"
        alerts.append(AlertSpec(
            name="AgentToolCallRetryRate", expr=f"({rate_r}) / ({rate_c}) > {_fmt(thr)}", for_s=for_s,
            severity="critical", check="agent.format_errors", rollback=True,
            summary=f"Tool-call retry rate above {_fmt(thr)}",
            description="Tool calls fail schema validation and are retried more often than accepted: lost schema "
                        "validation is a rollback trigger for agent traffic.",
            source=t["tool_retry_ratio"].source))
    # A restart stays visible for at least 10 minutes, whatever the rate window.
    restart = f"changes({_sel('process_start_time_seconds', m)}[{_duration(max(window_s, 600))}]) > 0"
    alerts.append(AlertSpec(
        name="VllmRestarted", expr=restart, for_s=0, severity="critical", check="capacity.soak", rollback=True,
        summary="vLLM server restarted",
        description="The server process started again. OOM kills and NCCL errors are log-based (vLLM exports no "
                    "metric for them): read the previous start's log for the patterns in the rollback triggers. "
                    "Repeated OOM on the accepted profile is a rollback trigger.",
        source="any restart: the accepted run had none",
        fire={"process_start_time_seconds": f"100x{minutes - 4} 5000x3"},
        quiet={"process_start_time_seconds": f"100x{minutes}"}, test_minutes=minutes,
        alert_labels=("job", "instance")))
    alerts.append(AlertSpec(
        name="VllmTargetDown", expr=f"{_sel('up', m)} == 0", for_s=min(for_s, 60), severity="critical",
        check="compat.serve", rollback=False,
        summary="vLLM metrics endpoint down",
        description="Prometheus cannot scrape the server: it died (OOM kill, NCCL abort) or hangs. Check the log.",
        source="scrape health", fire={"up": f"0x{minutes}"}, quiet={"up": f"1x{minutes}"}, test_minutes=minutes,
        alert_labels=("job", "instance")))
    return alerts


def _rule_labels(spec: AlertSpec, report: dict[str, Any], profile: Profile) -> dict[str, str]:
    return {"severity": spec.severity, "check": spec.check, "profile": profile.name,
            "acceptance_run": str(report.get("run_id", "")), "rollback_trigger": "true" if spec.rollback else "false"}


def _annotations(spec: AlertSpec, owner: str) -> dict[str, str]:
    return {"summary": spec.summary, "description": spec.description, "threshold_source": spec.source,
            "owner": owner}


def monitoring_owner(report: dict[str, Any]) -> str:
    """The signed-off monitoring owner, else the owner the findings were assigned to."""
    signoff = report.get("signoff") or {}
    finding_owners = [f.get("owner") for f in report.get("findings") or [] if isinstance(f, dict) and f.get("owner")]
    return str(signoff.get("monitoring_owner") or report.get("owner") or (finding_owners[0] if finding_owners else None)
               or "unassigned: name a monitoring owner")


def recording_rules(matchers: str, window_s: int) -> list[dict[str, str]]:
    w = _duration(window_s)
    m = matchers
    hits, queries = q_rate("prefix_cache_hits_total", m, w), q_rate("prefix_cache_queries_total", m, w)
    rules = {
        "vllm_acceptance:num_requests_running": q_sum("num_requests_running", m),
        "vllm_acceptance:num_requests_waiting": q_sum("num_requests_waiting", m),
        "vllm_acceptance:kv_cache_usage_perc:max": q_sum("kv_cache_usage_perc", m, "max"),
        "vllm_acceptance:queue_time_seconds:p95": q_quantile(0.95, "request_queue_time_seconds", m, w),
        "vllm_acceptance:ttft_seconds:p95": q_quantile(0.95, "time_to_first_token_seconds", m, w),
        "vllm_acceptance:ttft_seconds:p50": q_quantile(0.5, "time_to_first_token_seconds", m, w),
        "vllm_acceptance:itl_seconds:p95": q_quantile(0.95, "inter_token_latency_seconds", m, w),
        "vllm_acceptance:e2e_seconds:p95": q_quantile(0.95, "e2e_request_latency_seconds", m, w),
        "vllm_acceptance:requests:rate": q_rate("request_success_total", m, w),
        "vllm_acceptance:request_errors:ratio": q_ratio(
            q_rate("request_success_total", m, w, 'finished_reason="error"'), q_rate("request_success_total", m, w)),
        "vllm_acceptance:preemptions:rate": q_rate("num_preemptions_total", m, w),
        "vllm_acceptance:prefix_cache_hit_ratio": q_ratio(hits, queries),
        "vllm_acceptance:prompt_tokens:rate": q_rate("prompt_tokens_total", m, w),
        "vllm_acceptance:generation_tokens:rate": q_rate("generation_tokens_total", m, w),
    }
    return [{"record": name, "expr": expr} for name, expr in rules.items()]


def generate_rules(report: dict[str, Any], profile: Profile, *, for_s: int = 300, window_s: int = 300,
                   margin: float = DEFAULT_MARGIN, matchers: str = "",
                   tool_retry_metrics: tuple[str, str] | None = None) -> dict[str, Any]:
    """The Prometheus rule file: recording rules for dashboards, alerts with thresholds from the run.

    for_s: how long a condition must hold (production 5 min; tests pass a few seconds).
    window_s: rate/quantile window. matchers: PromQL label matchers for every vLLM series
    (e.g. 'job="vllm-k3"'). tool_retry_metrics: (retries counter, tool-call counter) exported by
    the agent gateway, when it exports them (vLLM itself has no retry metric).
    """
    thresholds = derive_thresholds(report, profile, margin=margin)
    specs = build_alerts(report, profile, thresholds, for_s=for_s, window_s=window_s, matchers=matchers,
                         tool_retry_metrics=tool_retry_metrics)
    owner = monitoring_owner(report)
    alerts = []
    for spec in specs:
        rule: dict[str, Any] = {"alert": spec.name, "expr": spec.expr}
        if spec.for_s:
            rule["for"] = _duration(spec.for_s)
        rule["labels"] = _rule_labels(spec, report, profile)
        rule["annotations"] = _annotations(spec, owner)
        alerts.append(rule)
    return {"groups": [
        {"name": "vllm-acceptance-recording", "rules": recording_rules(matchers, window_s)},
        {"name": "vllm-acceptance-alerts", "rules": alerts},
    ]}


# ----------------------------------------------------------------------------------------------
# promtool tests


def _series_name(metric: str, form: str) -> str:
    """`num_requests_waiting{x="y"}` -> `vllm:num_requests_waiting{x="y", <base labels>}`."""
    base = 'job="vllm", instance="vllm-test:8000", model_name="test-model", engine="0"'
    name, _, rest = metric.partition("{")
    labels = rest.rstrip("}")
    if name in ("up", "process_start_time_seconds"):
        prefix, base = "", 'job="vllm", instance="vllm-test:8000"'
    else:
        prefix = form
    return f"{prefix}{name}{{{base}{', ' + labels if labels else ''}}}"


def generate_promtool_tests(report: dict[str, Any], profile: Profile, rules_file: str = RULES_FILE, *,
                            for_s: int = 300, window_s: int = 300, margin: float = DEFAULT_MARGIN,
                            matchers: str = "") -> dict[str, Any]:
    """For every alert, in both metric name forms: series that make it fire, and series that keep it silent."""
    thresholds = derive_thresholds(report, profile, margin=margin)
    specs = build_alerts(report, profile, thresholds, for_s=for_s, window_s=window_s, matchers=matchers)
    owner = monitoring_owner(report)
    label_values = {"job": "vllm", "instance": "vllm-test:8000", "model_name": "test-model"}
    tests = []
    for spec in specs:
        if not spec.fire or not spec.quiet:
            continue
        eval_time = f"{spec.test_minutes - 2}m"
        expected = {**{k: label_values[k] for k in spec.alert_labels}, **_rule_labels(spec, report, profile)}
        forms = FORMS if any(not k.startswith(("up", "process_")) for k in spec.fire) else FORMS[:1]
        for form in forms:
            for fires, series in ((True, spec.fire), (False, spec.quiet)):
                tests.append({
                    "name": f"{spec.name} {'fires' if fires else 'stays silent'} ({form}* names)",
                    "interval": "1m",
                    "input_series": [{"series": _series_name(k, form), "values": v} for k, v in series.items()],
                    "alert_rule_test": [{"eval_time": eval_time, "alertname": spec.name, "exp_alerts": [
                        {"exp_labels": expected,
                         "exp_annotations": _annotations(spec, owner)}] if fires else []}],
                })
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests}


# ----------------------------------------------------------------------------------------------
# Rollback triggers


def rollback_triggers(report: dict[str, Any], profile: Profile,
                      thresholds: dict[str, Threshold] | None = None) -> list[dict[str, Any]]:
    """SPEC's rollback triggers made concrete for this run: the signal, the alert or log pattern, the action."""
    t = thresholds if thresholds is not None else derive_thresholds(report, profile)
    signoff = report.get("signoff") or {}
    lineage = report.get("lineage") or {}
    target = signoff.get("rollback_rehearsed") or lineage.get("rollback_image") or "the previous image and config"
    action = f"pause the ramp-up and roll back ({target})"
    queue = t.get("queue_p95_slo_s")
    details = {
        ROLLBACK_TRIGGERS[0]: {
            "signal": "log", "alerts": ["VllmRestarted", "VllmTargetDown"],
            "log_pattern": _OOM.pattern,
            "condition": "more than one OOM (log pattern) or OOM-caused restart on the accepted profile; "
                         "vLLM exports no OOM metric, so the log (and the kernel's oom-kill line) decides"},
        ROLLBACK_TRIGGERS[1]: {
            "signal": "client/gateway", "alerts": ["AgentToolCallRetryRate"],
            "condition": "any invalid tool-call JSON reaching the executor, or schema-validation retries above "
                         f"{t['tool_retry_ratio'].value if 'tool_retry_ratio' in t else 'the profile threshold'}; "
                         "vLLM exports no retry or parse-failure metric (tool_call_parser_invocations counts "
                         "tool_call/no_tool_call only): the agent gateway must export retries"},
        ROLLBACK_TRIGGERS[2]: {
            "signal": "metric", "alerts": ["VllmQueueTimeP95AboveSlo"],
            "condition": f"queue time p95 above {queue.value:g} s ({queue.source}) for the alert's sustained period"
            if queue else "queue time above the SLO (no queue SLO in the profile: set contract.slo.queue_p95_s)"},
        ROLLBACK_TRIGGERS[3]: {
            "signal": "metric", "alerts": ["VllmPrefixCacheHitRatioCollapse", "VllmPrefixCacheHitRatioLow"],
            "condition": (f"hit ratio below {HIT_RATIO_COLLAPSE_FACTOR} x its value an hour earlier, or below "
                          f"{t['hit_ratio_min'].value:.3g} (accepted hot ratio {t['hit_ratio_accepted'].value:.3g}), "
                          "after a system-prompt or tool-schema change") if "hit_ratio_min" in t else
            "no accepted hit ratio in this run: the cache stage measured no reuse"},
        ROLLBACK_TRIGGERS[4]: {
            "signal": "log", "alerts": ["VllmRestarted", "VllmTargetDown"], "log_pattern": _NCCL_ERROR.pattern,
            "condition": "any NCCL / inter-node transfer error in the vLLM log; vLLM exports no NCCL metric"},
    }
    return [{"trigger": text, **details.get(text, {"signal": "unmapped", "alerts": [], "condition": text}),
             "action": action} for text in ROLLBACK_TRIGGERS]


# ----------------------------------------------------------------------------------------------
# Dashboard


def _panel(pid: int, title: str, targets: list[tuple[str, str]], unit: str, x: int, y: int,
           threshold: float | None = None, description: str = "") -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if threshold is not None:
        steps.append({"color": "red", "value": threshold})
    return {
        "id": pid, "type": "timeseries", "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps},
                                     "custom": {"thresholdsStyle": {"mode": "line" if threshold is not None
                                                                    else "off"}}},
                        "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
                    for i, (expr, legend) in enumerate(targets)],
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
    }


def generate_dashboard(report: dict[str, Any], profile: Profile, *, window_s: int = 300) -> dict[str, Any]:
    """A Grafana dashboard on current vLLM names (both forms), threshold lines from the accepted figures."""
    t = derive_thresholds(report, profile)
    m = 'instance=~"$instance"'
    w = "$__rate_interval"
    leg = "{{instance}} {{model_name}}"

    def thr(key: str) -> float | None:
        return t[key].value if key in t else None

    specs: list[tuple[str, list[tuple[str, str]], str, float | None, str]] = [
        ("Requests finished by reason", [(either(f"sum by ({AGG}, finished_reason) "
                                                  f"(rate(vllm:request_success_total{{{m}}}[{w}]))"),
                                          "{{instance}} {{finished_reason}}")], "reqps", None, ""),
        ("Error ratio", [(q_ratio(q_rate("request_success_total", m, w, 'finished_reason="error"'),
                                  q_rate("request_success_total", m, w)), leg)], "percentunit", thr("error_ratio"), ""),
        ("Running requests", [(q_sum("num_requests_running", m), leg)], "short", thr("running_max"),
         "line: the accepted concurrency"),
        ("Waiting requests", [(q_sum("num_requests_waiting", m), leg)], "short", thr("waiting_max"),
         "line: the peak waiting at the accepted step"),
        ("Queue time p95", [(q_quantile(0.95, "request_queue_time_seconds", m, w), leg)], "s",
         thr("queue_p95_slo_s"), "line: the SLO"),
        ("Time to first token p50 / p95", [(q_quantile(0.5, "time_to_first_token_seconds", m, w), "p50 " + leg),
                                           (q_quantile(0.95, "time_to_first_token_seconds", m, w), "p95 " + leg)],
         "s", thr("ttft_p95_slo_s"), "line: the SLO"),
        ("End-to-end latency p95", [(q_quantile(0.95, "e2e_request_latency_seconds", m, w), leg)], "s",
         thr("e2e_p95_slo_s"), "line: the SLO"),
        ("Inter-token latency p95", [(q_quantile(0.95, "inter_token_latency_seconds", m, w), leg)], "s",
         thr("itl_p95_slo_s"), "line: the SLO"),
        ("Prompt and generation tokens/s", [(q_rate("prompt_tokens_total", m, w), "prompt " + leg),
                                            (q_rate("generation_tokens_total", m, w), "generation " + leg)],
         "short", None, ""),
        ("KV cache usage", [(q_sum("kv_cache_usage_perc", m, "max"), leg)], "percentunit", thr("kv_usage_max"),
         "vllm:kv_cache_usage_perc (the GPU-prefixed usage gauge was removed)"),
        ("Preemptions / s", [(q_rate("num_preemptions_total", m, w), leg)], "short", None,
         "accepted: " + (t["preemptions_max"].source if "preemptions_max" in t else "n/a")),
        ("Prefix cache queries and hits (tokens/s)",
         [(q_rate("prefix_cache_queries_total", m, w), "queries " + leg),
          (q_rate("prefix_cache_hits_total", m, w), "hits " + leg)], "short", None,
         "vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total (the GPU-prefixed families were removed)"),
        ("Prefix cache hit ratio", [(q_ratio(q_rate("prefix_cache_hits_total", m, w),
                                             q_rate("prefix_cache_queries_total", m, w)), leg)],
         "percentunit", thr("hit_ratio_min"), "line: the floor derived from the accepted hot ratio"),
        ("Tool parser invocations by outcome",
         [(either(f"sum by ({AGG}, outcome) (rate(vllm:tool_call_parser_invocations_total{{{m}}}[{w}]))"),
           "{{instance}} {{outcome}}")], "short", None,
         "vLLM counts tool_call / no_tool_call; the retry rate must come from the agent gateway"),
        ("Restarts", [(f"changes(process_start_time_seconds{{{m}}}[1h])", "{{instance}}"),
                      (f"1 - up{{{m}}}", "down {{instance}}")], "short", None,
         "OOM and NCCL errors are log-based: a restart or a down target is their trace here"),
        ("GPU memory used (DCGM exporter, where exported)",
         [('sum by (Hostname, gpu) (DCGM_FI_DEV_FB_USED) * 1048576', "{{Hostname}} gpu{{gpu}}")], "bytes", None,
         "needs dcgm-exporter on the GPU nodes; empty on the CPU lab"),
        ("GPU utilisation per node and GPU (DCGM exporter, where exported)",
         [("avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}} gpu{{gpu}}")], "percent", None,
         "needs dcgm-exporter on the GPU nodes; empty on the CPU lab"),
    ]
    panels: list[dict[str, Any]] = [{
        "id": 1, "type": "text", "title": "Accepted run", "gridPos": {"h": 8, "w": 24, "x": 0, "y": 0},
        "options": {"mode": "markdown", "content": _summary_markdown(report, profile, t)}}]
    for i, (title, targets, unit, threshold, desc) in enumerate(specs):
        panels.append(_panel(i + 2, title, targets, unit, 12 * (i % 2), 8 + 8 * (i // 2), threshold, desc))
    return {
        "title": f"vLLM acceptance: {report.get('inventory', '')} ({profile.name})",
        "uid": f"vllm-acc-{str(report.get('inventory', 'x'))[:20]}",
        "tags": ["vllm", "vllm-acceptance", profile.name],
        "timezone": "utc", "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "instance", "type": "query", "label": "instance", "multi": True, "includeAll": True,
             "datasource": {"type": "prometheus", "uid": "${datasource}"}, "refresh": 2,
             "query": {"query": "label_values(up, instance)", "refId": "instances"},
             "definition": "label_values(up, instance)"}]},
        "annotations": {"list": []},
        "panels": panels,
    }


def _summary_markdown(report: dict[str, Any], profile: Profile, t: dict[str, Threshold]) -> str:
    lines = [f"**Run** {report.get('run_id')} &middot; **verdict** {report.get('verdict')} &middot; "
             f"**profile** {profile.name} &middot; **monitoring owner** {monitoring_owner(report)}", "",
             "| threshold | value | from |", "| --- | --- | --- |"]
    lines += [f"| {th.key} | {th.value:g} {th.unit} | {th.source} |" for th in t.values()]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Summary and files


def monitoring_summary(report: dict[str, Any], profile: Profile, *, files: list[str] | None = None
                       ) -> dict[str, Any]:
    """What report.json should carry under "monitoring": thresholds with sources, rollback triggers, files."""
    t = derive_thresholds(report, profile)
    return {"owner": monitoring_owner(report),
            "accepted": report.get("verdict") in ACCEPTED_VERDICTS,
            "thresholds": {k: asdict(v) for k, v in t.items()},
            "rollback_triggers": rollback_triggers(report, profile, t),
            "not_exported": {
                "tool_call_retry_rate": "vLLM exports no retry metric; pass the gateway's counters",
                "oom": "log-based (no metric): see rollback_triggers log_pattern",
                "nccl_errors": "log-based (no metric): see rollback_triggers log_pattern"},
            "files": files or monitoring_files()}


def monitoring_files() -> list[str]:
    return [f"monitoring/{name}" for name in (RULES_FILE, DASHBOARD_FILE, TESTS_FILE, SUMMARY_FILE)]


def write_monitoring(run_dir: Path, report: dict[str, Any], profile: Profile, *, for_s: int = 300,
                     window_s: int = 300, matchers: str = "",
                     tool_retry_metrics: tuple[str, str] | None = None) -> list[str]:
    """Write the rules, the dashboard, the promtool tests and monitoring.json; paths relative to run_dir."""
    out = Path(run_dir) / "monitoring"
    rules = generate_rules(report, profile, for_s=for_s, window_s=window_s, matchers=matchers,
                           tool_retry_metrics=tool_retry_metrics)
    tests = generate_promtool_tests(report, profile, RULES_FILE, for_s=for_s, window_s=window_s, matchers=matchers)
    header = (f"# Generated by vllm-acceptance from run {report.get('run_id')} ({report.get('verdict')}), "
              f"profile {profile.name}. Thresholds name their source in annotations.threshold_source.\n")
    atomic_write(out / RULES_FILE, header + yaml.safe_dump(rules, sort_keys=False, width=1000))
    atomic_write(out / TESTS_FILE, yaml.safe_dump(tests, sort_keys=False, width=1000))
    atomic_write(out / DASHBOARD_FILE, json.dumps(generate_dashboard(report, profile, window_s=window_s), indent=2)
                 + "\n")
    files = monitoring_files()
    atomic_write(out / SUMMARY_FILE, json.dumps(monitoring_summary(report, profile, files=files), indent=2)
                 + "\n")
    return files
