"""The agent probe's rate run over the case set (agent.tool_call, agent.schema_accuracy,
agent.trigger_consistency, agent.separation; docs/checks.md)."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...core.findings import Finding, Status
from ...runtime.client import Exchange
from ...scenarios.case_packs import pack_cases
from ...scenarios.cases import CALL_CLASSES, Case, build_cases, choice_cases, class_counts
from .base import AgentProbeBase
from .common import BATCH, GATEWAY_REASON, _finding, case_counts
from .rules import (
    BOUND_ASSUMPTIONS,
    CONSISTENCY_RULE,
    CallCheck,
    CaseJudgement,
    Rate,
    ToolChoiceJudgement,
    call_signature,
    call_structure,
    calls_differences,
    check_tool_call,
    class_rates,
    finish_of,
    judge_case,
    judge_tool_choice,
    rate_lower_bound,
    turns_to_resolve,
    verifier_measures,
)

# The verifier's public request settings, reported beside its measures (docs/sources.md#k2-vendor-verifier):
# the probe keeps its own sampling (agent.temperature); these say what the verifier's numbers were taken with.
VERIFIER_SETTINGS = {
    "k2_vendor_verifier": {"requests": 4000, "compared_with": "the official Moonshot API", "concurrency_default": 5,
                           "k2_thinking": {"temperature": 1.0, "max_tokens": 64000, "tool_call_f1_min": 0.73},
                           "k2_0905": {"temperature": 0.6, "tool_call_f1_min": 0.80}},
    "kimi_vendor_verifier_k3": {"temperature": 1.0, "top_p": 0.95,
                                "tool_call_json_schema": "every case's arguments validate (jsonschema), streamed "
                                                         "and non-streamed, --reruns 3",
                                "tool_choice": ["auto", "none", "required"]},
}


class RateRun(AgentProbeBase):
    """The rate run: the seeded case set once, concurrently, the rates over distinct cases with their
    95 % bounds, a sample repeated for consistency, and the validated retry of a failed case."""

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
        calls, others = case_counts(self.cfg)
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
        # one case per tool_choice besides auto (required, named, none): agent.tool_choice judges each every run
        out += self._fit(choice_cases(self.cfg.scenario, self.cfg.case_seed, self.system, self.cfg.case_tools), limit)
        if self.cfg.case_pack:  # agent.case_pack: the vendored pack's requests, as call cases
            out += self._fit(pack_cases(self.cfg.case_pack), limit)
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
        choices: list[ToolChoiceJudgement] = []
        rows, hung_ev, bad_ev, failed = [], [], [], []
        for case, ex in zip(cases, exchanges, strict=False):
            if ex.timed_out:  # judged apart (_judge_hangs); not a format error of the answered cases
                hung_ev.append(self.keep(case.id, ex, {"valid": None, "timed_out": True}))
                continue
            j = judge_case(case.id, case.cls, case.expect, case.schema, ex.status, ex.body if ex.ok else None,
                           self.tools_of(case), ex.error)
            if case.tool_choice == "none" and j.separation:
                # tool_choice none: vLLM runs no tool parser (chat_completion/serving.py), so a model that writes
                # call markup anyway leaves it in content by design: reported with the case, not a parser leak
                j.separation = [p for p in j.separation if not p[1].startswith("tool-call markup")]
            judged.append(j)
            if ex.ok:
                choices.append(judge_tool_choice(case.id, case.cls, case.expect, case.tool_choice, j.check.names,
                                                 self.write_tools))
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
            "vendor_verifier": {**verifier_measures(judged), "settings": VERIFIER_SETTINGS},
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
        out.append(self._judge_tool_choice(choices, {c.id: c for c in cases}, [ev_cases]))
        out.append(self._judge_separation(sep_rate, [j.separation for j in judged], retries, evs))
        return out

    def repeat_sample(self, cases: list[Case]) -> tuple[list[dict[str, Any]], str]:
        """The first `agent.consistency_cases` single cases, each sent `agent.repeats` times: consistent when
        every run gives the same call structure (rules.CONSISTENCY_RULE: tools, argument keys, enum / id /
        boolean values); free text and numbers that differ are reported (`free_text_differences`), not failed."""
        sample = [c for c in cases if c.cls == "single"][:self.cfg.consistency_cases]
        jobs = [(c, r) for c in sample for r in range(max(1, self.cfg.repeats))]
        with ThreadPoolExecutor(max_workers=max(1, self.cfg.concurrency)) as pool:
            got = list(pool.map(self.client.chat, [self._case_body(job[0]) for job in jobs]))
        out = []
        for case in sample:
            tools = self.tools_of(case)
            runs = [(ex, check_tool_call(ex.body if ex.ok else None, tools))
                    for (c, _), ex in zip(jobs, got, strict=True) if c is case and not ex.timed_out]
            sigs = [call_structure(call_signature(ex.body), tools) for ex, _ in runs]
            full = [call_signature(ex.body) for ex, _ in runs]
            # the values the structure leaves out (free text, numbers) that differ between runs: reported only
            loose = sorted({d for other in full[1:] for part in calls_differences(full[0], other, tools)
                            for d in part}) if len(set(sigs)) == 1 else []
            out.append({"case": case.id, "runs": len(runs), "consistent": len(set(sigs)) == 1 and bool(runs),
                        "signatures": Counter(sigs).most_common(3), "checks": [c for _, c in runs],
                        "structures": sigs, "free_text_differences": loose[:10],
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
            sigs = [sig for r in runs for sig in r["structures"]]
            base = self._trigger_layer(checks, sigs, triggered) if (odd or not triggered) else "model"
            layer, why, _ = self._attribute(base, "tool")
            reasons.append(why)
        return _finding("agent.trigger_consistency", status, layer, evs, reason="; ".join(x for x in reasons if x),
                        observed={"consistency": self.rates.get("trigger_consistency"), "repeated_cases": len(runs),
                                  "runs_each": self.cfg.repeats, "inconsistent": [r["case"] for r in odd][:10],
                                  "free_text_varied": [{"case": r["case"], "differences": r["free_text_differences"]}
                                                       for r in runs if r.get("free_text_differences")][:10],
                                  "abstain": abstain.to_dict()},
                        expected=f"every repeated case gives the same call; irrelevance cases abstain "
                                 f"(95 % lower bound >= {abstain.threshold:g})",
                        rule="consistency over repeats of the same case (never a rate): " + CONSISTENCY_RULE
                             + "; abstention over distinct irrelevance cases (a rate, judged on its bound)",
                        action="pin temperature / review the prompt; inconsistent triggering needs a retry policy; "
                               "calls where no tool fits: review the tool descriptions and the system prompt")

    def _judge_separation(self, rate: Rate, seps: list[list[tuple[str, str]]], retries: list[dict[str, Any]],
                          evs: list[str]) -> Finding:
        leaked = [p for s in seps for p in s]
        return self._rate_finding(
            "agent.separation", rate, retries, leaked[0][0] if leaked else None, evs,
            {"problems": leaked[:10]}, "no tool-call or reasoning markup in content",
            "check the --tool-call-parser / --reasoning-parser names and the gateway")

    def _judge_tool_choice(self, choices: list[ToolChoiceJudgement], cases: dict[str, Case],
                           evs: list[str]) -> Finding:
        """agent.tool_choice: calls of a tool the case does not expect (a write tool: severe, its own bound,
        0 by default: any one fails), the request's tool_choice honoured, parallel calls judged as a set."""
        scope = [c for c in choices if c.cls in (*CALL_CLASSES, "irrelevance")]
        calls = [c for c in scope if c.cls in CALL_CLASSES]
        read = [c for c in calls if c.wrong and not c.severe]
        severe = [c for c in scope if c.severe]
        broken = [c for c in choices if c.violations]
        read_rate = Rate("wrong_tool_rate", len(read), len(calls), self.cfg.wrong_tool_rate)
        write_rate = Rate("wrong_write_tool_rate", len(severe), len(scope), self.cfg.wrong_write_tool_rate)
        write_verdict = (("fail" if severe else "pass") if self.cfg.wrong_write_tool_rate <= 0
                         else write_rate.verdict())
        observed = {"wrong_tool": read_rate.to_dict(), "wrong_write_tool": write_rate.to_dict(),
                    "write_tools": sorted(self.write_tools), "tool_choice_violations": len(broken),
                    "cases": [c.to_dict() for c in [*severe, *broken, *read][:20]]}
        expected = (f"calls only of the tools a case expects (read tools: 95 % upper bound <= "
                    f"{self.cfg.wrong_tool_rate:g}; write tools: "
                    + ("none" if self.cfg.wrong_write_tool_rate <= 0 else f"<= {self.cfg.wrong_write_tool_rate:g}")
                    + "); tool_choice required / none / named honoured; a parallel answer a set of expected tools")
        rule = ("per case: called names against the case's expected tools (single, parallel: a set) and its "
                "tool_choice; irrelevance: a write call is wrong; multi_turn: any offered tool")
        reasons = []
        if write_verdict == "fail":
            reasons.append(f"severe: {len(severe)} case(s) called a write tool they do not expect: " + ", ".join(
                f"{c.case} ({', '.join(c.severe)})" for c in severe[:5]))
        if broken:
            reasons.append(f"{len(broken)} case(s) break tool_choice or the parallel set: " + ", ".join(
                f"{c.case} ({c.violations[0]})" for c in broken[:5]))
        read_verdict = read_rate.verdict() if calls else "unresolved"
        if read_verdict == "fail":
            reasons.append(f"{len(read)} of {len(calls)} call cases called a tool they do not expect "
                           f"({read_rate.value:.3f} > {self.cfg.wrong_tool_rate:g}): " + ", ".join(
                               f"{c.case} ({', '.join(c.wrong)})" for c in read[:5]))
        if reasons:
            layer = "parser" if broken and not severe and read_verdict != "fail" and all(
                v.startswith("tool_choice") for c in broken for v in c.violations) else "model"
            why = (self._wrong_tool_direct([*severe, *read], cases) if severe or read
                   else self._violations_direct(broken, cases))
            if why.startswith(GATEWAY_REASON.split("(")[0]) and "cleanly" in why:
                layer = "gateway"
            return _finding("agent.tool_choice", Status.FAIL, layer, evs, observed=observed, expected=expected,
                            rule=rule, reason="; ".join(x for x in (*reasons, why) if x),
                            action="a wrong tool, a write above all, acts on the user's behalf: compare the tool "
                                   "descriptions, the chat template and the tool parser; any gateway mapping names")
        if read_verdict != "pass" or (self.cfg.wrong_write_tool_rate > 0 and write_verdict != "pass"):
            return _finding("agent.tool_choice", Status.INCONCLUSIVE, None, evs, observed=observed,
                            expected=expected, rule=rule,
                            reason=(f"unresolved: {len(read)} of {len(calls)} call cases with a wrong tool, 95 % "
                                    f"upper bound {read_rate.bound:.4f} > {self.cfg.wrong_tool_rate:g}"
                                    if calls else "no call case answered: no tool choice to judge"),
                            action="raise agent.cases / agent.turn_budget")
        return _finding("agent.tool_choice", Status.PASS, None, evs, observed=observed, expected=expected, rule=rule,
                        reason=f"{len(calls)} call cases: {len(read)} with another read tool (95 % upper bound "
                               f"{read_rate.bound:.4f}), {len(severe)} with a write tool not expected, "
                               f"{len(broken)} breaking tool_choice")

    def _violations_direct(self, broken: list[ToolChoiceJudgement], cases: dict[str, Case]) -> str:
        """With --direct-url: the cases whose answer broke their tool_choice (or the parallel set) sent to the
        direct server (10 at most); when it honours most of them, the answer changed between it and the client
        (the gateway: e.g. a call moved into content); otherwise the server's parser or model broke them."""
        sample = [c for c in broken if c.case in cases][:10]
        if not sample or self.direct is None:
            return ""
        direct = self._judge_all(self.direct, [cases[c.case] for c in sample], self.cfg.concurrency)
        kept = [j.case for j, ex in direct if ex.ok and not judge_tool_choice(
            j.case, cases[j.case].cls, cases[j.case].expect, cases[j.case].tool_choice, j.check.names,
            self.write_tools).violations]
        if len(kept) * 2 > len(sample):
            return GATEWAY_REASON.format(detail=f"{len(kept)} of the {len(sample)} cases sent to it honour their "
                                                "tool_choice")
        return (f"the direct server breaks tool_choice on {len(sample) - len(kept)} of {len(sample)} cases too: "
                "not the gateway")

    def _wrong_tool_direct(self, wrong: list[ToolChoiceJudgement], cases: dict[str, Case]) -> str:
        """With --direct-url: the cases that called a wrong tool sent to the direct server (10 at most); when the
        direct server avoids those wrong tools on most of them (greedy decoding repeats a model's own wrong
        choice), the names changed between it and the client (the gateway); otherwise the model chose them."""
        sample = [c for c in wrong if c.case in cases][:10]
        if not sample or self.direct is None:
            return ""
        direct = self._judge_all(self.direct, [cases[c.case] for c in sample], self.cfg.concurrency)
        again = {j.case: set(j.check.names) for j, ex in direct if ex.ok}
        avoided = [c.case for c in sample if c.case in again and not set(c.wrong) & again[c.case]]
        if len(avoided) * 2 > len(sample):
            return GATEWAY_REASON.format(detail=f"{len(avoided)} of the {len(sample)} cases sent to it call none "
                                                "of the wrong tools")
        return (f"the direct server calls the same wrong tools on {len(sample) - len(avoided)} of {len(sample)} "
                "cases: not the gateway")
