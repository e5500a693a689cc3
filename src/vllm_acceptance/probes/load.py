"""Capacity under load (docs/acceptance.md "Capacity under load"): staged, each stage with its own evidence.

Stages, in order: the KV cache readout against the contract (no traffic), one long prompt at the
contracted context (prefill vs decode memory), the context contract (at it succeeds, just over it is
rejected for its length), the concurrency ramp at the contract's shape (the profile's share of
sessions at the contracted context, every prompt counted with the server's ``/tokenize``) past the
contract to the real knee, a run at the proposed limit when the contract does not hold, the mixed
stream and the soak (at the verified limit when there is one). A sampler scrapes the server's metrics
and memory (per-GPU where there are GPUs, the server's RSS in the lab, labelled so), each sample
tagged with its stage. A server that dies mid-stage leaves the OOM/crash record, its stage
classified, and the remaining stages are reported `missing`. All judgement is in rules/capacity.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..core.evidence import EvidenceStore
from ..core.findings import Finding, Status
from ..core.profile import Profile
from ..load.agent import AgentPool
from ..load.engine import Record, RequestSpec, run_load
from ..load.prompts import filler, words_spec
from ..load.stats import client_summary, summarize
from ..parsers.causal import causal_line
from ..parsers.startup_log import StartupScan, scan_startup_log
from ..rules import capacity as rules
from ..rules import loadgen as loadgen_rules
from ..rules import registry
from ..rules.loadgen import ClientLimits
from ..runtime.metrics import (
    MetricsError,
    MetricsSource,
    Snapshot,
    cache_config,
    cache_configs,
    delta,
    histogram_delta,
    histogram_quantile_delta,
    server_root,
)
from ..runtime.process import rss_bytes, tail_lines

# Sends that measure one request alone stay on the controller; every other step goes through the agents.
LONE_STAGES = ("long_prompt", "mixed_repeated")
OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "killed process",
               "oom-kill", "cannot allocate memory")

@dataclass
class LoadProbeConfig:
    model: str
    contract_concurrency: int = 4
    context_tokens: int = 1536
    max_output_tokens: int = 64
    max_model_len: int = 2048
    ramp: list[int] = field(default_factory=lambda: [1, 2, 4])
    max_step: int | None = None            # the ramp's bound past the contract (default 4 x contract)
    ramp_budget_s: float = 300.0           # no new step past the contract after this long
    contract_share: float = 0.5            # share of ramp requests at the contracted context
    requests_per_step: int = 8
    prompt_tokens: int = 256
    output_tokens: int = 32
    long_prompt_tokens: int = 1400
    soak_s: float = 20.0
    request_timeout_s: float = 60.0
    stage_timeout_s: float = 300.0
    slo: dict[str, float] = field(default_factory=dict)
    max_preemptions: int = 0
    memory_growth_pct: float = 20.0
    api_key: str | None = None
    server_pid: int | None = None
    server_log: str | None = None
    sample_interval_s: float = 0.25
    verify_limit: bool = True
    nodes: int | None = None
    interconnect: str | None = None
    parallel: dict[str, Any] = field(default_factory=dict)
    client: ClientLimits = field(default_factory=ClientLimits)  # the load generator's self-check
    # Loadgen hosts besides the controller (load/agent.py): their agents send the ramp, mixed and soak steps.
    agent_hosts: list[str] = field(default_factory=list)
    agent_endpoints: list[dict[str, Any]] = field(default_factory=list)
    agent_token: str | None = None

    @property
    def ramp_bound(self) -> int:
        return self.max_step or 4 * self.contract_concurrency

    @classmethod
    def from_profile(cls, profile: Profile | None, overrides: dict[str, Any], **kw: Any) -> LoadProbeConfig:
        def get(dotted: str, default: Any) -> Any:
            if dotted in overrides:
                return overrides[dotted]
            return profile.get(dotted, default) if profile else default

        max_step = get("load.max_step", None)
        return cls(
            contract_concurrency=int(get("contract.concurrency", 4)),
            context_tokens=int(get("contract.context_tokens", 1536)),
            max_output_tokens=int(get("contract.max_output_tokens", 64)),
            max_model_len=int(get("model.max_model_len", 2048)),
            ramp=[int(c) for c in get("load.ramp", [1, 2, 4])],
            max_step=int(max_step) if max_step is not None else None,
            ramp_budget_s=float(get("load.ramp_budget_s", 300)),
            contract_share=float(get("load.contract_share", 0.5)),
            requests_per_step=int(get("load.requests_per_step", 8)),
            prompt_tokens=int(get("load.prompt_tokens", 256)),
            output_tokens=int(get("load.output_tokens", 32)),
            long_prompt_tokens=int(get("load.long_prompt_tokens", 1400)),
            soak_s=float(get("load.soak_s", 20)),
            request_timeout_s=float(get("load.request_timeout_s", 60)),
            stage_timeout_s=float(get("load.stage_timeout_s", 300)),
            slo=dict(get("contract.slo", {})),
            max_preemptions=int(get("thresholds.max_preemptions", 0)),
            memory_growth_pct=float(get("thresholds.memory_growth_pct", 20)),
            sample_interval_s=float(get("load.sample_interval_s", 0.25)),
            verify_limit=bool(get("load.verify_limit", True)),
            nodes=get("hardware.min_nodes", None), interconnect=get("hardware.interconnect", None),
            parallel=dict(get("parallel", {}) or {}),
            client=ClientLimits.from_profile(get), **kw)


class PromptBuilder:
    """Prompts of an exact token count, counted by the server itself (POST /tokenize with the chat
    messages, so the chat template's tokens count too). Where the server has no /tokenize the count is
    estimated and the workload says so."""

    TOLERANCE = 2

    def __init__(self, base_url: str, model: str, api_key: str | None = None) -> None:
        self.url = server_root(base_url) + "/tokenize"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.available: bool | None = None
        self.max_model_len: int | None = None
        self.words_per_token = 1 / 1.3
        self.targets: dict[str, dict[str, Any]] = {}   # tag -> the shape its requests were built for
        self.known: dict[tuple[int, int, bool], int] = {}  # shape -> words that gave it
        self.calls = 0
        self.client = httpx.Client(timeout=30, headers=self.headers)  # keep-alive: 4x fewer ms per count

    def count(self, messages: list[dict[str, Any]]) -> int | None:
        if self.available is False:
            return None
        try:
            self.calls += 1
            response = self.client.post(self.url, json={"model": self.model, "messages": messages})
            data = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            data = None
        if not isinstance(data, dict) or "count" not in data:
            self.available = False
            return None
        self.available = True
        self.max_model_len = data.get("max_model_len") or self.max_model_len
        return int(data["count"])

    def spec(self, tokens: int, output: int, seed: int, tag: str, prefix: str = "",
             at_least: bool = False) -> tuple[RequestSpec, int | None]:
        """(request, its counted prompt tokens): within ``TOLERANCE`` tokens under ``tokens`` (or, with
        ``at_least``, at or over it). The word count found for a shape seeds the next request's search."""
        self.targets.setdefault(tag, {"prompt_tokens": tokens, "max_tokens": output})
        key = (tokens, len(prefix), at_least)
        words = self.known.get(key) or max(1, round(tokens * self.words_per_token))
        best: tuple[RequestSpec, int, int] | None = None
        for _ in range(10):
            # One filler text per length (the unique system line keeps requests apart): the count found
            # for a shape holds for the next seed within a token or two, so most requests cost one count.
            req = words_spec(words, output, seed, tag, prefix, text_seed=0)
            n = self.count(req.messages)
            if n is None:
                return req, None
            fits = n >= tokens if at_least else n <= tokens
            if fits and (best is None or abs(n - tokens) < abs(best[1] - tokens)):
                best = (req, n, words)
            if best is not None and abs(best[1] - tokens) <= self.TOLERANCE:
                break
            self.words_per_token = max(0.2, min(2.0, words / max(1, n)))
            words = max(1, words + (int((tokens - n) * self.words_per_token) or (1 if n < tokens else -1)))
        if best is None:  # the fixed part alone (template, system line) is over the target
            req = words_spec(1, output, seed, tag, prefix, text_seed=0)
            return req, self.count(req.messages)
        self.known[key] = best[2]
        return best[0], best[1]


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
            mem = {"t": time.time(), "bytes": rss, "series": "rss:vllm", "label": "process RSS (no GPU)",
                   "stage": self.stage}
            self.memory.append(mem)
            self.store.append_jsonl("memory.jsonl", mem)
        return rss

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

    def window(self, start: float, end: float) -> list[dict[str, Any]]:
        """Samples of a stage, including the one taken right after it ends."""
        slack = self.cfg.sample_interval_s * 2
        return [s for s in self.samples if start <= s["t"] <= end + slack]

    def failed_in(self, start: float, end: float) -> int:
        """Scrapes of a stage's window that failed."""
        slack = self.cfg.sample_interval_s * 2
        return sum(1 for t in self.failed if start <= t <= end + slack)

    def memory_window(self, start: float, end: float) -> list[int]:
        slack = self.cfg.sample_interval_s * 2
        return [m["bytes"] for m in self.memory if start <= m["t"] <= end + slack]


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


class LoadRun:
    def __init__(self, base_url: str, source: MetricsSource, cfg: LoadProbeConfig, store: EvidenceStore) -> None:
        self.base_url, self.source, self.cfg, self.store = base_url, source, cfg, store
        self.sampler = Sampler(source, store, cfg)
        self.bounds: list[dict[str, Any]] = []
        self.crashed: dict[str, Any] | None = None
        self.prompts = PromptBuilder(base_url, cfg.model, cfg.api_key)
        self.workload: list[dict[str, Any]] = []
        self.scan: StartupScan | None = None
        self.cache_cfg: dict[str, str] | None = None
        self.healthy_at_start = False
        self.readout = rules.KvReadout()
        # The client's self-check per send: (label, judged check); see rules/loadgen.py.
        self.client_checks: list[tuple[str, dict[str, Any]]] = []
        self.last_client: dict[str, Any] = {}
        self.chunks_per_session_s: float | None = None  # streamed chunks/s per request in flight, measured
        self.pool: AgentPool | None = None   # the loadgen hosts' agents, when the run has loadgen hosts

    def snapshot(self) -> Snapshot | None:
        """A metrics snapshot, or None when the server stopped answering (judged by `send`) or the scrape failed.
        Through Prometheus it reflects a scrape made after this call began (its real interval), so a step's
        before/after deltas hold the whole step."""
        try:
            wait = getattr(self.source, "wait_for_scrape", None)
            if wait is not None:
                wait()
            return self.source.snapshot()
        except MetricsError:
            return None

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{server_root(self.base_url)}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def build(self, tokens: int, output: int, seed: int, tag: str, prefix: str = "",
              at_least: bool = False) -> RequestSpec:
        req, counted = self.prompts.spec(tokens, output, seed, tag, prefix, at_least)
        self.workload.append({"tag": tag, "seed": seed, "target_tokens": tokens, "counted_tokens": counted,
                              "max_tokens": output, "counted_by": "/tokenize" if counted is not None else
                              "estimate (no /tokenize)"})
        return req

    def send(self, stage: str, specs: list[RequestSpec], concurrency: int) -> tuple[list[Record], float, float]:
        self.sampler.stage = stage
        start = time.time()
        checks: list[dict[str, Any]] = []
        bound: dict[str, Any] = {"stage": stage, "start": start, "concurrency": concurrency}

        def evidence(rec: Record) -> None:
            self.store.append_jsonl(f"records/{stage}.jsonl", rec.to_dict())

        if self.pool is not None and stage not in LONE_STAGES:
            share = max(1, concurrency // len(self.pool.agents))
            records, by_host = self.pool.send(
                self.base_url, self.cfg.model, specs, concurrency, stage=stage, timeout_s=self.cfg.request_timeout_s,
                stage_deadline_s=self.cfg.stage_timeout_s, on_record=evidence, processes=self.workers(share))
            for host, host_checks in by_host.items():
                mine = [r for r in records if r.worker.startswith(f"{host}/")]
                self.check_client(f"{stage}@{host}", share, mine, host_checks)
            bound["hosts"] = [a.host for a in self.pool.agents]
        else:
            records = run_load(
                self.base_url, self.cfg.model, specs, mode="closed", concurrency=concurrency,
                processes=self.workers(concurrency), timeout_s=self.cfg.request_timeout_s,
                stage_deadline_s=self.cfg.stage_timeout_s, api_key=self.cfg.api_key, selfcheck=checks,
                on_record=evidence)
            self.check_client(stage, concurrency, records, checks)
        end = time.time()
        self.bounds.append({**bound, "end": end})
        self.sampler.take()
        if any(r.status != "ok" for r in records) and not self.healthy():
            self.crashed = self.crash_record(stage, records, start, concurrency)
        return records, start, end

    def workers(self, concurrency: int) -> int:
        """Worker processes for a step, sized from the chunk rate and per-chunk cost measured so far."""
        rate = self.chunks_per_session_s * concurrency if self.chunks_per_session_s else None
        return loadgen_rules.workers_for(rate, self.last_client.get("chunk_us"), self.cfg.client, os.cpu_count() or 1)

    def check_client(self, stage: str, concurrency: int, records: list[Record], checks: list[dict[str, Any]]) -> None:
        """Judge the client's self-check of this send and learn its per-chunk cost for sizing the next."""
        client = loadgen_rules.judge_client(client_summary(checks, records), self.cfg.client, self.cfg.slo)
        labels = {label for label, _ in self.client_checks}
        label, n = stage, 1
        while label in labels:
            n += 1
            label = f"{stage}#{n}"
        self.client_checks.append((label, client))
        self.last_client = client
        s = summarize(records)
        if s["chunks_per_s"]:
            self.chunks_per_session_s = s["chunks_per_s"] / max(1, concurrency)

    def process_state(self) -> str:
        """After the server stopped answering: recovered (healthy again within ~10 s), exited, stuck."""
        for _ in range(5):
            if self.healthy():
                return "recovered"
            if self.cfg.server_pid and not rss_bytes(self.cfg.server_pid):
                return "exited"
            time.sleep(2)
        return "stuck (process alive, /health does not answer)" if self.cfg.server_pid else \
            "unresponsive (attached server: process state not observable)"

    def crash_record(self, stage: str, records: list[Record], start: float, concurrency: int) -> dict[str, Any]:
        """The OOM record of docs/acceptance.md: what is known at the moment the server stopped answering."""
        state = self.process_state()
        log = tail_lines(_path(self.cfg.server_log), 40)
        oom = [line for line in log.splitlines() if any(m in line.lower() for m in OOM_MARKERS)]
        now = time.time()
        in_flight = [{"request_id": r.request_id, "tag": r.tag,
                      "prompt_tokens": r.prompt_tokens or self.prompts.targets.get(r.tag, {}).get("prompt_tokens"),
                      "max_tokens": self.prompts.targets.get(r.tag, {}).get("max_tokens"),
                      "first_token": r.first_token is not None, "phase": "decode" if r.first_token else "prefill",
                      "duration_s": round((r.end or now) - (r.sent or r.scheduled), 3), "error": r.error}
                     for r in records if r.status != "ok"]
        stage_samples = self.sampler.window(start, now)
        model_loaded = bool(self.healthy_at_start or (self.scan and self.scan.ready)
                            or any(r.status == "ok" for r in records))
        trend = rules.kv_trend(stage_samples)
        where, why = rules.classify_oom_stage(model_loaded, stage, concurrency, in_flight, trend)
        last = self.sampler.samples[-1] if self.sampler.samples else {}
        labels, args = self.cache_cfg or {}, (self.scan.non_default_args if self.scan else None) or {}
        self.sampler.take_memory()  # the "after" point: none when the process is gone
        record = {
            "time": now, "kind": "oom" if oom else "crash", "probe_stage": stage, "stage_started": start,
            "stage": where, "stage_evidence": why, "action": rules.oom_action(where),
            "model_loaded": model_loaded, "kv_usage_trend": trend,
            "memory_timeline": {"series": sorted({m["series"] for m in self.sampler.memory}) or None,
                                "before": [m for m in self.sampler.memory if m["t"] < start][-10:],
                                "during": [m for m in self.sampler.memory if start <= m["t"] <= now],
                                "after": [m for m in self.sampler.memory if m["t"] > now]},
            "in_flight": in_flight,
            "prompt_tokens": max((r["prompt_tokens"] or 0) for r in in_flight) if in_flight else None,
            "max_output_tokens": max((r["max_tokens"] or 0) for r in in_flight) if in_flight else None,
            "request_duration_s": max(r["duration_s"] for r in in_flight) if in_flight else None,
            "running": last.get("running"), "waiting": last.get("waiting"), "last_samples": self.sampler.samples[-5:],
            "prefix_caching": labels.get("enable_prefix_caching"),
            "kv_offload": {k: labels.get(k) for k in ("kv_offloading_backend", "kv_offloading_size")} if labels
            else None,
            "cross_node_transfer": args.get("kv_transfer_config") or (False if self.scan else None),
            "max_model_len": self.prompts.max_model_len or self.cfg.max_model_len,
            "gpu_memory_utilization": labels.get("gpu_memory_utilization"),
            "max_num_batched_tokens": args.get("max_num_batched_tokens",
                                               "vLLM default (not among the non-default args)" if self.scan else None),
            "parallel_layout": self.layout(), "nodes": self.cfg.nodes, "interconnect": self.cfg.interconnect,
            "concurrency": concurrency, "requests_in_stage": len(records),
            "ok_before_crash": sum(r.status == "ok" for r in records),
            "errors": [r.error for r in records if r.error][:5],
            "log_tail": log.splitlines(), "oom_lines": oom, "process_state": state,
        }
        record["gaps"] = rules.record_gaps(record)
        return record

    def layout(self) -> dict[str, Any]:
        scan = self.scan
        return {"tensor": len(scan.tp_ranks) if scan and scan.tp_ranks else self.cfg.parallel.get("tensor"),
                "pipeline": len(scan.pp_ranks) if scan and scan.pp_ranks else self.cfg.parallel.get("pipeline"),
                "data": len(scan.dp_ranks) if scan and scan.dp_ranks else self.cfg.parallel.get("data"),
                "world_size": scan.world_size if scan else None}


def _path(p: str | None) -> Path | None:
    return Path(p) if p else None


def hung_requests(records: list[Record], limit: int = 20) -> dict[str, Any]:
    """How many requests got no complete answer within the request timeout (or the stage deadline),
    and which: their request ids, as in records/<stage>.jsonl (the first `limit`)."""
    ids = [r.request_id for r in records if r.status == "timeout"]
    return {"timeouts": len(ids), "timed_out": ids[:limit]}


def step_row(concurrency: int, records: list[Record], samples: list[dict[str, Any]],
             preempt: float | None, cfg: LoadProbeConfig, **measured: Any) -> dict[str, Any]:
    """One step's figures; ``measured`` adds what the probe read around it (queue_p95, memory, ...)."""
    s = summarize(records)

    def pct(key: str, p: str) -> float | None:
        return s[key][p]

    row = {"concurrency": concurrency, "requests": s["count"], "ok": s["ok"],
           "errors": s["errors"] + s["timeouts"], "error_rate": s["error_rate"], **hung_requests(records)}
    for metric, key in (("ttft", "ttft_s"), ("itl", "itl_s"), ("e2e", "e2e_s"), ("tpot", "tpot_s")):
        for p in ("p50", "p95", "p99"):
            row[f"{metric}_{p}"] = pct(key, p)
    row["output_tokens_per_s"] = s["output_tokens_per_s"]
    row["max_running"] = max((x["running"] or 0) for x in samples) if samples else None
    row["max_waiting"] = max((x["waiting"] or 0) for x in samples) if samples else None
    row["max_kv_usage"] = max((x["kv_usage"] or 0) for x in samples) if samples else None
    row["kv_usage_by_engine"] = engine_peaks(samples)
    row["preemptions"] = preempt
    row.update(measured)
    row["breaches"] = rules.breaches(row, cfg.slo, cfg.max_preemptions)
    row["inconclusive"] = bool(row.get("missing_samples"))
    row["meets_slo"] = not row["breaches"] and not row["inconclusive"]
    return row


def meets_slo(row: dict[str, Any], cfg: LoadProbeConfig) -> bool:
    """A step meets the SLO when it breaks no limit (rules.capacity.breaches); a row without a queue
    figure (merged loadgen hosts) is not judged on the queue."""
    return not rules.breaches(row, cfg.slo, cfg.max_preemptions)


def knee_of(steps: list[dict[str, Any]]) -> int | None:
    return rules.knee_of(steps)


def contract_shaped(i: int, share: float) -> bool:
    """Spread the contract's share evenly over a step: request i is at the contracted context."""
    return math.floor((i + 1) * share) > math.floor(i * share)


EARLY = ("capacity.long_prompt", "capacity.context_contract")


@dataclass
class Progress:
    """What the stages before the verified limit found: all a later call needs to conclude the stage
    after the server was relaunched with a limit's flags (run_load_limit)."""

    early: list[Finding] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    proposed: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    kv_ev: str = "kv_capacity.json"
    initial_preemptions: float | None = None
    seconds_before: float = 0.0
    memory: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    workload: list[dict[str, Any]] = field(default_factory=list)


def run_load_probe(base_url: str, source: MetricsSource, cfg: LoadProbeConfig, store: EvidenceStore, *,
                   relaunch: bool = False) -> tuple[list[Finding], dict[str, Any]]:
    """The capacity stage. With ``relaunch`` (the caller launched the server and can launch it again), a
    contract that does not hold stops after the ramp with a ``relaunch_point``: the caller relaunches the
    server with each proposed limit's flags in turn and calls :func:`run_load_limit`; otherwise a limit
    is verified by driving the client at it against the server as it runs."""
    run = LoadRun(base_url, source, cfg, store)
    try:
        first = source.snapshot()
    except MetricsError as exc:
        ev = store.write_text("metrics-error.txt", str(exc))
        return [registry.get("capacity.metrics").missing(None, str(exc), evidence=[ev])], {}
    with agents(run):
        return _run_load_probe(run, first, relaunch)


@contextlib.contextmanager
def agents(run: LoadRun) -> Iterator[None]:
    """The loadgen hosts' agents for this call (load/agent.py), connected and clock-checked; a host that does
    not answer raises LoadgenDown, which stops the probe naming it (the stage is missing)."""
    cfg = run.cfg
    if not cfg.agent_hosts:
        yield
        return
    run.pool = AgentPool(cfg.agent_endpoints, cfg.agent_hosts, cfg.agent_token or "")
    try:
        connected = run.pool.connect()
        run.store.append_jsonl("loadgen_agents.jsonl", {"t": time.time(), "agents": connected})
        yield
    finally:
        run.pool.close()


def _run_load_probe(run: LoadRun, first: Snapshot, relaunch: bool) -> tuple[list[Finding], dict[str, Any]]:
    cfg = run.cfg
    run.healthy_at_start = run.healthy()
    progress = Progress(initial_preemptions=first.value("vllm:num_preemptions"))
    progress.kv_ev = read_kv(run, first)
    run.sampler.start()
    t0 = time.time()
    late: list[Finding] = []
    try:
        progress.early += stage_long_prompt(run)
        if not run.crashed:
            progress.early.append(stage_context_contract(run))
        if not run.crashed:
            progress.steps = stage_ramp(run)
            progress.summary = rules.ramp_summary(progress.steps, cfg.contract_concurrency, cfg.ramp_bound)
        if not run.crashed and progress.steps:
            # No limit is proposed from an inconclusive step: the ramp's knee is unknown there, not low.
            knee = cfg.contract_concurrency if progress.summary.get("inconclusive_at") is not None \
                else progress.summary["knee"]
            progress.proposed = rules.propose_limits(run.readout, knee, cfg.contract_concurrency,
                                                     cfg.context_tokens, cfg.max_output_tokens,
                                                     min_context_tokens=cfg.prompt_tokens)
        if relaunch and cfg.verify_limit and progress.proposed:
            progress.seconds_before = time.time() - t0
            return pending_limit(run, progress)
        if cfg.verify_limit:
            progress.attempts = stage_verify(run, progress.proposed)
        verified, limit = judge_limit(run, progress)
        late = stage_at_limit(run, limit)
    finally:
        run.sampler.stop()
    progress.seconds_before = time.time() - t0
    return conclude(run, progress, verified, limit, late)


def read_kv(run: LoadRun, first: Snapshot) -> str:
    """The KV cache as the server reads it out (startup log, cache_config_info): kept as evidence."""
    cfg = run.cfg
    run.cache_cfg = cache_config(first)
    log_text = _path(cfg.server_log).read_text(errors="replace") if cfg.server_log and Path(
        cfg.server_log).is_file() else ""
    run.scan = scan_startup_log(log_text) if log_text else None
    # Each data-parallel engine has its own cache: the capacity is summed over them (each share stated).
    run.readout = rules.kv_readout_engines(run.scan.kv_cache_tokens if run.scan else None,
                                           run.scan.max_concurrency if run.scan else None,
                                           run.scan.max_concurrency_len if run.scan else None,
                                           cache_configs(first), first.engines())
    return run.store.write_json("kv_capacity.json", {"readout": run.readout.to_dict(),
                                                     "cache_config_info": run.cache_cfg,
                                                     "startup_log": cfg.server_log})


def judge_limit(run: LoadRun, progress: Progress) -> tuple[Finding, dict[str, Any]]:
    store = run.store
    ev = [store.write_json("verified_limit.json", {"proposed": progress.proposed, "attempts": progress.attempts})]
    return rules.judge_verified_limit(progress.proposed, progress.attempts, evidence=ev + [
        f"records/{a['stage']}.jsonl" for a in progress.attempts
        if a.get("stage") and store.path(f"records/{a['stage']}.jsonl").exists()])


def stage_at_limit(run: LoadRun, limit: dict[str, Any]) -> list[Finding]:
    """The mixed stream and the soak, at the verified limit when there is one, else at the contract."""
    concurrency = int(limit.get("client_concurrency", run.cfg.contract_concurrency))
    context = int(limit.get("context_tokens", run.cfg.context_tokens))
    late: list[Finding] = []
    if not run.crashed:
        late.append(stage_mixed(run, concurrency, context))
    if not run.crashed:
        late.append(stage_soak(run, concurrency))
    return late


def pending_limit(run: LoadRun, progress: Progress) -> tuple[list[Finding], dict[str, Any]]:
    """The stage as far as it went, waiting for the relaunch at each proposed limit: the limit, the mixed
    stream and the soak are inconclusive until a later call (run_load_limit) replaces them, so a run
    that stops here never passes on them."""
    why = "waiting for the server to be relaunched with the proposed limit's flags"
    verified = registry.get("capacity.verified_limit").inconclusive(
        reason=f"{why}: {'; '.join(' '.join(rules.limit_flags(s)) for s in progress.proposed)}",
        expected="a limited run that holds", action="relaunch the server with the limit's flags (playbooks/probes.yml)")
    late = [registry.get(check).inconclusive(reason=f"not run yet: {why}", expected="run at the verified limit",
                                             action="relaunch the server with the limit's flags (playbooks/probes.yml)")
            for check in ("capacity.mixed", "capacity.soak")]
    findings, details = conclude(run, progress, verified, {}, late)
    details["relaunch_point"] = {"settings": [{**s, "flags": rules.limit_flags(s)} for s in progress.proposed],
                                 "next": len(progress.attempts)}
    return findings, details


def run_load_limit(base_url: str, source: MetricsSource, cfg: LoadProbeConfig, store: EvidenceStore,
                   details: dict[str, Any], prior: list[Finding], *, relaunch_error: str | None = None,
                   relaunch_log: str | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """The next proposed limit, on the server the caller relaunched with its flags (or could not): one
    step at the limit's shape. The first that holds is the verified limit, and the mixed stream and the
    soak run there; when none is left, the stage concludes as run_load_probe would have."""
    point = details.get("relaunch_point") or {}
    settings = point.get("settings") or []
    index = int(point.get("next", 0))
    if index >= len(settings):
        raise ValueError("the load stage has no proposed limit left to verify (no relaunch_point)")
    run = LoadRun(base_url, source, cfg, store)
    with agents(run):
        return _run_load_limit(run, details, prior, relaunch_error, relaunch_log)


def _run_load_limit(run: LoadRun, details: dict[str, Any], prior: list[Finding], relaunch_error: str | None,
                    relaunch_log: str | None) -> tuple[list[Finding], dict[str, Any]]:
    store = run.store
    point = details["relaunch_point"]
    settings, index = point["settings"], int(point.get("next", 0))
    setting = {k: v for k, v in settings[index].items() if k != "flags"}
    progress = restore(run, details, prior)
    mode = f"server relaunched with {' '.join(settings[index]['flags'])}"
    if relaunch_log or relaunch_error:
        store.append_jsonl("relaunch.jsonl", {"flags": settings[index]["flags"], "log": relaunch_log,
                                              "error": relaunch_error})
    run.healthy_at_start = not relaunch_error and run.healthy()
    t0 = time.time()
    late: list[Finding] = []
    limit: dict[str, Any] = {}
    run.sampler.start()
    try:
        if relaunch_error or not run.healthy_at_start:
            progress.attempts.append({"setting": setting, "stage": None, "held": False, "breaches": [],
                                      "mode": mode, "relaunch_error": relaunch_error or "the relaunched server "
                                      "does not answer /health"})
        else:   # judged against the KV cache of the deployment as launched (the first call's readout)
            progress.attempts.append(verify_one(run, setting, mode))
        held = progress.attempts[-1]["held"]
        if not held and index + 1 < len(settings) and not run.crashed:
            progress.seconds_before += time.time() - t0
            return pending_limit(run, progress)
        verified, limit = judge_limit(run, progress)
        if not progress.attempts[-1].get("relaunch_error"):
            # No limit held: the server now runs the last refuted limit's flags, so the mixed stream and the
            # soak are measured at that setting (the contract's shape would hit the flags, not the deployment).
            late = stage_at_limit(run, limit or progress.attempts[-1]["setting"])
    finally:
        run.sampler.stop()
    progress.seconds_before += time.time() - t0
    if not late:  # the relaunched server never answered: nothing more to measure on it
        late = [registry.get(c).missing(None, f"not run: {progress.attempts[-1]['relaunch_error']}")
                for c in ("capacity.mixed", "capacity.soak")]
    return conclude(run, progress, verified, limit, late)


def restore(run: LoadRun, details: dict[str, Any], prior: list[Finding]) -> Progress:
    """The first call's progress from its stage details and findings (evidence relative to the probe)."""
    run.readout = rules.KvReadout(**(details.get("kv_readout") or {}))
    run.client_checks = list((details.get("client") or {}).items())
    run.bounds = list(details.get("stage_bounds") or [])
    return Progress(early=[f for f in prior if f.check in EARLY], steps=list(details.get("steps") or []),
                    summary=dict(details.get("ramp_summary") or {}),
                    proposed=list(details.get("proposed_limits") or []),
                    attempts=list(details.get("limit_attempts") or []),
                    initial_preemptions=details.get("initial_preemptions"),
                    seconds_before=float(details.get("seconds") or 0.0),
                    memory=list(details.get("memory_timeline") or []),
                    metrics=list(details.get("metrics_timeline") or []),
                    workload=_read_workload(run.store))


def _read_workload(store: EvidenceStore) -> list[dict[str, Any]]:
    try:
        return list(json.loads(store.path("workload.json").read_text()).get("requests") or [])
    except (OSError, ValueError, AttributeError):
        return []


def conclude(run: LoadRun, progress: Progress, verified_finding: Finding, limit: dict[str, Any],
             late: list[Finding]) -> tuple[list[Finding], dict[str, Any]]:
    """The stage's findings and details from what was measured (rules/capacity.py judges)."""
    cfg, store = run.cfg, run.store
    steps, summary, proposed = progress.steps, progress.summary, progress.proposed
    verified = bool(limit) if proposed else None
    findings = list(progress.early)
    if steps:
        ev = [store.write_json("ramp.json", {"summary": summary, "steps": steps})] + [
            f"records/ramp_c{s['concurrency']}.jsonl" for s in steps
            if store.path(f"records/ramp_c{s['concurrency']}.jsonl").exists()]
        findings.append(rules.judge_ramp(steps, summary, evidence=ev, verified=verified,
                                         request_timeout_s=cfg.request_timeout_s,
                                         max_preemptions=cfg.max_preemptions))
    if steps or proposed:
        findings.append(verified_finding)
    findings += late
    findings.insert(0, rules.judge_kv_capacity(run.readout, cfg.contract_concurrency, cfg.context_tokens,
                                               cfg.max_output_tokens, evidence=[progress.kv_ev], verified=verified))
    workload = progress.workload + run.workload
    store.write_json("workload.json", {"tokenize": run.prompts.available, "tokenize_calls": run.prompts.calls,
                                       "contract_share": cfg.contract_share, "requests": workload})
    ev_samples = [p for p in ("samples.jsonl", "memory.jsonl") if store.path(p).exists()]
    if run.crashed:
        findings += crash_findings(run, findings, ev_samples)
    findings = [saturated_overrule(f, run, steps) for f in findings]
    client_ev = store.write_json("client.json", [{"label": label, **c} for label, c in run.client_checks])
    findings.append(loadgen_rules.loadgen_finding(run.client_checks, [client_ev]))
    details = {"contract_concurrency": cfg.contract_concurrency, "knee": summary.get("knee"),
               "headroom": summary.get("headroom"), "broke_on": summary.get("broke_on"),
               "knee_text": summary.get("text"), "ramp_summary": summary, "steps": steps,
               "kv_readout": run.readout.to_dict(), "proposed_limits": proposed, "limit_attempts": progress.attempts,
               "memory_timeline": progress.memory + run.sampler.memory, "stage_bounds": run.bounds, "limits": limit,
               "samples": len(progress.metrics) + len(run.sampler.samples), "crash": run.crashed,
               "seconds": round(progress.seconds_before, 1), "initial_preemptions": progress.initial_preemptions,
               # For the report's KV / queue timeline plot; the full rows are evidence (samples.jsonl).
               "metrics_timeline": progress.metrics + [
                   {k: s.get(k) for k in ("t", "stage", "running", "waiting", "kv_usage", "preemptions")}
                   for s in run.sampler.samples],
               # The workload actually sent, beside the contract it stands for (the report flags differences):
               # the contract's share of every step at the contracted context and maximum output.
               "workload": {"tokenize": run.prompts.available, "contract_share": cfg.contract_share,
                            "ramp": cfg.ramp, "requests_per_step": cfg.requests_per_step,
                            "prompt_tokens": cfg.prompt_tokens,
                            "ramp_context_tokens": cfg.context_tokens if cfg.contract_share > 0 else cfg.prompt_tokens,
                            "output_tokens": cfg.max_output_tokens if cfg.contract_share > 0 else cfg.output_tokens,
                            "long_prompt_tokens": cfg.long_prompt_tokens, "context_tokens": cfg.context_tokens,
                            "soak_s": cfg.soak_s},
               "client": {label: c for label, c in run.client_checks}}
    return findings, details


def crash_findings(run: LoadRun, findings: list[Finding], ev_samples: list[str]) -> list[Finding]:
    crashed = run.crashed or {}
    ev = run.store.write_json("oom_record.json", crashed)
    out = [crash_finding(crashed, [ev] + ev_samples)]
    done = {f.check for f in findings}
    for check in ("capacity.context_contract", "capacity.ramp", "capacity.mixed", "capacity.soak"):
        if check not in done:
            out.append(registry.get(check).missing(
                None, f"not run: the server died in stage {crashed.get('probe_stage') or crashed.get('stage')}"))
    return out


def crash_finding(record: dict[str, Any], evidence: list[str]) -> Finding:
    """capacity.crash from the crash record: an OOM is a capacity failure (expand_capacity, the OOM line
    quoted); a death without a capacity signature decides nothing about capacity (inconclusive, the
    causal line of the log or of the failed requests named), so the run is incomplete, never a release."""
    check = registry.get("capacity.crash")
    stage = record.get("probe_stage") or record.get("stage")
    observed = {k: record.get(k) for k in ("probe_stage", "stage", "kind", "process_state", "model_loaded",
                                           "stage_evidence")}
    if record.get("oom_lines"):
        return check.fail(observed=observed, expected="the server survives every stage", evidence=evidence,
                          reason=f"OOM in stage {stage}: " + "; ".join(record["oom_lines"][-2:]),
                          action=record.get("action") or "read the OOM record: at load -> weights/parallel "
                          "layout/topology; under KV growth -> context, concurrency, retention, prefill/decode "
                          "balance; adjust limits before adding GPUs")
    # The log's telling line, else the first failed request's error (the later ones only find the port closed).
    cause = causal_line("\n".join(record.get("log_tail") or [])) or causal_line(
        "\n".join(str(e) for e in (record.get("errors") or [])[:1]))
    return check.inconclusive(
        observed=observed, expected="the server survives every stage", evidence=evidence,
        reason=f"the server died in stage {stage} without an OOM signature: "
               + (cause or "no log line says why (give the server log)"),
        action="read the crash record and the server log: a crash that is not capacity (a bug, a killed process, "
               "a lost node) is fixed and the run repeated; it proves nothing about capacity")


def memory_split(run: LoadRun, rec: Record | None) -> dict[str, int | None]:
    """Peak memory of one request's prefill (sent -> first token) and of its decode (first token -> end)."""
    if rec is None or rec.sent is None:
        return {"prefill_peak_bytes": None, "decode_peak_bytes": None}
    cut = rec.first_token or rec.end or rec.sent
    pre = run.sampler.memory_window(rec.sent, cut)
    # Like the prefill's window, the decode's includes the sample taken right after it ends: a decode shorter than
    # a sample's own cost on a busy host would otherwise hold no sample at all.
    dec = run.sampler.memory_window(cut, rec.end or cut)
    return {"prefill_peak_bytes": max(pre) if pre else None, "decode_peak_bytes": max(dec) if dec else None}


STAGE_LABELS = {"capacity.long_prompt": "long_prompt", "capacity.ramp": "ramp_c", "capacity.mixed": "mixed",
                "capacity.soak": "soak"}


def saturated_overrule(finding: Finding, run: LoadRun, steps: list[dict[str, Any]]) -> Finding:
    """A stage whose client was saturated is inconclusive (rules/loadgen.py), never a capacity verdict."""
    prefix = STAGE_LABELS.get(finding.check)
    if prefix is None:
        return finding
    checks = [(label, c) for label, c in run.client_checks if label.startswith(prefix)]
    trusted = finding.check == "capacity.ramp" and loadgen_rules.first_break_trusted(steps)
    return loadgen_rules.overrule(finding, checks, trusted_failure=trusted)


def stage_long_prompt(run: LoadRun) -> list[Finding]:
    """One agent-like prompt at the contracted context (counted), concurrency 1; prefill vs decode memory."""
    cfg = run.cfg
    tokens = min(cfg.long_prompt_tokens, cfg.context_tokens)
    req = run.build(tokens, cfg.max_output_tokens, 1, "long")
    # One request's prefill can be shorter than the sampling interval (25 ms on the lab): sample its memory
    # every 5 ms while it runs, so its prefill and decode peaks are measured, not missed between two samples.
    run.sampler.fine_memory(min(0.005, cfg.sample_interval_s))
    try:
        records, start, end = run.send("long_prompt", [req], 1)
    finally:
        run.sampler.fine_memory(None)
    samples = run.sampler.window(start, end)
    rec = records[0] if records else None
    ok = rec is not None and rec.status == "ok"
    check = registry.get("capacity.long_prompt")
    observed = {"target_tokens": tokens, "prompt_tokens": rec.prompt_tokens if rec else None,
                "status": rec.status if rec else None, "request_id": rec.request_id if rec else None,
                "error": rec.error if rec else "no record", "e2e_s": rec.e2e if rec else None,
                "ttft_s": rec.ttft if rec else None, **memory_split(run, rec),
                "max_kv_usage": max((s["kv_usage"] or 0) for s in samples) if samples else None}
    common = {"observed": observed, "expected": f"one agent-like prompt of {tokens} tokens completes",
              "evidence": [p for p in ("records/long_prompt.jsonl", "memory.jsonl") if run.store.path(p).exists()]}
    if ok:
        return [check.passed(**common)]
    return [check.fail(action="a failure here points at max-model-len, the cache format or one profile's capacity",
                       reason=f"the long request ended {observed['status']}: {observed['error']}", **common)]


def _post(run: LoadRun, req: RequestSpec) -> dict[str, Any]:
    body = {"model": run.cfg.model, "messages": req.messages, "max_tokens": req.max_tokens, "temperature": 0.0}
    headers = {"Authorization": f"Bearer {run.cfg.api_key}"} if run.cfg.api_key else {}
    try:
        response = httpx.post(run.base_url.rstrip("/") + "/chat/completions", json=body,
                              timeout=run.cfg.request_timeout_s, headers=headers)
        return {"http_status": response.status_code, "body": response.text[:600]}
    except httpx.HTTPError as exc:
        return {"http_status": 0, "body": f"{type(exc).__name__}: {exc}"}


def served_max_model_len(run: LoadRun) -> int | None:
    """The context the server itself says it serves: /tokenize's max_model_len, else /v1/models' (never the
    profile's: a site contract below the recipe's --max-model-len is judged against the served one)."""
    if run.prompts.max_model_len:
        return int(run.prompts.max_model_len)
    headers = {"Authorization": f"Bearer {run.cfg.api_key}"} if run.cfg.api_key else {}
    try:
        data = httpx.get(run.base_url.rstrip("/") + "/models", timeout=10.0, headers=headers).json()
    except (httpx.HTTPError, ValueError):
        return None
    entries = data.get("data") if isinstance(data, dict) else None
    found = [e.get("max_model_len") for e in entries or [] if isinstance(e, dict) and e.get("id") == run.cfg.model]
    return found[0] if found and isinstance(found[0], int) else None


def stage_context_contract(run: LoadRun) -> Finding:
    """At the contracted context (context + max output) a request succeeds; one token over is rejected, or, where
    the server serves more than the contract, served with a warning while one over the served limit is rejected
    (rules/capacity.py, judge_context_contract)."""
    cfg = run.cfg
    window = rules.tokens_per_session(cfg.context_tokens, cfg.max_output_tokens)
    run.sampler.stage = "context_contract"
    at_req = run.build(cfg.context_tokens, cfg.max_output_tokens, 3, "at-context")
    at = {**_post(run, at_req), "prompt_tokens": run.workload[-1]["counted_tokens"],
          "max_tokens": cfg.max_output_tokens}
    # The whole contracted window plus one token in the prompt alone: over the contract whatever max_tokens.
    over_req = run.build(window + 1, cfg.max_output_tokens, 2, "over-context", at_least=True)
    over = {**_post(run, over_req), "prompt_tokens": run.workload[-1]["counted_tokens"],
            "max_tokens": cfg.max_output_tokens}
    served = served_max_model_len(run)
    over_served = None
    if served is not None and served > window:
        # The served limit plus one token in the prompt alone: the server must refuse it for its length.
        served_req = run.build(served + 1, cfg.max_output_tokens, 4, "over-served", at_least=True)
        over_served = {**_post(run, served_req), "prompt_tokens": run.workload[-1]["counted_tokens"],
                       "max_tokens": cfg.max_output_tokens}
    healthy = run.healthy()
    ev = run.store.write_json("context_contract.json", {"contract_window_tokens": window, "at_contract": at,
                                                        "over_contract": over, "served_max_model_len": served,
                                                        "over_served": over_served, "healthy_after": healthy,
                                                        "counted_by": "/tokenize" if run.prompts.available
                                                        else "estimate"})
    return rules.judge_context_contract(at, over, healthy, cfg.context_tokens, cfg.max_output_tokens, evidence=[ev],
                                        served_max_model_len=served, over_served=over_served)


def run_step(run: LoadRun, stage: str, concurrency: int, context: int, seed0: int) -> dict[str, Any]:
    """One step at the contract's shape: the profile's share at ``context`` (+ max output), the rest short."""
    cfg = run.cfg
    n = max(cfg.requests_per_step, concurrency)
    specs = [run.build(context, cfg.max_output_tokens, seed0 + i, f"{stage}-ctx")
             if contract_shaped(i, cfg.contract_share) else
             run.build(cfg.prompt_tokens, cfg.output_tokens, seed0 + i, f"{stage}-short") for i in range(n)]
    before = run.snapshot()
    records, start, end = run.send(stage, specs, concurrency)
    after = run.snapshot()
    have = before is not None and after is not None
    preempted = delta(before, after, "vllm:num_preemptions") if have else None
    count, total = histogram_delta(before, after, "vllm:request_queue_time_seconds") if have else (None, None)
    queue_p95 = histogram_quantile_delta(before, after, "vllm:request_queue_time_seconds", 0.95) if have else None
    mem = run.sampler.memory_window(start, end)
    samples = run.sampler.window(start, end)
    block = run.readout.block_size
    sat = rules.kv_saturated(samples, preempted, run.readout.tokens,
                             rules.tokens_per_session(context, cfg.max_output_tokens), block,
                             demand_tokens=rules.peak_inflight_tokens([r.to_dict() for r in records], block),
                             queued_s=total, engine_tokens=run.readout.engine_tokens)
    row = step_row(concurrency, records, samples, preempted, cfg, queue_p95=queue_p95,
                   queue_time_mean_s=(total / count) if count and total is not None else None, **sat,
                   peak_memory_bytes=max(mem) if mem else None, context_tokens=context, stage=stage,
                   seconds=round(end - start, 2),
                   missing_samples=missing_samples(before, after, run.sampler.failed_in(start, end), samples,
                                                   run.crashed is not None))
    row["client"] = run.last_client
    return row


def missing_samples(before: Snapshot | None, after: Snapshot | None, failed: int,
                    samples: list[dict[str, Any]], crashed: bool) -> list[str]:
    """What a step lacks because a metrics scrape failed (the server answering): the figures read from the
    scrape around it, or every sample of its window. The step is then inconclusive, never a breach or a pass
    (a server that died is judged as a crash, not here)."""
    if crashed:
        return []
    lacks = []
    for when, snap in (("before", before), ("after", after)):
        if snap is None:
            lacks.append(f"the metrics scrape {when} the step failed: no preemption count, no queue time "
                         "(preemptions, queue_p95)")
    if failed and not samples:
        lacks.append(f"every metrics sample of the step's window failed ({failed}): no KV usage, running or "
                     "waiting reading (kv_usage)")
    return lacks


def stage_ramp(run: LoadRun) -> list[dict[str, Any]]:
    """Step up through the profile's ramp to the contract, then past it (doubling, bounded by
    ``load.max_step`` and ``load.ramp_budget_s``) until a step breaks: the real knee."""
    cfg = run.cfg
    steps: list[dict[str, Any]] = []
    t0 = time.time()
    for concurrency in rules.ramp_plan(cfg.ramp, cfg.contract_concurrency, cfg.ramp_bound):
        if concurrency > cfg.contract_concurrency and time.time() - t0 > cfg.ramp_budget_s:
            break
        row = run_step(run, f"ramp_c{concurrency}", concurrency, cfg.context_tokens, 1000 * concurrency)
        steps.append(row)
        if run.crashed or (concurrency >= cfg.contract_concurrency and not row["meets_slo"]):
            break
    return steps


def stage_verify(run: LoadRun, proposed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Re-run at each proposed limit (client concurrency and context) until one holds, the server as it
    runs (an attached server is someone else's: it is never relaunched)."""
    attempts = []
    for setting in proposed:
        attempts.append(verify_one(run, setting, "client driven at the limit (server as launched)"))
        if run.crashed or attempts[-1]["held"]:
            break
    return attempts


def verify_one(run: LoadRun, setting: dict[str, Any], mode: str) -> dict[str, Any]:
    """One step at a proposed limit's client concurrency and context: held when it meets the SLO."""
    stage = f"verify_{setting['kind']}"
    row = run_step(run, stage, int(setting["client_concurrency"]), int(setting["context_tokens"]), 50_000)
    return {"setting": setting, "stage": stage, "held": row["meets_slo"] and not run.crashed,
            "breaches": row["breaches"], "mode": mode, "missing_samples": row.get("missing_samples") or [],
            "row": {k: row.get(k) for k in ("concurrency", "ok", "errors", "ttft_p95", "e2e_p95", "queue_p95",
                                             "max_waiting", "max_kv_usage", "preemptions", "kv_saturated")}}


SHARED_PREFIX = ("Shared agent system prompt. " + filler(300, 99) + " ")


def repeated_hit_ratio(run: LoadRun, probe: RequestSpec) -> float | None:
    """Send the repeated request alone and read its hit ratio from the counter deltas (no other traffic)."""
    before = run.snapshot()
    records, _, _ = run.send("mixed_repeated", [probe], 1)
    after = run.snapshot()
    if not before or not after or not records or records[0].status != "ok":
        return None
    hits = delta(before, after, "vllm:prefix_cache_hits")
    queries = delta(before, after, "vllm:prefix_cache_queries")
    return (hits / queries) if hits is not None and queries else None


def stage_mixed(run: LoadRun, concurrency: int, context: int, windows: int = 3) -> Finding:
    """Short, long, cold and repeated requests together: the repeated requests' hit ratio after each
    window (a lone repeated request, counters), and the queue window over window."""
    cfg = run.cfg
    repeated = run.build(64, cfg.output_tokens, 7, "mixed-repeated", prefix=SHARED_PREFIX)
    warm = repeated_hit_ratio(run, repeated)  # the first send fills the cache
    rows = []
    for w in range(windows):
        specs = []
        for i in range(concurrency * 2):
            seed = 10_000 * (w + 1) + i
            kind = i % 4
            if kind == 0:
                specs.append(run.build(64, cfg.output_tokens, seed, "mixed-short"))
            elif kind == 1:
                specs.append(run.build(context, cfg.max_output_tokens, seed, "mixed-long"))
            elif kind == 2:
                specs.append(run.build(cfg.prompt_tokens, cfg.output_tokens, seed, "mixed-cold"))
            else:
                specs.append(repeated)
        before = run.snapshot()
        records, start, end = run.send("mixed", specs, concurrency)
        after = run.snapshot()
        count, total = histogram_delta(before, after, "vllm:request_queue_time_seconds") if before and after \
            else (None, None)
        samples = run.sampler.window(start, end)
        client_saturated = run.last_client.get("saturated")
        row = {"window": w + 1, "requests": len(records), "errors": sum(r.status != "ok" for r in records),
               "client_saturated": client_saturated,
               **hung_requests(records), "queue_time_mean_s": (total / count) if count and total is not None else None,
               "max_waiting": max((x["waiting"] or 0) for x in samples) if samples else None}
        if not run.crashed:
            row["repeated_hit_ratio"] = repeated_hit_ratio(run, repeated)
        rows.append(row)
        if run.crashed:
            break
    ev = [run.store.write_json("mixed.json", {"warm_hit_ratio": warm, "concurrency": concurrency,
                                              "context_tokens": context, "windows": rows})] + [
        p for p in ("records/mixed.jsonl", "records/mixed_repeated.jsonl") if run.store.path(p).exists()]
    finding = rules.judge_mixed(rows, cfg.contract_concurrency, evidence=ev)
    finding.configuration = {"concurrency": concurrency, "context_tokens": context}
    return finding


def proc_start_time(pid: int | None) -> float | None:
    """Start time of a local process (clock ticks since boot, /proc/PID/stat field 22)."""
    if not pid:
        return None
    try:
        return float(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def log_size(path: str | None) -> int:
    try:
        return Path(path).stat().st_size if path else 0
    except OSError:
        return 0


def stage_soak(run: LoadRun, concurrency: int) -> Finding:
    """Fixed and varied samples alternating at the (limited) contracted concurrency: memory growth,
    errors, hangs, restarts (process start time), preemptions and communication errors in the log."""
    cfg = run.cfg
    before = run.snapshot()
    pid_start, log_from = proc_start_time(cfg.server_pid), log_size(cfg.server_log)
    deadline = time.time() + cfg.soak_s
    records: list[Record] = []
    start = time.time()
    batch = 0
    while time.time() < deadline and not run.crashed:
        seed = 7 if batch % 2 == 0 else 5000 + batch  # fixed sample, then a varied one
        specs = [run.build(cfg.prompt_tokens, cfg.output_tokens, seed + i, "soak") for i in range(concurrency)]
        got, _, _ = run.send("soak", specs, concurrency)
        records += got
        batch += 1
    end = time.time()
    after = run.snapshot()
    restarts = []
    for name, a, b in (("process_start_time_seconds", before and before.value("process_start_time_seconds"),
                        after and after.value("process_start_time_seconds")),
                       (f"/proc/{cfg.server_pid}/stat start time", pid_start, proc_start_time(cfg.server_pid))):
        if a is not None and b is not None and a != b:
            restarts.append(f"{name} {a} -> {b}")
    new_log = _read_from(cfg.server_log, log_from)
    scan = scan_startup_log(new_log) if new_log.strip() else None
    comm = [f"{x.number}: {x.text[:300]}" for x in (scan.nccl_errors + scan.dmabuf_errors)] if scan else []
    mem = run.sampler.memory_window(start, end)
    s = summarize(records)
    obs = {"seconds": round(end - start, 1), "concurrency": concurrency, "requests": s["count"],
           "errors": s["errors"] + s["timeouts"], **hung_requests(records),
           "memory_growth_pct": memory_growth_pct(mem), "memory_samples": len(mem),
           "preemptions": delta(before, after, "vllm:num_preemptions") if before and after else None,
           "restarts": restarts, "start_times_seen": bool(
               (before and before.value("process_start_time_seconds") is not None) or pid_start is not None),
           "log_observed": bool(new_log.strip()), "comm_errors": comm}
    ev = [run.store.write_json("soak.json", obs)] + [p for p in ("records/soak.jsonl", "memory.jsonl")
                                                    if run.store.path(p).exists()]
    return rules.judge_soak(obs, cfg.memory_growth_pct, cfg.max_preemptions, evidence=ev,
                            configuration={"window": {"start": start, "end": end}, "concurrency": concurrency,
                                           "max_growth_pct": cfg.memory_growth_pct},
                            request_timeout_s=cfg.request_timeout_s)


def _read_from(path: str | None, offset: int) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def memory_growth_pct(series: list[int] | list[float]) -> float | None:
    """Mean of the last quarter against the first quarter of a memory series; None under 4 samples."""
    if len(series) < 4:
        return None
    q = max(1, len(series) // 4)
    first, last = sum(series[:q]) / q, sum(series[-q:]) / q
    return (last - first) / first * 100 if first else None


def judge_soak_gpu_memory(finding: Finding, rows: list[dict[str, Any]]) -> Finding:
    """capacity.soak judged on the per-GPU series sampled on the nodes over the soak window, the worst
    GPU deciding: it decides a soak left inconclusive for want of process memory (a container, an
    attached or remote server), and it can fail one that passed on the server process's memory alone
    (host RSS stays flat while GPU memory leaks). A failed soak stays failed."""
    window = (finding.configuration or {}).get("window") or {}
    limit = (finding.configuration or {}).get("max_growth_pct")
    if finding.status not in (Status.INCONCLUSIVE, Status.PASS) or not window or limit is None:
        return finding
    by_series: dict[str, list[int]] = {}
    for row in rows:
        if window["start"] <= row["t"] <= window["end"]:
            by_series.setdefault(row["series"], []).append(row["bytes"])
    growth = {name: memory_growth_pct(values) for name, values in by_series.items()}
    known = {k: v for k, v in growth.items() if v is not None}
    if not known:
        return finding
    worst = max(known, key=lambda k: known[k])
    finding.observed = {**(finding.observed or {}), "gpu_memory_growth_pct": known, "worst_gpu": worst}
    others = [u for u in (finding.observed.get("not_observed") or []) if not u.startswith("memory growth")]
    if known[worst] <= limit and others:
        return finding  # memory is now known, the rest still is not: never a pass
    finding.status = Status.PASS if known[worst] <= limit else Status.FAIL
    finding.reason = "" if finding.status == Status.PASS else f"GPU memory rises {known[worst]:.1f}% on {worst}"
    return finding


def snapshot_preemptions(snap: Snapshot) -> float | None:
    return snap.value("vllm:num_preemptions")
