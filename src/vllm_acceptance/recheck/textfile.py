"""The scheduled re-check's metrics file, for node_exporter's textfile collector (docs/recheck-schedule.md).

After each scheduled run the wrapper that roles/recheck_timer installs calls

    python -m vllm_acceptance.recheck.textfile --exit-code N --inventory INV --baseline RUN --out FILE.prom
        [--period-s SECONDS] [--outcome OUTCOME.json]

The verdict comes from the re-check's exit code (recheck/outcome.py RECHECK_EXIT_CODES: one code per verdict);
an outcome file, when given, adds the drift counts and whether the signed decision holds, and is used only when
its verdict is the exit code's (a stale or foreign outcome file never changes what the run said). An exit code
that names no verdict (1 failed, 2 refused, a signal) writes every verdict series 0: the alert rules
(monitoring/recheck.py) read that as "no verdict", never as still accepted.

The file is written atomically (a temporary file in the same directory, then a rename), as the textfile collector
requires: it never reads half a file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..core.evidence import atomic_write
from ..monitoring.recheck import textfile_text
from .outcome import RECHECK_EXIT_CODES, Drift, RecheckOutcome

VERDICT_OF_EXIT_CODE = {code: verdict for verdict, code in RECHECK_EXIT_CODES.items()}


def verdict_of(exit_code: int) -> str | None:
    """The run's verdict: the exit code's (None when it names none)."""
    return VERDICT_OF_EXIT_CODE.get(exit_code)


def usable_outcome(outcome: RecheckOutcome | None, exit_code: int) -> RecheckOutcome | None:
    """The outcome, when it is this run's: its verdict is the one its exit code says."""
    if outcome is None or VERDICT_OF_EXIT_CODE.get(exit_code) != outcome.verdict:
        return None
    return outcome


def write_textfile(outcome: RecheckOutcome | None, exit_code: int, path: Path, *, inventory: str, baseline: str,
                   now: float, period_s: int | None = None) -> str:
    """Write the metrics file of one run at `path` (atomically); return its text."""
    used = usable_outcome(outcome, exit_code)
    drifts: dict[str, int] | None = None
    if used is not None:
        drifts = {"reopen": 0, "drifted": 0}
        for drift in used.drifts:
            drifts[drift.consequence] = drifts.get(drift.consequence, 0) + 1
    text = textfile_text(verdict=verdict_of(exit_code), exit_code=exit_code, inventory=inventory,
                         baseline=baseline, now=now, period_s=period_s, drifts=drifts,
                         signed_decision_holds=None if used is None else used.signed_decision_holds)
    if Path(path).suffix != ".prom":
        raise ValueError(f"{path}: node_exporter's textfile collector reads only *.prom files; name it NAME.prom")
    atomic_write(Path(path), text)
    return text


def read_outcome(path: Path) -> RecheckOutcome:
    """A RecheckOutcome from its JSON (RecheckOutcome.as_dict())."""
    data = json.loads(Path(path).read_text())
    drifts = [Drift(**d) for d in data.pop("drifts", [])]
    return RecheckOutcome(**data, drifts=drifts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.recheck.textfile",
                                     description="Write the scheduled re-check's metrics file for node_exporter.")
    parser.add_argument("--exit-code", type=int, required=True, help="the re-check's exit code")
    parser.add_argument("--inventory", required=True, help="the inventory's name (a label of every series)")
    parser.add_argument("--baseline", required=True, help="the signed baseline run (a label of every series)")
    parser.add_argument("--out", type=Path, required=True, help="the .prom file in node_exporter's textfile dir")
    parser.add_argument("--period-s", type=int, default=None, help="the schedule's period in seconds")
    parser.add_argument("--outcome", type=Path, default=None, help="the run's outcome JSON, when it wrote one")
    parser.add_argument("--now", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    outcome = None
    if args.outcome is not None:
        try:
            outcome = read_outcome(args.outcome)
        except (OSError, ValueError, TypeError) as exc:
            print(f"outcome {args.outcome} not read ({exc}): the verdict comes from the exit code alone",
                  file=sys.stderr)
    try:
        write_textfile(outcome, args.exit_code, args.out, inventory=args.inventory, baseline=args.baseline,
                       now=time.time() if args.now is None else args.now, period_s=args.period_s)
    except (OSError, ValueError) as exc:
        print(f"metrics file not written: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
