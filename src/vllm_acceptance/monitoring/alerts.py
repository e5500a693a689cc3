"""The alerts of the accepted run, one function per family; each alert carries the series that must make it
fire and keep it silent (promtool tests), and the catalogued check its threshold comes from (docs/checks.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.profile import Profile
from .promql import AGG, _duration, _fmt, _sel, either, q_increase, q_quantile, q_rate, q_ratio, q_sum
from .thresholds import Threshold

HIT_RATIO_COLLAPSE_FACTOR = 0.5


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


@dataclass(frozen=True)
class AlertContext:
    """What every alert family reads: the run, its thresholds, and the rule settings."""

    report: dict[str, Any]
    profile: Profile
    thresholds: dict[str, Threshold]
    for_s: int
    window_s: int
    matchers: str = ""

    @property
    def window(self) -> str:
        return _duration(self.window_s)

    @property
    def minutes(self) -> int:
        """Length of the promtool test series."""
        return max(20, (2 * self.for_s + self.window_s) // 60 + 10)


def latency_alerts(c: AlertContext) -> list[AlertSpec]:
    """p95 of queue time, TTFT, end-to-end and inter-token latency: above the SLO (critical; queue time is a
    rollback trigger) and above the accepted figure (drift warning)."""
    t, m, w, minutes, for_s = c.thresholds, c.matchers, c.window, c.minutes, c.for_s
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

    return alerts


def queue_alerts(c: AlertContext) -> list[AlertSpec]:
    """Waiting above the accepted peak; running above the accepted concurrency."""
    t, m, minutes, for_s = c.thresholds, c.matchers, c.minutes, c.for_s
    alerts: list[AlertSpec] = []
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
        limited = bool((c.report.get("limits") or {}).get("max_num_seqs"))
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
    return alerts


def kv_alerts(c: AlertContext) -> list[AlertSpec]:
    """KV cache usage above the accepted peak; preemptions above the accepted count."""
    t, m, w, minutes, for_s = c.thresholds, c.matchers, c.window, c.minutes, c.for_s
    alerts: list[AlertSpec] = []
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
    return alerts


def error_alerts(c: AlertContext) -> list[AlertSpec]:
    """Request errors above the contracted rate; any admission rejection."""
    t, m, w, minutes, for_s = c.thresholds, c.matchers, c.window, c.minutes, c.for_s
    alerts: list[AlertSpec] = []
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
    return alerts


def cache_alerts(c: AlertContext) -> list[AlertSpec]:
    """Prefix-cache hit ratio far below the accepted hot ratio, and its collapse (a rollback trigger)."""
    t, m, w, minutes, for_s = c.thresholds, c.matchers, c.window, c.minutes, c.for_s
    alerts: list[AlertSpec] = []
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
    return alerts


def agent_alerts(c: AlertContext, tool_retry_metrics: tuple[str, str] | None) -> list[AlertSpec]:
    """Tool-call retry rate above the accepted format-error rate (the gateway's counters)."""
    t, m, w, for_s = c.thresholds, c.matchers, c.window, c.for_s
    alerts: list[AlertSpec] = []
    if tool_retry_metrics and "tool_retry_ratio" in t:
        retries, calls = tool_retry_metrics
        thr = t["tool_retry_ratio"].value
        rate_r = f"sum by ({AGG}) (rate({_sel(retries, m)}[{w}]))"
        rate_c = f"sum by ({AGG}) (rate({_sel(calls, m)}[{w}]))"
        alerts.append(AlertSpec(
            name="AgentToolCallRetryRate", expr=f"({rate_r}) / ({rate_c}) > {_fmt(thr)}", for_s=for_s,
            severity="critical", check="agent.tool_call", rollback=True,
            summary=f"Tool-call retry rate above {_fmt(thr)}",
            description="Tool calls fail schema validation and are retried more often than accepted: lost schema "
                        "validation is a rollback trigger for agent traffic.",
            source=t["tool_retry_ratio"].source))
    return alerts


def health_alerts(c: AlertContext) -> list[AlertSpec]:
    """Restarts (a rollback trigger when repeated) and a metrics endpoint that is down."""
    m, minutes, for_s = c.matchers, c.minutes, c.for_s
    alerts: list[AlertSpec] = []
    # A restart stays visible for at least 10 minutes, whatever the rate window.
    # With several API servers (vllm serve with data parallel) /metrics has no process_* series: a restart shows as
    # vLLM's request counter starting again from zero (runtime/metrics.py Instance; docs/lab.md "Data parallel").
    window = _duration(max(c.window_s, 600))
    counter_reset = either(f"sum by (job, instance) (resets({_sel('vllm:request_success_total', m)}[{window}])) > 0")
    restart = f"(changes({_sel('process_start_time_seconds', m)}[{window}]) > 0) or {counter_reset}"
    alerts.append(AlertSpec(
        name="VllmRestarted", expr=restart, for_s=0, severity="critical", check="capacity.soak", rollback=True,
        summary="vLLM server restarted",
        description="The server process started again. OOM kills and NCCL errors are log-based (vLLM exports no "
                    "metric for them): read the previous start's log for the patterns in the rollback triggers. "
                    "Repeated OOM on the accepted profile is a rollback trigger.",
        source="any restart (process_start_time_seconds moved, or vLLM's request counter reset): the accepted run "
               "had none",
        # fires on the sign the several-API-server case has alone (its counter starting again from zero); the
        # one-API-server case shows process_start_time_seconds moving too
        fire={'request_success_total{finished_reason="stop"}': f"0+10x{minutes - 4} 0+1x3"},
        quiet={"process_start_time_seconds": f"100x{minutes}",
               'request_success_total{finished_reason="stop"}': f"0+10x{minutes}"}, test_minutes=minutes,
        alert_labels=("job", "instance")))
    alerts.append(AlertSpec(
        name="VllmTargetDown", expr=f"{_sel('up', m)} == 0", for_s=min(for_s, 60), severity="critical",
        check="compat.serve", rollback=False,
        summary="vLLM metrics endpoint down",
        description="Prometheus cannot scrape the server: it died (OOM kill, NCCL abort) or hangs. Check the log.",
        source="scrape health", fire={"up": f"0x{minutes}"}, quiet={"up": f"1x{minutes}"}, test_minutes=minutes,
        alert_labels=("job", "instance")))
    return alerts


def build_alerts(report: dict[str, Any], profile: Profile, thresholds: dict[str, Threshold], *,
                 for_s: int, window_s: int, matchers: str = "",
                 tool_retry_metrics: tuple[str, str] | None = None) -> list[AlertSpec]:
    """Every alert of the run, in a fixed order."""
    c = AlertContext(report, profile, thresholds, for_s, window_s, matchers)
    return [*latency_alerts(c), *queue_alerts(c), *kv_alerts(c), *error_alerts(c), *cache_alerts(c),
            *agent_alerts(c, tool_retry_metrics), *health_alerts(c)]
