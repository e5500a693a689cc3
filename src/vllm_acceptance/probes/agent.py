"""Agent interface conformance (docs/acceptance.md "Agent interface"): tool calls, separation, streaming,
multi-turn, the planned fallback, structured output, the reference client on the real calls; every
defect attributed to a layer.

This module sends and records; the judgement is in ``rules/agent.py``. Every exchange is kept as
evidence (request body, raw response, parsed result, decision). Every scenario detail (tools, tasks,
the fallback plan, write tools and their idempotency keys) comes from the scenario pack.

Rates resolve their threshold: the number of tool-call turns is chosen from the threshold (zero errors
in n turns bounds the rate at about 3/n with 95 % confidence, so 1 % needs 299 turns), sent
concurrently, bounded by ``agent.turn_budget``; each rate is reported with its 95 % bound and judged on
the bound. A format error is retried (``agent.retry_attempts``) and validated; a limited observation
needs every error recovered and the bound under the threshold.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import jsonschema

from ..core.evidence import EvidenceStore
from ..core.findings import Finding, Status
from ..rules import registry
from ..rules.agent import (
    BOUND_ASSUMPTIONS,
    CallCheck,
    CaseJudgement,
    Rate,
    _arg,
    arguments_diff,
    call_signature,
    channel_diff,
    check_separation,
    check_tool_call,
    class_rates,
    client_library_problems,
    execute_real_calls,
    finish_of,
    judge_case,
    judge_fallback_step,
    message_of,
    rate_lower_bound,
    reference_agreement,
    stream_structure_problems,
    structure_diff,
    turns_to_resolve,
)
from ..runtime.client import Exchange, OpenAIClient
from ..scenarios import tool_schema_problems
from ..scenarios.cases import CALL_CLASSES, Case, build_cases, case_tools, class_counts

# Checks judged over repeated runs: a hung run is left out of the rates, the answered runs still judged.
REPEATED = ("agent.tool_call", "agent.trigger_consistency", "agent.separation", "agent.schema_accuracy")
BATCH = 64  # turns sent per round of the rate run; the run stops early once every rate is decided


def solid_png_base64(size: int = 16, rgb: tuple[int, int, int] = (220, 30, 30)) -> str:
    """A small solid-colour PNG built with the standard library (no image files shipped)."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


GATEWAY_REASON = ("the direct server (--direct-url) answers the same request cleanly ({detail}): "
                  "the defect appears between the server and the client, in the gateway")


@dataclass
class AgentProbeConfig:
    model: str
    scenario: dict[str, Any]
    repeats: int = 3  # the fewest tool-call turns (and the direct-server reference runs)
    temperature: float = 0.0
    max_tokens: int = 256
    format_error_threshold: float = 0.01
    schema_accuracy_min: float = 0.99
    turn_budget: int = 1000
    concurrency: int = 8
    retry_attempts: int = 1
    images: bool = False
    image_tokens: int | None = None  # prompt tokens one probe image adds, where the profile states it
    reasoning_parser: str | None = None
    cases: int = 300  # distinct call-requiring cases of the case set (at least; the thresholds may need more)
    other_cases: int = 60  # multi-turn, irrelevance and structured cases beside them
    case_seed: int = 0
    seed: int | None = None  # agent.seed: each request carries `seed` + its position, so a sampled run repeats
    case_tools: str = "sample"  # "pack": every case offers exactly the pack's tools (scenarios/cases.py)
    consistency_cases: int = 10  # single cases repeated `repeats` times for trigger consistency
    abstain_min: float = 0.9  # irrelevance cases: the abstention rate's 95 % lower bound
    reference_model: str | None = None  # the reference endpoint's model name (agent.reference_agreement)
    reference_min: float = 0.80  # tool-call F1 on triggering vs the reference (K2-Vendor-Verifier, K2-0905)
    under_load: int = 0  # the case set sent again with this many requests in flight (agent.under_load)


def turn_target(cfg: AgentProbeConfig) -> int:
    """Turns needed so that zero errors resolve both thresholds, at least `repeats`, at most the budget."""
    need = max(cfg.repeats, cfg.cases, turns_to_resolve(cfg.format_error_threshold),
               turns_to_resolve(1.0 - cfg.schema_accuracy_min))
    return min(need, cfg.turn_budget)


def _finding(check: str, status: Status, layer: str | None, ev: list[str], **kw: Any) -> Finding:
    return registry.get(check).result(status, layer=layer, evidence=ev, **kw)


def _layer_of(check: CallCheck) -> str | None:
    return check.problems[0][0] if check.problems else None


def exchange_row(case: str, ex: Exchange, parsed: Any, decision: dict[str, Any], path: str) -> dict[str, Any]:
    """One request of the probe as the report's agent table shows it: answer shape and the client's decision."""
    choices = (ex.body or {}).get("choices") if isinstance(ex.body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    calls = (parsed or {}).get("tool_calls") if isinstance(parsed, dict) else None
    names = [str((c.get("function") or {}).get("name")) for c in calls or [] if isinstance(c, dict)]
    problems = decision.get("problems") if isinstance(decision.get("problems"), list) else []
    valid = decision.get("valid")
    if valid is None and "problems" in decision:
        valid = not problems
    return {"case": case, "http_status": ex.status, "finish_reason": first.get("finish_reason"),
            "calls": len(names), "names": names, "valid": valid, "problems": len(problems),
            "timed_out": bool(ex.timed_out), "evidence": path}


class AgentProbe:
    def __init__(self, client: OpenAIClient, cfg: AgentProbeConfig, store: EvidenceStore,
                 direct: OpenAIClient | None = None, reference: OpenAIClient | None = None) -> None:
        self.client, self.cfg, self.store, self.direct = client, cfg, store, direct
        self.reference = reference
        self.cases: list[Case] = []
        self.context_fit: dict[str, Any] = {}
        self.tools = cfg.scenario["tools"]
        # with the pack's case_set.extra_tools (offered in the case set only, unless agent.case_tools is "pack")
        self.all_tools = case_tools(cfg.scenario) if cfg.case_tools == "sample" else list(self.tools)
        self.tasks = cfg.scenario["tasks"]
        self.write_tools: dict[str, dict[str, Any]] = cfg.scenario.get("write_tools") or {}
        self.system = cfg.scenario["system_prompt"].format(
            session_id="agent-probe", environment=cfg.scenario["default_environment"])
        self.n = 0
        self._sent = 0  # requests built so far: the next one's sampling seed is cfg.seed + this
        self.rates: dict[str, Any] = {}
        self.hung: list[dict[str, Any]] = []
        self.exchanges: list[dict[str, Any]] = []  # one row per request sent, for the report's case table
        self.case_rows: list[dict[str, Any]] = []  # every case of the case set: request, response, judgement
        self.required_bodies: list[Any] = []
        # Every tool call the deployment returned: {"case", "call", "retry_group"?} (executor_safety).
        self.real_calls: list[dict[str, Any]] = []
        # Direct-server references per check kind (only with --direct-url): (clean, detail, evidence).
        self._refs: dict[str, tuple[bool, str, list[str]]] = {}

    def keep(self, name: str, ex: Exchange, decision: dict[str, Any]) -> str:
        self.n += 1
        parsed = message_of(ex.body)
        path = self.store.write_json(f"cases/{self.n:02d}-{name}.json", {
            **ex.evidence(), "max_tokens": ex.request.get("max_tokens"), "temperature": ex.request.get("temperature"),
            "parsed": parsed, "decision": decision})
        self.exchanges.append(exchange_row(f"{self.n:02d}-{name}", ex, parsed, decision, path))
        if ex.timed_out:
            self.hung.append({"case": f"{self.n:02d}-{name}", "evidence": path, "url": ex.url,
                              "timeout_s": ex.timeout_s, "waited_s": round(ex.end - ex.sent, 2),
                              "stream_chunks": len(ex.chunks), "error": ex.error})
        return path

    def collect_calls(self, case: str, body: Any, group: str | None = None) -> None:
        for call in message_of(body).get("tool_calls") or []:
            self.real_calls.append({"case": case, "call": call, **({"retry_group": group} if group else {})})

    def base(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return self.seeded({"model": self.cfg.model, "messages": messages, "max_tokens": self.cfg.max_tokens,
                            "temperature": self.cfg.temperature, **extra})

    def seeded(self, body: dict[str, Any]) -> dict[str, Any]:
        """With `agent.seed`, the request's own sampling seed: the seed plus the request's position in the run
        (bodies are built in a fixed order), so a run at temperature > 0 repeats answer for answer, and a
        re-sent operation is still sampled anew, as a real client's retry is."""
        if self.cfg.seed is not None:
            body["seed"] = self.cfg.seed + self._sent
        self._sent += 1
        return body

    def required_call_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": self.tasks["required_tool"]["user"]}]

    def pack_call(self, call_id: str) -> dict[str, Any]:
        """The pack's call of the required task, as an assistant turn's tool call."""
        call = self.tasks["required_tool"]["call"]
        return {"id": call_id, "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}

    def run(self) -> tuple[list[Finding], dict[str, Any]]:
        findings: list[Finding] = []
        ev_schemas = self.store.write_json("tool_schemas.json", self.all_tools)
        problems = tool_schema_problems(self.all_tools)
        check = registry.get("agent.tool_schemas")
        if problems:
            return [check.fail(layer="client", evidence=[ev_schemas], observed=problems,
                               expected="every tool's parameters are a valid JSON Schema",
                               action="fix the tool definitions")], {}
        findings.append(check.passed(evidence=[ev_schemas], observed="valid",
                                     expected="every tool's parameters are a valid JSON Schema"))
        findings += self.required_tool_calls()
        findings += self.streaming()
        findings.append(self.multi_turn())
        findings.append(self.failed_tool_fallback())
        findings.append(self.structured_output())
        findings.append(self.executor_safety())
        findings.append(self.multimodal())
        findings.append(self.client_library())
        if self.direct is not None:
            findings.append(self.gateway_compare())
        findings.append(self.under_load())
        findings.append(self.reference_agreement())
        findings = [self._judge_hangs(f) for f in findings]
        if self.hung:
            findings.append(self._timeouts(findings))
        elif self.exchanges:
            findings.append(self._no_timeouts())
        return findings, {"cases": [{"id": f.check, "check": f.check, "status": f.status.value, "layer": f.layer,
                                     "evidence": f.evidence} for f in findings], "rates": self.rates,
                          "timeouts": self.hung, "exchanges": self.exchanges}

    def _judge_hangs(self, f: Finding) -> Finding:
        """A request that got no complete answer in time is no evidence of correctness: the check it
        belongs to is inconclusive, naming it -- unless answered runs of a repeated check already failed."""
        hung = [h for h in self.hung if h["evidence"] in f.evidence]
        if not hung:
            return f
        names = "; ".join(f"{h['case']} ({h['url']}) no complete answer within {h['timeout_s']:g} s" for h in hung)
        if f.check in REPEATED and f.status == Status.FAIL:
            f.reason = (f.reason + "; " if f.reason else "") + f"besides, hung: {names}"
            return f
        f.status, f.layer = Status.INCONCLUSIVE, None
        f.reason = f"hung: {names}"
        return f

    def _no_timeouts(self) -> Finding:
        """agent.timeouts passes only on the requests kept as evidence, each of which got its whole answer."""
        ev = self.store.write_json("exchanges.json", self.exchanges)
        limit = self.client.timeout_s
        return _finding("agent.timeouts", Status.PASS, None, [ev],
                        observed={"requests": len(self.exchanges), "hung": 0},
                        expected=f"every request answered within the request timeout ({limit:g} s)",
                        reason=f"all {len(self.exchanges)} requests kept as evidence answered within {limit:g} s")

    def _timeouts(self, findings: list[Finding]) -> Finding:
        for h in self.hung:
            h["checks"] = [f.check for f in findings if h["evidence"] in f.evidence]
        limit = self.hung[0]["timeout_s"]
        return _finding(
            "agent.timeouts", Status.INCONCLUSIVE, None, [h["evidence"] for h in self.hung],
            observed=self.hung, expected=f"every request answered within the request timeout ({limit:g} s)",
            reason=f"{len(self.hung)} request(s) hung: " + ", ".join(
                f"{h['case']} of {'/'.join(h['checks'])} to {h['url']}" for h in self.hung),
            rule="a request without a complete answer within agent.request_timeout_s decides nothing",
            action="find where the request stalls (server queue, gateway, network) and re-run the agent probe")

    # --- the rate run ----------------------------------------------------------------------------------

    def turn_target(self) -> int:
        return turn_target(self.cfg)

    def _decided(self, errors: int, misses: int, by_finish: int, n: int) -> bool:
        """Every rate already certain on one side: the format-error rate's lower bound above its
        threshold (a failure more turns cannot mend), or every rate's bound on the passing side."""
        if n and rate_lower_bound(errors, n) > self.cfg.format_error_threshold:
            return True
        fmt = Rate("format_error", errors, n, self.cfg.format_error_threshold).verdict()
        acc = Rate("schema_accuracy", by_finish - misses, by_finish, self.cfg.schema_accuracy_min, "min").verdict()
        return fmt == "pass" and acc == "pass" and errors == 0

    def case_set(self) -> list[Case]:
        """The seeded case set: as many call-requiring cases as the thresholds need (at least `agent.cases`,
        at most `agent.turn_budget`), and `agent.other_cases` of the other classes (a fifth of the calls
        at most)."""
        calls = self.turn_target()
        others = min(self.cfg.other_cases, max(5, calls // 5))
        limit = self._context_limit()
        want = class_counts(calls, others)
        extra = 0
        while True:
            built = build_cases(self.cfg.scenario, calls + extra, others + extra, self.cfg.case_seed, self.system,
                                self.cfg.case_tools)
            fitted = self._fit(built, limit)
            have = Counter(c.cls for c in fitted)
            if all(have[k] >= n for k, n in want.items()) or extra >= calls:
                break
            extra += max(want[k] - have[k] for k in want) * 2
        taken: Counter[str] = Counter()
        out = []
        for case in fitted:
            if taken[case.cls] < want.get(case.cls, 0):
                taken[case.cls] += 1
                out.append(case)
        self.context_fit = {"prompt_token_limit": limit, "max_tokens": self.cfg.max_tokens,
                                 "trimmed": sum(1 for c in built if c not in fitted)}
        return out

    def _context_limit(self) -> int | None:
        """The prompt tokens a case may take: the served model's max_model_len less max_tokens (None: unknown)."""
        try:
            data = self.client.models().get("data") or []
        except Exception:  # noqa: BLE001 - an unknown context length only means no trimming
            return None
        lengths = [m.get("max_model_len") for m in data if isinstance(m, dict) and m.get("max_model_len")]
        return int(lengths[0]) - self.cfg.max_tokens if lengths else None

    def _fit(self, cases: list[Case], limit: int | None) -> list[Case]:
        """Each case trimmed (notes, earlier turns, spare tools) until its rendered prompt fits the server's
        context (/tokenize); a case that cannot fit, or whose trimmed body repeats another, is left out."""
        if limit is None:
            return cases

        def fit(case: Case) -> Case | None:
            current: Case | None = case
            while current is not None:
                tokens = self.client.tokenize(self.cfg.model, current.messages, current.tools or None)
                if tokens is None or len(tokens) <= limit:
                    return current
                current = current.trimmed()
            return None

        with ThreadPoolExecutor(max_workers=4) as pool:
            fitted = list(pool.map(fit, cases))
        seen: set[str] = set()
        out = []
        for case in fitted:
            key = json.dumps(case.body("m", 0, 0.0), sort_keys=True) if case else ""
            if case is not None and key not in seen:
                seen.add(key)
                out.append(case)
        return out

    def send_cases(self, cases: list[Case]) -> list[Exchange]:
        """Every case once, concurrently, in rounds: the run stops early once the format-error rate's lower
        bound is above its threshold (a failure more cases cannot mend); unsent cases are left out."""
        exchanges: list[Exchange] = []
        errors = answered = 0
        with ThreadPoolExecutor(max_workers=max(1, self.cfg.concurrency)) as pool:
            for start in range(0, len(cases), BATCH):
                batch = cases[start:start + BATCH]
                got = list(pool.map(self.client.chat, [self._case_body(c) for c in batch]))
                exchanges += got
                for case, ex in zip(batch, got, strict=True):
                    if ex.timed_out or case.cls not in CALL_CLASSES:
                        continue
                    answered += 1
                    errors += bool(check_tool_call(ex.body if ex.ok else None, self.tools_of(case)).problems)
                if answered and rate_lower_bound(errors, answered) > self.cfg.format_error_threshold:
                    break
        return exchanges

    def _case_body(self, case: Case) -> dict[str, Any]:
        return self.seeded(case.body(self.cfg.model, self.cfg.max_tokens, self.cfg.temperature))

    def tools_of(self, case: Case) -> list[dict[str, Any]]:
        return case.tools or self.tools

    def validated_retry(self, failed: list[Case]) -> list[dict[str, Any]]:
        """The retry the policy names, for real: the failed case's request re-sent (up to `retry_attempts`),
        each answer judged as the case was (its class); recovered when one passes."""
        out = []
        for case in failed:
            attempts = []
            recovered = False
            for attempt in range(1, self.cfg.retry_attempts + 1):
                ex = self.client.chat(self._case_body(case))
                j = judge_case(case.id, case.cls, case.expect, case.schema, ex.status, ex.body if ex.ok else None,
                               self.tools_of(case), ex.error)
                attempts.append({"attempt": attempt, "status": ex.status, "response": ex.body, "error": ex.error,
                                 "problems": j.problems + j.separation, "valid": j.ok})
                if ex.ok:
                    self.collect_calls(f"retry-{case.id}-{attempt}", ex.body, group=case.id)
                if j.ok:
                    recovered = True
                    break
            out.append({"turn": case.id, "class": case.cls, "recovered": recovered, "attempts": attempts})
        return out

    def required_tool_calls(self) -> list[Finding]:
        """The case set, each case once: the rates over distinct cases; a sample of cases repeated for
        consistency (a repeat is the same observation again: it never enters a rate)."""
        cases = self.cases = self.case_set()
        exchanges = self.send_cases(cases)
        judged: list[CaseJudgement] = []
        rows, hung_ev, bad_ev, failed = [], [], [], []
        for case, ex in zip(cases, exchanges, strict=False):
            if ex.timed_out:  # judged apart (_judge_hangs); not a format error of the answered cases
                hung_ev.append(self.keep(case.id, ex, {"valid": None, "timed_out": True}))
                continue
            j = judge_case(case.id, case.cls, case.expect, case.schema, ex.status, ex.body if ex.ok else None,
                           self.tools_of(case), ex.error)
            judged.append(j)
            if case.cls in CALL_CLASSES:
                self.required_bodies.append(ex.body if ex.ok else None)
            self.collect_calls(case.id, ex.body, group=case.id)
            if not j.ok:
                failed.append(case)
                if len(bad_ev) < 20:
                    bad_ev.append(self.keep(case.id, ex, j.to_dict()))
            rows.append({**case.summary(), **j.to_dict(), "seconds": round(ex.end - ex.sent, 3),
                         "request": ex.request, "response": ex.body, "error": ex.error})
        self.case_rows = rows
        ev_cases = self.store.write_json("cases.json", {"seed": self.cfg.case_seed, "cases": rows})
        repeats, ev_rep = self.repeat_sample(cases)
        retries = self.validated_retry(failed)
        ev_retry = [self.store.write_json("retries.json", retries)] if retries else []
        evs = [ev_cases, *ev_retry, *bad_ev, *hung_ev]
        calls = [j for j in judged if j.cls in CALL_CLASSES]
        fmt_cases = [j for j in judged if j.cls in (*CALL_CLASSES, "multi_turn")]
        errors = [j for j in fmt_cases if j.problems]
        by_finish = [j for j in judged if j.check.finish_reason == "tool_calls" and j.cls != "structured"]
        valid = [j for j in by_finish if not j.check.problems]
        leaks = [j for j in judged if j.separation]
        irrelevant = [j for j in judged if j.cls == "irrelevance"]
        thr, acc_min = self.cfg.format_error_threshold, self.cfg.schema_accuracy_min
        fmt = Rate("format_error_rate", len(errors), len(fmt_cases), thr)
        acc = Rate("schema_accuracy", len(valid), len(by_finish), acc_min, "min")
        sep_rate = Rate("separation_error_rate", len(leaks), len(judged), thr)
        abstain = Rate("abstain_rate", sum(1 for j in irrelevant if j.abstained), len(irrelevant),
                       self.cfg.abstain_min, "min")
        consistent = sum(1 for r in repeats if r["consistent"])
        recovered = sum(1 for r in retries if r["recovered"])
        self.rates = {
            "schema_accuracy": acc.value, "format_error_rate": fmt.value,
            "separation_error_rate": sep_rate.value, "abstain_rate": abstain.value,
            "trigger_consistency": consistent / len(repeats) if repeats else None,
            "runs": len(fmt_cases), "cases": len(judged), "distinct_bodies": len(
                {json.dumps(r["request"], sort_keys=True) for r in rows}),
            "turns_sent": sum(1 for c in cases[:len(exchanges)] if c.cls in (*CALL_CLASSES, "multi_turn")),
            "turn_target": self.turn_target(), "turn_budget": self.cfg.turn_budget,
            "concurrency": self.cfg.concurrency, "seed": self.cfg.case_seed,
            "triggered": sum(1 for j in calls if j.check.tool_calls), "finish_tool_calls": len(by_finish),
            "bounds": {"format_error_rate": fmt.to_dict(), "schema_accuracy": acc.to_dict(),
                       "separation_error_rate": sep_rate.to_dict(), "abstain_rate": abstain.to_dict()},
            "classes": class_rates(judged), "misses": [m for j in judged for m in
                                                        (f"{j.case}: {x}" for x in j.misses)][:20],
            "repeats": {"cases": len(repeats), "consistent": consistent, "runs_each": self.cfg.repeats,
                        "evidence": ev_rep},
            "assumptions": BOUND_ASSUMPTIONS, "context": self.context_fit,
            "resolution": self._resolution(len(fmt_cases)),
            "retry": {"policy": f"re-send the same request, up to {self.cfg.retry_attempts} time(s), validate",
                      "errors": len(retries), "recovered": recovered},
        }
        checks = [j.check for j in fmt_cases]
        for j in fmt_cases:  # the case's own problems (HTTP errors, a missing assistant answer) count as its check's
            j.check.problems = list(j.problems)
        out = [self._judge_format(fmt, checks, retries, evs), self._judge_accuracy(
            acc, evs, Counter(la for j in errors for la, _ in j.problems).most_common(1)[0][0] if errors else None)]
        out.append(self._judge_trigger(repeats, abstain, evs + [ev_rep]))
        out.append(self._judge_separation(sep_rate, [j.separation for j in judged], retries, evs))
        return out

    def repeat_sample(self, cases: list[Case]) -> tuple[list[dict[str, Any]], str]:
        """The first `agent.consistency_cases` single cases, each sent `agent.repeats` times: consistent when
        every run gives the same calls (names and parsed arguments)."""
        sample = [c for c in cases if c.cls == "single"][:self.cfg.consistency_cases]
        jobs = [(c, r) for c in sample for r in range(max(1, self.cfg.repeats))]
        with ThreadPoolExecutor(max_workers=max(1, self.cfg.concurrency)) as pool:
            got = list(pool.map(self.client.chat, [self._case_body(job[0]) for job in jobs]))
        out = []
        for case in sample:
            runs = [(ex, check_tool_call(ex.body if ex.ok else None, self.tools_of(case)))
                    for (c, _), ex in zip(jobs, got, strict=True) if c is case and not ex.timed_out]
            sigs = [json.dumps(call_signature(ex.body), sort_keys=True) for ex, _ in runs]
            out.append({"case": case.id, "runs": len(runs), "consistent": len(set(sigs)) == 1 and bool(runs),
                        "signatures": Counter(sigs).most_common(3), "checks": [c for _, c in runs],
                        "triggered": [bool(c.tool_calls) for _, c in runs],
                        "responses": [ex.body for ex, _ in runs]})
        ev = self.store.write_json("repeats.json", [{k: v for k, v in r.items() if k != "checks"} for r in out])
        return out, ev

    def _resolution(self, n: int) -> str:
        need = turns_to_resolve(self.cfg.format_error_threshold)
        budget = self.cfg.turn_budget
        return (f"{n} answered turns resolve a rate down to {Rate('r', 0, n, 0).resolution:.4f} (95 % bound of zero "
                f"errors); the threshold {self.cfg.format_error_threshold:g} needs >= {need} turns; the budget "
                f"agent.turn_budget={budget} buys {Rate('r', 0, budget, 0).resolution:.4f}")

    def _rate_finding(self, check: str, rate: Rate, retries: list[dict[str, Any]], layer: str | None,
                      evs: list[str], observed: Any, expected: str, action: str) -> Finding:
        verdict = rate.verdict()
        bound = rate.to_dict()
        unrecovered = [r["turn"] for r in retries if not r["recovered"]]
        reason = ""
        if verdict == "pass" and not rate.events:
            status, layer = Status.PASS, None
        elif verdict == "pass" and not unrecovered:
            status = Status.WARN
            reason = (f"{rate.events} of {rate.n} turns in error, 95 % upper bound {rate.bound:.4f} <= "
                      f"{rate.threshold:g}; the validated retry recovered every one: limited observation "
                      "with the retry policy")
        elif verdict == "pass":
            status = Status.FAIL
            reason = f"the validated retry did not recover turns {unrecovered[:10]}"
            layer = "retry" if layer is None else layer
        elif verdict == "fail":
            status = Status.FAIL
            reason = f"{rate.events} of {rate.n} turns in error: {rate.value:.4f} > {rate.threshold:g}"
        else:
            status, layer = Status.INCONCLUSIVE, None
            reason = (f"unresolved: {rate.events} of {rate.n}, 95 % upper bound {rate.bound:.4f} > threshold "
                      f"{rate.threshold:g}; {self._resolution(rate.n)}")
        if status in (Status.FAIL, Status.WARN):
            layer, why, ref_ev = self._attribute(layer, "tool")
            reason = "; ".join(x for x in (reason, why) if x)
            evs = evs + ref_ev
        return _finding(check, status, layer, evs, reason=reason, observed={**observed, "rate": bound},
                        expected=expected, action=action,
                        rule=f"95 % upper bound of the rate over the turns <= {rate.threshold:g}; errors below "
                             "it only with every one recovered by the validated retry (limited observation)")

    def _judge_format(self, fmt: Rate, checks: list[CallCheck], retries: list[dict[str, Any]],
                      evs: list[str]) -> Finding:
        layers = Counter(layer for c in checks for layer, _ in c.problems)
        expect = self.tasks["required_tool"]["expect_tool"]
        return self._rate_finding(
            "agent.tool_call", fmt, retries, layers.most_common(1)[0][0] if layers else None, evs,
            {"names": Counter(n for c in checks for n in c.names).most_common(5),
             "problems": [p for c in checks for p in c.problems][:10], "retry": self.rates.get("retry")},
            f"tool_calls with {expect} (or another schema tool), valid JSON arguments per schema",
            "attribute by layer: model (same input, illegal format repeatedly), parser (markup in content, no "
            "tool_calls); a retry with validation only below the threshold")

    def _judge_accuracy(self, acc: Rate, evs: list[str], layer: str | None = None) -> Finding:
        observed = {"rate": acc.to_dict()}
        expected = f"95 % lower bound of valid calls / calls >= {acc.threshold:g}"
        rule = "schema accuracy = valid calls / calls with finish_reason tool_calls, judged on its 95 % lower bound"
        if not acc.n and not any(finish_of(b) for b in self.required_bodies if b):
            return _finding("agent.schema_accuracy", Status.INCONCLUSIVE, None, evs, observed=observed,
                            expected=expected, rule=rule,
                            reason="no turn carries a finish_reason: the accuracy over finish_reason tool_calls "
                                   "cannot be computed (see agent.client_library / agent.gateway)",
                            action="keep finish_reason in the answers (server, gateway)")
        if not acc.n:
            layer, why, ref = self._attribute(layer or "model", "tool")
            return _finding("agent.schema_accuracy", Status.FAIL, layer, evs + ref, observed=observed,
                            expected=expected, rule=rule,
                            reason="; ".join(x for x in ("no turn ended with finish_reason tool_calls", why) if x),
                            action="fix tool calling first (agent.tool_call)")
        verdict = acc.verdict()
        status = {"pass": Status.PASS, "fail": Status.FAIL}.get(verdict, Status.INCONCLUSIVE)
        reason = "" if status == Status.PASS else (
            f"{acc.events} of {acc.n} valid, 95 % lower bound {acc.bound:.4f} vs minimum {acc.threshold:g}"
            + ("" if status == Status.FAIL else f"; {self._resolution(acc.n)}"))
        layer = (layer or "model") if status == Status.FAIL else None
        if status == Status.FAIL:
            layer, why, ref = self._attribute(layer, "tool")
            reason = "; ".join(x for x in (reason, why) if x)
            evs = evs + ref
        return _finding("agent.schema_accuracy", status, layer, evs, observed=observed, expected=expected, rule=rule,
                        reason=reason, action="see agent.tool_call; raise agent.turn_budget when unresolved")

    def _judge_trigger(self, repeats: list[dict[str, Any]], abstain: Rate, evs: list[str]) -> Finding:
        """Repeats of a case trigger the same call (consistency), and the irrelevance cases abstain at a rate
        whose 95 % lower bound reaches `thresholds.tool_abstain_min`."""
        runs = [r for r in repeats if r["runs"]]
        checks = [c for r in runs for c in r["checks"]]
        triggered = [c for c in checks if c.tool_calls > 0]
        odd = [r for r in runs if not r["consistent"]]
        abstain_verdict = abstain.verdict() if abstain.n else "pass"
        status = Status.FAIL if not triggered else (Status.PASS if not odd else Status.WARN)
        if not checks:
            status = Status.INCONCLUSIVE  # no repeat answered: nothing to judge
        reasons = []
        if odd:
            reasons.append(f"{len(odd)} of {len(runs)} repeated cases gave different calls: "
                           + ", ".join(r["case"] for r in odd[:10]))
        if abstain_verdict == "fail":
            status = Status.FAIL
            reasons.append(f"irrelevance cases: a tool was called in {abstain.n - abstain.events} of {abstain.n} "
                           f"where none fits (abstained {abstain.value:.3f} < {abstain.threshold:g})")
        elif abstain_verdict == "unresolved" and status == Status.PASS:
            status = Status.INCONCLUSIVE
            reasons.append(f"abstention unresolved: {abstain.events} of {abstain.n}, 95 % lower bound "
                           f"{abstain.bound:.3f} < {abstain.threshold:g} (more irrelevance cases needed)")
        layer = None
        if status in (Status.FAIL, Status.WARN) and checks:
            sigs = [json.dumps(call_signature(b), sort_keys=True) for r in runs for b in r["responses"]]
            base = self._trigger_layer(checks, sigs, triggered) if (odd or not triggered) else "model"
            layer, why, _ = self._attribute(base, "tool")
            reasons.append(why)
        return _finding("agent.trigger_consistency", status, layer, evs, reason="; ".join(x for x in reasons if x),
                        observed={"consistency": self.rates.get("trigger_consistency"), "repeated_cases": len(runs),
                                  "runs_each": self.cfg.repeats, "inconsistent": [r["case"] for r in odd][:10],
                                  "abstain": abstain.to_dict()},
                        expected=f"every repeated case gives the same call; irrelevance cases abstain "
                                 f"(95 % lower bound >= {abstain.threshold:g})",
                        rule="consistency over repeats of the same case (never a rate); abstention over distinct "
                             "irrelevance cases (a rate, judged on its bound)",
                        action="pin temperature / review the prompt; inconsistent triggering needs a retry policy; "
                               "calls where no tool fits: review the tool descriptions and the system prompt")

    def _judge_separation(self, rate: Rate, seps: list[list[tuple[str, str]]], retries: list[dict[str, Any]],
                          evs: list[str]) -> Finding:
        leaked = [p for s in seps for p in s]
        return self._rate_finding(
            "agent.separation", rate, retries, leaked[0][0] if leaked else None, evs,
            {"problems": leaked[:10]}, "no tool-call or reasoning markup in content",
            "check the --tool-call-parser / --reasoning-parser names and the gateway")

    # --- streaming ------------------------------------------------------------------------------------

    def streaming(self) -> list[Finding]:
        """The same request non-streamed and streamed: the assembled stream carries the same tool calls
        (with a reasoning parser: the same reasoning and content too), and its deltas are consistent."""
        body = self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto")
        plain = self.client.chat(body)
        streamed = self.client.chat_stream(body)
        reasoning = bool(self.cfg.reasoning_parser)
        a, b = call_signature(plain.body), call_signature(streamed.body)
        diffs = channel_diff(plain.body, streamed.body, reasoning) if plain.ok and streamed.ok else []
        leak = check_separation(streamed.body)
        structure = stream_structure_problems(streamed.chunks) if streamed.ok else []
        ev = [self.keep("stream-plain", plain, {"signature": a}),
              self.keep("stream-streamed", streamed, {"signature": b, "separation": leak, "diffs": diffs,
                                                      "structure": structure})]
        self.collect_calls("stream-plain", plain.body, group="required-tool")
        self.collect_calls("stream-streamed", streamed.body, group="required-tool")
        same = plain.ok and streamed.ok and bool(a) and not diffs
        status = Status.PASS if same and not leak else Status.FAIL
        named = [layer for ex in (plain, streamed) for layer, _ in check_tool_call(ex.body, self.tools).problems]
        layer = None if status == Status.PASS else (
            leak[0][0] if leak else "gateway" if not (plain.ok and streamed.ok) else
            "parser" if (a and not b) else named[0] if named else "model")
        reason = ""
        if status == Status.FAIL:
            layer, reason, ref_ev = self._attribute(layer, "stream")
            ev += ref_ev
        consistency = _finding(
            "agent.stream_consistency", status, layer, ev, reason=reason,
            observed={"plain": a, "streamed": b, "diffs": diffs, "compared": "reasoning, content, tool calls"
                      if reasoning else "content, tool calls"},
            expected="the same channels, assembled from deltas",
            action="streamed tool calls lost or different: check the parser's streaming path")
        if not streamed.ok:
            shape = _finding("agent.stream_structure", Status.INCONCLUSIVE, None, ev, observed=streamed.error,
                             reason="no complete stream to judge", expected="a complete stream",
                             action="see agent.stream_consistency")
        elif not b:
            shape_layer, why, ref_ev = self._attribute("parser", "stream")
            shape = _finding("agent.stream_structure", Status.FAIL, shape_layer, ev + ref_ev,
                             observed="no tool-call deltas", expected="tool-call deltas with index, id, name",
                             reason="; ".join(x for x in ("the stream carries no tool call", why) if x),
                             action="check the parser's streaming path")
        else:
            shape_layer, shape_reason = (None, "")
            if structure:
                shape_layer, shape_reason, ref_ev = self._attribute("parser", "stream")
                ev = ev + ref_ev
            shape = _finding("agent.stream_structure", Status.FAIL if structure else Status.PASS, shape_layer, ev,
                             observed=structure or f"{len(b)} call(s), deltas consistent", reason=shape_reason,
                             expected="index from 0 rising by one; id and name once per call, never changed",
                             action="a client assembling by index gets split or merged calls: fix the parser or "
                                    "the gateway's stream handling")
        return [consistency, shape]

    # --- the planned fallback ----------------------------------------------------------------------------

    def failed_tool_fallback(self) -> Finding:
        """Send the failed tool result and judge each answer against the pack's planned fallback."""
        plan = self.tasks["fallback"]
        driven = plan.get("driven_by", "client")
        retries = int(plan.get("retries", 1))
        ticket = plan["ticket"]
        failed_call = self.pack_call("call_failed_1")
        failed = {"name": failed_call["function"]["name"],
                  "arguments": self.tasks["required_tool"]["call"]["arguments"]}
        messages = self.required_call_messages() + [
            {"role": "assistant", "content": None, "tool_calls": [failed_call]},
            {"role": "tool", "tool_call_id": failed_call["id"], "content": plan["failed_result"]}]
        steps: list[dict[str, Any]] = []
        evs: list[str] = []

        def ask(name: str, tool_choice: Any, kind: str | None = None) -> tuple[Exchange, str, bool]:
            ex = self.client.chat(self.base(list(messages), tools=self.tools, tool_choice=tool_choice))
            chosen = kind or self._fallback_kind(ex.body, failed["name"], ticket["tool"])
            step = {"kind": chosen, "tool": ticket["tool"], "require": ticket.get("require") or {},
                    "acknowledge": plan.get("acknowledge") or [], "must_not_claim": plan.get("must_not_claim") or []}
            judged = judge_fallback_step(step, ex.body if ex.ok else None, self.tools, failed, driven)
            if not ex.ok:
                judged.ok, judged.layer = False, "gateway" if ex.status >= 500 or ex.status == 0 else "client"
                judged.problems.append(f"HTTP {ex.status}: {ex.error}")
            steps.append({"step": name, "kind": chosen, "ok": judged.ok, "layer": judged.layer,
                          "problems": judged.problems})
            evs.append(self.keep(f"fallback-{name}", ex, steps[-1]))
            self.collect_calls(f"fallback-{name}", ex.body, group=f"fallback-{name}")
            return ex, chosen, judged.ok

        # The answer to the failed result. Model-driven, it must be a step of the plan (a retry of the
        # same call, the ticket, or an answer that says the tool failed); client-driven, any of those,
        # an answer stating none of the missing data included (the client drives the next step).
        ex, chosen, ok = ask("answer", "auto")
        ticket_ex: Exchange | None = None
        if driven == "model":
            retried = 0
            while ok and chosen == "retry":
                if retried >= retries:
                    steps[-1].update(ok=False, layer="model", problems=steps[-1]["problems"] + [
                        f"the failed call {failed['name']} is repeated past the plan's {retries} retries"])
                    ok = False
                    break
                retried += 1
                call = message_of(ex.body)["tool_calls"][0]
                messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": call.get("id") or f"call_retry_{retried}",
                              "content": plan["failed_result"]}]
                ex, chosen, ok = ask(f"after-retry-{retried}", "auto")
            ticket_ex = ex if ok and chosen == "ticket" else None
        elif ok:
            # The client retries the call itself (the retry fails too), then asks for the ticket by name,
            # twice: one write operation re-sent, which must carry one idempotency key.
            for r in range(retries):
                call = self.pack_call(f"call_retry_{r + 1}")
                messages += [{"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": call["id"], "content": plan["failed_result"]}]
            named = {"type": "function", "function": {"name": ticket["tool"]}}
            ticket_ex, _, ok_first = ask("ticket", named, "ticket")
            _, _, ok_again = ask("ticket-resent", named, "ticket")
            self._regroup("fallback-ticket-resent", "fallback-ticket")
            ok = ok_first and ok_again
        calls = message_of(ticket_ex.body).get("tool_calls") or [] if ticket_ex is not None else []
        if ok and calls:
            messages += [{"role": "assistant", "content": None, "tool_calls": calls[:1]},
                         {"role": "tool", "tool_call_id": calls[0].get("id") or "call_ticket",
                          "content": ticket["result"]}]
            ask("final", "auto", "user_error")
        bad = [s for s in steps if not s["ok"]]
        layer = next((s["layer"] for s in bad if s["layer"]), "model") if bad else None
        reason = "; ".join(f"{s['step']}: {'; '.join(s['problems'])}" for s in bad)[:800]
        if bad and layer in ("parser", "model"):
            layer, why, ref = self._attribute(layer, "tool")
            reason = "; ".join(x for x in (reason, why) if x)
            evs += ref
        return _finding("agent.tool_failure_fallback", Status.FAIL if bad else Status.PASS, layer, evs,
                        observed={"driven_by": driven, "steps": steps}, reason=reason,
                        expected=f"the plan: retry {failed['name']} x{retries}, then a {ticket['tool']} call, then "
                                 "a user-facing answer without the missing data",
                        rule=f"a failed tool result leads to the planned fallback ({driven}-driven: "
                             + ("the client retries and asks for the ticket by name; the deployment must produce "
                                "each step)" if driven == "client" else "the deployment must choose each step)"),
                        action="an answer that ignores the failure: fix the prompt or the model; a step the "
                               "deployment cannot produce: see agent.tool_call")

    def _regroup(self, case: str, group: str) -> None:
        for item in self.real_calls:
            if item["case"] == case:
                item["retry_group"] = group

    @staticmethod
    def _fallback_kind(body: Any, failed_tool: str, ticket_tool: str) -> str:
        names = [(c.get("function") or {}).get("name") for c in message_of(body).get("tool_calls") or []]
        if failed_tool in names:
            return "retry"
        if ticket_tool in names:
            return "ticket"
        return "user_error"

    # --- structured output ---------------------------------------------------------------------------------

    def structured_output(self) -> Finding:
        """A valid answer accepted; a real broken body from the server (the JSON cut by max_tokens)
        rejected by the client validation, and marked by the server (finish_reason length)."""
        task = self.tasks["structured"]
        schema = task["schema"]
        body = self.base([{"role": "system", "content": self.system}, {"role": "user", "content": task["user"]}],
                         response_format={"type": "json_schema", "json_schema": {
                             "name": task.get("name", "structured"), "schema": schema, "strict": True}})
        ex = self.client.chat(body)
        content = message_of(ex.body).get("content")
        problems: list[str] = []
        valid_error = _validation_error(content, schema)
        if valid_error:
            problems.append(f"valid-path answer rejected: {valid_error}")
        cut = self.client.chat({**body, "max_tokens": int(task.get("truncate_max_tokens", 3))})
        cut_content = message_of(cut.body).get("content")
        cut_finish = (cut.body or {}).get("choices", [{}])[0].get("finish_reason") if cut.ok else None
        cut_error = _validation_error(cut_content, schema) if cut.ok else None
        broken = {"status": cut.status, "content": cut_content, "finish_reason": cut_finish,
                  "client_validation": cut_error or "accepted"}
        cut_layer = None
        if not cut.ok:
            problems.append(f"no broken body obtained: HTTP {cut.status} {cut.error}")
            cut_layer = "gateway" if cut.status >= 500 or cut.status == 0 else "client"
        elif cut_error is None:
            problems.append(f"a body cut at {task.get('truncate_max_tokens', 3)} tokens was accepted by the client "
                            "validation")
            cut_layer = "client"
        elif cut_finish != "length":
            problems.append(f"a cut body arrived with finish_reason {cut_finish!r}, not 'length': the client cannot "
                            "tell a truncated answer")
            cut_layer = "gateway"
            if self.direct is not None:
                direct_cut = self.direct.chat({**body, "max_tokens": int(task.get("truncate_max_tokens", 3))})
                direct_finish = (direct_cut.body or {}).get("choices", [{}])[0].get("finish_reason") \
                    if direct_cut.ok else None
                self.keep("direct-structured-output-cut", direct_cut, {"finish_reason": direct_finish})
                if direct_finish == "length":
                    problems.append(GATEWAY_REASON.format(detail="its cut body carries finish_reason length"))
                else:
                    cut_layer = "parser"
        # The case set's structured cases (other phrasings, context lengths): each answer validated too.
        cased = [r for r in self.case_rows if r["class"] == "structured"]
        rejected = [r for r in cased if not r["ok"]]
        if rejected:
            problems.append(f"{len(rejected)} of {len(cased)} structured cases rejected: "
                            + "; ".join(f"{r['case']}: {r['problems'][0][1]}" for r in rejected[:5]))
            valid_error = valid_error or rejected[0]["problems"][0][1]
        ev = [self.keep("structured-output", ex, {"problems": problems, "validation": valid_error or "valid"}),
              self.keep("structured-output-cut", cut, broken)]
        finish = (ex.body or {}).get("choices", [{}])[0].get("finish_reason") if ex.ok else None
        leak = check_separation(ex.body) if ex.ok else []
        layer = "model" if valid_error and finish == "length" else (
            leak[0][0] if valid_error and leak else "parser" if valid_error else cut_layer)
        if not ex.ok:
            layer = "gateway" if ex.status >= 500 else "client"
        status = Status.FAIL if problems or not ex.ok else Status.PASS
        reason = "; ".join(problems)
        if status == Status.FAIL and valid_error:
            layer, why, ref_ev = self._attribute(layer, "structured")
            reason = "; ".join(x for x in (reason, why) if x)
            ev += ref_ev
        return _finding("agent.structured_output", status, layer, ev, reason=reason,
                        observed={"content": content, "finish_reason": finish, "problems": problems,
                                  "structured_cases": len(cased), "structured_rejected": [r["case"] for r in rejected],
                                  "separation": leak, "broken_body": broken},
                        expected="content valid per the JSON Schema; a body cut by max_tokens rejected and marked "
                                 "finish_reason length",
                        action="check guided decoding backend and max_tokens; keep finish_reason through the gateway")

    # --- the reference client on the real calls ----------------------------------------------------------

    def executor_safety(self) -> Finding:
        """Every tool call the deployment returned in this run through the reference client."""
        records, unsafe, retry = execute_real_calls(self.real_calls, self.all_tools, self.write_tools)
        ev = [self.store.write_json("executor.json", {"write_tools": self.write_tools, "calls": records})]
        executed = sum(r["executions"] for r in records)
        keys: dict[Any, set[str]] = {}
        for item, r in zip(self.real_calls, records, strict=True):
            name = r["call"]["function"].get("name")
            if name in self.write_tools and isinstance(r["outcome"], dict):
                key = _arg(r["call"], self.write_tools[name].get("idempotency_key", "request_id"))
                keys.setdefault(json.dumps(key), set()).add(item.get("retry_group") or item["case"])
        refused = [r for r in records if not r["outcome"].get("executed") and not r["outcome"].get("deduplicated")]
        observed = {"calls": len(records), "executed": executed, "refused": len(refused),
                    "invalid": sum(1 for r in records if not r["valid"]),
                    "writes": sum(1 for r in records if r["call"]["function"].get("name") in self.write_tools),
                    "refusals": Counter(r["outcome"].get("error") for r in refused).most_common(5),
                    "unsafe": unsafe[:10], "retry": retry[:10],
                    # One key across different operations: the later write is suppressed as a duplicate
                    # (a lost write, not a double one): shown, since the key should come from the client.
                    "key_shared_across_operations": {k: sorted(v) for k, v in keys.items() if len(v) > 1}}
        expected = ("every invalid call refused with a predictable error; every valid read executed; a write runs "
                    "once per idempotency key, also when the deployment answers one operation twice")
        if not records:
            # Nothing reached the reference client. Never a pass; not applicable rather than unknown, since
            # a run without a single tool call already fails agent.tool_call (agents stay blocked).
            return _finding("agent.executor_safety", Status.NOT_APPLICABLE, None, ev, observed=observed,
                            expected=expected, reason="the deployment returned no tool call in this run: nothing "
                                                      "reached the reference client (see agent.tool_call)",
                            action="fix tool calling first (agent.tool_call)")
        status = Status.FAIL if unsafe or retry else Status.PASS
        layer = "executor" if unsafe else "retry" if retry else None
        return _finding("agent.executor_safety", status, layer, ev, observed=observed, expected=expected,
                        reason="; ".join((unsafe + retry)[:5]),
                        action="validate before executing; the client must hold the idempotency key (one per "
                               "logical write, reused on retry), never take a fresh one from the model")

    def multi_turn(self) -> Finding:
        """user -> assistant tool call -> tool result -> assistant: roles and order kept."""
        first = self.client.chat(self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto"))
        calls = message_of(first.body).get("tool_calls") or []
        evs = [self.keep("multi-turn-1", first, {"tool_calls": len(calls)})]
        self.collect_calls("multi-turn-1", first.body, group="required-tool")
        if not calls:
            problems = check_tool_call(first.body if first.ok else None, self.tools).problems
            layer, reason, _ = self._attribute(problems[0][0] if problems else "model", "tool")
            return _finding("agent.multi_turn", Status.FAIL, layer, evs, reason=reason,
                            observed={"turn_1": "no tool call", "problems": problems},
                            expected="a tool call to continue from", rule="multi-turn order kept",
                            action="fix tool calling first (agent.tool_call)")
        messages = self.required_call_messages() + [
            {"role": "assistant", "content": None, "tool_calls": calls[:1]},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": self.tasks["tool_result_ok"]},
            {"role": "user", "content": self.tasks["second_turn_user"]}]
        second = self.client.chat(self.base(messages, tools=self.tools, tool_choice="auto"))
        msg = message_of(second.body)
        ok = second.ok and msg.get("role") == "assistant" and (msg.get("content") or msg.get("tool_calls"))
        # The conversation the server answered is the one sent: its prompt is as long as the server's own
        # rendering of the messages sent (/tokenize); a hop that drops or rewrites a turn changes it.
        rendered = self.client.tokenize(self.cfg.model, messages, self.tools)
        seen = ((second.body or {}).get("usage") or {}).get("prompt_tokens") if second.ok else None
        tokens = {"prompt_tokens": seen, "rendered_tokens": len(rendered) if rendered is not None else None}
        evs.append(self.keep("multi-turn-2", second, {"role": msg.get("role"), **tokens}))
        self.collect_calls("multi-turn-2", second.body)
        observed = {"status": second.status, "role": msg.get("role"), **tokens}
        if ok and isinstance(seen, int) and tokens["rendered_tokens"] is not None and seen != tokens["rendered_tokens"]:
            return _finding("agent.multi_turn", Status.FAIL, "gateway", evs, observed=observed,
                            expected="the server answers the conversation sent: prompt tokens = its rendering",
                            reason=f"the server answered a {seen}-token prompt; the conversation sent renders to "
                                   f"{tokens['rendered_tokens']} tokens (/tokenize): a turn was dropped or "
                                   "rewritten between the client and the server",
                            rule="user -> assistant tool call -> tool result -> assistant, as sent",
                            action="check what the gateway forwards of the assistant and tool turns")
        return _finding("agent.multi_turn", Status.PASS if ok else Status.FAIL, None if ok else "parser", evs,
                        observed=observed, expected="HTTP 200, an assistant message after the tool result",
                        rule="user -> assistant tool call -> tool result -> assistant",
                        action="check the chat template's tool-message rendering")

    def multimodal(self) -> Finding:
        """An image request, where the profile says the service takes images: the image must reach the
        model, so the prompt with it is longer than the same prompt without it (by `agent.image_tokens`
        exactly, when the profile states it)."""
        if not self.cfg.images:
            return _finding("agent.multimodal", Status.NOT_APPLICABLE, None, [],
                            reason="the profile says this service takes no images (agent.images: false)",
                            action="none")
        question = {"type": "text", "text": "What colour is this image? Answer in one word."}
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + solid_png_base64()}}
        ex = self.client.chat(self.base([{"role": "user", "content": [question, image]}]))
        bare = self.client.chat(self.base([{"role": "user", "content": [question]}]))
        msg = message_of(ex.body)
        with_image = ((ex.body or {}).get("usage") or {}).get("prompt_tokens") if ex.ok else None
        without = ((bare.body or {}).get("usage") or {}).get("prompt_tokens") if bare.ok else None
        added = with_image - without if with_image is not None and without is not None else None
        # vLLM's own count of the multimodal tokens (with --enable-prompt-tokens-details; null elsewhere):
        # corroboration kept in the observation, not needed for the verdict.
        server_count = ((((ex.body or {}).get("usage") or {}).get("prompt_tokens_details") or {})
                        .get("multimodal_tokens") if ex.ok else None)
        want = self.cfg.image_tokens
        answered = ex.ok and msg.get("role") == "assistant" and bool(msg.get("content"))
        reached = added is not None and added > 0 and (want is None or added == want)
        ok = answered and reached
        ev = [self.keep("multimodal-image", ex, {"ok": ok, "prompt_tokens": with_image}),
              self.keep("multimodal-no-image", bare, {"prompt_tokens": without})]
        reason = ""
        if not answered:
            layer = "gateway" if ex.status >= 500 else "model"
            reason = f"the image request was not answered: HTTP {ex.status} {ex.error or ''}".strip()
        elif added is None:
            layer, reason = "gateway", "no usage.prompt_tokens to tell whether the image reached the model"
        elif added <= 0:
            layer = "gateway"
            reason = (f"the image never reached the model: {with_image} prompt tokens with it, {without} without "
                      "(something between the client and the model drops it)")
        elif not reached:
            layer = "model"
            reason = f"the image added {added} prompt tokens, the profile says {want} (agent.image_tokens)"
        else:
            layer = None
        return _finding("agent.multimodal", Status.PASS if ok else Status.FAIL, layer, ev, reason=reason,
                        observed={"status": ex.status, "content": (msg.get("content") or "")[:200],
                                  "prompt_tokens_with_image": with_image, "prompt_tokens_without": without,
                                  "image_tokens": added, "server_multimodal_tokens": server_count,
                                  "error": ex.error},
                        expected="HTTP 200, an assistant answer, and the image's tokens in the prompt"
                                 + (f" ({want})" if want is not None else ""),
                        action="check the model's multimodal support, --limit-mm-per-prompt, the image "
                               "pre-processing and any gateway that rewrites message content")

    def gateway_compare(self) -> Finding:
        """Direct vs through the gateway: a difference in structure is the gateway's."""
        assert self.direct is not None
        body = self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto")
        via, direct = self.client.chat(body), self.direct.chat(body)
        diffs = structure_diff(direct.body, via.body) + arguments_diff(direct.body, via.body) \
            if direct.ok and via.ok else [f"direct {direct.status}/{direct.error}, gateway {via.status}/{via.error}"]
        ev = [self.keep("gateway-via", via, {}), self.keep("gateway-direct", direct, {"diffs": diffs})]
        self.collect_calls("gateway-via", via.body, group="required-tool")
        return _finding("agent.gateway", Status.FAIL if diffs else Status.PASS, "gateway" if diffs else None, ev,
                        observed=diffs or "identical structure", expected="identical structure",
                        rule="direct and gateway responses have the same fields and types",
                        action="fix the gateway: it drops or reshapes fields")

    def client_library(self) -> Finding:
        """A field present in the raw HTTP JSON but lost (or refused) by the `openai` client library."""
        bodies = [b for b in getattr(self, "required_bodies", []) if b is not None][:3]
        results = [client_library_problems(b) for b in bodies]
        if not bodies or any(r is None for r in results):
            why = ("the openai Python library is not installed on the controller" if bodies
                   else "no successful tool-call response to parse")
            if bodies:  # openai is a runtime dependency (pyproject.toml): an install without it is broken
                return registry.get("agent.client_library").missing(None, why)
            return registry.get("agent.client_library").inconclusive(None, reason=why, expected="a tool-call "
                                                                     "response to parse", action="see agent.tool_call")
        problems = sorted({p for r in results for p in r or []})
        ev = [self.store.write_json("client-library.json", {"library": "openai", "problems": problems})]
        layer, reason = (None, "")
        if problems:
            layer, reason, ref_ev = self._attribute("client", "library")
            ev += ref_ev
        return _finding("agent.client_library", Status.FAIL if problems else Status.PASS, layer, ev,
                        reason=reason, observed=problems or "every raw field kept",
                        expected="openai ChatCompletion.model_validate keeps every raw field",
                        rule="a field present in raw HTTP but lost through the client library is the client's",
                        action="upgrade/pin the client library or read the raw response for the lost field")

    # --- the case set under load, and against a reference -------------------------------------------

    def _judge_all(self, client: OpenAIClient, cases: list[Case], concurrency: int,
                   model: str | None = None) -> list[tuple[CaseJudgement, Exchange]]:
        # The bodies are built here, in the cases' order, so agent.seed gives each the same seed every run.
        bodies = [self._case_body(case) for case in cases]
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            got = list(pool.map(client.chat, [{**b, "model": model} if model else b for b in bodies]))
        return [(judge_case(c.id, c.cls, c.expect, c.schema, ex.status, ex.body if ex.ok else None,
                            self.tools_of(c), ex.error), ex) for c, ex in zip(cases, got, strict=True)]

    def under_load(self) -> Finding:
        """The case set again with `under_load` requests in flight (the contracted concurrency): a case that
        passed alone and fails under load is a defect that appears only under concurrency."""
        check = registry.get("agent.under_load")
        n = self.cfg.under_load
        if n <= 0:
            return check.result(Status.NOT_APPLICABLE, reason="not measured in this run: no concurrency to hold "
                                "(--under-load N, agent.under_load)", action="set agent.under_load in the profile to "
                                "contract.concurrency (the flagship profiles do; accept.yml sends it in the agent "
                                "stage), or run the probe with --under-load N")
        alone = {r["case"]: r for r in self.case_rows}
        cases = [c for c in self.cases if c.id in alone]
        if not cases:
            return check.inconclusive(None, reason="no case was answered alone: nothing to compare",
                                      expected="the case set answered alone first", action="see agent.tool_call")
        loaded = self._judge_all(self.client, cases, n)
        rows = [{**j.to_dict(), "request": ex.request, "response": ex.body, "error": ex.error,
                 "alone_ok": alone[j.case]["ok"]} for j, ex in loaded]
        ev = [self.store.write_json("cases-under-load.json", {"concurrency": n, "cases": rows})]
        broke = [(j, ex) for j, ex in loaded if alone[j.case]["ok"] and not j.ok]
        hung = [j.case for j, ex in loaded if ex.timed_out]
        judged = [j for j, _ in loaded]
        self.rates["under_load"] = {"concurrency": n, "cases": len(loaded), "broke": len(broke),
                                    "classes": class_rates(judged)}
        for j, ex in broke[:10]:
            ev.append(self.keep(f"under-load-{j.case}", ex, j.to_dict()))
        observed = {"concurrency": n, "cases": len(loaded), "passed_alone": sum(1 for r in rows if r["alone_ok"]),
                    "broke_under_load": [{"case": j.case, "problems": [list(p) for p in j.problems + j.separation]}
                                         for j, _ in broke[:20]]}
        expected = f"every case that passed alone passes with {n} requests in flight"
        rule = "a case's result under the contracted concurrency equals its result served alone"
        if hung and not broke:
            return check.inconclusive(None, reason=f"{len(hung)} case(s) hung under load: {', '.join(hung[:10])}",
                                      expected=expected, evidence=ev, observed=observed, rule=rule,
                                      action="see agent.timeouts")
        if not broke:
            return check.passed(evidence=ev, observed=observed, expected=expected, rule=rule,
                                reason=f"{len(loaded)} cases with {n} in flight: none broke")
        layers = Counter(la for j, _ in broke for la, _ in j.problems + j.separation)
        layer = layers.most_common(1)[0][0]
        why = ""
        if self.direct is not None:
            direct = self._judge_all(self.direct, [c for c in cases if c.id in {j.case for j, _ in broke}] or cases,
                                     n)
            clean = all(j.ok for j, _ in direct)
            ev.append(self.store.write_json("cases-under-load-direct.json",
                                            [{**j.to_dict(), "response": ex.body} for j, ex in direct]))
            if clean:
                layer, why = "gateway", GATEWAY_REASON.format(
                    detail=f"the {len(direct)} broken cases, sent to it with {n} in flight, all pass")
            else:
                why = "the direct server shows the same defects under load: not the gateway"
        names = ", ".join(j.case for j, _ in broke[:10])
        return check.fail(layer=layer, evidence=ev, observed=observed, expected=expected, rule=rule,
                          reason="; ".join(x for x in (
                              f"{len(broke)} case(s) passed alone and failed with {n} requests in flight: {names} "
                              f"({broke[0][0].to_dict()['problems'][0][1]})", why) if x),
                          action="a defect only under concurrency: check guided decoding and the tool parser "
                                 "under concurrent requests, and any gateway in front")

    def reference_agreement(self) -> Finding:
        """The case set (tool classes) sent to the reference: tool-call F1 on triggering (the reference's
        calls the positive class), per-case argument agreement on the cases both call."""
        check = registry.get("agent.reference_agreement")
        if self.reference is None:
            return check.result(Status.NOT_APPLICABLE, reason="no reference given (agent_reference_url / "
                                "--reference-url): nothing to compare with", action="none, or give a reference")
        mine = {r["case"]: r for r in self.case_rows if r["class"] != "structured"}
        cases = [c for c in self.cases if c.id in mine]
        ref = self._judge_all(self.reference, cases, self.cfg.concurrency, self.cfg.reference_model)
        rows = []
        for j, ex in ref:
            ours = mine[j.case]
            rows.append({"case": j.case, "class": j.cls, "reference_status": ex.status,
                         "reference_calls": call_signature(ex.body) if ex.ok else None,
                         "calls": call_signature(ours["response"]) if ours["status"] == 200 else None,
                         "reference_response": ex.body, "reference_request": ex.request})
        ev = [self.store.write_json("reference.json", {"model": self.cfg.reference_model, "cases": rows})]
        agreement = reference_agreement(rows)
        self.rates["reference"] = agreement
        observed = {k: v for k, v in agreement.items() if k != "disagreeing"} | {
            "disagreeing": agreement["disagreeing"][:20]}
        thr = self.cfg.reference_min
        expected = f"tool-call F1 on triggering >= {thr:g} (the reference's calls are the positive class)"
        rule = ("F1 = 2TP / (2TP + FP + FN) over the cases both answered; TP: both call, FP: only the deployment, "
                "FN: only the reference; argument agreement: same names and parsed arguments where both call")
        if agreement["answered"] == 0 or agreement["f1"] is None:
            why = ("the reference answered no case" if agreement["answered"] == 0 else
                   "neither side called a tool on any case: F1 has no positive class")
            return check.inconclusive(None, reason=why, expected=expected, evidence=ev, observed=observed,
                                      rule=rule, action="check the reference URL, model and key")
        ok = agreement["f1"] >= thr
        reason = (f"F1 {agreement['f1']:.3f} over {agreement['answered']} cases (TP {agreement['tp']}, FP "
                  f"{agreement['fp']}, FN {agreement['fn']}); arguments agree on {agreement['arguments_agree']} of "
                  f"{agreement['tp']} cases both call")
        if ok:
            return check.passed(evidence=ev, observed=observed, expected=expected, rule=rule, reason=reason)
        return check.fail(layer="model", evidence=ev, observed=observed, expected=expected, rule=rule,
                          reason=reason + f" < {thr:g}",
                          action="the deployment triggers tools unlike the reference: compare the chat template, "
                                 "the tool parser and the weights with the reference's")

    # --- layer attribution helpers ---------------------------------------------------------------

    @staticmethod
    def _trigger_layer(checks: list[Any], signatures: list[str], triggered: list[Any]) -> str:
        """Runs that did not trigger the majority call: their own problems name the layer (markup left in
        content is the parser's, not an inconsistent model); none -> the model."""
        if not triggered:
            odd = checks
        else:
            majority = Counter(signatures).most_common(1)[0][0]
            odd = [c for c, sig in zip(checks, signatures, strict=True) if sig != majority]
        layers = Counter(layer for c in odd for layer, _ in c.problems if layer != "model")
        return layers.most_common(1)[0][0] if layers else "model"

    def _attribute(self, layer: str | None, kind: str) -> tuple[str | None, str, list[str]]:
        """With --direct-url: when the direct server answers the same request cleanly, the layer is the
        gateway's. Without it (or when the direct answer shows the same defect) the layer stays."""
        if self.direct is None:
            return layer, "", []
        if kind not in self._refs:
            self._refs[kind] = self._reference(kind)
        clean, detail, ev = self._refs[kind]
        if clean:
            return "gateway", GATEWAY_REASON.format(detail=detail), ev
        return layer, f"the direct server shows the same defect ({detail}): not the gateway", ev

    def _reference(self, kind: str) -> tuple[bool, str, list[str]]:
        assert self.direct is not None
        body = self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto")
        if kind in ("tool", "library"):
            # As many direct runs as gateway runs: a rare (one-in-N) defect must not hide by chance.
            bad, evs = 0, []
            for i in range(self.cfg.repeats):
                ex = self.direct.chat(body)
                check = check_tool_call(ex.body if ex.ok else None, self.tools)
                problems = check.problems + check_separation(ex.body) if ex.ok else [("client", f"{ex.error}")]
                if kind == "library" and ex.ok:
                    problems = [("client", p) for p in client_library_problems(ex.body) or []]
                bad += bool(problems)
                evs.append(self.keep(f"direct-{kind}-{i + 1}", ex, {"problems": problems}))
            return bad == 0, f"{bad}/{self.cfg.repeats} direct runs with a defect", evs
        if kind == "stream":
            plain, streamed = self.direct.chat(body), self.direct.chat_stream(body)
            a, b = call_signature(plain.body), call_signature(streamed.body)
            clean = plain.ok and streamed.ok and a == b and bool(a) and not check_separation(streamed.body)
            ev = [self.keep("direct-stream-plain", plain, {"signature": a}),
                  self.keep("direct-stream-streamed", streamed, {"signature": b})]
            return clean, f"direct plain and streamed calls {'agree' if clean else 'differ'}", ev
        task = self.tasks["structured"]
        ex = self.direct.chat(self.base(
            [{"role": "system", "content": self.system}, {"role": "user", "content": task["user"]}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": task.get("name", "structured"), "schema": task["schema"],
                                             "strict": True}}))
        try:
            jsonschema.validate(json.loads(message_of(ex.body).get("content") or ""), task["schema"])
            clean = ex.ok
        except (ValueError, jsonschema.ValidationError):
            clean = False
        ev = [self.keep("direct-structured-output", ex, {"valid": clean})]
        return clean, f"direct structured answer {'valid' if clean else 'invalid'}", ev


def _validation_error(content: str | None, schema: dict[str, Any]) -> str | None:
    """The client validation of a structured answer: None when it parses and validates."""
    try:
        jsonschema.validate(json.loads(content or ""), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return str(exc).splitlines()[0][:200]
    return None
