"""vLLM metrics: snapshots from /metrics (direct) or from Prometheus, in one shape.

Names are normalised to the `vllm:` form: prometheus_client >= 0.23 exposes `vllm:x` as
`vllm_x` when Prometheus asks for OpenMetrics, so both forms are accepted everywhere.
Counters are read without their `_total` suffix. A family that is absent is absent (None),
never zero: a missing counter must not read as "no reuse" or "no preemption".
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Families that vLLM 0.x exposed and current releases removed; seeing them means an old server.
REMOVED_FAMILIES = ("vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits", "vllm:gpu_cache_usage_perc")


class MetricsError(Exception):
    """The metrics source could not be read or is not the Prometheus exposition format."""


def canonical(name: str) -> str:
    """`vllm_x_total` / `vllm:x_total` / `vllm:x` -> `vllm:x`."""
    if name.startswith("vllm_"):
        name = "vllm:" + name[len("vllm_"):]
    for suffix in ("_total", "_created"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


@dataclass
class Snapshot:
    """Samples keyed by canonical name, then by a frozenset of label pairs."""

    taken: float
    samples: dict[str, dict[frozenset[tuple[str, str]], float]] = field(default_factory=dict)
    raw: str = ""

    def families(self) -> set[str]:
        return set(self.samples)

    def value(self, name: str, **labels: str) -> float | None:
        """Sum of the samples of `name` whose labels include `labels`; None if the family is absent."""
        series = self.samples.get(canonical(name))
        if series is None:
            return None
        wanted = set(labels.items())
        matched = [v for k, v in series.items() if wanted <= set(k)]
        return sum(matched) if matched else (None if wanted else 0.0)

    def labels_of(self, name: str) -> list[dict[str, str]]:
        return [dict(k) for k in self.samples.get(canonical(name), {})]


def parse_exposition(text: str, taken: float | None = None) -> Snapshot:
    """Parse the text exposition format; raise MetricsError on text that is not it."""
    snap = Snapshot(taken=taken if taken is not None else time.time(), raw=text)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = frozenset((k, v) for k, v in sample.labels.items())
                bucket = snap.samples.setdefault(canonical(sample.name), {})
                bucket[key] = bucket.get(key, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise MetricsError(f"not the Prometheus exposition format: {exc}") from exc
    if text.strip() and not snap.samples:
        raise MetricsError("no samples in the metrics text")
    return snap


def delta(before: Snapshot, after: Snapshot, name: str, **labels: str) -> float | None:
    a, b = before.value(name, **labels), after.value(name, **labels)
    if a is None or b is None:
        return None
    return b - a


def histogram_delta(before: Snapshot, after: Snapshot, name: str) -> tuple[float | None, float | None]:
    """(count delta, sum delta) of a histogram, None where absent."""
    return delta(before, after, f"{name}_count"), delta(before, after, f"{name}_sum")


def histogram_quantile_delta(before: Snapshot, after: Snapshot, name: str, q: float) -> float | None:
    """The q-quantile of the observations a histogram gained between two snapshots (the upper bound of
    the bucket holding it, as Prometheus' histogram_quantile without interpolation); None when absent
    or when nothing was observed. Summed over the other labels (engines, models)."""
    buckets: dict[float, float] = {}
    for key in after.samples.get(canonical(f"{name}_bucket"), {}):
        le = dict(key).get("le")
        if le is None:
            continue
        bound = float("inf") if le in ("+Inf", "inf") else float(le)
        if bound not in buckets:
            d = delta(before, after, f"{name}_bucket", le=le)
            if d is None:
                return None
            buckets[bound] = d
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    for bound in bounds:
        if buckets[bound] >= q * total:
            return bound
    return bounds[-1]


class MetricsSource:
    """Where snapshots come from: a /metrics URL, or Prometheus scraping that server."""

    description = "metrics"

    def snapshot(self) -> Snapshot:
        raise NotImplementedError


class DirectMetrics(MetricsSource):
    def __init__(self, url: str, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.headers = headers or {}
        self.description = f"direct scrape of {url}"

    def snapshot(self) -> Snapshot:
        try:
            response = httpx.get(self.url, timeout=self.timeout_s, headers=self.headers)
        except httpx.HTTPError as exc:
            raise MetricsError(f"cannot read {self.url}: {exc}") from exc
        if response.status_code != 200:
            raise MetricsError(f"{self.url} answered HTTP {response.status_code}")
        return parse_exposition(response.text)


class PrometheusMetrics(MetricsSource):
    """The same families through a real Prometheus (prometheus-api-client), for one scrape job/instance.

    Prometheus only knows what it scraped: `wait_for_scrape` makes a snapshot reflect state at
    least one scrape interval after the last request.
    """

    def __init__(self, url: str, instance: str | None = None, scrape_interval_s: float = 1.0) -> None:
        from prometheus_api_client import PrometheusConnect

        self.url = url
        self.instance = instance
        self.scrape_interval_s = scrape_interval_s
        self.client = PrometheusConnect(url=url, disable_ssl=True)
        self.description = f"Prometheus {url}" + (f" instance {instance}" if instance else "")

    def snapshot(self) -> Snapshot:
        selector = '{__name__=~"vllm[:_].*"' + (f', instance="{self.instance}"' if self.instance else "") + "}"
        try:
            result = self.client.custom_query(selector)
        except Exception as exc:  # noqa: BLE001 - the client raises many types; all mean "unreadable"
            raise MetricsError(f"Prometheus query failed at {self.url}: {exc}") from exc
        snap = Snapshot(taken=time.time())
        for item in result:
            metric = dict(item.get("metric", {}))
            name = metric.pop("__name__", "")
            for drop in ("job", "instance"):
                metric.pop(drop, None)
            key = frozenset(metric.items())
            bucket = snap.samples.setdefault(canonical(name), {})
            bucket[key] = bucket.get(key, 0.0) + float(item["value"][1])
        if not snap.samples:
            raise MetricsError(f"Prometheus at {self.url} holds no vllm metrics for {selector}")
        return snap

    def wait_for_scrape(self) -> None:
        time.sleep(self.scrape_interval_s * 2.5)


def metrics_source(metrics_url: str | None, prometheus_url: str | None, instance: str | None,
                   base_url: str) -> MetricsSource:
    if prometheus_url:
        return PrometheusMetrics(prometheus_url, instance)
    return DirectMetrics(metrics_url or server_root(base_url) + "/metrics")


def server_root(base_url: str) -> str:
    """http://h:p/v1 -> http://h:p"""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


def missing_families(snap: Snapshot, wanted: Iterable[str]) -> list[str]:
    have = snap.families()
    return [w for w in wanted if canonical(w) not in have]


def cache_config(snap: Snapshot) -> dict[str, Any] | None:
    """Labels of `vllm:cache_config_info` (the actual config), or None when the family is absent."""
    labels = snap.labels_of("vllm:cache_config_info")
    return labels[0] if labels else None
