"""vLLM metrics: snapshots from /metrics (direct) or from Prometheus, in one shape.

Names are normalised to the `vllm:` form: prometheus_client >= 0.23 exposes `vllm:x` as
`vllm_x` when Prometheus asks for OpenMetrics, so both forms are accepted everywhere.
Counters are read without their `_total` suffix. A family that is absent is absent (None),
never zero: a missing counter must not read as "no reuse" or "no preemption".
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Families that vLLM 0.x exposed and current releases removed; seeing them means an old server.
REMOVED_FAMILIES = ("vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits", "vllm:gpu_cache_usage_perc")
# vLLM labels every scheduler metric with the engine (data-parallel rank) it comes from. With several API servers
# (`vllm serve` with data parallel: one per engine by default) /metrics is Prometheus' multiprocess collection and an
# engine's scheduler gauges appear only once it served a request (measured, docs/lab.md "Data parallel"); its
# cache_config_info and counters are there from the start.
ENGINE_LABEL = "engine"
ENGINE_FAMILIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "vllm:gpu_cache_usage_perc", "vllm:cache_config_info", "vllm:prefix_cache_queries",
                   "vllm:request_success")


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

    def per_engine(self, name: str, *, usage: bool = False) -> dict[str, float] | None:
        """``name`` per engine (the ``engine`` label of data-parallel / DEP servers; "" where a sample has
        none): other labels summed, or for a usage fraction the largest (a fraction is never summed);
        None if the family is absent."""
        series = self.samples.get(canonical(name))
        if series is None:
            return None
        grouped: dict[str, list[float]] = {}
        for key, v in series.items():
            grouped.setdefault(dict(key).get(ENGINE_LABEL, ""), []).append(v)
        return {e: (max(vs) if usage else sum(vs)) for e, vs in sorted(grouped.items())}

    def engine_max(self, name: str) -> float | None:
        """The largest per-engine value of a usage fraction (two engines at 55 % read 55 %, never 110 %)."""
        per = self.per_engine(name, usage=True)
        return max(per.values()) if per else None

    def engines(self) -> list[str]:
        """The engines the server exposes (``engine`` label values of its scheduler gauges, cache config and
        counters), in order."""
        seen: set[str] = set()
        for name in ENGINE_FAMILIES:
            for key in self.samples.get(name, {}):
                if (engine := dict(key).get(ENGINE_LABEL)) is not None:
                    seen.add(engine)
        return sorted(seen, key=lambda e: (len(e), e))


@dataclass(frozen=True)
class Instance:
    """What tells one server process from a restarted one in its /metrics: `process_start_time_seconds` where it
    is exported (one API server), and vLLM's finished-request counter, which a new process starts from zero. With
    several API servers (`vllm serve` with data parallel) /metrics is Prometheus' multiprocess collection, which has
    no process_* series at all (docs/lab.md "Data parallel"): the counter is then the only sign."""

    start: float | None = None          # process_start_time_seconds
    served: float | None = None         # vllm:request_success, summed over engines and reasons

    @classmethod
    def of(cls, snap: Snapshot) -> Instance:
        return cls(start=snap.value("process_start_time_seconds"), served=snap.value("vllm:request_success"))

    @classmethod
    def from_dict(cls, data: Any) -> Instance | None:
        if not isinstance(data, dict):
            return None
        return cls(start=data.get("process_start"), served=data.get("requests_served"))

    def to_dict(self) -> dict[str, float | None]:
        return {"process_start": self.start, "requests_served": self.served}

    def restarted_since(self, earlier: Instance, finished: int = 0) -> bool | None:
        """True when this reading comes from another process than `earlier`: its start time moved, or (no start
        time on either side) its request counter holds less than `earlier`'s plus the `finished` requests known to
        have completed since (a counter never falls in one process). None when neither sign can be read."""
        if self.start is not None and earlier.start is not None:
            return self.start != earlier.start
        if self.served is not None and earlier.served is not None:
            return self.served < earlier.served + finished
        return None

    def describe(self) -> str:
        if self.start is not None:
            return f"process_start_time_seconds {self.start:.0f}"
        return f"vllm:request_success {self.served:g}" if self.served is not None else "no process sign"


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
    """The same families through a real Prometheus (prometheus-api-client), for the one scrape target that is
    the server under test: ``selector`` (PromQL label matchers, e.g. ``job="vllm",instance="10.0.0.5:8000"``;
    ``instance`` alone makes ``instance="..."``). A query that matches more than one target is refused, never
    summed. The scrape interval is Prometheus's own (``/api/v1/targets``); ``wait_for_scrape`` waits until
    Prometheus has scraped the target after the call began, so a snapshot reflects the state after it.
    """

    def __init__(self, url: str, instance: str | None = None, selector: str | None = None,
                 timeout_s: float = 10.0) -> None:
        from prometheus_api_client import PrometheusConnect

        self.url = url.rstrip("/")
        self.selector = selector or (f'instance="{instance}"' if instance else "")
        self.matchers = parse_selector(self.selector)
        self.timeout_s = timeout_s
        self.client = PrometheusConnect(url=self.url, disable_ssl=True)
        self.description = f"Prometheus {self.url}" + (f" {{{self.selector}}}" if self.selector else "")
        self._interval: float | None = None

    def snapshot(self) -> Snapshot:
        selector = '{__name__=~"vllm[:_].*"' + (f", {self.selector}" if self.selector else "") + "}"
        try:
            result = self.client.custom_query(selector)
        except Exception as exc:  # noqa: BLE001 - the client raises many types; all mean "unreadable"
            raise MetricsError(f"Prometheus query failed at {self.url}: {exc}") from exc
        targets = sorted({(i.get("metric", {}).get("job", ""), i.get("metric", {}).get("instance", ""))
                          for i in result})
        if len(targets) > 1:
            names = ", ".join(f'job="{j}",instance="{n}"' for j, n in targets)
            raise MetricsError(f"Prometheus at {self.url} holds vllm metrics of {len(targets)} scrape targets for "
                               f"{selector} ({names}): set prometheus_selector to the server under test; "
                               "targets are never summed")
        snap = Snapshot(taken=time.time())
        for item in result:
            metric = dict(item.get("metric", {}))
            name = metric.pop("__name__", "")
            if name.endswith("_created"):   # a counter's creation time, not its value (as parse_exposition)
                continue
            for drop in ("job", "instance"):
                metric.pop(drop, None)
            key = frozenset(metric.items())
            bucket = snap.samples.setdefault(canonical(name), {})
            bucket[key] = bucket.get(key, 0.0) + float(item["value"][1])
        if not snap.samples:
            raise MetricsError(f"Prometheus at {self.url} holds no vllm metrics for {selector}")
        return snap

    def target(self) -> dict[str, Any]:
        """The active scrape target the selector names (its ``scrapeInterval`` and ``lastScrape``)."""
        try:
            response = httpx.get(f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=self.timeout_s)
            active = response.json()["data"]["activeTargets"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise MetricsError(f"cannot read the scrape targets of {self.url}: {exc}") from exc
        matched = [t for t in active if target_matches(t.get("labels", {}), self.matchers)]
        if len(matched) != 1:
            raise MetricsError(f"{len(matched)} scrape targets of {self.url} match {{{self.selector}}}; one is "
                               "the server under test")
        return dict(matched[0])

    def scrape_interval_s(self) -> float:
        """The target's real scrape interval, as Prometheus states it."""
        if self._interval is None:
            self._interval = duration_s(str(self.target().get("scrapeInterval", "")))
        return self._interval

    def wait_for_scrape(self) -> None:
        """Wait until Prometheus finished a scrape of the target that began after this call (its
        ``lastScrape``), for at most three scrape intervals plus the timeout; else MetricsError."""
        mark = time.time()
        interval = self.scrape_interval_s()
        deadline = mark + 3 * interval + self.timeout_s
        while True:
            target = self.target()
            if scrape_time(str(target.get("lastScrape", ""))) > mark and target.get("health") == "up":
                return
            if time.time() > deadline:
                raise MetricsError(f"Prometheus did not scrape {{{self.selector}}} successfully within "
                                   f"{3 * interval + self.timeout_s:g} s (interval {interval:g} s, last "
                                   f"error: {target.get('lastError') or 'none'})")
            time.sleep(min(1.0, interval / 4))


def parse_selector(selector: str) -> list[tuple[str, str]]:
    """``a="x", b="y"`` -> [("a", "x"), ("b", "y")]; only equality matchers (a target is named, not searched)."""
    matchers = []
    for part in re.findall(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"\s*,?', selector):
        name, op, value = part
        if op != "=":
            raise MetricsError(f"prometheus_selector {selector!r}: only label=\"value\" matchers name one target")
        matchers.append((name, value))
    if selector.strip() and not matchers:
        raise MetricsError(f"prometheus_selector {selector!r} is not label=\"value\" matchers")
    return matchers


def target_matches(labels: dict[str, str], matchers: list[tuple[str, str]]) -> bool:
    return all(labels.get(name) == value for name, value in matchers)


def duration_s(text: str) -> float:
    """A Prometheus duration ("15s", "1m", "1m30s", "500ms") in seconds; MetricsError if unreadable."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise MetricsError(f"not a Prometheus duration: {text!r}")
    unit = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    return sum(float(n) * unit[u] for n, u in parts)


def scrape_time(text: str) -> float:
    """``lastScrape`` (RFC 3339, nanoseconds) as a Unix time; 0 when never scraped or unreadable."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text.strip())
    if not match:
        return 0.0
    base = datetime.fromisoformat(match.group(1) + (match.group(3).replace("Z", "+00:00")))
    return base.timestamp() + (float(match.group(2)) if match.group(2) else 0.0)


def metrics_source(metrics_url: str | None, prometheus_url: str | None, instance: str | None,
                   base_url: str, selector: str | None = None) -> MetricsSource:
    """The run's metrics: through Prometheus when ``prometheus_url`` is set (the target named by ``selector``,
    else by ``instance``, else by the server's own host:port as the instance label), else /metrics direct."""
    if prometheus_url:
        if not selector and not instance:
            instance = urlsplit(server_root(base_url)).netloc
        return PrometheusMetrics(prometheus_url, instance, selector)
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


def cache_configs(snap: Snapshot) -> dict[str, dict[str, str]]:
    """``vllm:cache_config_info`` labels per engine (its ``engine`` label; "" where it has none), in order."""
    out: dict[str, dict[str, str]] = {}
    for labels in snap.labels_of("vllm:cache_config_info"):
        out.setdefault(labels.get(ENGINE_LABEL, ""), labels)
    return dict(sorted(out.items(), key=lambda kv: (len(kv[0]), kv[0])))


# --- a P/D deployment's pool counters (probes/quality/pd_path.py; docs/sources.md#pd-path) -----------------------
# vLLM 0.32 v1/metrics/loggers.py and stats.py PromptTokenStats: every prompt token of an engine is counted once
# under `vllm:prompt_tokens_by_source{source=...}`: `local_compute` (prefilled by this engine), `local_cache_hit`
# (its own prefix cache) or `external_kv_transfer` (loaded through the KV connector); computed + local hit +
# external = `vllm:prompt_tokens`. `vllm:external_prefix_cache_hits` counts the tokens the connector offered.
# NIXL's own counters (distributed/kv_transfer/kv_connector/v1/nixl/stats.py) exist only with that connector.
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
NIXL_FAILURE_FAMILIES = ("vllm:nixl_num_failed_transfers", "vllm:nixl_num_failed_notifications")
NIXL_TRANSFERS = "vllm:nixl_xfer_time_seconds_count"
NIXL_EXPIRED = "vllm:nixl_num_kv_expired_reqs"


@dataclass(frozen=True)
class PoolCounters:
    """One P/D instance's counters at one moment (or, from `since`, what they gained between two); a field is None
    where its family is absent, never 0."""

    requests: float | None = None             # vllm:request_success, every reason
    prefill_side: float | None = None         # requests with max_tokens <= 1 (vllm:request_params_max_tokens le=1):
                                              # a P/D router's prefill request, never a client's answer
    errors: float | None = None               # vllm:request_success{finished_reason="error"} (e.g. a failed KV load)
    prompt_tokens: float | None = None        # vllm:prompt_tokens
    computed: float | None = None             # vllm:prompt_tokens_by_source{source="local_compute"}
    local_hit: float | None = None            # ... source="local_cache_hit"
    external: float | None = None             # ... source="external_kv_transfer"
    connector_hits: float | None = None       # vllm:external_prefix_cache_hits
    transfers: float | None = None            # NIXL: vllm:nixl_xfer_time_seconds_count
    failed_transfers: float | None = None     # NIXL: failed transfers + failed notifications
    expired: float | None = None              # NIXL: vllm:nixl_num_kv_expired_reqs
    block_size: int | None = None             # vllm:cache_config_info's block_size label

    @classmethod
    def of(cls, snap: Snapshot) -> PoolCounters:
        errors = snap.value("vllm:request_success", finished_reason="error")
        if errors is None and snap.value("vllm:request_success") is not None:
            errors = 0.0   # the family is there; no sample with reason "error" means none finished so
        failures = [snap.value(n) for n in NIXL_FAILURE_FAMILIES]
        config = cache_config(snap) or {}
        block = config.get("block_size", "")
        return cls(requests=snap.value("vllm:request_success"), errors=errors, prefill_side=_max_tokens_one(snap),
                   prompt_tokens=snap.value("vllm:prompt_tokens"),
                   computed=_source(snap, "local_compute"), local_hit=_source(snap, "local_cache_hit"),
                   external=_source(snap, "external_kv_transfer"),
                   connector_hits=snap.value("vllm:external_prefix_cache_hits"),
                   transfers=snap.value(NIXL_TRANSFERS),
                   failed_transfers=None if all(f is None for f in failures) else sum(f or 0.0 for f in failures),
                   expired=snap.value(NIXL_EXPIRED),
                   block_size=int(block) if str(block).isdigit() else None)

    def since(self, earlier: PoolCounters) -> PoolCounters:
        """What each counter gained from `earlier` to this reading (None where either side lacks it)."""
        def gained(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else a - b
        return PoolCounters(**{name: gained(getattr(self, name), getattr(earlier, name))
                               for name in self.__dataclass_fields__ if name != "block_size"},
                            block_size=self.block_size if self.block_size is not None else earlier.block_size)

    def to_dict(self) -> dict[str, float | int | None]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, data: Any) -> PoolCounters | None:
        if not isinstance(data, dict):
            return None
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _max_tokens_one(snap: Snapshot) -> float | None:
    """Requests whose max_tokens was at most 1: the `le` = 1 bucket of vllm:request_params_max_tokens (vLLM 0.32
    v1/metrics/loggers.py, 1-2-5 buckets), summed over engines; None when the histogram is absent."""
    series = snap.samples.get("vllm:request_params_max_tokens_bucket")
    if series is None:
        return None
    total = 0.0
    for key, value in series.items():
        try:
            if float(dict(key).get("le", "nan")) == 1.0:
                total += value
        except ValueError:
            continue
    return total


def _source(snap: Snapshot, source: str) -> float | None:
    return snap.value("vllm:prompt_tokens_by_source", source=source)
