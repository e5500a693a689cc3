"""The metrics and memory sampler (Sampler) and the per-engine readings of a scrape (engine_rows,
engine_peaks): every row tagged with the stage it was taken in.

The server's own (host) memory has two sources here, each its own series in memory.jsonl: ``rss:vllm``, the
resident memory of a local pid and its children (a server on the controller), and ``rss:/metrics``, the
``process_resident_memory_bytes`` the server's API process exports itself (prometheus_client's process collector;
read with every scrape, so it is there for a server in a container or on another node). With several API servers
/metrics is Prometheus' multiprocess collection, which has no process_* series (docs/lab.md "Data parallel"): no
``rss:/metrics`` row then, never a guessed one."""

from __future__ import annotations

import threading
import time
from typing import Any

from ...core.evidence import EvidenceStore
from ...runtime.metrics import MetricsError, MetricsSource, Snapshot
from ...runtime.process import rss_bytes
from .config import LoadProbeConfig

LOCAL_RSS = "rss:vllm"
METRICS_RSS = "rss:/metrics"
METRICS_RSS_FAMILY = "process_resident_memory_bytes"


def metrics_rss(snap: Snapshot) -> int | None:
    """The server's resident memory from its own /metrics (``process_resident_memory_bytes``); None where the
    family is absent (several API servers: Prometheus multiprocess mode) or holds no positive sample."""
    if METRICS_RSS_FAMILY not in snap.families():
        return None
    value = snap.value(METRICS_RSS_FAMILY)
    return int(value) if value else None


class Sampler(threading.Thread):
    """Scrape metrics (and memory) every interval into samples.jsonl / memory.jsonl until stopped; every
    row carries the stage it was taken in (the stage boundaries are in ``bounds`` too)."""

    def __init__(self, source: MetricsSource, store: EvidenceStore, cfg: LoadProbeConfig) -> None:
        super().__init__(daemon=True)
        self.source, self.store, self.cfg = source, store, cfg
        self.stop_event = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.stage = "idle"
        self.errors = 0
        self.failed: list[float] = []   # when a scrape failed (the step names the samples it lacks)
        self.memory_interval_s = cfg.sample_interval_s   # finer for one short request (stage_long_prompt)
        self.wake = threading.Event()

    def run(self) -> None:
        # Memory is read locally in its own thread: a /metrics scrape of a busy server can take
        # seconds, and the memory series must not thin out with it.
        if self.cfg.server_pid:
            threading.Thread(target=self.memory_loop, daemon=True).start()
        while not self.stop_event.is_set():
            self.take()
            self.stop_event.wait(self.cfg.sample_interval_s)

    def memory_loop(self) -> None:
        while not self.stop_event.is_set():
            self.take_memory()
            self.wake.wait(self.memory_interval_s)   # set by stop() and by a change of the interval
            self.wake.clear()

    def fine_memory(self, interval_s: float | None) -> None:
        """Sample memory every ``interval_s`` from now on (None: back to the profile's interval)."""
        self.memory_interval_s = interval_s or self.cfg.sample_interval_s
        self.wake.set()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        self.join(timeout=5)

    def take_memory(self) -> int | None:
        rss = rss_bytes(self.cfg.server_pid) if self.cfg.server_pid else None
        if rss:
            self.add_memory(time.time(), rss, LOCAL_RSS, "process RSS (no GPU)")
        return rss

    def add_memory(self, t: float, value: int, series: str, label: str) -> None:
        mem = {"t": t, "bytes": value, "series": series, "label": label, "stage": self.stage}
        self.memory.append(mem)
        self.store.append_jsonl("memory.jsonl", mem)

    def take(self) -> None:
        now = time.time()
        try:
            snap = self.source.snapshot()
        except MetricsError as exc:
            self.errors += 1
            self.failed.append(now)
            self.store.append_jsonl("samples.jsonl", {"t": now, "stage": self.stage, "error": str(exc)})
            return
        row = {"t": now, "stage": self.stage,
               "running": snap.value("vllm:num_requests_running"),
               "waiting": snap.value("vllm:num_requests_waiting"),
               "kv_usage": snap.engine_max("vllm:kv_cache_usage_perc"),
               "engines": engine_rows(snap),
               "preemptions": snap.value("vllm:num_preemptions"),
               "queue_time_sum": snap.value("vllm:request_queue_time_seconds_sum"),
               "prefill_time_sum": snap.value("vllm:request_prefill_time_seconds_sum"),
               "decode_time_sum": snap.value("vllm:request_decode_time_seconds_sum")}
        self.samples.append(row)
        self.store.append_jsonl("samples.jsonl", row)
        rss = metrics_rss(snap)
        if rss:
            self.add_memory(now, rss, METRICS_RSS, "server RSS from its /metrics (process_resident_memory_bytes)")

    def window(self, start: float, end: float) -> list[dict[str, Any]]:
        """Samples of a stage, including the one taken right after it ends."""
        slack = self.cfg.sample_interval_s * 2
        return [s for s in self.samples if start <= s["t"] <= end + slack]

    def failed_in(self, start: float, end: float) -> int:
        """Scrapes of a stage's window that failed."""
        slack = self.cfg.sample_interval_s * 2
        return sum(1 for t in self.failed if start <= t <= end + slack)

    def memory_window(self, start: float, end: float, series: str | None = None) -> list[int]:
        """Memory samples of a stage's window: one series, or every series (the crash record's timeline)."""
        slack = self.cfg.sample_interval_s * 2
        return [m["bytes"] for m in self.memory
                if start <= m["t"] <= end + slack and (series is None or m["series"] == series)]

    def memory_series(self, start: float, end: float) -> dict[str, list[int]]:
        """Each host-memory series' samples over a stage's window (local RSS, RSS from /metrics)."""
        names = sorted({m["series"] for m in self.memory})
        return {name: self.memory_window(start, end, name) for name in names}


def engine_rows(snap: Snapshot) -> dict[str, dict[str, float | None]] | None:
    """Running, waiting and KV usage of each engine (data parallel / DEP); None for a server without
    ``engine`` labels. KV usage is judged per engine: the engines' fractions are never summed."""
    engines = snap.engines()
    if not engines:
        return None
    per = {key: snap.per_engine(name, usage=key == "kv_usage") or {}
           for key, name in (("running", "vllm:num_requests_running"), ("waiting", "vllm:num_requests_waiting"),
                             ("kv_usage", "vllm:kv_cache_usage_perc"))}
    return {e: {key: values.get(e) for key, values in per.items()} for e in engines}


def engine_peaks(samples: list[dict[str, Any]]) -> dict[str, float] | None:
    """Each engine's highest KV usage over a step's samples (data parallel / DEP), None for one engine."""
    peaks: dict[str, float] = {}
    for sample in samples:
        for engine, row in (sample.get("engines") or {}).items():
            if row.get("kv_usage") is not None:
                peaks[engine] = max(peaks.get(engine, 0.0), float(row["kv_usage"]))
    return peaks if len(peaks) > 1 else None
