"""The agent probe as one run: every check family of the mixins, in order (AgentProbe.run)."""

from __future__ import annotations

from typing import Any

from ...core.findings import Finding, Status
from ...rules import registry
from ...scenarios import tool_schema_problems
from .common import REPEATED, _finding
from .comparison import Comparisons
from .conversation import ConversationChecks
from .interface import InterfaceChecks
from .rates import RateRun


class AgentProbe(RateRun, ConversationChecks, InterfaceChecks, Comparisons):
    """The whole agent probe: every check family in order, hung requests judged last."""

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
        findings.append(self.stream_twins())
        findings.append(self.reference_agreement())
        findings.append(self.reference_arguments())
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

