"""The agent probe's shared state and helpers (AgentProbeBase); each family of checks is a mixin on it."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema

from ...core.evidence import EvidenceStore
from ...runtime.client import Exchange, OpenAIClient
from ...scenarios.cases import Case, case_tools
from .common import GATEWAY_REASON, AgentProbeConfig, exchange_row, turn_target
from .rules import (
    CaseJudgement,
    call_signature,
    check_separation,
    check_tool_call,
    client_library_problems,
    judge_case,
    message_of,
)


class AgentProbeBase:
    """The probe's state and what every check shares: the clients, the evidence kept per request, the
    request bodies (seeded), the case set sent at a concurrency, and the layer attribution."""

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

    def turn_target(self) -> int:
        return turn_target(self.cfg)


    def _case_body(self, case: Case) -> dict[str, Any]:
        return self.seeded(case.body(self.cfg.model, self.cfg.max_tokens, self.cfg.temperature))

    def tools_of(self, case: Case) -> list[dict[str, Any]]:
        return case.tools or self.tools


    def _judge_all(self, client: OpenAIClient, cases: list[Case], concurrency: int,
                   model: str | None = None) -> list[tuple[CaseJudgement, Exchange]]:
        # The bodies are built here, in the cases' order, so agent.seed gives each the same seed every run.
        bodies = [self._case_body(case) for case in cases]
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            got = list(pool.map(client.chat, [{**b, "model": model} if model else b for b in bodies]))
        return [(judge_case(c.id, c.cls, c.expect, c.schema, ex.status, ex.body if ex.ok else None,
                            self.tools_of(c), ex.error), ex) for c, ex in zip(cases, got, strict=True)]


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

