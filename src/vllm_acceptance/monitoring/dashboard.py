"""The Grafana dashboard of the accepted run (current vLLM metric names, both forms)."""

from __future__ import annotations

from typing import Any

from ..core.profile import Profile
from .promql import AGG, either, q_quantile, q_rate, q_ratio, q_sum
from .thresholds import Threshold, derive_thresholds, monitoring_owner


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


def _summary_markdown(report: dict[str, Any], profile: Profile, t: dict[str, Threshold]) -> str:
    lines = [f"**Run** {report.get('run_id')} &middot; **verdict** {report.get('verdict')} &middot; "
             f"**profile** {profile.name} &middot; **monitoring owner** {monitoring_owner(report)}", "",
             "| threshold | value | from |", "| --- | --- | --- |"]
    lines += [f"| {th.key} | {th.value:g} {th.unit} | {th.source} |" for th in t.values()]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Summary and files


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
