"""PromQL for vLLM's metrics in both name forms (`vllm:x` and, under OpenMetrics, `vllm_x`)."""

from __future__ import annotations

FORMS = ("vllm:", "vllm_")
AGG = "job, instance, model_name"


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
