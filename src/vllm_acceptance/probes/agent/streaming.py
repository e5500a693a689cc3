"""Streamed twins in every pass (agent.stream_tool_calls; docs/checks.md).

Production agents stream, and many streams run at once: the kimi_k2 streaming parser returns empty `tool_calls`
under concurrent load while the same request non-streamed calls its tool (docs/sources.md#stream-under-load).
So the call cases of the case set are sent streamed beside their non-streamed send, the very same request body
(the same seed), alone (at agent.concurrency) and under the contracted concurrency (agent.under_load), where the
streamed and non-streamed requests go out mixed through one pool, as production traffic has them. A stream whose
non-streamed twin calls a tool must carry its calls whole (rules.py stream_twin_problems).

The layer: the parser's streaming path, unless the direct server (--direct-url), sent the same pass at the same
concurrency, streams every twin whole: then the gateway. Without a direct server the attribution is open (the
finding says so): the probe cannot tell the parser from a gateway it does not know about.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...core.findings import Finding, Status
from ...runtime.client import Exchange, OpenAIClient
from ...scenarios.cases import CALL_CLASSES, Case
from .base import AgentProbeBase
from .common import GATEWAY_REASON, _finding
from .rules import CaseJudgement, call_signature, judge_case, stream_twin_problems

CHECK = "agent.stream_tool_calls"
# (case, the non-streamed twin's answer, the streamed answer)
Pair = tuple[Case, Exchange, Exchange]


class StreamTwins(AgentProbeBase):
    """The streamed twins of the call cases: sent in every pass, judged against their non-streamed twins."""

    # Filled by under_load (comparison.py) through send_mixed: that pass's pairs and how it was sent.
    twins_under_load: list[Pair] | None = None
    under_load_sent: tuple[list[Case], list[dict[str, Any]]] | None = None  # the pass's cases and bodies

    def stream_sample(self, cases: list[Case]) -> list[Case]:
        """The call cases given a streamed twin: every one, or the first `agent.stream_cases` (the same in
        every pass)."""
        calls = [c for c in cases if c.cls in CALL_CLASSES]
        limit = self.cfg.stream_cases
        return calls if limit is None else calls[:limit]

    def send_mixed(self, client: OpenAIClient, cases: list[Case], concurrency: int,
                   bodies: list[dict[str, Any]] | None = None) -> tuple[list[tuple[CaseJudgement, Exchange]],
                                                                        list[Pair]]:
        """Each case non-streamed and, for the sample, streamed too (the same body, right after it), all through
        one pool of `concurrency`: the traffic mixed. Bodies are built in the cases' order before the first is
        sent (agent.seed gives each case its own seed), unless given (a pass re-sent as it was)."""
        if bodies is None:
            bodies = [self._case_body(case) for case in cases]
        twins = {c.id for c in self.stream_sample(cases)}
        jobs = [(case, body, streamed) for case, body in zip(cases, bodies, strict=True)
                for streamed in ((False, True) if case.id in twins else (False,))]
        with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
            got = list(pool.map(lambda job: client.chat_stream(job[1]) if job[2] else client.chat(job[1]), jobs))
        plain: dict[str, Exchange] = {}
        streamed: dict[str, Exchange] = {}
        for (case, _, is_stream), ex in zip(jobs, got, strict=True):
            (streamed if is_stream else plain)[case.id] = ex
        judged = [(judge_case(c.id, c.cls, c.expect, c.schema, plain[c.id].status,
                              plain[c.id].body if plain[c.id].ok else None, self.tools_of(c), plain[c.id].error),
                   plain[c.id]) for c in cases]
        return judged, [(c, plain[c.id], streamed[c.id]) for c in cases if c.id in streamed]

    def send_under_load(self, cases: list[Case], n: int) -> list[tuple[CaseJudgement, Exchange]]:
        """The under-load pass (agent.under_load): the cases and the sample's streamed twins mixed at `n` in flight;
        the twins are kept for agent.stream_tool_calls, the non-streamed answers returned for agent.under_load."""
        loaded, self.twins_under_load = self.send_mixed(self.client, cases, n)
        self.under_load_sent = (cases, [ex.request for _, ex in loaded])
        return loaded

    def _alone_pairs(self) -> tuple[list[Pair], list[dict[str, Any]]]:
        """The sample's streamed twins sent alone (agent.concurrency), each the body its non-streamed twin
        was sent with in the rate run; the non-streamed answer is the rate run's."""
        rows = {r["case"]: r for r in self.case_rows}
        sample = [c for c in self.stream_sample(self.cases) if c.id in rows]
        bodies = [rows[c.id]["request"] for c in sample]
        with ThreadPoolExecutor(max_workers=max(1, self.cfg.concurrency)) as pool:
            got = list(pool.map(self.client.chat_stream, bodies))
        pairs = []
        for case, body, ex in zip(sample, bodies, got, strict=True):
            row = rows[case.id]
            plain = Exchange(request=body, status=row["status"], body=row["response"], error=row["error"])
            pairs.append((case, plain, ex))
        return pairs, bodies

    @staticmethod
    def judge_pairs(pairs: list[Pair]) -> dict[str, Any]:
        """Per pair: comparable when the non-streamed twin answered with a tool call; broken when its stream
        does not carry those calls whole (or the stream failed); hung streams apart (never a pass)."""
        out: dict[str, Any] = {"pairs": len(pairs), "compared": 0, "not_calling": 0, "broken": [], "hung": [],
                               "differing": 0, "rows": []}
        for case, plain, streamed in pairs:
            want = call_signature(plain.body) if plain.ok else []
            row = {"case": case.id, "class": case.cls, "plain_status": plain.status, "plain_calls": want,
                   "stream_status": streamed.status, "stream_calls": call_signature(streamed.body),
                   "stream_finish_reason": (streamed.body or {}).get("choices", [{}])[0].get("finish_reason"),
                   "stream_chunks": len(streamed.chunks), "problems": []}
            out["rows"].append(row)
            if streamed.timed_out:
                out["hung"].append((case, streamed))
                continue
            if not want:
                out["not_calling"] += 1
                continue
            out["compared"] += 1
            problems = stream_twin_problems(plain.body, streamed.body) if streamed.ok else [
                f"the stream failed: HTTP {streamed.status}: {streamed.error}"]
            row["problems"] = problems
            if problems:
                out["broken"].append((case, streamed, problems))
            elif row["stream_calls"] != want:
                out["differing"] += 1
        return out

    def _direct_clean(self, name: str, cases: list[Case], bodies: list[dict[str, Any]],
                      concurrency: int) -> tuple[bool, str, list[str]]:
        """The same pass (the same bodies, mixed, at the same concurrency) sent to the direct server: clean when
        at least one twin compares and none is broken. Only the broken cases at their own concurrency would not
        load it as the pass did."""
        assert self.direct is not None
        _, pairs = self.send_mixed(self.direct, cases, concurrency, bodies)
        judged = self.judge_pairs(pairs)
        ev = self.store.write_json(f"stream-twins-direct-{name}.json", {"concurrency": concurrency,
                                                                         "rows": judged["rows"]})
        clean = judged["compared"] > 0 and not judged["broken"]
        detail = (f"{name}: {judged['compared']} streamed twins at {concurrency} in flight, "
                  f"{len(judged['broken'])} broken")
        return clean, detail, [ev]

    def stream_twins(self) -> Finding:
        """agent.stream_tool_calls: the sample's twins alone, and (with agent.under_load) those the under-load
        pass sent mixed; a stream whose twin calls a tool carries the calls whole."""
        alone, alone_bodies = self._alone_pairs()
        passes = {"alone": (alone, self.cfg.concurrency)}
        if self.twins_under_load is not None:
            passes["under_load"] = (self.twins_under_load, self.cfg.under_load)
        judged = {name: self.judge_pairs(pairs) for name, (pairs, _) in passes.items()}
        rows = {name: {"concurrency": n, "rows": judged[name]["rows"]} for name, (_, n) in passes.items()}
        ev = [self.store.write_json("stream-twins.json", rows)]
        for name, j in judged.items():
            for case, ex in j["hung"]:
                ev.append(self.keep(f"stream-twin-{name}-{case.id}", ex, {"timed_out": True}))
            for case, ex, problems in j["broken"][:10]:
                ev.append(self.keep(f"stream-twin-{name}-{case.id}", ex, {"problems": problems}))
        observed: dict[str, Any] = {
            name: {"concurrency": n, "pairs": judged[name]["pairs"], "compared": judged[name]["compared"],
                   "not_calling": judged[name]["not_calling"], "broken": len(judged[name]["broken"]),
                   "hung": len(judged[name]["hung"]), "arguments_differ": judged[name]["differing"]}
            for name, (_, n) in passes.items()}
        observed["sample"] = "every call case" if self.cfg.stream_cases is None else \
            f"the first {self.cfg.stream_cases} call cases (agent.stream_cases)"
        self.rates["stream_twins"] = observed
        under = (f"; with {self.cfg.under_load} in flight, streamed and non-streamed mixed"
                 if "under_load" in passes else "")
        expected = ("every stream whose non-streamed twin (the same request) calls a tool carries those calls whole, "
                    f"alone (agent.concurrency {self.cfg.concurrency}){under}")
        rule = ("a streamed tool call is judged against its non-streamed twin, in every pass: empty or partial "
                "tool_calls (a call lost, no name, arguments cut) fail; argument values are not compared")
        broken = [(name, case, problems) for name, j in judged.items() for case, _, problems in j["broken"]]
        if broken:
            return self._broken(broken, judged, passes, alone_bodies, ev, observed, expected, rule)
        compared = sum(j["compared"] for j in judged.values())
        if not compared:
            # As agent.executor_safety: call cases answered without a call already fail agent.tool_call (agents stay
            # blocked); a stream has no twin call to be judged against. Never a pass.
            return _finding(CHECK, Status.NOT_APPLICABLE, None, ev, observed=observed, expected=expected, rule=rule,
                            reason="no streamed twin to compare: none of their non-streamed twins called a tool "
                                   "(see agent.tool_call)",
                            action="fix tool calling first (agent.tool_call)")
        not_measured = "" if "under_load" in passes else (
            "; under load not measured (agent.under_load 0: see agent.under_load)")
        return _finding(CHECK, Status.PASS, None, ev, observed=observed, expected=expected, rule=rule,
                        reason="; ".join(f"{name}: {j['compared']} streamed twins carried their calls whole"
                                         for name, j in judged.items()) + not_measured)

    def _broken(self, broken: list[tuple[str, Case, list[str]]], judged: dict[str, Any],
                passes: dict[str, tuple[list[Pair], int]], alone_bodies: list[dict[str, Any]], ev: list[str],
                observed: dict[str, Any], expected: str, rule: str) -> Finding:
        """Fail, on the parser unless the direct server streams the same pass whole (the gateway's then); with no
        direct server the attribution is open and the finding says so."""
        names = "; ".join(f"{name} {case.id}: {problems[0]}" for name, case, problems in broken[:5])
        counts = ", ".join(f"{len(j['broken'])} of {j['compared']} {name}" for name, j in judged.items()
                           if j["broken"])
        reason = f"{counts} streamed twins lost their tool calls: {names}"
        layer = "parser"
        if self.direct is None:
            observed["attribution"] = "open"
            reason += ("; attribution open: the parser's streaming path, or a gateway between the client and the "
                       "server (no --direct-url to send the same pass to)")
        else:
            verdicts = []
            for name in dict.fromkeys(n for n, _, _ in broken):
                if name == "alone":
                    sample = [c for c, _, _ in passes["alone"][0]]
                    clean, detail, ref = self._direct_clean(name, sample, alone_bodies, passes[name][1])
                else:
                    cases, bodies = self.under_load_sent or ([], [])
                    clean, detail, ref = self._direct_clean(name, cases, bodies, passes[name][1])
                ev += ref
                verdicts.append((name, clean, detail))
            gateway = all(clean for _, clean, _ in verdicts)
            layer = "gateway" if gateway else "parser"
            details = "; ".join(d for _, _, d in verdicts)
            observed["attribution"] = layer
            reason += "; " + (GATEWAY_REASON.format(detail=details) if gateway else
                              f"the direct server shows the same defect ({details}): the parser's streaming path")
        return _finding(CHECK, Status.FAIL, layer, ev, observed=observed, expected=expected, rule=rule,
                        reason=reason,
                        action="streamed tool calls lost: check the tool parser's streaming path under concurrent "
                               "requests (and any gateway's stream handling); a client streaming tool calls sees a "
                               "turn without its call")

