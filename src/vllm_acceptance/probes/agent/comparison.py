"""The case set under load (agent.under_load) and against a reference (agent.reference_agreement)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...core.findings import Finding, Status
from ...rules import registry
from .common import GATEWAY_REASON
from .rules import (
    ARGUMENT_COMPARISON,
    call_signature,
    class_rates,
    reference_agreement,
)
from .streaming import StreamTwins


class Comparisons(StreamTwins):
    """The case set again: under the contracted concurrency, and against a reference endpoint."""

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
        loaded = self.send_under_load(cases, n)  # mixed with the streamed twins (agent.stream_tool_calls)
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
        tools = {c.id: self.tools_of(c) for c in cases}
        for j, ex in ref:
            ours = mine[j.case]
            rows.append({"case": j.case, "class": j.cls, "reference_status": ex.status,
                         "reference_calls": call_signature(ex.body) if ex.ok else None,
                         "calls": call_signature(ours["response"]) if ours["status"] == 200 else None,
                         "reference_response": ex.body, "reference_request": ex.request})
        ev = [self.store.write_json("reference.json", {"model": self.cfg.reference_model, "cases": rows})]
        agreement = reference_agreement([{**r, "tools": tools.get(r["case"])} for r in rows],
                                        self.cfg.reference_min_cases)
        self.rates["reference"] = agreement
        self._reference_result = (agreement, ev)
        observed = {k: v for k, v in agreement.items() if k != "disagreeing"} | {
            "disagreeing": agreement["disagreeing"][:20]}
        thr = self.cfg.reference_min
        expected = f"tool-call F1 on triggering >= {thr:g} (the reference's calls are the positive class)"
        rule = ("F1 = 2TP / (2TP + FP + FN) over the cases both answered; TP: both call, FP: only the deployment, "
                "FN: only the reference; judged once both sides answered >= thresholds.reference_min_cases cases "
                "(below it: inconclusive, with the count); arguments: agent.reference_arguments")
        if agreement["answered"] == 0 or agreement["f1"] is None or not agreement["conclusive"]:
            why = ("the reference answered no case" if agreement["answered"] == 0 else
                   few_cases(agreement) if not agreement["conclusive"] else
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

    def reference_arguments(self) -> Finding:
        """The arguments of the cases both the deployment and the reference call, compared per value under
        rules.ARGUMENT_COMPARISON; the share that agrees must reach thresholds.reference_argument_min. Needs
        agent.reference_agreement's run (it sends nothing of its own)."""
        check = registry.get("agent.reference_arguments")
        result = getattr(self, "_reference_result", None)
        if self.reference is None or result is None:
            return check.result(Status.NOT_APPLICABLE, reason="no reference given (agent_reference_url / "
                                "--reference-url): nothing to compare with", action="none, or give a reference")
        agreement, ev = result
        thr = self.cfg.reference_argument_min
        observed = {k: agreement[k] for k in ("answered", "min_cases", "tp", "arguments_agree",
                                              "argument_agreement")} | {
            "disagreeing": [d for d in agreement["disagreeing"] if "differences" in d][:20]}
        expected = (f"arguments agree on >= {thr:g} of the cases both call, over >= {agreement['min_cases']} cases "
                    "both answered")
        rule = ARGUMENT_COMPARISON
        if not agreement["conclusive"] or not agreement["tp"]:
            why = few_cases(agreement) if not agreement["conclusive"] else "no case where both sides call a tool"
            return check.inconclusive(None, reason=why, expected=expected, evidence=ev, observed=observed,
                                      rule=rule, action="check the reference URL, model and key; send more cases")
        share = agreement["argument_agreement"]
        reason = (f"arguments agree on {agreement['arguments_agree']} of {agreement['tp']} cases both call "
                  f"({share:.3f})")
        if share >= thr:
            return check.passed(evidence=ev, observed=observed, expected=expected, rule=rule, reason=reason)
        first = next((d for d in agreement["disagreeing"] if "differences" in d), {})
        return check.fail(layer="model", evidence=ev, observed=observed, expected=expected, rule=rule,
                          reason=reason + f" < {thr:g}; e.g. {first.get('case')}: "
                                          f"{'; '.join(first.get('differences') or [])[:200]}",
                          action="the deployment calls the same tools with other arguments than the reference: "
                                 "compare the chat template, the tool parser and the weights with the reference's")


def few_cases(agreement: dict[str, Any]) -> str:
    """Why a reference result does not count yet: fewer cases answered by both sides than the minimum."""
    return (f"only {agreement['answered']} case(s) answered by both the deployment and the reference, fewer than "
            f"the {agreement['min_cases']} a reference result needs (thresholds.reference_min_cases): one case "
            "would move the F1 by more than the verifier's margin")
