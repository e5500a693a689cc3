"""Prefix-cache reuse, measured (docs/acceptance.md "Prefix-cache reuse").

Per session: cold (a prefix never sent before, unique id at its start), hot A (same prefix byte
for byte, another question), hot B (same prefix, different tool data), control (a key field
changed near the start). Every request is measured alone: the server must be idle before and
after, and the request counter must move by exactly one; otherwise the measurement is repeated
and finally reported inconclusive. Expected hits come from the server's own tokenisation
(/tokenize) and the block size of `vllm:cache_config_info`.

A server that dies during the protocol stops it: `crash_record.json` keeps the request and the
last server log lines (with `server_log`), the measurements so far stay on disk, `cache.crash`
names the request it died on and every reuse check is `missing` -- never a pass.
"""

from __future__ import annotations

import copy
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..core.evidence import EvidenceStore
from ..core.findings import Consequence, Finding, Status, missing
from ..lab.server import rss_bytes, tail_lines
from .client import OpenAIClient
from .metrics import (
    MetricsError,
    MetricsSource,
    PrometheusMetrics,
    Snapshot,
    cache_config,
    delta,
    histogram_delta,
    missing_families,
)

KINDS = ("cold", "hot_a", "hot_b", "control")
REQUIRED_FAMILIES = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:request_success",
                     "vllm:num_requests_running", "vllm:num_requests_waiting")
LOCAL_SOURCES = ("device", "host")


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


JUDGED = ("cache.cold_baseline", "cache.control", "cache.hot_reuse", "cache.prefill_gain", "cache.source")


class ServerLost(Exception):
    """The server stopped answering in the middle of the protocol (killed, crashed, OOM)."""

    def __init__(self, request: str, error: str, evidence: list[str]) -> None:
        super().__init__(f"{request}: {error}")
        self.request, self.error, self.evidence = request, error, evidence


@dataclass
class Measurement:
    session: int
    kind: str
    prompt_tokens: int | None = None
    token_ids: list[int] | None = None
    hits: float | None = None
    queries: float | None = None
    cached_tokens_usage: int | None = None
    cached_by_source: dict[str, float] = field(default_factory=dict)
    prefill_computed_tokens: float | None = None
    prefill_time_s: float | None = None
    ttft_s: float | None = None
    expected_hits: int | None = None
    clean: bool = False
    problems: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    hung: dict[str, Any] | None = None

    def row(self) -> dict[str, Any]:
        return {"session": self.session, "kind": self.kind, "prompt_tokens": self.prompt_tokens,
                "hits": self.hits, "queries": self.queries, "expected_hits": self.expected_hits,
                "cached_tokens": self.cached_tokens_usage, "cached_by_source": self.cached_by_source,
                "prefill_computed_tokens": self.prefill_computed_tokens,
                "prefill_time_s": self.prefill_time_s, "ttft_s": self.ttft_s, "clean": self.clean,
                "problems": self.problems, "hung": self.hung}


def build_messages(scenario: dict[str, Any], kind: str, session_id: str) -> list[dict[str, Any]]:
    """The four request kinds; everything before the last turn is the shared prefix."""
    questions = scenario["cache_questions"]
    environment = scenario["control_environment"] if kind == "control" else scenario["default_environment"]
    system = scenario["system_prompt"].format(session_id=session_id, environment=environment)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    messages += copy.deepcopy(scenario.get("shared_history", []))
    if kind == "hot_b":
        call_id = "call_status_1"
        messages += [
            {"role": "user", "content": "Status of node-07, please."},
            {"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": "get_node_status", "arguments": '{"node": "node-07", "include": "all"}'}}]},
            {"role": "tool", "tool_call_id": call_id, "content": questions["hot_b_tool_data"]},
            {"role": "user", "content": questions["hot_b"]},
        ]
    else:
        messages.append({"role": "user", "content": questions[kind]})
    return messages


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def expected_hits(ids: list[int] | None, earlier: list[list[int]], block: int) -> int | None:
    """Whole blocks shared with any earlier prompt; an identical resend recomputes its last token."""
    if ids is None:
        return None
    best = 0
    for prev in earlier:
        shared = common_prefix(ids, prev)
        if shared == len(ids):
            shared -= 1
        best = max(best, shared)
    return (best // block) * block


class CacheProbe:
    def __init__(self, client: OpenAIClient, source: MetricsSource, cfg: CacheProbeConfig,
                 store: EvidenceStore) -> None:
        self.client, self.source, self.cfg, self.store = client, source, cfg, store
        self.tools = cfg.scenario.get("tools", [])
        self.snap_count = 0
        self.current: Measurement | None = None

    def snapshot(self, label: str) -> tuple[Snapshot, str]:
        if isinstance(self.source, PrometheusMetrics):
            self.source.wait_for_scrape()
        snap = self.source.snapshot()
        self.snap_count += 1
        name = f"metrics/{self.snap_count:03d}-{label}.prom"
        text = snap.raw or "\n".join(f"{k} {dict(lbl)} {v}" for k, s in snap.samples.items()
                                     for lbl, v in s.items())
        return snap, self.store.write_text(name, text)

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

    def measure(self, session: int, kind: str, session_id: str) -> Measurement:
        messages = build_messages(self.cfg.scenario, kind, session_id)
        body = {"model": self.cfg.model, "messages": messages, "tools": self.tools, "tool_choice": "none",
                "max_tokens": self.cfg.max_tokens, "temperature": 0.0}
        m = Measurement(session=session, kind=kind)
        self.current = m
        m.token_ids = self.client.tokenize(self.cfg.model, messages, self.tools)
        for attempt in range(1, self.cfg.max_attempts + 1):
            m.problems = []
            name = f"s{session}-{kind}-try{attempt}"
            try:
                self.wait_idle()
                before, ev_before = self.snapshot(f"s{session}-{kind}-before")
            except MetricsError as exc:
                raise ServerLost(name, f"metrics before the request: {exc}", m.evidence) from exc
            exchange = self.client.chat_stream(body)
            # The exchange goes to disk first: if the server died under it, this is the evidence.
            ev_req = self.store.write_json(f"requests/{name}.json", exchange.evidence())
            m.evidence = [ev_before, ev_req]
            if not exchange.ok and not self.alive():
                raise ServerLost(name, f"request failed: {exchange.error}", m.evidence)
            try:
                after, ev_after = self.snapshot(f"s{session}-{kind}-after")
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

    def fill(self, m: Measurement, before: Snapshot, after: Snapshot, usage: dict[str, Any],
             ttft: float | None) -> None:
        m.prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        m.cached_tokens_usage = details.get("cached_tokens")
        m.hits = delta(before, after, "vllm:prefix_cache_hits")
        m.queries = delta(before, after, "vllm:prefix_cache_queries")
        m.ttft_s = ttft
        for source in after.labels_of("vllm:prompt_tokens_cached_by_source"):
            name = source.get("source", "")
            value = delta(before, after, "vllm:prompt_tokens_cached_by_source", source=name)
            if value:
                m.cached_by_source[name] = m.cached_by_source.get(name, 0.0) + value
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
    findings: list[Finding] = []
    config_finding, block = check_cache_config(snap0, [ev0], cfg)
    findings.append(config_finding)
    absent = missing_families(snap0, REQUIRED_FAMILIES)
    if absent:
        findings.append(Finding(check="cache.metrics", status=Status.MISSING, observed={"absent": absent},
                                expected=list(REQUIRED_FAMILIES), evidence=[ev0],
                                rule="every counter of the protocol must be exported",
                                action="upgrade vLLM or enable its metrics; removed 0.x names are not read",
                                consequence=Consequence.REBUILD))
    if config_finding.status != Status.PASS or absent or block is None:
        findings.append(Finding(
            check="cache.reuse", status=Status.FAIL if config_finding.status == Status.FAIL else Status.INCONCLUSIVE,
            observed="not measured", expected="hot hits near the shared prefix",
            reason="prefix caching disabled" if config_finding.status == Status.FAIL else "cannot measure",
            evidence=[ev0], consequence=config_finding.consequence,
            action="rework configuration and protocol; do not count the expected gain"))
        return findings, {"requests": [], "block_size": block}

    measurements: list[Measurement] = []
    tag = uuid.uuid4().hex[:12]
    head = probe.template_head(tag, block)
    try:
        for session in range(1, cfg.sessions + 1):
            session_id = f"{tag}-{session}"
            earlier: list[list[int]] = [m.token_ids for m in measurements if m.token_ids]
            for kind in KINDS:
                m = probe.measure(session, kind, session_id)
                m.expected_hits = expected_hits(m.token_ids, earlier, block)
                if kind == "cold" and head is not None:
                    m.expected_hits = max(m.expected_hits or 0, head)  # the template's head may be cached by anyone
                if m.token_ids:
                    earlier.append(m.token_ids)
                measurements.append(m)
                if m.hung:
                    break  # the rest of this session would be measured against an unknown cache state
    except ServerLost as lost:
        return findings + server_lost(probe, lost, measurements, cfg, started), {
            "block_size": block, "requests": [m.row() for m in measurements], "crash": lost.request,
            "metrics_source": source.description,
            "requests_sent": len(list(store.path("requests").glob("*.json"))),
            "seconds": round(time.time() - started, 2)}
    rows_ev = store.write_json("requests.json", [m.row() for m in measurements])
    findings += judge_reuse(measurements, cfg, block, rows_ev, head or 0)
    hung = [m.hung for m in measurements if m.hung]
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
    shared = max((m.expected_hits or 0) for m in measurements if m.kind == "hot_a")
    details = {"block_size": block, "shared_prefix_tokens": shared, "expected_hot_hits": shared,
               "template_head_tokens": head,
               "requests": [m.row() for m in measurements], "metrics_source": source.description,
               "requests_sent": sum(1 for m in measurements) , "seconds": round(time.time() - started, 2)}
    return findings, details


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


def check_cache_config(snap: Snapshot, evidence: list[str], cfg: CacheProbeConfig) -> tuple[Finding, int | None]:
    """cache.config: prefix caching on per the running server's `vllm:cache_config_info`."""
    info = cache_config(snap)
    consequence = Consequence.REBUILD if cfg.relies_on_reuse else Consequence.LIMIT
    if info is None:
        return Finding(check="cache.config", status=Status.MISSING, observed=None,
                       expected="vllm:cache_config_info exported", evidence=evidence, consequence=consequence,
                       rule="the actual configuration is read from the server, not the command line",
                       action="expose /metrics of this server to the controller"), None
    enabled = str(info.get("enable_prefix_caching", "")).lower() == "true"
    try:
        block = int(float(info.get("block_size", "")))
    except ValueError:
        block = None
    status = Status.PASS if enabled and block else Status.FAIL
    return Finding(
        check="cache.config", status=status,
        observed={"enable_prefix_caching": info.get("enable_prefix_caching"), "block_size": info.get("block_size")},
        expected={"enable_prefix_caching": "True"}, evidence=evidence, consequence=consequence,
        reason="" if enabled else "configuration: prefix caching is off on the running server",
        rule="enable_prefix_caching label of vllm:cache_config_info is True",
        action="start vLLM with --enable-prefix-caching (the profile's launch args) and re-run acceptance",
    ), block


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def judge_reuse(ms: list[Measurement], cfg: CacheProbeConfig, block: int, rows_ev: str,
                head: int = 0) -> list[Finding]:
    ev = [rows_ev]
    consequence = Consequence.REBUILD if cfg.relies_on_reuse else Consequence.LIMIT
    tol = cfg.tolerance_blocks * block
    unclean = [m for m in ms if not m.clean and not m.hung]  # hung requests: cache.timeouts
    findings: list[Finding] = []
    if unclean:
        findings.append(Finding(
            check="cache.isolation", status=Status.INCONCLUSIVE, evidence=ev, consequence=consequence,
            observed=[f"s{m.session}/{m.kind}: {'; '.join(m.problems)}" for m in unclean],
            expected="each request measured alone", rule="idle before/after, request counter +1",
            action="isolate the instance (no other traffic) and re-run the cache probe"))
    clean = [m for m in ms if m.clean]

    def by(kind: str) -> list[Measurement]:
        return [m for m in clean if m.kind == kind]

    def within(m: Measurement, expected: int | None) -> bool:
        return m.hits is not None and expected is not None and abs(m.hits - expected) <= tol

    # A cold request's expected hits include the template's head before the session id (the probe
    # measures it, `head`): anyone's traffic may have cached that; nothing of the session's own part.
    cold_ok = [m for m in by("cold") if m.hits is not None and m.hits <= (m.expected_hits or 0) + tol]
    findings.append(_judged("cache.cold_baseline", by("cold"), cold_ok, ev, consequence,
                            "cold hits stay within the template's head before the session id (near zero when "
                            "the system prompt comes first)",
                            f"hits <= {head} (template head) + {tol}" if head else f"hits <= {tol}"))
    control_ok = [m for m in by("control") if m.hits is not None and m.expected_hits is not None
                  and m.hits <= m.expected_hits + tol]
    findings.append(_judged("cache.control", by("control"), control_ok, ev, consequence,
                            "a change near the start of the system prompt drops reuse back",
                            "hits <= block-aligned common prefix (near zero)"))

    hots = by("hot_a") + by("hot_b")
    if cfg.hybrid:
        # Hybrid (KDA/Mamba + attention) models keep state only at retention checkpoints: the first
        # repeat may only create the retention. Judge the later sessions, and accept step-shaped hits.
        last = [m for m in hots if m.session > 1] or hots
        ok = [m for m in last if m.hits and m.expected_hits is not None and 0 < m.hits <= m.expected_hits + tol]
        reuse = _judged("cache.hot_reuse", last, ok, ev, consequence,
                        "hybrid model: hot hits appear at retention checkpoints (step-shaped) after the first "
                        "session; one pair decides nothing", "0 < hits <= block-aligned shared prefix")
    else:
        ok = [m for m in hots if within(m, m.expected_hits)]
        reuse = _judged("cache.hot_reuse", hots, ok, ev, consequence,
                        "hot hits equal the block-aligned shared prefix",
                        f"|hits - expected| <= {tol} tokens")
    findings.append(reuse)
    findings.append(judge_prefill_gain(by("cold"), hots, cfg, ev, consequence, reuse.status))
    findings.append(judge_usage_and_source(hots, ev, consequence))
    return findings


def _judged(check: str, considered: list[Measurement], ok: list[Measurement], ev: list[str],
            consequence: Consequence, rule: str, expected: str) -> Finding:
    observed = [{"session": m.session, "kind": m.kind, "hits": m.hits, "expected": m.expected_hits,
                 "prompt_tokens": m.prompt_tokens} for m in considered]
    if not considered:
        status = Status.INCONCLUSIVE
    elif len(ok) == len(considered):
        status = Status.PASS
    else:
        status = Status.FAIL
    return Finding(check=check, status=status, observed=observed, expected=expected, rule=rule, evidence=ev,
                   consequence=consequence,
                   reason="" if status == Status.PASS else f"{len(considered) - len(ok)} of {len(considered)} "
                   "requests outside the rule" if considered else "no clean measurement",
                   action="rework configuration and protocol (byte-identical prefix: order, whitespace, tool "
                          "definitions, earlier messages); do not count the expected gain")


def judge_prefill_gain(colds: list[Measurement], hots: list[Measurement], cfg: CacheProbeConfig,
                       ev: list[str], consequence: Consequence, reuse: Status) -> Finding:
    """Counters alone prove nothing: prefill work and time must drop with the hits."""
    cold_time = _median([m.prefill_time_s for m in colds if m.prefill_time_s is not None])
    hot_time = _median([m.prefill_time_s for m in hots if m.prefill_time_s is not None])
    cold_work = _median([m.prefill_computed_tokens for m in colds if m.prefill_computed_tokens is not None])
    hot_work = _median([m.prefill_computed_tokens for m in hots if m.prefill_computed_tokens is not None])
    observed = {"cold_prefill_time_s": cold_time, "hot_prefill_time_s": hot_time,
                "cold_prefill_computed_tokens": cold_work, "hot_prefill_computed_tokens": hot_work}
    common = dict(check="cache.prefill_gain", observed=observed, evidence=ev, consequence=consequence,
                  expected=f"hot prefill time <= cold x {1 - cfg.min_prefill_drop:.2f}, computed tokens drop",
                  rule="new computed prefill tokens and prefill time drop with the hits",
                  action="do not count the gain until hits and prefill time move together")
    if None in (cold_time, hot_time, cold_work, hot_work):
        return Finding(status=Status.INCONCLUSIVE, reason="prefill histograms not exported", **common)
    work_dropped = hot_work < cold_work
    time_dropped = hot_time < cold_time * (1 - cfg.min_prefill_drop) if cfg.min_prefill_drop else hot_time < cold_time
    if reuse == Status.PASS and work_dropped and time_dropped:
        return Finding(status=Status.PASS, **common)
    if reuse == Status.PASS or work_dropped or time_dropped:
        return Finding(status=Status.INCONCLUSIVE, reason="counters and latency disagree", **common)
    return Finding(status=Status.FAIL, reason="no reuse and no prefill gain", **common)


def judge_usage_and_source(hots: list[Measurement], ev: list[str], consequence: Consequence) -> Finding:
    """Hits must be local (device/host) reuse; external-cache statistics never pass for it."""
    local = sum(v for m in hots for k, v in m.cached_by_source.items() if k in LOCAL_SOURCES)
    external = sum(v for m in hots for k, v in m.cached_by_source.items() if k not in LOCAL_SOURCES)
    usage_mismatch = [f"s{m.session}/{m.kind}: usage {m.cached_tokens_usage} vs hits {m.hits}" for m in hots
                      if m.cached_tokens_usage is not None and m.hits is not None
                      and m.cached_tokens_usage < m.hits]
    observed = {"local_cached_tokens": local, "external_cached_tokens": external,
                "usage_cached_tokens": [m.cached_tokens_usage for m in hots], "mismatch": usage_mismatch}
    status = Status.PASS
    reason = ""
    if not any(m.cached_by_source for m in hots):
        status, reason = Status.NOT_APPLICABLE, "prompt_tokens_cached_by_source not exported or no hits"
    elif external and not local:
        status, reason = Status.FAIL, "hits come only from an external KV connector, not local reuse"
    if usage_mismatch:
        status, reason = Status.INCONCLUSIVE, "usage.cached_tokens disagrees with the counters"
    return Finding(check="cache.source", status=status, observed=observed, evidence=ev, consequence=consequence,
                   expected="hits from device/host cache; usage.cached_tokens matches", reason=reason,
                   rule="external_prefix_cache_* never pass for local reuse",
                   action="check the KV connector and the client's usage handling")
