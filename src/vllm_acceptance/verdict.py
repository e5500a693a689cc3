"""The decision table: findings -> one verdict per inventory.

Precedence (docs/acceptance.md): rebuild_environment > expand_capacity > limited_observation > release.
`incomplete` states that no decision can be signed yet: a required finding is missing or
inconclusive, or a host was unreachable. A failed compatibility chain is the one thing that is
certain even then (more evidence cannot make a wrong driver right), so it still decides.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from .core.findings import Consequence, Finding, Status
from .core.probes import probe_families
from .rules.registry import warn_blocks

RELEASE_SCOPE = "compat.lineage.release_scope"
# The reasons that add to the first one: what else is certain or unverified beside the deciding cause.
ALSO_FAILED = "also failed: "
ALSO_UNVERIFIED = "also unverified: "

IMMEDIATE_ACTION = {
    "release": "Allow the planned traffic at the contracted profile; enable the generated monitoring.",
    "limited_observation": "Allow traffic only under the stated caps; name an owner and a re-check date; "
                           "the limits go into the serving config and the alerts.",
    "rebuild_environment": "Rebuild the environment (image, CUDA build, driver, vLLM version or launch "
                           "config), then redo the whole acceptance. Adding GPUs fixes nothing here.",
    "expand_capacity": "Change topology, context/concurrency limits, split prefill/decode, or add GPUs; "
                       "adjust limits first and expand only when the adjusted profile still fails.",
    "incomplete": "No decision can be signed: collect the missing evidence and re-run.",
}

REOPEN_TRIGGERS = [
    "a change of the official recipe (re-check profiles/*.yml)",
    "a new container image or digest",
    "a host driver change (version or branch)",
    "a topology change (node count, GPU model or count, interconnect, parallel layout)",
    "a change of the contracted context limit or concurrency",
]

ROLLBACK_TRIGGERS = [
    "repeated OOM on the accepted profile",
    "lost schema validation or invalid tool-call JSON",
    "queue time above the SLO for a sustained period",
    "a collapse of the prefix-cache hit ratio after a system-prompt change",
    "inter-node transfer (NCCL) errors",
]


@dataclass
class Decision:
    verdict: str
    reasons: list[str]
    gates: dict[str, dict[str, Any]]
    experimental: bool = False
    missing: list[str] = field(default_factory=list)


def _ids(findings: list[Finding]) -> list[str]:
    return sorted({f"{f.check}@{f.host}" if f.host else f.check for f in findings})


def decide(findings: list[Finding], *, experimental: bool = False,
           unreachable_hosts: list[str] | None = None,
           unreachable_errors: dict[str, str] | None = None) -> Decision:
    """Apply the decision table to all findings of one inventory's run. `unreachable_errors`: each unreachable
    host's connection error (evidence/preflight-unreachable.json), named in the reasons."""
    unreachable_hosts = unreachable_hosts or []
    failing = [f for f in findings if f.status == Status.FAIL]
    rebuild = [f for f in failing if f.consequence == Consequence.REBUILD]
    expand = [f for f in failing if f.consequence == Consequence.EXPAND]
    # The experimental release scope is judged below, on a run that would otherwise be a release.
    scope_failed = [f for f in failing if f.check == RELEASE_SCOPE]
    limit = [f for f in failing if f.consequence == Consequence.LIMIT and f.check != RELEASE_SCOPE]
    agent_blocked = [f for f in failing if f.consequence == Consequence.BLOCK_AGENT]
    # A warn keeps the run from release unless its catalog entry says it does not (rules/registry.py, warn_blocks).
    warned = [f for f in findings if f.status == Status.WARN and warn_blocks(f.check)]
    advisory = [f for f in findings if f.status == Status.WARN and not warn_blocks(f.check)]
    unknown = [f for f in findings if f.status in (Status.MISSING, Status.INCONCLUSIVE)]
    # A launch that failed with a classified cause is decided by that cause (docs/acceptance.md, "When vLLM does not
    # start"): the stages it kept from running are not reached, not unknown. Node evidence still counts.
    launch_failed = [f for f in failing if f.check.endswith(".launch_triage")]
    not_reached = [f for f in unknown if launch_failed and not_reached_after_launch(f)]
    # An OOM under load decides capacity (SPEC "Capacity under load"): the load stages it cut short are
    # not reached, not unknown. A crash without a capacity signature stays unknown and is named.
    oom = [f for f in failing if f.check == "capacity.crash"]
    not_reached += [f for f in unknown if oom and f not in not_reached and f.check.startswith("capacity.")
                    and f.status == Status.MISSING and "the server died" in (f.reason or "")]
    unknown = [f for f in unknown if f not in not_reached]
    crashed = [f for f in unknown if f.check == "capacity.crash"]

    reasons: list[str] = []
    if rebuild:
        verdict = "rebuild_environment"
        reasons.append("compatibility or configuration out of profile: " + ", ".join(_ids(rebuild)))
        if unknown or unreachable_hosts:
            reasons.append(ALSO_UNVERIFIED + ", ".join(_ids(unknown) + unreachable_hosts))
    elif unknown or unreachable_hosts:
        verdict = "incomplete"
        if unreachable_hosts:
            reasons.append("unreachable hosts: " + ", ".join(sorted(unreachable_hosts)))
            reasons += unreachable_reasons(unreachable_hosts, unreachable_errors or {})
        if unknown:
            reasons.append("missing or inconclusive evidence: " + ", ".join(_ids(unknown)))
        reasons += [f"{f.check}: {one_line(f.reason)}" for f in crashed if f.reason]
        # What already failed is certain whatever the missing evidence shows (a soak's memory rise, a failed agent
        # check): named as rebuild_environment names what is also unverified (issue 43 item 6).
        if failing:
            reasons.append(ALSO_FAILED + ", ".join(_ids(failing)))
    elif expand:
        verdict = "expand_capacity"
        reasons.append("capacity limits at nominal load: " + ", ".join(_ids(expand)))
        reasons += [f"{f.check}: {one_line(f.reason)}" for f in oom if f.reason]
    elif limit or warned or agent_blocked:
        verdict = "limited_observation"
        if limit:
            reasons.append("stable only under limits: " + ", ".join(_ids(limit)))
        if warned:
            reasons.append("non-critical defects with a controlled mitigation: " + ", ".join(_ids(warned)))
        if agent_blocked:
            reasons.append("agent traffic blocked: " + ", ".join(_ids(agent_blocked)))
    elif not findings:
        verdict = "incomplete"
        reasons.append("no findings at all: no stage produced evidence")
    else:
        verdict = "release"
        reasons.append("every required check passed with evidence")

    if advisory:
        reasons.append("warnings that do not block release: "
                       + "; ".join(f"{f.check}: {one_line(f.reason)}" if f.reason else f.check for f in advisory))
    if not_reached:
        reasons.append(("not reached because vLLM did not start: " if launch_failed else
                        "not reached because the server died under load: ") + ", ".join(_ids(not_reached)))

    if (experimental or scope_failed) and verdict == "release":
        scope = [f for f in findings if f.check == RELEASE_SCOPE and f.status == Status.PASS]
        if scope and not scope_failed:
            reasons.append("EXPERIMENTAL release: " + scope[0].reason)
        else:
            verdict = "limited_observation"
            reasons.append("experimental (self-built) image: never a release of the official profile; "
                           "release only on its own experimental profile, with owner and exit date, complete "
                           "lineage and a reproducible build (compat.lineage.release_scope)"
                           + (": " + "; ".join(f.reason for f in scope_failed) if scope_failed else ""))

    return Decision(verdict=verdict, reasons=reasons,
                    gates=traffic_gates(verdict, findings),
                    experimental=experimental,
                    missing=_ids(unknown) + sorted(unreachable_hosts))


def unreachable_reasons(hosts: list[str], errors: dict[str, str]) -> list[str]:
    """One line per unreachable node: its connection error and what was not collected from it."""
    return [f"{host} unreachable ({one_line(errors.get(host)) or 'no connection error recorded'}): none of its "
            "preflight checks ran, and nothing was launched or sampled on it" for host in sorted(hosts)]


def one_line(text: str | None) -> str:
    """A message as one line of a reason: ssh's connection errors carry the CR LF of its terminal output
    (`Warning: Permanently added ...\r\nuser@host: Permission denied`), which a list of reasons would otherwise
    print as a literal `\r\n` (issue 43 item 6). The evidence keeps the error as it was."""
    return " ".join(part.strip() for part in str(text or "").splitlines() if part.strip())


def not_reached_after_launch(finding: Finding) -> bool:
    """Stages that need a running server (probes, actual config, startup log of a later rank)."""
    return finding.check.startswith(tuple(f"{family}." for family in probe_families())) or finding.check.startswith(
        ("compat.actual_config", "compat.serve"))


def traffic_gates(verdict: str, findings: list[Finding]) -> dict[str, dict[str, Any]]:
    """Plain-text and agent traffic are gated separately ("agents blocked, plain text fine")."""
    text_open = verdict in ("release", "limited_observation")
    agent_findings = [f for f in findings if f.check.startswith("agent.")]
    agent_bad = [f for f in agent_findings if f.status in (Status.FAIL, Status.MISSING, Status.INCONCLUSIVE)]
    agent_warn = [f for f in agent_findings if f.status == Status.WARN]
    if not text_open:
        agent = {"open": False, "reason": f"verdict {verdict}"}
    elif not agent_findings:
        agent = {"open": False, "reason": "no agent-interface evidence"}
    elif agent_bad:
        agent = {"open": False, "reason": "agent checks failed: " + ", ".join(_ids(agent_bad))}
    elif agent_warn:
        agent = {"open": True, "limited": True,
                 "reason": "open with the validated retry policy: " + ", ".join(_ids(agent_warn))}
    else:
        agent = {"open": True, "reason": "every agent check passed"}
    text = {"open": text_open, "reason": f"verdict {verdict}"}
    return {"text": text, "agent": agent}


def annotate(findings: list[Finding], owner: str | None, period_days: int,
             today: dt.date | None = None) -> None:
    """Every finding carries an owner and a re-check date (docs/acceptance.md, "The four verdicts")."""
    today = today or dt.datetime.now(dt.UTC).date()
    recheck = (today + dt.timedelta(days=period_days)).isoformat()
    for finding in findings:
        finding.owner = finding.owner or owner
        finding.recheck_date = finding.recheck_date or recheck
