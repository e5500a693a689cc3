"""The day-N re-check's run (docs/recheck.md): refuse a baseline that is not signed, collect today's evidence
with recheck.yml (the acceptance's own plays, attach only, the probes with the light settings of plan.py), then
judge it against the signed baseline (judge.py) and write the re-check's report beside it (report.py).

    vllm-acceptance recheck --baseline RUN|latest-signed -i INVENTORY      # the CLI (cli.py cmd_recheck)
    ansible-playbook -i INVENTORY recheck.yml -e acceptance_baseline=RUN   # the same collection, without a verdict

Today's evidence is a run directory of its own, reports/<inventory>/rechecks/<run-id>/, written by the same stages
as an acceptance run (report.json in the acceptance report's shape), so the judgement compares like with like.
recheck.yml calls `python -m vllm_acceptance.recheck.run prepare` first: the same refusals, the same settings.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.profile import ConfigError
from ..core.rundir import RunDir, check_run_files, new_run_id
from ..report.reopen import ACCEPTING_DECISIONS, last_signed_acceptance, read_signoff, sha256_file
from .outcome import RECHECK_EXIT_CODES
from .plan import light_overrides

LATEST_SIGNED = "latest-signed"
RECHECKS = "rechecks"                 # reports/<inventory>/rechecks/<run-id>/: today's evidence of each re-check
RECHECK_PLAYBOOK = "recheck.yml"
RECHECK_FILE = "recheck.json"         # beside today's report.json (report.py write_recheck)
EXIT_RUN_FAILED = 1                   # the playbook ended before today's report.json (as `run`)
EXIT_REFUSED = 2                      # the baseline or the inputs refused (RECHECK_EXIT_CODES' comment)


class BaselineRefused(ConfigError):
    """The baseline cannot be re-checked as given; the message names what to give instead."""


def inventory_name(inventory: str | Path, extra_vars: Mapping[str, Any] | None = None) -> str:
    """The inventory's name in reports/<inventory>/, as playbooks/validate.yml takes it: acceptance_inventory_name,
    else the inventory directory's name (a file's parent directory)."""
    given = (extra_vars or {}).get("acceptance_inventory_name")
    if given:
        return str(given)
    path = Path(inventory).resolve()
    return path.name if path.is_dir() else path.parent.name


def resolve_baseline(baseline: str | Path, reports_dir: Path, inventory: str) -> Path:
    """A run directory, or `latest-signed`: the newest run of the inventory whose sign-off allows traffic."""
    if str(baseline) == LATEST_SIGNED:
        found = last_signed_acceptance(Path(reports_dir) / inventory)
        if found is None:
            raise BaselineRefused(
                f"--baseline latest-signed: no signed run of inventory {inventory!r} under "
                f"{Path(reports_dir) / inventory} (a decision in {', '.join(ACCEPTING_DECISIONS)}): "
                "run the acceptance, sign it (`vllm-acceptance sign RUN --reviewer NAME --decision release`), "
                "then re-check it")
        return found[0].resolve()
    path = Path(baseline)
    if not path.is_dir():
        raise BaselineRefused(f"--baseline {baseline}: no such run directory (give reports/<inventory>/<run-id> of a "
                              f"signed run, or {LATEST_SIGNED})")
    return path.resolve()


def check_baseline(baseline_dir: Path, inventory: str) -> dict[str, Any]:
    """The baseline's sign-off record, or BaselineRefused: a run never signed, signed with a decision that lets no
    traffic through, whose report.json or bound files changed since (core/rundir.py), or a run of another
    inventory."""
    run = RunDir(baseline_dir)
    record = read_signoff(baseline_dir)
    if record is None:
        raise BaselineRefused(
            f"baseline {baseline_dir}: not signed (no signoff.json): a re-check compares today with what a reviewer "
            f"signed; sign it first (`vllm-acceptance sign {baseline_dir} --reviewer NAME --decision DECISION`) or "
            f"give --baseline {LATEST_SIGNED}")
    decision = record.get("decision")
    if decision not in ACCEPTING_DECISIONS:
        raise BaselineRefused(
            f"baseline {baseline_dir}: signed {decision!r}, a decision that lets no traffic through: only a run "
            f"signed {' or '.join(ACCEPTING_DECISIONS)} is re-checked; give --baseline {LATEST_SIGNED}")
    if not run.report_json.is_file() or record.get("report_sha256") != sha256_file(run.report_json):
        raise BaselineRefused(
            f"baseline {baseline_dir}: report.json is not the one signed (signoff.json report_sha256 "
            f"{str(record.get('report_sha256'))[:16]}...): re-check a run whose signed report is intact")
    try:
        check_run_files(baseline_dir, "recheck")
    except ConfigError as exc:
        raise BaselineRefused(str(exc)) from exc
    ran = run.meta().get("inventory")
    if ran != inventory:
        raise BaselineRefused(
            f"baseline {baseline_dir} is a run of inventory {ran!r}, this re-check is of inventory {inventory!r}: "
            f"give -i the inventory the baseline was accepted on, or --baseline a signed run of {inventory!r} "
            f"(reports/{inventory}/<run-id>, or {LATEST_SIGNED})")
    if not run.profile_path.is_file():
        raise BaselineRefused(f"baseline {baseline_dir}: no evidence/profile.yml (the profile it was judged on)")
    return record


def baseline_base_url(baseline_dir: Path) -> str | None:
    """Where the signed run reached its server (stages/serve.json base_url): the deployment that serves."""
    serve = RunDir(baseline_dir).stage("serve") or {}
    url = serve.get("base_url")
    return str(url) if url else None


def prepare(baseline: str | Path, reports_dir: Path, inventory: str, *, base_url: str | None = None,
            run_id: str | None = None) -> dict[str, Any]:
    """What recheck.yml runs with: the signed baseline, its frozen profile (today is judged on the same one), the
    run id under rechecks/, the deployment's URL (the inventory's vllm_base_url, else the baseline's), the probes
    and their light overrides (plan.py)."""
    from ..core.profile import load_profile

    if not str(baseline).strip():
        raise BaselineRefused(f"no baseline: give the signed run to re-check, -e acceptance_baseline=RUN (a run "
                              f"directory) or -e acceptance_baseline={LATEST_SIGNED}")
    baseline_dir = resolve_baseline(baseline, reports_dir, inventory)
    record = check_baseline(baseline_dir, inventory)
    if run_id and not str(run_id).startswith(f"{RECHECKS}/"):
        raise BaselineRefused(f"acceptance_run_id {run_id!r}: a re-check's run id is {RECHECKS}/<id> (its evidence "
                              f"goes to reports/{inventory}/{RECHECKS}/<id>/); leave it out")
    url = base_url or baseline_base_url(baseline_dir)
    if not url:
        raise BaselineRefused(f"baseline {baseline_dir}: no base URL recorded (stages/serve.json): give the "
                              "deployment's URL as vllm_base_url (-e vllm_base_url=http://HOST:PORT/v1)")
    profile_path = RunDir(baseline_dir).profile_path
    profile = load_profile(profile_path)
    probes = list(profile.model.recheck.probes)
    overrides = light_overrides(profile)
    return {"baseline_dir": str(baseline_dir), "profile_path": str(profile_path),
            "run_id": run_id or f"{RECHECKS}/{new_run_id()}", "base_url": url, "probes": probes,
            "overrides": {k: overrides[k] for k in probes},
            "signed": {k: record.get(k) for k in ("decision", "reviewer", "signed_at", "run_id")}}


@dataclass
class RecheckRun:
    """What one `vllm-acceptance recheck` gave: the outcome (None when the run failed before it), where."""

    baseline_dir: Path
    today_dir: Path | None
    exit_code: int
    outcome: Any = None            # outcome.RecheckOutcome
    reason: str | None = None
    written: list[Path] | None = None


def run_recheck(inventory: str | Path, baseline: str | Path, *, extra_vars: Mapping[str, Any] | None = None,
                project_dir: str | Path | None = None, reports_dir: str | Path | None = None,
                env: Mapping[str, str] | None = None,
                on_line: Callable[[str], None] | None = print) -> RecheckRun:
    """Refuse a baseline that is not signed (BaselineRefused, exit 2), collect today's evidence with recheck.yml
    (api.accept, its progress lines as they print), judge it and write the re-check's report."""
    from ..api import accept, default_project_dir

    extra = dict(extra_vars or {})
    project = Path(project_dir).resolve() if project_dir else default_project_dir(inventory)
    reports = Path(reports_dir).resolve() if reports_dir else project / "reports"
    name = inventory_name(inventory, extra)
    prepared = prepare(baseline, reports, name, base_url=extra.get("vllm_base_url"),
                       run_id=extra.get("acceptance_run_id"))
    baseline_dir = Path(prepared["baseline_dir"])
    # Extra variables outrank the inventory and the playbook's facts: the run id must be the re-check's (api.accept
    # would otherwise give a plain one, a sibling of the signed runs), and the server is attached, never launched.
    extra.update({"acceptance_baseline": str(baseline_dir), "acceptance_run_id": prepared["run_id"],
                  "vllm_serve_mode": "attach", "vllm_base_url": prepared["base_url"]})
    result = accept(inventory, extra_vars=extra, playbook=str(project / RECHECK_PLAYBOOK), project_dir=project,
                    reports_dir=reports, env=env, on_line=on_line)
    today = result.run_dir
    if today is None or not RunDir(today).report_json.is_file():
        return RecheckRun(baseline_dir, today, EXIT_RUN_FAILED,
                          reason=result.reason or "the re-check ended before today's report.json was written")
    # recheck.yml's last play judged today against the baseline and wrote the re-check's report (one judgement,
    # one lineage entry per re-check, whichever entry point ran it).
    verdict = recorded_verdict(today)
    if verdict is None:
        return RecheckRun(baseline_dir, today, EXIT_RUN_FAILED,
                          reason=result.reason or f"no {RECHECK_FILE} in {today}: the judgement did not complete")
    return RecheckRun(baseline_dir, today, RECHECK_EXIT_CODES[verdict], outcome=recorded(today),
                      written=[RunDir(today).report_file(RECHECK_FILE)])


def recorded(today_dir: Path) -> dict[str, Any] | None:
    """recheck.json as the judgement wrote it (report.py), or None."""
    try:
        data = json.loads(RunDir(today_dir).report_file(RECHECK_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_verdict(today_dir: Path) -> str | None:
    """The verdict recheck.json records; None when there is none or it is not a re-check verdict."""
    verdict = (recorded(today_dir) or {}).get("verdict")
    return verdict if verdict in RECHECK_EXIT_CODES else None


def judge_and_report(baseline_dir: Path, today_dir: Path) -> RecheckRun:
    """Today's run against the signed baseline (judge.py), its report and the lineage beside the signed run
    (report.py)."""
    from .judge import judge
    from .report import write_recheck

    outcome = judge(baseline_dir, today_dir)
    # The server's own log over today's window: its tool-call parse failures (parsers/tool_parse_log.py).
    outcome.details.setdefault("server_log_window", server_log_window(today_dir))
    written = write_recheck(baseline_dir, today_dir, outcome)
    return RecheckRun(baseline_dir, today_dir, outcome.exit_code, outcome=outcome, written=list(written))


def server_log_window(today_dir: Path, until: float | None = None) -> dict[str, Any]:
    """Tool-call parse failures the server logged from the attach (stages/serve.json judged_at) to now: read from
    the server's whole log taken after the probes (evidence/serve/after-probes/, a container's or the operator's log
    command), else the operator's log file (vllm_serve_startup_log) where the controller reads it. vLLM stamps its
    lines in the server's local time without a year (vllm/logger.py): the window is compared in this machine's
    local time, which is the server's on the lab and on a head in the same zone. No log: said, never zero."""
    import datetime as dt
    import time

    from ..parsers.tool_parse_log import tool_parse_failures

    run = RunDir(today_dir)
    sources = sorted(run.evidence_path("serve", "after-probes").glob("*.log"))
    named = run.inventory_vars().get("vllm_serve_startup_log")
    if not sources and named and Path(str(named)).is_file():
        sources = [Path(str(named))]
    serve = run.stage("serve") or {}
    start = serve.get("judged_at")
    if not sources or not isinstance(start, (int, float)):
        return {"source": None, "failures": None,
                "reason": "no server log over the window (give vllm_serve_attach_log_command or "
                          "vllm_serve_startup_log, or a container the run reads) or no attach time recorded"}

    def stamp(epoch: float) -> str:
        return dt.datetime.fromtimestamp(epoch).strftime("%m-%d %H:%M:%S")

    since, end = stamp(float(start)), stamp(until if until is not None else time.time())
    window = tool_parse_failures("\n".join(p.read_text(errors="replace") for p in sources), since, end)
    return {"source": [str(p) for p in sources], "since": since, "until": end, **window.as_dict()}


def judge_command(baseline_dir: Path, today_dir: Path | None) -> int:
    """recheck.yml's last step: one line per reason, the verdict line `RECHECK: <verdict>`, the report's path."""
    if today_dir is None or not RunDir(today_dir).report_json.is_file():
        print(f"recheck: no today's report.json in {today_dir}: the re-check's run did not reach its report",
              file=sys.stderr)
        return EXIT_RUN_FAILED
    try:
        done = judge_and_report(baseline_dir, today_dir)
    except ConfigError as exc:
        print(f"recheck refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    for line in summary_lines(done):
        print(line)
    return done.exit_code


def summary_lines(done: RecheckRun) -> list[str]:
    """What the re-check prints last: its verdict, why, what drifted, where its report is."""
    outcome = done.outcome
    data = outcome.as_dict() if hasattr(outcome, "as_dict") else dict(outcome or {})
    lines = [f"RECHECK: {data.get('verdict')}"
             + (f" (signed {data.get('signed_decision')}: "
                f"{'still holds' if data.get('signed_decision_holds') else 'no longer holds'})"
                if data.get("signed_decision") else "")]
    lines += [f"- {r}" for r in data.get("reasons") or []]
    for drift in data.get("drifts") or []:
        lines.append(f"  {drift.get('consequence')}: {drift.get('check')} {drift.get('what')}: "
                     f"{drift.get('baseline')} -> {drift.get('today')} ({drift.get('reason')})")
    lines += [f"  missing: {m}" for m in data.get("missing") or []]
    if done.today_dir is not None:
        lines.append(f"recheck report: {RunDir(done.today_dir).report_file('recheck.html')}")
    return lines


def print_recheck_plan(args: argparse.Namespace) -> int:
    """`vllm-acceptance plan -i INVENTORY --recheck [--baseline RUN] [--profile P]`: the re-check's duration and its
    load on the deployment, from the probes' own plans with the light settings (plan.py); the profile is the one
    the re-check runs with, the signed baseline's (or --profile)."""
    from ..api import default_project_dir
    from ..core.profile import load_profile
    from ..core.rundir import resolve_profile_path
    from .plan import recheck_plan, render_text

    project = Path(args.project_dir).resolve() if args.project_dir else default_project_dir(args.inventory)
    if args.profile:
        profile = load_profile(resolve_profile_path(str(args.profile), project))
        source = f"profile {profile.name}"
    else:
        name = inventory_name(args.inventory)
        baseline_dir = resolve_baseline(args.baseline, project / "reports", name)
        check_baseline(baseline_dir, name)
        profile = load_profile(RunDir(baseline_dir).profile_path)
        source = f"baseline {baseline_dir}"
    plan = recheck_plan(profile)
    if args.json:
        print(json.dumps({**plan.to_dict(), "source": source}, indent=1, default=str))
    else:
        print(f"{source}\n{render_text(plan)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """recheck.yml's two steps. `prepare`: the JSON it runs with, or the refusal on stderr and exit 2. `judge`:
    today against the baseline, the re-check's report written; exit code per verdict (RECHECK_EXIT_CODES)."""
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.recheck.run")
    parser.add_argument("what", choices=("prepare", "judge"))
    parser.add_argument("--baseline", required=True, help=f"a signed run directory, or {LATEST_SIGNED}")
    parser.add_argument("--reports-dir", type=Path)
    parser.add_argument("--inventory", help="the inventory's name in reports/<inventory>/")
    parser.add_argument("--base-url", default="", help="the deployment's URL (default: the baseline's)")
    parser.add_argument("--run-id", default="", help="rechecks/<id> (default: a new one)")
    parser.add_argument("--today", type=Path, help="judge: today's run directory")
    args = parser.parse_args(argv)
    if args.what == "judge":
        return judge_command(Path(args.baseline), args.today)
    if args.reports_dir is None or not args.inventory:
        parser.error("prepare: --reports-dir and --inventory are required")
    try:
        prepared = prepare(args.baseline, args.reports_dir, args.inventory, base_url=args.base_url or None,
                           run_id=args.run_id or None)
    except ConfigError as exc:
        print(f"recheck refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(json.dumps(prepared))
    return 0


if __name__ == "__main__":
    sys.exit(main())
