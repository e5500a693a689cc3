"""The scheduled re-check's metrics and the alerts on them (docs/recheck-schedule.md).

The scheduled re-check (roles/recheck_timer) leaves, after each run, a metrics file for node_exporter's textfile
collector (recheck/textfile.py writes it with `textfile_text` below). The alerts here read those series:

    VllmAcceptanceRecheckReopen      the last re-check said `reopen`: a full acceptance is required
    VllmAcceptanceRecheckDrifted     the last re-check said `drifted`
    VllmAcceptanceRecheckNoVerdict   the last re-check gave no verdict (`incomplete`, or it failed: exit 1 or 2)
    VllmAcceptanceRecheckNotRun      the last re-check is older than its schedule's period x STALE_MARGIN
    VllmAcceptanceRecheckAbsent      no re-check series at all (the timer was never installed, or node_exporter
                                     does not read its directory)

They live in their own rule file (RECHECK_RULES_FILE) beside the vLLM rules: their series come from node_exporter,
not from vLLM, so the vLLM rules' name forms (promql.py) do not apply to them. The promtool tests of these rules
(`recheck_promtool_tests`) take their input series from `textfile_text`, the writer the scheduled run uses.
"""

from __future__ import annotations

import re
from typing import Any

from .promql import _duration, _fmt

RECHECK_RULES_FILE = "vllm-acceptance-recheck.rules.yml"
RECHECK_TESTS_FILE = "recheck-promtool-tests.yml"
METRIC = "vllm_acceptance_recheck"
# The re-check's verdicts (recheck/outcome.py RECHECK_VERDICTS; tests/unit/test_recheck_textfile.py keeps them equal:
# monitoring sits below recheck/ and does not import it).
TEXTFILE_VERDICTS = ("still_accepted", "drifted", "reopen", "incomplete")
# A re-check is late when its last run is older than period x this margin (the run itself takes minutes, and a
# timer with RandomizedDelaySec or a busy host starts it late).
STALE_MARGIN = 1.5
# Without a period in the file (written by hand, an older writer): late after two days.
DEFAULT_MAX_AGE_S = 2 * 86400
ABSENT_FOR_S = 3600
# In the promtool tests node_exporter's own labels are added to the file's series, as a scrape does.
_SCRAPE_LABELS = {"job": "node", "instance": "recheck-host:9100"}
_RUNBOOK = "docs/recheck-schedule.md"


def _escape(value: str) -> str:
    """A label value in the text exposition format: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    """A sample value with its full precision (a Unix timestamp keeps its seconds)."""
    return f"{value:.15g}"


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def textfile_text(*, verdict: str | None, exit_code: int, inventory: str, baseline: str, now: float,
                  period_s: int | None = None, drifts: dict[str, int] | None = None,
                  signed_decision_holds: bool | None = None) -> str:
    """The metrics file of one re-check run (Prometheus text exposition format, as node_exporter reads it).

    verdict: the run's verdict, or None when it gave none (failed before a verdict, inputs refused): every
    verdict series is then 0, and the exit code says why. drifts: count of drift findings per consequence,
    when the run's outcome was read.
    """
    if verdict is not None and verdict not in TEXTFILE_VERDICTS:
        raise ValueError(f"verdict {verdict!r}: expected one of {', '.join(TEXTFILE_VERDICTS)} or None")
    base = {"inventory": inventory, "baseline": baseline}
    out: list[str] = []

    def family(name: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        out.append(f"# HELP {METRIC}_{name} {help_text}")
        out.append(f"# TYPE {METRIC}_{name} gauge")
        out.extend(f"{METRIC}_{name}{_labels({**base, **extra})} {_num(value)}" for extra, value in samples)

    family("last_run_timestamp_seconds", "Unix time the last scheduled re-check finished.", [({}, float(now))])
    family("verdict", "1 for the verdict of the last re-check, 0 for the others (all 0: no verdict).",
           [({"verdict": v}, 1.0 if v == verdict else 0.0) for v in TEXTFILE_VERDICTS])
    family("exit_code", "Exit code of the last re-check (0 still_accepted, 50 drifted, 60 reopen, 40 incomplete, "
           "2 refused, 1 failed).", [({}, float(exit_code))])
    if period_s:
        family("period_seconds", "The schedule's period: a re-check older than this x margin did not run.",
               [({}, float(period_s))])
    if drifts is not None:
        family("drifts", "Drift findings of the last re-check, by consequence.",
               [({"consequence": c}, float(n)) for c, n in sorted(drifts.items())])
    if signed_decision_holds is not None:
        family("signed_decision_holds", "1 when the signed decision still covers what the last re-check found.",
               [({}, 1.0 if signed_decision_holds else 0.0)])
    return "\n".join(out) + "\n"


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = re.compile(r"\\(.)")


def parse_textfile(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) of each sample of a text exposition file (escapes undone)."""
    samples = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError(f"not a sample line: {line!r}")
        labels = {k: _UNESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), v)
                  for k, v in _PAIR.findall(match.group(2) or "")}
        samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def _annotations(summary: str, description: str, runbook: str, owner: str) -> dict[str, str]:
    return {"summary": summary, "description": description, "runbook": runbook, "runbook_url": _RUNBOOK,
            "owner": owner}


def recheck_alerts(*, stale_margin: float = STALE_MARGIN, absent_for_s: int = ABSENT_FOR_S
                   ) -> list[dict[str, Any]]:
    """The alerts on the scheduled re-check's series: name, expr, for, severity, texts."""
    v = f"{METRIC}_verdict"
    ts, period = f"{METRIC}_last_run_timestamp_seconds", f"{METRIC}_period_seconds"
    age = f"(time() - {ts})"
    return [
        {"alert": "VllmAcceptanceRecheckReopen", "expr": f'{v}{{verdict="reopen"}} == 1', "for_s": 0,
         "severity": "critical",
         "summary": "Re-check of {{ $labels.baseline }} ({{ $labels.inventory }}): reopen, a full acceptance is "
                    "required",
         "description": "A reopen trigger fired (image, driver, topology, context, recipe or served identity "
                        "changed since the signed run): the signed acceptance no longer covers this deployment.",
         "runbook": "Read the re-check's report (the run directory under reports/<inventory>/ that the per-run "
                    "result names): each drift names what changed, the baseline's value and today's. If the "
                    "change was not intended, roll back to the signed image/driver/flags (the acceptance report's "
                    "rollback section). If it was intended, run a full acceptance (`vllm-acceptance run -i "
                    "INVENTORY`) and sign it; then point the timer at the new baseline."},
        {"alert": "VllmAcceptanceRecheckDrifted", "expr": f'{v}{{verdict="drifted"}} == 1', "for_s": 0,
         "severity": "warning",
         "summary": "Re-check of {{ $labels.baseline }} ({{ $labels.inventory }}): drifted",
         "description": "Something changed or a rate left its baseline interval; the signed decision may still "
                        "hold (vllm_acceptance_recheck_signed_decision_holds says so when the outcome was read).",
         "runbook": "Read the re-check's report: each drift names the rate or setting, the baseline's interval and "
                    "today's value. Find the cause (a gateway or client change, traffic mix, cache pressure) and "
                    "run `vllm-acceptance recheck --baseline RUN -i INVENTORY` again by hand after the fix; if the "
                    "signed decision does not hold, treat it as a reopen."},
        {"alert": "VllmAcceptanceRecheckNoVerdict",
         "expr": f'max without (verdict) ({v}{{verdict=~"still_accepted|drifted|reopen"}}) == 0', "for_s": 0,
         "severity": "warning",
         "summary": "Re-check of {{ $labels.baseline }} ({{ $labels.inventory }}) gave no verdict",
         "description": "The last re-check was incomplete (evidence missing: a probe could not run, a node was "
                        "unreachable) or failed before a verdict (vllm_acceptance_recheck_exit_code 1, or 2: "
                        "inputs refused, e.g. an unsigned baseline). An unchecked deployment is not a checked one.",
         "runbook": "Read the per-run stdout log and exit code the timer kept on the re-check host (the results "
                    "directory of roles/recheck_timer, one directory per run) and the re-check's report (its "
                    "`missing` list). Fix what was missing (reachability, credentials in the environment file, "
                    "the baseline's path) and start the service once by hand."},
        {"alert": "VllmAcceptanceRecheckNotRun",
         "expr": f"({age} > ({period} * {_fmt(stale_margin)})) or (({age} > {DEFAULT_MAX_AGE_S}) unless {period})",
         "for_s": 0, "severity": "warning",
         "summary": "Re-check of {{ $labels.baseline }} ({{ $labels.inventory }}) did not run on schedule",
         "description": f"The last scheduled re-check finished more than its period x {_fmt(stale_margin)} ago "
                        f"({DEFAULT_MAX_AGE_S // 3600} h when the file states no period): the timer or cron "
                        "entry stopped, the host is down, or the run hangs.",
         "runbook": "On the re-check host: `systemctl status vllm-acceptance-recheck-<name>.timer` and "
                    "`journalctl -u vllm-acceptance-recheck-<name>.service` (cron: the cron log), then the "
                    "results directory's newest run. Start the service by hand once it is fixed."},
        {"alert": "VllmAcceptanceRecheckAbsent", "expr": f"absent({ts})", "for_s": absent_for_s,
         "severity": "warning",
         "summary": "No scheduled re-check reports its result",
         "description": "No vllm_acceptance_recheck_* series reaches Prometheus: the re-check timer was never "
                        "installed, its metrics file is not in node_exporter's textfile directory, or node_exporter "
                        "is not scraped.",
         "runbook": "Install the timer (`ansible-playbook -i INVENTORY playbooks/recheck_timer.yml`) with "
                    "recheck_timer_textfile_dir set to node_exporter's --collector.textfile.directory; check that "
                    "node_exporter is started with that flag and scraped."},
    ]


def generate_recheck_rules(report: dict[str, Any], profile_name: str, owner: str, *,
                           stale_margin: float = STALE_MARGIN) -> dict[str, Any]:
    """The re-check rule file: one group of alerts on the textfile series."""
    rules = []
    for alert in recheck_alerts(stale_margin=stale_margin):
        rule: dict[str, Any] = {"alert": alert["alert"], "expr": alert["expr"]}
        if alert["for_s"]:
            rule["for"] = _duration(alert["for_s"])
        rule["labels"] = _rule_labels(alert, report, profile_name)
        rule["annotations"] = _annotations(alert["summary"], alert["description"], alert["runbook"], owner)
        rules.append(rule)
    return {"groups": [{"name": "vllm-acceptance-recheck", "rules": rules}]}


def _rule_labels(alert: dict[str, Any], report: dict[str, Any], profile_name: str) -> dict[str, str]:
    return {"severity": alert["severity"], "profile": profile_name, "acceptance_run": str(report.get("run_id", "")),
            "source": "recheck"}


def _series(text: str, *, minutes: int, timestamp: str | None = None) -> list[dict[str, str]]:
    """promtool input series from a metrics file: each sample constant over `minutes`, node_exporter's labels
    added; `timestamp` replaces the last-run series' values (a file rewritten on schedule)."""
    series = []
    for name, labels, value in parse_textfile(text):
        values = timestamp if timestamp and name.endswith("_last_run_timestamp_seconds") else f"{_num(value)}x{minutes}"
        series.append({"series": name + _labels({**labels, **_SCRAPE_LABELS}), "values": values})
    return series


def _expected_labels(text: str, metric: str, where: dict[str, str], drop: tuple[str, ...]) -> dict[str, str]:
    for name, labels, _ in parse_textfile(text):
        if name == metric and all(labels.get(k) == v for k, v in where.items()):
            return {k: v for k, v in {**labels, **_SCRAPE_LABELS}.items() if k not in drop}
    raise ValueError(f"{metric} {where} not in the metrics file")


def recheck_promtool_tests(report: dict[str, Any], profile_name: str, owner: str,
                           rules_file: str = RECHECK_RULES_FILE, *, stale_margin: float = STALE_MARGIN
                           ) -> dict[str, Any]:
    """For every re-check alert: series written by the textfile writer that make it fire, and that keep it silent.

    Test time starts at 0: files are written with now=0 and a 60 s period (the schedule of the tests)."""
    minutes, period = 20, 60
    eval_time = "10m"

    def text(verdict: str | None, code: int, period_s: int | None = period) -> str:
        return textfile_text(verdict=verdict, exit_code=code, inventory="lab", baseline="run-signed", now=0,
                             period_s=period_s)

    ok = text("still_accepted", 0)
    on_time = f"0+{period}x{minutes}"   # rewritten every period: its age stays under one period
    alerts = {a["alert"]: a for a in recheck_alerts(stale_margin=stale_margin)}
    # alert -> [(case, series, expected labels of the alert or None for silent)]
    cases: dict[str, list[tuple[str, list[dict[str, str]], dict[str, str] | None]]] = {}
    for name, verdict, code in (("VllmAcceptanceRecheckReopen", "reopen", 60),
                                ("VllmAcceptanceRecheckDrifted", "drifted", 50)):
        bad = text(verdict, code)
        cases[name] = [
            (f"on a {verdict} result", _series(bad, minutes=minutes, timestamp=on_time),
             _expected_labels(bad, f"{METRIC}_verdict", {"verdict": verdict}, ())),
            ("on still_accepted", _series(ok, minutes=minutes, timestamp=on_time), None)]
    incomplete, failed = text("incomplete", 40), text(None, 1)
    cases["VllmAcceptanceRecheckNoVerdict"] = [
        ("on incomplete", _series(incomplete, minutes=minutes, timestamp=on_time),
         _expected_labels(incomplete, f"{METRIC}_verdict", {}, ("verdict",))),
        ("on a run that failed before a verdict (exit 1)", _series(failed, minutes=minutes, timestamp=on_time),
         _expected_labels(failed, f"{METRIC}_verdict", {}, ("verdict",))),
        ("on still_accepted", _series(ok, minutes=minutes, timestamp=on_time), None)]
    ts_metric = f"{METRIC}_last_run_timestamp_seconds"
    no_period = text("still_accepted", 0, period_s=None)
    cases["VllmAcceptanceRecheckNotRun"] = [
        ("when the file stopped being rewritten", _series(ok, minutes=minutes),
         _expected_labels(ok, ts_metric, {}, ())),
        ("when rewritten every period", _series(ok, minutes=minutes, timestamp=on_time), None),
        ("without a period, within the default age", _series(no_period, minutes=minutes), None)]
    cases["VllmAcceptanceRecheckAbsent"] = [
        ("without any re-check series", [{"series": 'up{job="node", instance="recheck-host:9100"}',
                                          "values": f"1x{minutes * 6}"}], {}),
        ("with the re-check's series", _series(ok, minutes=minutes * 6, timestamp=f"0+{period}x{minutes * 6}"),
         None)]
    tests = []
    for name, runs in cases.items():
        alert = alerts[name]
        at = _duration(alert["for_s"] + 600) if alert["for_s"] else eval_time
        for case, series, labels in runs:
            expected = [] if labels is None else [{
                "exp_labels": {**labels, **_rule_labels(alert, report, profile_name)},
                "exp_annotations": {k: v.replace("{{ $labels.baseline }}", labels.get("baseline", ""))
                                    .replace("{{ $labels.inventory }}", labels.get("inventory", ""))
                                    for k, v in _annotations(alert["summary"], alert["description"],
                                                             alert["runbook"], owner).items()}}]
            tests.append({"name": f"{name} {'fires' if labels is not None else 'stays silent'} {case}",
                          "interval": "1m", "input_series": series,
                          "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}]})
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": tests}
