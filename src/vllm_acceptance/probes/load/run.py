"""LoadRun: one call's state and its sends (on the controller or through the loadgen agents), the client's
self-check per send, and the crash record taken when the server stops answering."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from ...core.evidence import EvidenceStore
from ...load.agent import AgentPool
from ...load.engine import Record, RequestSpec, run_load
from ...load.stats import client_summary, summarize
from ...parsers.startup_log import StartupScan
from ...rules import loadgen as loadgen_rules
from ...runtime.metrics import MetricsError, MetricsSource, Snapshot, server_root
from ...runtime.process import rss_bytes, tail_lines
from . import rules
from .config import LoadProbeConfig
from .crash import OOM_MARKERS
from .prompts import PromptBuilder
from .sampler import Sampler

# Sends that measure one request alone stay on the controller; every other step goes through the agents.
LONE_STAGES = ("long_prompt", "mixed_repeated")


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
                "data": scan.dp_size if scan and scan.dp_size else self.cfg.parallel.get("data"),
                "world_size": scan.world_size if scan else None}


def _path(p: str | None) -> Path | None:
    return Path(p) if p else None
