"""Agent interface conformance (docs/acceptance.md "Agent interface"): tool calls, separation, streaming,
multi-turn, structured output, safe execution; every defect attributed to a layer.

Every exchange is kept as evidence (request body, raw response, parsed result, decision).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import jsonschema

from ..core.evidence import EvidenceStore
from ..core.findings import Consequence, Finding, Status
from ..rules.agent import (
    ToolExecutor,
    arguments_diff,
    call_signature,
    check_separation,
    check_tool_call,
    client_library_problems,
    message_of,
    structure_diff,
)
from ..scenarios import tool_schema_problems
from .client import Exchange, OpenAIClient

WRITE_TOOLS = {"create_ticket"}
# Checks judged over repeated runs: a hung run is left out of the rates, the answered runs still judged.
REPEATED = ("agent.tool_call", "agent.trigger_consistency", "agent.separation")


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
    repeats: int = 3
    temperature: float = 0.0
    max_tokens: int = 256
    format_error_threshold: float = 0.01
    images: bool = False


def _finding(check: str, status: Status, layer: str | None, ev: list[str], **kw: Any) -> Finding:
    return Finding(check=check, status=status, layer=layer, evidence=ev,
                   consequence=kw.pop("consequence", Consequence.BLOCK_AGENT), **kw)


class AgentProbe:
    def __init__(self, client: OpenAIClient, cfg: AgentProbeConfig, store: EvidenceStore,
                 direct: OpenAIClient | None = None) -> None:
        self.client, self.cfg, self.store, self.direct = client, cfg, store, direct
        self.tools = cfg.scenario["tools"]
        self.tasks = cfg.scenario["tasks"]
        self.system = cfg.scenario["system_prompt"].format(
            session_id="agent-probe", environment=cfg.scenario["default_environment"])
        self.n = 0
        self.rates: dict[str, Any] = {}
        self.hung: list[dict[str, Any]] = []
        # Direct-server references per check kind (only with --direct-url): (clean, detail, evidence).
        self._refs: dict[str, tuple[bool, str, list[str]]] = {}

    def keep(self, name: str, ex: Exchange, decision: dict[str, Any]) -> str:
        self.n += 1
        path = self.store.write_json(f"cases/{self.n:02d}-{name}.json", {
            **ex.evidence(), "max_tokens": ex.request.get("max_tokens"), "temperature": ex.request.get("temperature"),
            "parsed": message_of(ex.body), "decision": decision})
        if ex.timed_out:
            self.hung.append({"case": f"{self.n:02d}-{name}", "evidence": path, "url": ex.url,
                              "timeout_s": ex.timeout_s, "waited_s": round(ex.end - ex.sent, 2),
                              "stream_chunks": len(ex.chunks), "error": ex.error})
        return path

    def base(self, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"model": self.cfg.model, "messages": messages, "max_tokens": self.cfg.max_tokens,
                "temperature": self.cfg.temperature, **extra}

    def required_call_messages(self) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": self.tasks["required_tool"]["user"]}]

    def run(self) -> tuple[list[Finding], dict[str, Any]]:
        findings: list[Finding] = []
        ev_schemas = self.store.write_json("tool_schemas.json", self.tools)
        problems = tool_schema_problems(self.tools)
        findings.append(_finding("agent.tool_schemas", Status.FAIL if problems else Status.PASS,
                                 "client" if problems else None, [ev_schemas], observed=problems or "valid",
                                 expected="every tool's parameters are a valid JSON Schema",
                                 rule="tool JSON Schemas validated before any request is sent",
                                 action="fix the tool definitions"))
        if problems:
            return findings, {}
        findings += self.required_tool_calls()
        findings.append(self.stream_consistency())
        findings.append(self.multi_turn())
        findings.append(self.failed_tool_fallback())
        findings.append(self.structured_output())
        findings.append(self.executor_safety())
        findings.append(self.multimodal())
        findings.append(self.client_library())
        if self.direct is not None:
            findings.append(self.gateway_compare())
        findings = [self._judge_hangs(f) for f in findings]
        if self.hung:
            findings.append(self._timeouts(findings))
        return findings, {"cases": [{"id": f.check, "check": f.check, "status": f.status.value, "layer": f.layer,
                                     "evidence": f.evidence} for f in findings], "rates": self.rates,
                          "timeouts": self.hung}

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

    def required_tool_calls(self) -> list[Finding]:
        """Repeated runs of a task that must call a tool: validity, separation and rates."""
        body = self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto")
        checks, evs, signatures = [], [], []
        separation: list[tuple[str, str]] = []
        separated_runs = 0
        self.required_bodies: list[Any] = []
        for i in range(self.cfg.repeats):
            ex = self.client.chat(body)
            if ex.timed_out:  # judged apart (_judge_hangs); not a format error of the answered runs
                self.required_bodies.append(None)
                evs.append(self.keep(f"required-tool-{i + 1}", ex, {"valid": None, "timed_out": True}))
                continue
            check = check_tool_call(ex.body if ex.ok else None, self.tools)
            if not ex.ok:
                check.problems.append(("gateway" if ex.status >= 500 else "client", f"HTTP error: {ex.error}"))
            sep = check_separation(ex.body)
            separation += sep
            separated_runs += bool(sep)
            self.required_bodies.append(ex.body if ex.ok else None)
            evs.append(self.keep(f"required-tool-{i + 1}", ex, {"valid": check.valid, "problems": check.problems,
                                                                 "separation": sep}))
            checks.append(check)
            signatures.append(json.dumps(call_signature(ex.body), sort_keys=True))
        triggered = [c for c in checks if c.tool_calls > 0]
        by_finish = [c for c in checks if c.finish_reason == "tool_calls"]
        valid = [c for c in by_finish if c.valid]
        format_errors = [c for c in checks if c.problems]
        self.rates = {
            "schema_accuracy": len(valid) / len(by_finish) if by_finish else None,
            "trigger_consistency": Counter(signatures).most_common(1)[0][1] / len(signatures) if signatures else None,
            "format_error_rate": len(format_errors) / len(checks) if checks else None,
            "separation_error_rate": separated_runs / len(checks) if checks else None,
            "runs": len(checks), "triggered": len(triggered), "finish_tool_calls": len(by_finish),
        }
        expect = self.tasks["required_tool"]["expect_tool"]
        out = []
        layers = Counter(layer for c in checks for layer, _ in c.problems)
        layer = layers.most_common(1)[0][0] if layers else None
        status = self._rate_status(self.rates["format_error_rate"])
        reason = ""
        if status != Status.PASS:
            layer, reason, ref_ev = self._attribute(layer, "tool")
            evs = evs + ref_ev
        out.append(_finding(
            "agent.tool_call", status, layer, evs, reason=reason,
            observed={"rates": self.rates, "names": [c.names for c in checks],
                      "problems": [p for c in checks for p in c.problems][:10]},
            expected=f"tool_calls with {expect} (or another schema tool), valid JSON arguments per schema",
            rule=f"every run valid; format error rate <= {self.cfg.format_error_threshold} for limited use",
            action="attribute by layer: model (same input, illegal format repeatedly), parser (markup in "
                   "content, no tool_calls); retry with validation only below the threshold"))
        # Model-layer consistency: the same input should trigger the same call.
        consistency = self.rates["trigger_consistency"] or 0.0
        trigger_status = Status.FAIL if not triggered else (Status.PASS if consistency == 1.0 else Status.WARN)
        if not checks:
            trigger_status = Status.INCONCLUSIVE  # no run answered: nothing to judge
        trigger_layer, trigger_reason = None, ""
        if trigger_status != Status.PASS:
            trigger_layer, trigger_reason, _ = self._attribute(self._trigger_layer(checks, signatures, triggered),
                                                               "tool")
        out.append(_finding(
            "agent.trigger_consistency", trigger_status, trigger_layer, evs, reason=trigger_reason,
            observed=self.rates, expected="1.0",
            rule="repeated runs of the same input trigger the same call",
            action="pin temperature / review the prompt; inconsistent triggering needs a retry policy"))
        sep_status = self._rate_status(self.rates["separation_error_rate"])
        sep_layer, sep_reason = (separation[0][0], "") if separation else (None, "")
        if separation:
            sep_layer, sep_reason, _ = self._attribute(sep_layer, "tool")
        out.append(_finding(
            "agent.separation", sep_status, sep_layer, evs, observed=separation or "separated", reason=sep_reason,
            expected="no tool-call or reasoning markup in content",
            rule=f"content, reasoning, tool_calls apart; a leak rate <= {self.cfg.format_error_threshold} "
                 "is a limited observation (validated retry)",
            action="check the --tool-call-parser / --reasoning-parser names and the gateway"))
        return out

    def stream_consistency(self) -> Finding:
        body = self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto")
        plain = self.client.chat(body)
        streamed = self.client.chat_stream(body)
        a, b = call_signature(plain.body), call_signature(streamed.body)
        same = plain.ok and streamed.ok and a == b and bool(a)
        leak = check_separation(streamed.body)
        ev = [self.keep("stream-plain", plain, {"signature": a}),
              self.keep("stream-streamed", streamed, {"signature": b, "separation": leak})]
        status = Status.PASS if same and not leak else Status.FAIL
        layer = None if status == Status.PASS else (leak[0][0] if leak else "parser" if a and not b else "model")
        reason = ""
        if status == Status.FAIL:
            layer, reason, ref_ev = self._attribute(layer, "stream")
            ev += ref_ev
        return _finding("agent.stream_consistency", status, layer, ev, observed={"plain": a, "streamed": b},
                        reason=reason,
                        expected="the same tool calls, assembled from deltas",
                        rule="streaming and non-streaming give the same structure",
                        action="streamed tool calls lost or different: check the parser's streaming path")

    def multi_turn(self) -> Finding:
        """user -> assistant tool call -> tool result -> assistant: roles and order kept."""
        first = self.client.chat(self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto"))
        calls = message_of(first.body).get("tool_calls") or []
        evs = [self.keep("multi-turn-1", first, {"tool_calls": len(calls)})]
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
        evs.append(self.keep("multi-turn-2", second, {"role": msg.get("role")}))
        return _finding("agent.multi_turn", Status.PASS if ok else Status.FAIL, None if ok else "parser", evs,
                        observed={"status": second.status, "role": msg.get("role")},
                        expected="HTTP 200, an assistant message after the tool result",
                        rule="user -> assistant tool call -> tool result -> assistant",
                        action="check the chat template's tool-message rendering")

    def failed_tool_fallback(self) -> Finding:
        """A failed tool result: the server still answers, and the client takes the planned fallback."""
        call_id = "call_failed_1"
        messages = self.required_call_messages() + [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": self.tasks["required_tool"]["expect_tool"],
                "arguments": json.dumps({"node": "node-07", "include": "gpus"})}}]},
            {"role": "tool", "tool_call_id": call_id, "content": self.tasks["tool_result_failed"]}]
        ex = self.client.chat(self.base(messages, tools=self.tools, tool_choice="auto"))
        tool_result = json.loads(self.tasks["tool_result_failed"])
        fallback = "retry_once_then_ticket" if "error" in tool_result else "none"
        ok = ex.ok and message_of(ex.body).get("role") == "assistant" and fallback != "none"
        ev = [self.keep("failed-tool-result", ex, {"fallback": fallback})]
        return _finding("agent.tool_failure_fallback", Status.PASS if ok else Status.FAIL,
                        None if ok else "executor", ev, observed={"status": ex.status, "fallback": fallback},
                        expected="assistant answer; planned fallback retry_once_then_ticket",
                        rule="a failed or incomplete tool result leads to the planned fallback",
                        action="define the client fallback for failed tools")

    def structured_output(self) -> Finding:
        task = self.tasks["structured"]
        schema = task["schema"]
        body = self.base([{"role": "system", "content": self.system}, {"role": "user", "content": task["user"]}],
                         response_format={"type": "json_schema",
                                          "json_schema": {"name": "node_health", "schema": schema, "strict": True}})
        ex = self.client.chat(body)
        content = message_of(ex.body).get("content")
        problems = []
        try:
            jsonschema.validate(json.loads(content or ""), schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            problems.append(f"valid-path answer rejected: {str(exc)[:200]}")
        # The client must reject a broken answer: feed the validator a truncated copy of a real answer.
        broken = (content or "{")[: max(1, len(content or "{") // 2)]
        try:
            jsonschema.validate(json.loads(broken), schema)
            problems.append("a broken answer was accepted by the client validator")
        except (ValueError, jsonschema.ValidationError):
            pass
        ev = [self.keep("structured-output", ex, {"problems": problems, "broken_probe": broken})]
        finish = (ex.body or {}).get("choices", [{}])[0].get("finish_reason") if ex.ok else None
        leak = check_separation(ex.body) if ex.ok else []
        layer = "model" if problems and finish == "length" else (
            leak[0][0] if problems and leak else "parser" if problems else None)
        if not ex.ok:
            layer = "gateway" if ex.status >= 500 else "client"
        status = Status.FAIL if problems or not ex.ok else Status.PASS
        reason = ""
        if status == Status.FAIL:
            layer, reason, ref_ev = self._attribute(layer, "structured")
            ev += ref_ev
        return _finding("agent.structured_output", status, layer, ev, reason=reason,
                        observed={"content": content, "finish_reason": finish, "problems": problems,
                                  "separation": leak},
                        expected="content valid per the JSON Schema; broken answers rejected",
                        rule="response_format json_schema: valid accepted, broken rejected, raw body kept",
                        action="check guided decoding backend and max_tokens")

    def multimodal(self) -> Finding:
        """An image request, where the profile says the service takes images."""
        if not self.cfg.images:
            return _finding("agent.multimodal", Status.NOT_APPLICABLE, None, [],
                            reason="the profile says this service takes no images (agent.images: false)",
                            action="none")
        content = [{"type": "text", "text": "What colour is this image? Answer in one word."},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64," + solid_png_base64()}}]
        ex = self.client.chat(self.base([{"role": "user", "content": content}]))
        msg = message_of(ex.body)
        ok = ex.ok and msg.get("role") == "assistant" and bool(msg.get("content"))
        ev = [self.keep("multimodal-image", ex, {"ok": ok})]
        layer = None if ok else ("gateway" if ex.status >= 500 else "model")
        return _finding("agent.multimodal", Status.PASS if ok else Status.FAIL, layer, ev,
                        observed={"status": ex.status, "content": (msg.get("content") or "")[:200],
                                  "error": ex.error},
                        expected="HTTP 200 and an assistant answer to an image request",
                        rule="a multimodal request where the service takes images",
                        action="check the model's multimodal support, --limit-mm-per-prompt and the "
                               "image pre-processing in the image")

    def executor_safety(self) -> Finding:
        """The harness: an invalid call never executes; a write retried with one id runs once."""
        executor = ToolExecutor(self.tools, WRITE_TOOLS)
        invalid = executor.execute("get_node_status", json.dumps({"node": "node-7", "include": "everything"}))
        request_id = uuid.uuid4().hex
        ticket = json.dumps({"request_id": request_id, "title": "GPU count low", "severity": "major",
                             "details": {"node": "node-07"}})
        first, retry = executor.execute("create_ticket", ticket), executor.execute("create_ticket", ticket)
        writes = [a for n, a in executor.executed if n == "create_ticket"]
        ok = not invalid.get("executed") and first.get("executed") and retry.get("deduplicated") and len(writes) == 1
        ev = [self.store.write_json("executor.json", {"invalid": invalid, "first": first, "retry": retry,
                                                      "executed": executor.executed})]
        return _finding("agent.executor_safety", Status.PASS if ok else Status.FAIL,
                        None if ok else ("executor" if invalid.get("executed") else "retry"), ev,
                        observed={"invalid_executed": invalid.get("executed"), "writes": len(writes)},
                        expected="invalid call not executed; one write per request id",
                        rule="safe failure and idempotent retry", action="validate before executing; dedupe by id")

    def gateway_compare(self) -> Finding:
        """Direct vs through the gateway: a difference in structure is the gateway's."""
        assert self.direct is not None
        body = self.base(self.required_call_messages(), tools=self.tools, tool_choice="auto")
        via, direct = self.client.chat(body), self.direct.chat(body)
        diffs = structure_diff(direct.body, via.body) + arguments_diff(direct.body, via.body) \
            if direct.ok and via.ok else [f"direct {direct.status}/{direct.error}, gateway {via.status}/{via.error}"]
        ev = [self.keep("gateway-via", via, {}), self.keep("gateway-direct", direct, {"diffs": diffs})]
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
            return Finding(check="agent.client_library", status=Status.NOT_APPLICABLE, reason=why,
                           consequence=Consequence.BLOCK_AGENT, action="install openai to check the client layer")
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

    # --- layer attribution helpers ---------------------------------------------------------------

    def _rate_status(self, rate: float | None) -> Status:
        """Never seen: pass; rare, at or below the profile's threshold: warn (limited observation with a
        validated retry); above it: fail (agent traffic blocked)."""
        if not rate:
            return Status.PASS
        return Status.WARN if rate <= self.cfg.format_error_threshold else Status.FAIL

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
                             "json_schema": {"name": "node_health", "schema": task["schema"], "strict": True}}))
        try:
            jsonschema.validate(json.loads(message_of(ex.body).get("content") or ""), task["schema"])
            clean = ex.ok
        except (ValueError, jsonschema.ValidationError):
            clean = False
        ev = [self.keep("direct-structured-output", ex, {"valid": clean})]
        return clean, f"direct structured answer {'valid' if clean else 'invalid'}", ev
