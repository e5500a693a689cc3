"""The Prometheus rule file (recording + alerting rules) and its promtool tests, in both name forms."""

from __future__ import annotations

from typing import Any

from ..core.profile import Profile
from .alerts import AlertSpec, build_alerts
from .promql import FORMS, _duration, q_quantile, q_rate, q_ratio, q_sum
from .thresholds import DEFAULT_MARGIN, derive_thresholds, monitoring_owner

RULES_FILE = "vllm-acceptance.rules.yml"


def _rule_labels(spec: AlertSpec, report: dict[str, Any], profile: Profile) -> dict[str, str]:
    return {"severity": spec.severity, "check": spec.check, "profile": profile.name,
            "acceptance_run": str(report.get("run_id", "")), "rollback_trigger": "true" if spec.rollback else "false"}


def _annotations(spec: AlertSpec, owner: str) -> dict[str, str]:
    return {"summary": spec.summary, "description": spec.description, "threshold_source": spec.source,
            "owner": owner}


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
