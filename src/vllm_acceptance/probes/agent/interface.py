"""The agent probe's interface checks: structured output, executor safety, gateway comparison
and the client library (docs/checks.md agent.*)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ...core.findings import Finding, Status
from ...rules import registry
from .base import AgentProbeBase
from .common import GATEWAY_REASON, _finding, _validation_error
from .rules import (
    _arg,
    arguments_diff,
    check_separation,
    client_library_problems,
    execute_real_calls,
    message_of,
    structure_diff,
)


class InterfaceChecks(AgentProbeBase):
    """Structured output, the reference client on the real calls, the gateway and the client library."""


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
