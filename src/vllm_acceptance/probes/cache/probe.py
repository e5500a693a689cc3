"""Prefix-cache reuse, measured (docs/acceptance.md "Prefix-cache reuse").

Per session: cold (a prefix never sent before, unique id at its start), hot A (same prefix byte
for byte, another question), hot B (same prefix, different tool data), control (a key field
changed near the start). Every request is measured alone: the server must be idle before and
after, and the request counter must move by exactly one; otherwise the measurement is repeated
and finally reported inconclusive. Expected hits come from the server's own tokenisation
(/tokenize) and the block size of `vllm:cache_config_info`.

A server with several engines behind its API server (data parallel, DEP: every series carries an `engine`
label) balances requests over them, and each engine has its own cache: the protocol then runs on every engine,
each session pinned to one with vLLM's `X-data-parallel-rank` request header, and each request's expected hits
come from what that engine served before. The engine whose counters moved is read from the metrics; a request
served elsewhere than pinned (a proxy that drops the header, a vLLM without it) is not measured alone and
decides nothing (`cache.engines` names the engines, docs/checks.md).

A server that dies during the protocol stops it: `crash_record.json` keeps the request and the
last server log lines (with `server_log`), the measurements so far stay on disk, `cache.crash`
names the request it died on and every reuse check is `missing` -- never a pass.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ...core.evidence import EvidenceStore
from ...core.findings import Consequence, Finding, Status
from ...rules import registry
from ...rules.registry import missing
from ...runtime.client import OpenAIClient
from ...runtime.metrics import (
    Instance,
    MetricsError,
    MetricsSource,
    PrometheusMetrics,
    Snapshot,
    cache_config,
    delta,
    histogram_delta,
    missing_families,
)
from ...runtime.process import rss_bytes, tail_lines
from .rules import (  # noqa: F401 - judge_reuse, expected_hits re-exported for callers
    Measurement,
    check_cache_config,
    common_prefix,
    expected_hits,
    judge_engines,
    judge_restart,
    judge_reuse,
    judge_rounds,
    kv_blocks,
    window_blocks,
)

KINDS = ("cold", "hot_a", "hot_b", "control")
RANK_HEADER = "X-data-parallel-rank"   # vLLM's OpenAI server: pin a request to one data-parallel rank
REQUIRED_FAMILIES = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success",
                     "vllm:num_requests_running", "vllm:num_requests_waiting")
# Scheduler gauges that several API servers (Prometheus' multiprocess collection) export only once an engine served.
LAZY_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


@dataclass
class CacheProbeConfig:
    model: str
    scenario: dict[str, Any]
    sessions: int = 3
    hybrid: bool = False
    relies_on_reuse: bool = True
    tolerance_blocks: int = 1
    min_prefill_drop: float = 0.0
    max_tokens: int = 4
    max_attempts: int = 2
    idle_wait_s: float = 30.0
    server_pid: int | None = None
    server_log: str | None = None
    retention_interval: int | None = None
    rounds: int = 3
    # A command that restarts the server; given only when the run launched it (hot A after a restart).
    restart_command: str | None = None
    restart_timeout_s: float = 600.0


JUDGED = ("cache.cold_baseline", "cache.control", "cache.hot_reuse", "cache.prefill_gain", "cache.source",
          "cache.repeat_rounds", "cache.restart", "cache.engines")


class ServerLost(Exception):
    """The server stopped answering in the middle of the protocol (killed, crashed, OOM)."""

    def __init__(self, request: str, error: str, evidence: list[str]) -> None:
        super().__init__(f"{request}: {error}")
        self.request, self.error, self.evidence = request, error, evidence


def build_messages(scenario: dict[str, Any], kind: str, session_id: str) -> list[dict[str, Any]]:
    """The four request kinds; everything before the last turn is the shared prefix."""
    questions = scenario["cache_questions"]
    environment = scenario["control_environment"] if kind == "control" else scenario["default_environment"]
    system = scenario["system_prompt"].format(session_id=session_id, environment=environment)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    messages += copy.deepcopy(scenario.get("shared_history", []))
    if kind == "hot_b":
        call_id = "call_hot_b_1"
        call = questions["hot_b_call"]
        messages += [
            {"role": "user", "content": questions["hot_b_user"]},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]},
            {"role": "tool", "tool_call_id": call_id, "content": questions["hot_b_tool_data"]},
            {"role": "user", "content": questions["hot_b"]},
        ]
    else:
        messages.append({"role": "user", "content": questions[kind]})
    return messages


class CacheProbe:
    def __init__(self, client: OpenAIClient, source: MetricsSource, cfg: CacheProbeConfig,
                 store: EvidenceStore) -> None:
        self.client, self.source, self.cfg, self.store = client, source, cfg, store
        self.tools = cfg.scenario.get("tools", [])
        self.snap_count = 0
        self.current: Measurement | None = None
        # The engines a request can be pinned to (data parallel / DEP), in rank order; empty for one engine.
        self.engines: list[str] = []

    def pin(self, snap: Snapshot) -> None:
        """Pin sessions to engines when the server has several (the `engine` label of its scheduler series)."""
        engines = snap.engines()
        self.engines = engines if len(engines) > 1 else []

    def rank_header(self, engine: str | None) -> dict[str, str] | None:
        """vLLM's header for one engine: its position among the engines this API server fronts (the rank it
        routes to; with hybrid load balancing, the local rank)."""
        if engine is None or engine not in self.engines:
            return None
        return {RANK_HEADER: str(self.engines.index(engine))}

    def snapshot(self, label: str) -> tuple[Snapshot, str]:
        if isinstance(self.source, PrometheusMetrics):
            self.source.wait_for_scrape()
        snap = self.source.snapshot()
        self.snap_count += 1
        name = f"metrics/{self.snap_count:03d}-{label}.prom"
        text = snap.raw or "\n".join(f"{k} {dict(lbl)} {v}" for k, s in snap.samples.items()
                                     for lbl, v in s.items())
        return snap, self.store.write_text(name, text)

    def wake_engines(self, engines: list[str]) -> list[str]:
        """One one-token request to each engine (pinned), outside the protocol's prefixes: with several API
        servers an engine's scheduler gauges, which the isolation check reads, appear only once it served a
        request (runtime/metrics.py ENGINE_FAMILIES). Returns the evidence of the exchanges."""
        written = []
        for engine in engines or [None]:
            body = {"model": self.cfg.model, "max_tokens": 1, "temperature": 0.0,
                    "messages": [{"role": "user", "content": f"metrics warm-up {uuid.uuid4().hex}"}]}
            exchange = self.client.chat(body, headers=self.rank_header(engine))
            label = f"e{engine}-" if engine is not None else ""
            written.append(self.store.write_json(f"requests/{label}warm-up.json", exchange.evidence()))
        return written

    def wait_idle(self) -> Snapshot:
        deadline = time.time() + self.cfg.idle_wait_s
        while True:
            snap = self.source.snapshot()
            if (snap.value("vllm:num_requests_running") or 0) == 0 and \
                    (snap.value("vllm:num_requests_waiting") or 0) == 0:
                return snap
            if time.time() > deadline:
                return snap
            time.sleep(0.5)

    def template_head(self, tag: str, block: int) -> int | None:
        """Whole blocks the chat template renders before the session id (e.g. tool declarations
        that Kimi's templates put ahead of the system prompt): shared by every session, so any
        earlier traffic with the same tools may have cached them. Two /tokenize calls, no generation."""
        pair = [self.client.tokenize(self.cfg.model, build_messages(self.cfg.scenario, "cold", f"{tag}-head-{n}"),
                                     self.tools) for n in (1, 2)]
        if not pair[0] or not pair[1]:
            return None
        return (common_prefix(pair[0], pair[1]) // block) * block

    def alive(self) -> bool:
        try:
            return self.client.http.get(self.client.root_url("health"), timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def instance(self) -> Instance | None:
        try:
            return Instance.of(self.source.snapshot())
        except MetricsError:
            return None

    def restart(self) -> tuple[Instance | None, Instance | None, str, str | None]:
        """Run the restart command (the run launched this server), wait for /health; return the
        process's signs before and after (runtime/metrics.py Instance), the log's evidence path, and an error."""
        assert self.cfg.restart_command
        before = Instance.of(self.source.snapshot())
        began = time.time()
        error = None
        try:
            proc = subprocess.run(self.cfg.restart_command, shell=True, capture_output=True, text=True,  # noqa: S602
                                  timeout=self.cfg.restart_timeout_s)
            log = f"$ {self.cfg.restart_command}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            if proc.returncode != 0:
                error = f"the restart command exited {proc.returncode}"
        except subprocess.TimeoutExpired:
            log, error = f"$ {self.cfg.restart_command}\ntimed out", "the restart command timed out"
        while error is None and not self.alive():
            if time.time() - began > self.cfg.restart_timeout_s:
                error = f"the server did not answer /health within {self.cfg.restart_timeout_s:g} s of the restart"
                break
            time.sleep(1.0)
        ev = self.store.write_text("restart.log", log + f"\nready after {time.time() - began:.1f} s\n")
        after = None
        if error is None:
            try:
                after = Instance.of(self.source.snapshot())
            except MetricsError as exc:
                error = f"metrics after the restart: {exc}"
        return before, after, ev, error

    def measure(self, session: int, kind: str, session_id: str, label: str | None = None,
                engine: str | None = None) -> Measurement:
        messages = build_messages(self.cfg.scenario, kind, session_id)
        body = {"model": self.cfg.model, "messages": messages, "tools": self.tools, "tool_choice": "none",
                "max_tokens": self.cfg.max_tokens, "temperature": 0.0}
        m = Measurement(session=session, kind=kind, engine=engine)
        self.current = m
        m.token_ids = self.client.tokenize(self.cfg.model, messages, self.tools)
        for attempt in range(1, self.cfg.max_attempts + 1):
            m.problems = []
            tag = (f"e{engine}-" if engine is not None else "") + (label or f"s{session}-{kind}")
            name = f"{tag}-try{attempt}"
            try:
                self.wait_idle()
                before, ev_before = self.snapshot(f"{tag}-before")
            except MetricsError as exc:
                raise ServerLost(name, f"metrics before the request: {exc}", m.evidence) from exc
            exchange = self.client.chat_stream(body, headers=self.rank_header(engine))
            # The exchange goes to disk first: if the server died under it, this is the evidence.
            ev_req = self.store.write_json(f"requests/{name}.json", exchange.evidence())
            m.evidence = [ev_before, ev_req]
            if not exchange.ok and not self.alive():
                raise ServerLost(name, f"request failed: {exchange.error}", m.evidence)
            try:
                after, ev_after = self.snapshot(f"{tag}-after")
            except MetricsError as exc:
                raise ServerLost(name, f"metrics after the request: {exc}", m.evidence) from exc
            m.evidence.insert(1, ev_after)
            if exchange.timed_out:
                # The server may still have computed it: the cache state of this session is unknown, so
                # no retry here (its hits would be the hung request's); the session ends (run_cache_probe).
                m.hung = {"request": name, "evidence": ev_req, "url": exchange.url, "timeout_s": exchange.timeout_s,
                          "waited_s": round(exchange.end - exchange.sent, 2), "stream_chunks": len(exchange.chunks),
                          "error": exchange.error}
                m.problems.append(f"hung: {ev_req} ({exchange.url}): {exchange.error}")
                break
            if not exchange.ok:
                m.problems.append(f"request failed ({ev_req}, {exchange.url}): {exchange.error}")
                continue
            self.fill(m, before, after, exchange.body.get("usage") or {}, exchange.ttft_s)
            if not m.problems:
                m.clean = True
                break
        return m

    def served(self, m: Measurement, before: Snapshot, after: Snapshot) -> None:
        """The engine whose prefix-cache queries moved with this request; on a pinned request, any other engine
        (or several) is a problem: the measurement is not this engine's alone."""
        was, now = before.per_engine("vllm:prefix_cache_queries"), after.per_engine("vllm:prefix_cache_queries")
        if was is None or now is None:
            return
        moved = [e for e, v in now.items() if v - was.get(e, 0.0) > 0]
        m.served_by = moved[0] if len(moved) == 1 else None
        if m.engine is None:
            return
        if len(moved) != 1:
            m.problems.append(f"prefix-cache queries moved on engine(s) {moved or 'none'}, not on engine {m.engine} "
                              "alone: other traffic, or the counters are not this request's")
        elif moved[0] != m.engine:
            m.problems.append(f"served by engine {moved[0]}, not engine {m.engine} it was pinned to ({RANK_HEADER}: "
                              f"{self.engines.index(m.engine)}): the header did not reach vLLM's balancer (a proxy "
                              "that drops it, or a vLLM without it)")

    def fill(self, m: Measurement, before: Snapshot, after: Snapshot, usage: dict[str, Any],
             ttft: float | None) -> None:
        m.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        m.cached_tokens_usage = details.get("cached_tokens")
        m.hits = delta(before, after, "vllm:prefix_cache_hits")
        m.queries = delta(before, after, "vllm:prefix_cache_queries")
        m.ttft_s = ttft
        self.served(m, before, after)
        for family, into in (("vllm:prompt_tokens_cached_by_source", m.cached_by_source),
                             ("vllm:prompt_tokens_by_source", m.tokens_by_source)):
            # one delta per source, summed over the engines (each engine has its own sample of a source)
            for name in sorted({labels.get("source", "") for labels in after.labels_of(family)}):
                value = delta(before, after, family, source=name)
                if value:
                    into[name] = value
        m.prompt_tokens_cached = delta(before, after, "vllm:prompt_tokens_cached")
        m.external_hits = delta(before, after, "vllm:external_prefix_cache_hits")
        m.external_queries = delta(before, after, "vllm:external_prefix_cache_queries")
        _, m.prefill_computed_tokens = histogram_delta(before, after, "vllm:request_prefill_kv_computed_tokens")
        _, m.prefill_time_s = histogram_delta(before, after, "vllm:request_prefill_time_seconds")
        finished = delta(before, after, "vllm:request_success")
        if finished != 1:
            m.problems.append(f"request counter moved by {finished}, not 1: other traffic on this instance")
        for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            if (before.value(gauge) or 0) != 0 or (after.value(gauge) or 0) != 0:
                m.problems.append(f"{gauge} not 0 around the request: the instance is not isolated")
        if m.queries is not None and m.prompt_tokens is not None and m.queries != m.prompt_tokens:
            m.problems.append(f"prefix_cache_queries moved by {m.queries}, prompt has {m.prompt_tokens} "
                              "tokens: the metrics are not from this request alone")


def run_cache_probe(client: OpenAIClient, source: MetricsSource, cfg: CacheProbeConfig,
                    store: EvidenceStore) -> tuple[list[Finding], dict[str, Any]]:
    """Run the protocol and judge it. Returns findings (evidence relative to the store's run dir)."""
    probe = CacheProbe(client, source, cfg, store)
    started = time.time()
    try:
        snap0, ev0 = probe.snapshot("initial")
    except MetricsError as exc:
        ev = store.write_text("metrics/error.txt", str(exc))
        return [Finding(check="cache.metrics", status=Status.MISSING, observed=str(exc),
                        expected="readable vLLM metrics", evidence=[ev], consequence=Consequence.REBUILD,
                        rule="metrics must be readable to measure reuse",
                        action=f"make {source.description} readable from the controller")], {}
    probe.pin(snap0)
    if set(missing_families(snap0, REQUIRED_FAMILIES)) <= set(LAZY_GAUGES) and snap0.engines() \
            and missing_families(snap0, LAZY_GAUGES):
        woken = probe.wake_engines(probe.engines)
        try:
            snap0, ev0 = probe.snapshot("initial-after-warm-up")
        except MetricsError as exc:
            unreadable = store.write_text("metrics/error.txt", str(exc))
            return [missing("cache.metrics", None, f"metrics unreadable after the warm-up requests: {exc}",
                            Consequence.REBUILD, evidence=[unreadable, *woken])], {}
    findings: list[Finding] = []
    config_finding, block = check_cache_config(cache_config(snap0), [ev0], cfg)
    findings.append(config_finding)
    absent = missing_families(snap0, REQUIRED_FAMILIES)
    if absent:
        findings.append(Finding(check="cache.metrics", status=Status.MISSING, observed={"absent": absent},
                                expected=list(REQUIRED_FAMILIES), evidence=[ev0],
                                rule="every counter of the protocol must be exported",
                                action="upgrade vLLM or enable its metrics; removed 0.x names are not read",
                                consequence=Consequence.REBUILD))
    else:
        findings.append(registry.get("cache.metrics").passed(
            observed={"exported": list(REQUIRED_FAMILIES)}, expected=list(REQUIRED_FAMILIES), evidence=[ev0],
            reason=f"every counter of the protocol is exported by {source.description}"))
    if config_finding.status != Status.PASS or absent or block is None:
        findings.append(Finding(
            check="cache.reuse", status=Status.FAIL if config_finding.status == Status.FAIL else Status.INCONCLUSIVE,
            observed="not measured", expected="hot hits near the shared prefix",
            reason="prefix caching disabled" if config_finding.status == Status.FAIL else "cannot measure",
            evidence=[ev0], consequence=config_finding.consequence,
            action="rework configuration and protocol; do not count the expected gain"))
        return findings, {"requests": [], "block_size": block}

    measurements: list[Measurement] = []
    rounds: list[Measurement] = []
    tag = uuid.uuid4().hex[:12]
    head = probe.template_head(tag, block)
    targets: list[str | None] = list(probe.engines) or [None]
    cached: dict[str | None, list[list[int]]] = {}   # per engine: the prompts it served (what it may have cached)
    restart = None
    try:
        for engine in targets:
            measurements += run_sessions(probe, engine, tag, block, head, cached)
        if not any(m.hung for m in measurements):
            for engine in targets:
                rounds += repeat_rounds(probe, cached.get(engine, []), session_id_of(tag, engine, cfg.sessions),
                                        block, engine)
        ended = probe.instance()  # before any restart the protocol makes itself
        if cfg.restart_command and not any(m.hung for m in measurements + rounds):
            restart = restart_hot(probe, session_id_of(tag, targets[0], cfg.sessions), targets[0])
    except ServerLost as lost:
        lost_findings = server_lost(probe, lost, measurements, cfg, started)
        decided = {f.check for f in lost_findings}  # metrics that stopped answering outrank their first reading
        return [f for f in findings if f.check not in decided] + lost_findings, {
            "block_size": block, "requests": [m.row() for m in measurements], "crash": lost.request,
            "metrics_source": source.description,
            "requests_sent": len(list(store.path("requests").glob("*.json"))),
            "seconds": round(time.time() - started, 2)}
    everything = measurements + rounds + ([restart[2]] if restart and restart[2] else [])
    rows_ev = store.write_json("requests.json", [m.row() for m in everything])
    findings += judge_reuse(measurements, cfg, block, rows_ev, head or 0)
    findings.append(judge_engines(measurements, probe.engines, cfg, block, head or 0, [rows_ev]))
    findings.append(judge_rounds(rounds, cfg, block, head or 0, [rows_ev], kv_blocks(cache_config(snap0)))
                    if rounds or not cfg.rounds else
                    registry.get("cache.repeat_rounds").inconclusive(
                        reason="not sent: a request of the sessions hung", evidence=[rows_ev],
                        action="see cache.timeouts"))
    if restart is not None and restart[3]:
        findings.append(registry.get("cache.restart").inconclusive(
            reason=restart[3], evidence=[rows_ev, restart[4]], observed={"error": restart[3]},
            action="check the restart command and the server log, then re-run the cache probe"))
    else:
        findings.append(judge_restart(restart[0] if restart else None, restart[1] if restart else None,
                                      restart[2] if restart else None, cfg, block,
                                      [rows_ev, *([restart[4]] if restart else [])], bool(cfg.restart_command)))
    hung = [m.hung for m in everything if m.hung]
    if hung:
        findings.append(Finding(
            check="cache.timeouts", status=Status.INCONCLUSIVE, observed=hung,
            consequence=Consequence.REBUILD if cfg.relies_on_reuse else Consequence.LIMIT,
            evidence=[rows_ev, *(h["evidence"] for h in hung)],
            expected=f"every request answered within the request timeout ({hung[0]['timeout_s']:g} s)",
            reason=f"{len(hung)} request(s) hung, the rest of their session not measured: " + ", ".join(
                f"{h['request']} to {h['url']}" for h in hung),
            rule="a request without a complete answer within cache.request_timeout_s decides nothing",
            action="find where the request stalls (server queue, gateway, network) and re-run the cache probe"))
    elif everything:
        findings.append(registry.get("cache.timeouts").passed(
            observed={"requests": len(everything), "hung": 0}, evidence=[rows_ev],
            expected=f"every request answered within the request timeout ({probe.client.timeout_s:g} s)",
            reason=f"all {len(everything)} requests answered within {probe.client.timeout_s:g} s"))
    findings += one_instance(Instance.of(snap0), ended, len(everything), rows_ev, cfg,
                             finished=sum(1 for m in measurements + rounds if m.clean))
    shared = max((m.expected_hits or 0) for m in measurements if m.kind == "hot_a")
    if restart is None and not hung:
        # What a restart between two probe calls needs (run_cache_restart): the session whose hot request is
        # re-sent and this process's start time (playbooks/probes.yml restarts a server the run launched).
        try:
            restart_point = {"session": session_id_of(tag, targets[0], cfg.sessions), "engine": targets[0],
                             **Instance.of(source.snapshot()).to_dict()}
        except MetricsError:
            restart_point = None
    else:
        restart_point = None
    details = {"block_size": block, "shared_prefix_tokens": shared, "expected_hot_hits": shared,
               "restart_point": restart_point,
               "template_head_tokens": head, "engines": probe.engines,
               "requests": [m.row() for m in measurements], "rounds": [m.row() for m in rounds],
               "restart": restart[2].row() if restart and restart[2] else None,
               "metrics_source": source.description,
               "requests_sent": len(everything), "seconds": round(time.time() - started, 2)}
    return findings, details


def one_instance(first: Instance | None, last: Instance | None, sent: int, rows_ev: str,
                 cfg: CacheProbeConfig, finished: int = 0) -> list[Finding]:
    """cache.crash once the protocol ran to its end: one live instance when the server's process start time is the
    same at the first and the last request, or (no start time: several API servers) its request counter grew by at
    least the `finished` requests measured in between; a quiet restart between them (a restart policy) makes the
    measurements two instances' and decides nothing. No sign to compare: no finding."""
    restarted = last.restarted_since(first, finished) if first is not None and last is not None else None
    if restarted is None:
        return []
    assert first is not None and last is not None
    check = registry.get("cache.crash")
    observed = {"first": first.to_dict(), "last": last.to_dict(), "requests": sent, "finished_between": finished}
    if not restarted:
        return [check.passed(observed=observed, evidence=[rows_ev], expected="one live instance",
                             reason=f"the server answered all {sent} requests of the protocol; "
                                    + ("process_start_time_seconds unchanged" if first.start is not None else
                                       f"its request counter rose by at least the {finished} measured"))]
    return [check.inconclusive(
        observed=observed, evidence=[rows_ev], expected="one live instance",
        consequence=Consequence.REBUILD if cfg.relies_on_reuse else Consequence.LIMIT,
        reason=f"the server restarted during the protocol ({first.describe()} -> {last.describe()}"
               + ("" if first.start is not None else f", {finished} requests finished in between") + "): "
               "the measurements span two instances",
        action="read the server log for the restart's cause (a restart policy hides a crash), then re-run the "
               "cache probe")]


def session_id_of(tag: str, engine: str | None, session: int) -> str:
    """A session's id: unique to the probe run, the engine it is pinned to and its number."""
    return f"{tag}-e{engine}-{session}" if engine is not None else f"{tag}-{session}"


def run_sessions(probe: CacheProbe, engine: str | None, tag: str, block: int, head: int | None,
                 cached: dict[str | None, list[list[int]]]) -> list[Measurement]:
    """`cfg.sessions` sessions of the four kinds, pinned to `engine` (None: one engine, nothing to pin). Each
    request's expected hits come from the prompts its engine served before (`cached`, updated here)."""
    out: list[Measurement] = []
    for session in range(1, probe.cfg.sessions + 1):
        session_id = session_id_of(tag, engine, session)
        for kind in KINDS:
            m = probe.measure(session, kind, session_id, engine=engine)
            m.expected_hits = expected_hits(m.token_ids, cached.get(engine, []), block)
            m.window_blocks = window_blocks(m.token_ids, cached.get(engine, []), block, probe.cfg.max_tokens)
            if kind == "cold" and head is not None:
                m.expected_hits = max(m.expected_hits or 0, head)  # the template's head may be cached by anyone
            if m.token_ids:
                # the engine that served it caches it; unknown (a failed request): the one it was pinned to
                served = m.served_by if engine is not None and m.served_by is not None else engine
                cached.setdefault(served, []).append(m.token_ids)
            out.append(m)
            if m.hung:
                break  # the rest of this session would be measured against an unknown cache state
    return out


def repeat_rounds(probe: CacheProbe, earlier: list[list[int]], session_id: str, block: int,
                  engine: str | None = None) -> list[Measurement]:
    """The last session's hot A re-sent byte for byte, `cfg.rounds` times, on the engine of its session:
    one hot prefix, repeated. `earlier`: the prompts that engine served before (each round's own added after it:
    the next round's window starts there)."""
    out: list[Measurement] = []
    served = list(earlier)
    for r in range(1, probe.cfg.rounds + 1):
        m = probe.measure(r, "hot_a", session_id, label=f"round{r}-hot_a", engine=engine)
        m.kind = "round"
        m.expected_hits = expected_hits(m.token_ids, served, block)
        m.window_blocks = window_blocks(m.token_ids, served, block, probe.cfg.max_tokens)
        if m.token_ids:
            served.append(m.token_ids)
        out.append(m)
        if m.hung:
            break
    return out


def restart_hot(probe: CacheProbe, session_id: str, engine: str | None = None
                ) -> tuple[float | None, float | None, Measurement | None, str | None, str]:
    """Restart the server (the run launched it), then hot A of the last session again (on its engine)."""
    before, after, ev, error = probe.restart()
    if error:
        return before, after, None, error, ev
    m = probe.measure(0, "hot_a", session_id, label="restart-hot_a", engine=engine)
    m.kind = "restart"
    m.expected_hits = 0  # a fresh process: nothing of it is in the device cache
    return before, after, m, None, ev


def run_cache_restart(client: OpenAIClient, source: MetricsSource, cfg: CacheProbeConfig, store: EvidenceStore,
                      details: dict[str, Any], restart_error: str | None = None,
                      restart_log: str | None = None) -> tuple[Finding, dict[str, Any] | None]:
    """The cache protocol's last request, after the server was restarted between two probe calls (the
    run launched it; playbooks/probes.yml): hot A of the last session again on the new process. Judged by
    probes/cache/rules.py judge_restart from the start time the first call saw and the one the server has now."""
    check = registry.get("cache.restart")
    consequence = Consequence.REBUILD if cfg.relies_on_reuse else Consequence.LIMIT
    evidence = [store.write_text("restart.log", restart_log)] if restart_log else []
    point = details.get("restart_point") or {}
    if not point.get("session") or details.get("block_size") is None:
        return check.inconclusive(evidence=evidence, consequence=consequence,
                                  reason="not measured: the cache protocol before the restart did not complete",
                                  action="see the other cache findings, then re-run the cache probe"), None
    if restart_error:
        return check.inconclusive(evidence=evidence, consequence=consequence, observed={"error": restart_error},
                                  reason=f"the restart failed: {restart_error}",
                                  action="read restart.log and the server log, then re-run acceptance"), None
    probe = CacheProbe(client, source, cfg, store)
    try:
        now = source.snapshot()
        after = Instance.of(now)
        probe.pin(now)
        engine = point.get("engine")
        m = probe.measure(0, "hot_a", str(point["session"]), label="restart-hot_a",
                          engine=str(engine) if engine is not None and probe.engines else None)
    except (MetricsError, ServerLost) as exc:
        return check.inconclusive(evidence=evidence, consequence=consequence, observed={"error": str(exc)},
                                  reason=f"the restarted server could not be measured: {exc}",
                                  action="read the server log, then re-run acceptance"), None
    m.kind = "restart"
    m.expected_hits = 0  # a fresh process: nothing of it is in the device cache
    rows_ev = store.write_json("restart-requests.json", [m.row()])
    finding = judge_restart(Instance.from_dict(point), after, m, cfg, int(details["block_size"]),
                            [rows_ev, *evidence], True)
    return finding, m.row()


def server_lost(probe: CacheProbe, lost: ServerLost, done: list[Measurement], cfg: CacheProbeConfig,
                started: float) -> list[Finding]:
    """The server died mid-protocol: a crash record (request, log tail, process state), the
    measurements so far kept, and every reuse check `missing` -- a half protocol decides nothing."""
    store = probe.store
    log = tail_lines(Path(cfg.server_log) if cfg.server_log else None, 40).splitlines()
    answering = probe.alive()
    if answering:
        process = "answering /health (its metrics stopped answering)"
    elif cfg.server_pid:
        process = "exited" if not rss_bytes(cfg.server_pid) else "running but not answering"
    else:
        process = "not answering (no --server-pid to tell exited from hung)"
    record = {"request": lost.request, "error": lost.error, "time": time.time(),
              "seconds_into_probe": round(time.time() - started, 2), "process_state": process,
              "server_log": cfg.server_log, "log_tail": log, "request_evidence": lost.evidence,
              "measured_before": [m.row() for m in done]}
    ev_record = store.write_json("crash_record.json", record)
    ev_rows = store.write_json("requests.json", [m.row() for m in done])
    consequence = Consequence.REBUILD if cfg.relies_on_reuse else Consequence.LIMIT
    last = next((line for line in reversed(log) if line.strip()), "")
    findings = [Finding(
        check="cache.metrics" if answering else "cache.crash", status=Status.INCONCLUSIVE, consequence=consequence,
        observed={"request": lost.request, "error": lost.error, "process_state": process,
                  "log_tail": log[-10:], "measured_before": len(done)},
        expected="the server answers every request of the protocol",
        evidence=[ev_record, ev_rows, *lost.evidence],
        reason=f"the server stopped answering during {lost.request} (process {process})"
               + (f"; last log line: {last}" if last else "; no server log given (--server-log)"),
        rule="the protocol runs to its end on one live instance",
        action="read crash_record.json and the server log; restart the server and re-run the cache probe "
               "on a fresh instance (a crash under load is judged by the capacity probe)")]
    for check in JUDGED:
        findings.append(missing(check, None, f"not measured: the server died during {lost.request}",
                                consequence, evidence=[ev_record]))
    return findings
