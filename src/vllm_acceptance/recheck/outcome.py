"""A day-N re-check's outcome: the one shape shared by the re-check's run (recheck/run.py collects today's
evidence), its judgement against the signed baseline (recheck/judge.py), its report (recheck/report.py) and
the metrics file that the scheduled re-check leaves for the alert rules (recheck/textfile.py).

Verdicts (docs/recheck.md):
- `still_accepted`: today's deployment is the signed one and behaves inside the baseline's bounds;
- `drifted`: something changed or a rate left its baseline interval; `signed_decision_holds` says whether the
  signed decision still covers it (a drift the reopen rules do not name);
- `reopen`: a reopen trigger fired (image, driver, topology, context, recipe, served identity): a full acceptance
  is required;
- `incomplete`: evidence missing or inconclusive (a probe that could not run, a node unreachable): never
  `still_accepted`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

RECHECK_VERDICTS = ("still_accepted", "drifted", "reopen", "incomplete")
# Exit codes of `vllm-acceptance recheck` (README "Exit codes"); 2 = inputs refused (an unsigned baseline too),
# 1 = failed before a verdict, as for `run`.
RECHECK_EXIT_CODES = {"still_accepted": 0, "drifted": 50, "reopen": 60, "incomplete": 40}


@dataclass
class Drift:
    """One difference between the signed baseline and today, with its consequence."""

    check: str                  # the drift finding's id (docs/checks.md), e.g. `drift.image`, `drift.agent_rate`
    what: str                   # what changed, said for people: "image digest", "--max-num-seqs", "tool-call rate"
    baseline: Any               # the baseline's value (or interval)
    today: Any                  # today's value
    consequence: str            # "reopen" | "drifted"
    reason: str                 # one line: why this consequence (the reopen rule or the bound it left)
    evidence: list[str] = field(default_factory=list)  # paths relative to the re-check's directory


@dataclass
class RecheckOutcome:
    verdict: str                # one of RECHECK_VERDICTS
    baseline_run: str           # the signed run's directory, relative to reports/<inventory>/
    recheck_id: str
    started: str
    finished: str
    signed_decision: str        # the baseline's signed decision (release | limited_observation)
    signed_decision_holds: bool
    drifts: list[Drift] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)       # why the verdict, in order
    missing: list[str] = field(default_factory=list)       # what could not be collected (makes it incomplete)
    details: dict[str, Any] = field(default_factory=dict)  # what was measured today (windows, sample sizes, load)

    @property
    def exit_code(self) -> int:
        return RECHECK_EXIT_CODES[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
