"""Capacity under load (docs/acceptance.md "Capacity under load"): staged, each stage with its own evidence.

Stages: long prompt (one request near the contracted context), context contract (one request
over it must be rejected, the server still healthy), concurrency ramp (knee = largest step that
meets the SLO with no errors and no preemption), mixed stream, soak. A sampler scrapes the
server's metrics (and memory: per-GPU where there are GPUs, the server's RSS in the lab, labelled
so) for the whole run, appending to JSONL as it goes. A server that dies mid-stage produces a
crash/OOM record and the remaining stages are reported `missing`.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..core.evidence import EvidenceStore
from ..core.findings import Consequence, Finding, Status, missing
from ..core.profile import Profile
from ..lab.server import rss_bytes, tail_lines
from ..load.engine import Record, RequestSpec, run_closed_loop_sync
from ..load.stats import summarize
from ..parsers.causal import causal_line
from .metrics import MetricsError, MetricsSource, Snapshot, delta, histogram_delta

OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "killed process",
               "oom-kill", "cannot allocate memory")
WORDS = ("node", "driver", "fabric", "gpu", "cache", "ticket", "health", "service", "gateway", "engine",
         "memory", "queue", "tensor", "parallel", "prefill", "decode", "token", "status", "window", "owner")


@dataclass
class LoadProbeConfig:
    model: str
    contract_concurrency: int = 4
    context_tokens: int = 1536
    max_model_len: int = 2048
    ramp: list[int] = field(default_factory=lambda: [1, 2, 4])
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

    @classmethod
    def from_profile(cls, profile: Profile | None, overrides: dict[str, Any], **kw: Any) -> LoadProbeConfig:
        def get(dotted: str, default: Any) -> Any:
            if dotted in overrides:
                return overrides[dotted]
            return profile.get(dotted, default) if profile else default

        return cls(
            contract_concurrency=int(get("contract.concurrency", 4)),
            context_tokens=int(get("contract.context_tokens", 1536)),
            max_model_len=int(get("model.max_model_len", 2048)),
            ramp=[int(c) for c in get("load.ramp", [1, 2, 4])],
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
            sample_interval_s=float(get("load.sample_interval_s", 0.25)), **kw)


def filler(n_words: int, seed: int) -> str:
    """Deterministic agent-like filler text of about n_words words (~1.3 tokens a word in the lab)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def spec(tokens: int, output: int, seed: int, tag: str, prefix: str = "") -> RequestSpec:
    words = max(1, int(tokens / 1.3))
    return RequestSpec(messages=[{"role": "system", "content": prefix + f"Request {tag}-{seed}."},
                                 {"role": "user", "content": filler(words, seed)}],
                       max_tokens=output, tag=tag, extra={"temperature": 0.0, "ignore_eos": True})


class Sampler(threading.Thread):
    """Scrape metrics (and memory) every interval into samples.jsonl until stopped."""

    def __init__(self, source: MetricsSource, store: EvidenceStore, cfg: LoadProbeConfig) -> None:
        super().__init__(daemon=True)
        self.source, self.store, self.cfg = source, store, cfg
        self.stop_event = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.stage = "idle"
        self.errors = 0

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
            self.stop_event.wait(self.cfg.sample_interval_s)

    def take_memory(self) -> None:
        rss = rss_bytes(self.cfg.server_pid) if self.cfg.server_pid else None
        if rss:
            mem = {"t": time.time(), "bytes": rss, "series": "rss:vllm", "label": "process RSS (no GPU)",
                   "stage": self.stage}
            self.memory.append(mem)
            self.store.append_jsonl("memory.jsonl", mem)

    def take(self) -> None:
        now = time.time()
        try:
            snap = self.source.snapshot()
        except MetricsError as exc:
            self.errors += 1
            self.store.append_jsonl("samples.jsonl", {"t": now, "stage": self.stage, "error": str(exc)})
            return
        row = {"t": now, "stage": self.stage,
               "running": snap.value("vllm:num_requests_running"),
               "waiting": snap.value("vllm:num_requests_waiting"),
               "kv_usage": snap.value("vllm:kv_cache_usage_perc"),
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

    def memory_window(self, start: float, end: float) -> list[int]:
        slack = self.cfg.sample_interval_s * 2
        return [m["bytes"] for m in self.memory if start <= m["t"] <= end + slack]


class LoadRun:
    def __init__(self, base_url: str, source: MetricsSource, cfg: LoadProbeConfig, store: EvidenceStore) -> None:
        self.base_url, self.source, self.cfg, self.store = base_url, source, cfg, store
        self.sampler = Sampler(source, store, cfg)
        self.bounds: list[dict[str, Any]] = []
        self.crashed: dict[str, Any] | None = None

    def snapshot(self) -> Snapshot | None:
        """A metrics snapshot, or None when the server stopped answering (judged by `send`)."""
        try:
            return self.source.snapshot()
        except MetricsError:
            return None

    def healthy(self) -> bool:
        root = self.base_url.rstrip("/")
        root = root[:-3] if root.endswith("/v1") else root
        try:
            return httpx.get(f"{root}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def send(self, stage: str, specs: list[RequestSpec], concurrency: int) -> tuple[list[Record], float, float]:
        self.sampler.stage = stage
        start = time.time()
        records = run_closed_loop_sync(
            self.base_url, self.cfg.model, specs, concurrency, timeout_s=self.cfg.request_timeout_s,
            stage_deadline_s=self.cfg.stage_timeout_s, api_key=self.cfg.api_key,
            on_record=lambda r: self.store.append_jsonl(f"records/{stage}.jsonl", r.to_dict()))
        end = time.time()
        self.bounds.append({"stage": stage, "start": start, "end": end})
        self.sampler.take()
        if any(r.status != "ok" for r in records) and not self.healthy():
            self.crashed = self.crash_record(stage, records, start)
        return records, start, end

    def crash_record(self, stage: str, records: list[Record], start: float) -> dict[str, Any]:
        """The OOM record of docs/acceptance.md: what is known at the moment the server stopped answering."""
        log = tail_lines(_path(self.cfg.server_log), 40)
        oom = [line for line in log.splitlines() if any(m in line.lower() for m in OOM_MARKERS)]
        last = self.sampler.samples[-5:]
        return {"stage": stage, "time": time.time(), "stage_started": start, "kind": "oom" if oom else "crash",
                "oom_lines": oom, "log_tail": log.splitlines(),
                "errors": [r.error for r in records if r.error][:5],
                "requests_in_stage": len(records), "ok_before_crash": sum(r.status == "ok" for r in records),
                "last_samples": last, "memory_before": self.sampler.memory[-10:],
                "process_state": "exited" if self.cfg.server_pid and not rss_bytes(self.cfg.server_pid)
                else ("unresponsive" if self.cfg.server_pid else "unknown (attached server)"),
                "model_loaded": True, "max_model_len": self.cfg.max_model_len,
                "prompt_tokens": max((r.prompt_tokens or 0) for r in records) if records else None}


def _path(p: str | None) -> Any:
    from pathlib import Path

    return Path(p) if p else None


def hung_requests(records: list[Record], limit: int = 20) -> dict[str, Any]:
    """How many requests got no complete answer within the request timeout (or the stage deadline),
    and which: their request ids, as in records/<stage>.jsonl (the first `limit`)."""
    ids = [r.request_id for r in records if r.status == "timeout"]
    return {"timeouts": len(ids), "timed_out": ids[:limit]}


def step_row(concurrency: int, records: list[Record], samples: list[dict[str, Any]],
             preempt: float | None, cfg: LoadProbeConfig) -> dict[str, Any]:
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
    row["preemptions"] = preempt
    row["meets_slo"] = meets_slo(row, cfg)
    return row


def meets_slo(row: dict[str, Any], cfg: LoadProbeConfig) -> bool:
    slo = cfg.slo
    checks = [row["ok"] > 0, (row["error_rate"] or 0) <= slo.get("max_error_rate", 0.0),
              row["preemptions"] is not None and row["preemptions"] <= cfg.max_preemptions]
    for metric, key in (("ttft_p95", "ttft_p95_s"), ("e2e_p95", "e2e_p95_s"), ("itl_p95", "itl_p95_s")):
        if key in slo:
            checks.append(row[metric] is not None and row[metric] <= slo[key])
    return all(checks)


def knee_of(steps: list[dict[str, Any]]) -> int | None:
    """Largest concurrency meeting the SLO, counting only up to the first step that breaks it."""
    knee = None
    for row in sorted(steps, key=lambda r: r["concurrency"]):
        if not row["meets_slo"]:
            break
        knee = row["concurrency"]
    return knee


def run_load_probe(base_url: str, source: MetricsSource, cfg: LoadProbeConfig, store: EvidenceStore
                   ) -> tuple[list[Finding], dict[str, Any]]:
    run = LoadRun(base_url, source, cfg, store)
    try:
        first = source.snapshot()
    except MetricsError as exc:
        ev = store.write_text("metrics-error.txt", str(exc))
        return [Finding(check="capacity.metrics", status=Status.MISSING, observed=str(exc), evidence=[ev],
                        consequence=Consequence.EXPAND, expected="readable metrics",
                        action=f"make {source.description} readable")], {}
    run.sampler.start()
    findings: list[Finding] = []
    steps: list[dict[str, Any]] = []
    try:
        findings += stage_long_prompt(run)
        if not run.crashed:
            findings.append(stage_context_contract(run))
        if not run.crashed:
            steps, ramp_findings = stage_ramp(run)
            findings += ramp_findings
        if not run.crashed:
            findings.append(stage_mixed(run))
        if not run.crashed:
            findings.append(stage_soak(run))
    finally:
        run.sampler.stop_event.set()
        run.sampler.join(timeout=5)
    ev_samples = [p for p in ("samples.jsonl", "memory.jsonl") if store.path(p).exists()]
    if run.crashed:
        ev = store.write_json("oom_record.json", run.crashed)
        findings.append(crash_finding(run.crashed, [ev] + ev_samples))
        done = {f.check for f in findings}
        for check in ("capacity.context_contract", "capacity.ramp", "capacity.mixed", "capacity.soak"):
            if check not in done:
                findings.append(missing(check, None, f"not run: the server died in stage {run.crashed['stage']}",
                                        Consequence.EXPAND))
    knee = knee_of(steps)
    limits = {}
    if knee is not None and knee < cfg.contract_concurrency:
        limits = {"max_num_seqs": knee, "client_concurrency": knee, "context_tokens": cfg.context_tokens,
                  "reason": f"stable only up to concurrency {knee} < contracted {cfg.contract_concurrency}"}
    details = {"contract_concurrency": cfg.contract_concurrency, "knee": knee, "steps": steps,
               "memory_timeline": run.sampler.memory, "stage_bounds": run.bounds, "limits": limits,
               "samples": len(run.sampler.samples), "crash": run.crashed,
               "initial_preemptions": first.value("vllm:num_preemptions")}
    return findings, details


def crash_finding(record: dict[str, Any], evidence: list[str]) -> Finding:
    """capacity.crash from the crash record: an OOM is a capacity failure (expand_capacity, the OOM line
    quoted); a death without a capacity signature decides nothing about capacity (inconclusive, the
    causal line of the log or of the failed requests named), so the run is incomplete, never a release."""
    observed = {k: record.get(k) for k in ("stage", "kind", "process_state")}
    action = ("read the OOM record: at load -> weights/parallel layout/topology; under KV growth -> "
              "context, concurrency, retention, prefill/decode balance; adjust limits before adding GPUs")
    if record.get("oom_lines"):
        return Finding(check="capacity.crash", status=Status.FAIL, observed=observed,
                       expected="the server survives every stage", evidence=evidence, consequence=Consequence.EXPAND,
                       rule="no OOM or crash at nominal load", action=action,
                       reason=f"OOM in stage {record.get('stage')}: " + "; ".join(record["oom_lines"][-2:]))
    cause = causal_line("\n".join(record.get("log_tail") or [])) or causal_line(
        "\n".join(str(e) for e in record.get("errors") or []))
    return Finding(check="capacity.crash", status=Status.INCONCLUSIVE, observed=observed,
                   expected="the server survives every stage", evidence=evidence, consequence=Consequence.EXPAND,
                   rule="no OOM or crash at nominal load",
                   reason=f"the server died in stage {record.get('stage')} without an OOM signature: "
                          + (cause or "no log line says why (give the server log)"),
                   action="read the crash record and the server log: a crash that is not capacity (a bug, a "
                          "killed process, a lost node) is fixed and the run repeated; it proves nothing about "
                          "capacity")


def stage_long_prompt(run: LoadRun) -> list[Finding]:
    cfg = run.cfg
    tokens = min(cfg.long_prompt_tokens, cfg.context_tokens - cfg.output_tokens - 64)
    records, start, end = run.send("long_prompt", [spec(tokens, cfg.output_tokens, 1, "long")], 1)
    samples = run.sampler.window(start, end)
    mem = run.sampler.memory_window(start, end)
    rec = records[0] if records else None
    ok = rec is not None and rec.status == "ok"
    return [Finding(
        check="capacity.long_prompt", status=Status.PASS if ok else Status.FAIL,
        observed={"prompt_tokens": rec.prompt_tokens if rec else None, "status": rec.status if rec else None,
                  "request_id": rec.request_id if rec else None,
                  "error": rec.error if rec else "no record", "e2e_s": rec.e2e if rec else None,
                  "peak_memory_bytes": max(mem) if mem else None, "max_kv_usage": max(
                      (s["kv_usage"] or 0) for s in samples) if samples else None},
        expected=f"one agent-like prompt of ~{tokens} tokens completes",
        evidence=["records/long_prompt.jsonl"] if run.store.path("records/long_prompt.jsonl").exists() else [],
        consequence=Consequence.EXPAND, rule="one long request near the contracted context, concurrency 1",
        action="a failure here points at max-model-len, the cache format or one profile's capacity")]


def stage_context_contract(run: LoadRun) -> Finding:
    """A request over the contracted context must be rejected before the GPUs are exhausted."""
    cfg = run.cfg
    over = spec(int(cfg.max_model_len * 1.2), 8, 2, "over-context")
    body = {"model": cfg.model, "messages": over.messages, "max_tokens": 8}
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    try:
        response = httpx.post(run.base_url.rstrip("/") + "/chat/completions", json=body, timeout=60, headers=headers)
        status, text = response.status_code, response.text[:500]
    except httpx.HTTPError as exc:
        status, text = 0, str(exc)
    healthy = run.healthy()
    ev = run.store.write_json("context_contract.json", {"http_status": status, "body": text, "healthy_after": healthy})
    ok = 400 <= status < 500 and healthy
    return Finding(check="capacity.context_contract", status=Status.PASS if ok else Status.FAIL,
                   observed={"http_status": status, "healthy_after": healthy, "body": text[:200]},
                   expected="HTTP 4xx rejection, server healthy after", evidence=[ev], consequence=Consequence.EXPAND,
                   rule="a request over the contracted context is rejected before the GPUs are exhausted",
                   action="set --max-model-len to the contracted context; an OOM here blocks release")


def stage_ramp(run: LoadRun) -> tuple[list[dict[str, Any]], list[Finding]]:
    cfg = run.cfg
    steps = []
    for concurrency in cfg.ramp:
        before = run.snapshot()
        specs = [spec(cfg.prompt_tokens, cfg.output_tokens, 1000 * concurrency + i, f"c{concurrency}")
                 for i in range(max(cfg.requests_per_step, concurrency))]
        records, start, end = run.send(f"ramp_c{concurrency}", specs, concurrency)
        after = run.snapshot()
        preempted = delta(before, after, "vllm:num_preemptions") if before and after else None
        row = step_row(concurrency, records, run.sampler.window(start, end), preempted, cfg)
        # Counters are exact where sampled gauges can miss a short peak: the queue-time histogram shows
        # waiting, and a preemption happens only when no KV block can be allocated (the cache is full).
        count, total = histogram_delta(before, after, "vllm:request_queue_time_seconds") if before and after \
            else (None, None)
        row["queue_time_mean_s"] = (total / count) if count and total is not None else None
        row["kv_saturated"] = bool(preempted) or (row["max_kv_usage"] or 0) >= 0.99
        steps.append(row)
        if run.crashed:
            break
    ev = [run.store.write_json("ramp.json", steps)] + [f"records/ramp_c{s['concurrency']}.jsonl" for s in steps]
    knee = knee_of(steps)
    nominal = next((s for s in steps if s["concurrency"] == cfg.contract_concurrency), None)
    observed = {"knee": knee, "contract": cfg.contract_concurrency,
                "steps": [{k: s[k] for k in ("concurrency", "ok", "errors", "timeouts", "timed_out", "ttft_p95",
                                              "e2e_p95", "max_waiting", "queue_time_mean_s", "max_kv_usage",
                                              "kv_saturated", "preemptions", "meets_slo")} for s in steps]}
    common = dict(check="capacity.ramp", observed=observed, evidence=ev,
                  expected=f"SLO met up to the contracted concurrency {cfg.contract_concurrency}",
                  rule="knee = largest concurrency meeting the SLO with no OOM and preemptions <= "
                       f"{cfg.max_preemptions}")
    if nominal is None:
        return steps, [Finding(status=Status.INCONCLUSIVE, consequence=Consequence.EXPAND,
                               reason="the ramp did not reach the contracted concurrency",
                               action="add the contracted concurrency to load.ramp", **common)]
    if knee is not None and knee >= cfg.contract_concurrency:
        return steps, [Finding(status=Status.PASS, consequence=Consequence.EXPAND, action="none", **common)]
    hung = "".join(f"; {s['timeouts']} request(s) hung at concurrency {s['concurrency']} (past "
                   f"{cfg.request_timeout_s:g} s): {', '.join(s['timed_out'])}" for s in steps if s["timeouts"])
    if knee is not None:
        return steps, [Finding(
            status=Status.FAIL, consequence=Consequence.LIMIT,
            reason=f"stable only up to concurrency {knee}{hung}",
            action=f"limited observation: cap --max-num-seqs / client concurrency at {knee}, write the limit into "
                   "config and alerts, owner and re-check date; or expand capacity and re-run", **common)]
    return steps, [Finding(status=Status.FAIL, consequence=Consequence.EXPAND,
                           reason=f"no step of the ramp meets the SLO{hung}",
                           action="expand capacity or change topology; adjust limits first", **common)]


SHARED_PREFIX = ("Shared agent system prompt. " + filler(300, 99) + " ")


def stage_mixed(run: LoadRun, windows: int = 3) -> Finding:
    """Short, long, cold and repeated requests together: do long sessions evict the shared prefix
    (hit ratio of each window), does the queue grow window over window?"""
    cfg = run.cfg
    rows = []
    long_tokens = min(cfg.long_prompt_tokens, cfg.context_tokens - cfg.output_tokens - 64) // 2
    for w in range(windows):
        specs = []
        for i in range(cfg.contract_concurrency * 2):
            seed = 10_000 * (w + 1) + i
            kind = i % 4
            if kind == 0:
                specs.append(spec(64, cfg.output_tokens, seed, "mixed-short"))
            elif kind == 1:
                specs.append(spec(long_tokens, cfg.output_tokens, seed, "mixed-long"))
            elif kind == 2:
                specs.append(spec(cfg.prompt_tokens, cfg.output_tokens, seed, "mixed-cold"))
            else:
                specs.append(spec(64, cfg.output_tokens, 7, "mixed-repeated", prefix=SHARED_PREFIX))
        before = run.snapshot()
        records, start, end = run.send("mixed", specs, cfg.contract_concurrency)
        after = run.snapshot()
        hits = delta(before, after, "vllm:prefix_cache_hits") if before and after else None
        queries = delta(before, after, "vllm:prefix_cache_queries") if before and after else None
        samples = run.sampler.window(start, end)
        rows.append({"window": w + 1, "requests": len(records), "errors": sum(r.status != "ok" for r in records),
                     **hung_requests(records),
                     "hit_ratio": (hits / queries) if hits is not None and queries else None,
                     "max_waiting": max((x["waiting"] or 0) for x in samples) if samples else None})
        if run.crashed:
            break
    ev = [run.store.write_json("mixed.json", rows)] + (["records/mixed.jsonl"] if run.store.path(
        "records/mixed.jsonl").exists() else [])
    errors = sum(r["errors"] for r in rows)
    ratios = [r["hit_ratio"] for r in rows if r["hit_ratio"] is not None]
    waiting = [r["max_waiting"] for r in rows if r["max_waiting"] is not None]
    evicted = len(ratios) >= 2 and ratios[-1] < 0.5 * ratios[0]
    queue_grows = len(waiting) >= 2 and all(b > a for a, b in zip(waiting, waiting[1:], strict=False)) \
        and waiting[-1] > cfg.contract_concurrency
    if errors or evicted or queue_grows:
        status = Status.FAIL
    elif len(ratios) < 2:
        status = Status.INCONCLUSIVE
    else:
        status = Status.PASS
    return Finding(check="capacity.mixed", status=status, consequence=Consequence.EXPAND, evidence=ev,
                   observed={"windows": rows}, expected="no errors; hit ratio of repeated requests holds; queue "
                   "does not grow window over window",
                   reason="; ".join(x for x, bad in (("errors", errors), ("shared prefix evicted by long sessions",
                                                                          evicted), ("queue grows", queue_grows))
                                    if bad),
                   rule="mixed stream: short, long, cold and repeated requests together",
                   action="cache retention / context and concurrency limits; split prefill and decode")


def stage_soak(run: LoadRun) -> Finding:
    """Fixed and varied samples alternating at the contracted concurrency: memory growth, errors, hangs."""
    cfg = run.cfg
    deadline = time.time() + cfg.soak_s
    records: list[Record] = []
    start = time.time()
    batch = 0
    while time.time() < deadline and not run.crashed:
        seed = 7 if batch % 2 == 0 else 5000 + batch  # fixed sample, then a varied one
        specs = [spec(cfg.prompt_tokens, cfg.output_tokens, seed + i, "soak") for i in range(cfg.contract_concurrency)]
        got, _, _ = run.send("soak", specs, cfg.contract_concurrency)
        records += got
        batch += 1
    end = time.time()
    mem = run.sampler.memory_window(start, end)
    growth = memory_growth_pct(mem)
    s = summarize(records)
    bad = s["errors"] + s["timeouts"]
    hung = hung_requests(records)
    ok = bad == 0 and records and (growth is None or growth <= cfg.memory_growth_pct)
    status = Status.PASS if ok else Status.FAIL
    if growth is None and ok:
        status = Status.INCONCLUSIVE
    return Finding(check="capacity.soak", status=status, consequence=Consequence.EXPAND,
                   observed={"seconds": round(end - start, 1), "requests": s["count"], "errors": bad, **hung,
                             "memory_growth_pct": growth, "memory_samples": len(mem)},
                   expected=f"no errors or hangs; memory growth <= {cfg.memory_growth_pct}%",
                   evidence=[p for p in ("records/soak.jsonl", "memory.jsonl") if run.store.path(p).exists()],
                   configuration={"window": {"start": start, "end": end}, "max_growth_pct": cfg.memory_growth_pct},
                   rule="a steady memory rise blocks release",
                   reason="" if ok else "errors or memory growth" + (
                       f"; {hung['timeouts']} request(s) hung past {cfg.request_timeout_s:g} s: "
                       + ", ".join(hung["timed_out"]) if hung["timeouts"] else ""),
                   action="look for leaks, fragmentation and eviction; re-run the soak for the agreed time")


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
    finding.status = Status.PASS if known[worst] <= limit else Status.FAIL
    finding.reason = "" if finding.status == Status.PASS else f"GPU memory rises {known[worst]:.1f}% on {worst}"
    return finding


def snapshot_preemptions(snap: Snapshot) -> float | None:
    return snap.value("vllm:num_preemptions")
