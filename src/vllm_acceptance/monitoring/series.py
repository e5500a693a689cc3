"""The vLLM series the generated monitoring reads (alerts.py, rules.py, dashboard.py), as the server exports
them. The metrics probe checks that the server under test exports each one (docs/checks.md
capacity.alert_series). tests/unit/test_metrics_probe.py keeps these lists in step with the generated files."""

from __future__ import annotations

# Read by an alert or a recording rule of the generated rule file: without it, that rule never fires.
RULE_SERIES: tuple[str, ...] = (
    "vllm:request_success_total",
    "vllm:admission_rejections_total",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_preemptions_total",
    "vllm:kv_cache_usage_perc",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)

# Read only by a dashboard panel: without it, the panel stays empty.
DASHBOARD_SERIES: tuple[str, ...] = (
    "vllm:tool_call_parser_invocations_total",
)

# Older names of a series: a server that exports the old one is older than the generated rules expect.
OLDER_NAMES: dict[str, str] = {
    "vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_queries_total": "vllm:gpu_prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "vllm:gpu_prefix_cache_hits_total",
}
