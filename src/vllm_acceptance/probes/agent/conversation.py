"""The agent probe's conversation checks: streaming, multi-turn, the planned fallback and
multimodal input (docs/checks.md agent.*)."""

from __future__ import annotations

from typing import Any

from ...core.findings import Finding, Status
from ...runtime.client import Exchange
from .base import AgentProbeBase
from .common import _finding, solid_png_base64
from .rules import (
    call_signature,
    channel_diff,
    check_separation,
    check_tool_call,
    judge_fallback_step,
    message_of,
    stream_structure_problems,
)


class ConversationChecks(AgentProbeBase):
    """Streaming, multi-turn, the planned fallback after a failed tool, and images."""

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
