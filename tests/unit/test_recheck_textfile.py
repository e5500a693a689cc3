"""The scheduled re-check's metrics file (recheck/textfile.py) and the alerts on it (monitoring/recheck.py): the
verdict comes from the exit code, a run without a verdict is never read as accepted, the file is written atomically,
and promtool's rule unit tests run the generated alerts against series the writer produced."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_monitoring import need_promtool  # the same skip-or-fail rule as the other promtool tests

from vllm_acceptance.monitoring import generate as mon
from vllm_acceptance.monitoring import recheck as rmon
from vllm_acceptance.recheck import textfile
from vllm_acceptance.recheck.outcome import RECHECK_EXIT_CODES, RECHECK_VERDICTS, Drift, RecheckOutcome

REPO = Path(__file__).resolve().parents[2]


def outcome(verdict: str, drifts: list[Drift] | None = None, holds: bool = True) -> RecheckOutcome:
    return RecheckOutcome(verdict=verdict, baseline_run="run-1", recheck_id="r1", started="s", finished="f",
                          signed_decision="release", signed_decision_holds=holds, drifts=drifts or [])


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(n, tuple(sorted(lab.items()))): v for n, lab, v in rmon.parse_textfile(path.read_text())}


def verdicts(path: Path) -> dict[str, float]:
    return {dict(k[1])["verdict"]: v for k, v in samples(path).items() if k[0] == f"{rmon.METRIC}_verdict"}


def test_the_metrics_verdicts_are_the_recheck_verdicts() -> None:
    assert rmon.TEXTFILE_VERDICTS == RECHECK_VERDICTS


@pytest.mark.parametrize("verdict", RECHECK_VERDICTS)
def test_each_verdict_is_one_and_the_others_zero(verdict: str, tmp_path: Path) -> None:
    path = tmp_path / "r.prom"
    textfile.write_textfile(None, RECHECK_EXIT_CODES[verdict], path, inventory="lab", baseline="run-1",
                            now=1765069200.5, period_s=86400)
    assert verdicts(path) == {v: (1.0 if v == verdict else 0.0) for v in RECHECK_VERDICTS}
    s = samples(path)
    labels = (("baseline", "run-1"), ("inventory", "lab"))
    assert s[(f"{rmon.METRIC}_last_run_timestamp_seconds", labels)] == 1765069200.5   # full precision
    assert s[(f"{rmon.METRIC}_exit_code", labels)] == RECHECK_EXIT_CODES[verdict]
    assert s[(f"{rmon.METRIC}_period_seconds", labels)] == 86400


@pytest.mark.parametrize("code", [1, 2, 124, 143])
def test_a_run_without_a_verdict_sets_every_verdict_to_zero(code: int, tmp_path: Path) -> None:
    path = tmp_path / "r.prom"
    # even with a still_accepted outcome left in the run directory by an earlier run
    textfile.write_textfile(outcome("still_accepted"), code, path, inventory="lab", baseline="run-1", now=1.0)
    assert set(verdicts(path).values()) == {0.0}
    assert f"{rmon.METRIC}_signed_decision_holds" not in path.read_text()


def test_an_outcome_adds_drift_counts_only_when_it_is_this_runs(tmp_path: Path) -> None:
    drifts = [Drift("drift.image", "image digest", "sha256:a", "sha256:b", "reopen", "image changed"),
              Drift("drift.agent_rate", "tool-call rate", [0.9, 1.0], 0.7, "drifted", "below the interval")]
    path = tmp_path / "r.prom"
    textfile.write_textfile(outcome("reopen", drifts, holds=False), 60, path, inventory="lab", baseline="run-1",
                            now=1.0)
    text = path.read_text()
    assert 'consequence="reopen"} 1' in text and 'consequence="drifted"} 1' in text
    assert f'{rmon.METRIC}_signed_decision_holds{{inventory="lab",baseline="run-1"}} 0' in text
    # a foreign outcome (its verdict is not the exit code's) adds nothing and changes nothing
    textfile.write_textfile(outcome("still_accepted"), 60, path, inventory="lab", baseline="run-1", now=1.0)
    assert verdicts(path)["reopen"] == 1.0 and "consequence=" not in path.read_text()


def test_labels_are_escaped_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "r.prom"
    textfile.write_textfile(None, 0, path, inventory='a"b\\c\nd', baseline="run-1", now=1.0)
    assert {dict(k[1])["inventory"] for k in samples(path)} == {'a"b\\c\nd'}
    assert len(path.read_text().splitlines()) == 2 * 3 + 1 + 4 + 1    # HELP/TYPE x3, ts, 4 verdicts, exit code


def test_the_file_is_replaced_atomically_and_must_be_a_prom_file(tmp_path: Path) -> None:
    path = tmp_path / "r.prom"
    path.write_text("old\n")
    inode = path.stat().st_ino
    textfile.write_textfile(None, 50, path, inventory="lab", baseline="run-1", now=1.0)
    assert path.stat().st_ino != inode and [p.name for p in tmp_path.iterdir()] == ["r.prom"]
    with pytest.raises(ValueError, match=r"\*\.prom"):
        textfile.write_textfile(None, 50, tmp_path / "r.txt", inventory="lab", baseline="run-1", now=1.0)


def test_the_cli_entry_the_wrapper_calls(tmp_path: Path) -> None:
    out, oc = tmp_path / "r.prom", tmp_path / "outcome.json"
    import json
    oc.write_text(json.dumps(outcome("drifted", [Drift("drift.x", "x", 1, 2, "drifted", "r")]).as_dict()))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run([sys.executable, "-m", "vllm_acceptance.recheck.textfile", "--exit-code", "50",
                          "--inventory", "lab", "--baseline", "run-1", "--out", str(out), "--period-s", "3600",
                          "--outcome", str(oc)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert verdicts(out)["drifted"] == 1.0 and 'consequence="drifted"} 1' in out.read_text()
    bad = subprocess.run([sys.executable, "-m", "vllm_acceptance.recheck.textfile", "--exit-code", "0",
                          "--inventory", "lab", "--baseline", "run-1", "--out", str(tmp_path / "r.txt")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1 and "*.prom" in bad.stderr


# ---------------------------------------------------------------------------------------------
# The alerts: in the generated monitoring, tested by promtool against the writer's series


def _report() -> dict:
    return {"run_id": "run-1", "verdict": "release"}


def test_the_recheck_alerts_have_a_runbook_and_sit_in_their_own_rule_file() -> None:
    rules = rmon.generate_recheck_rules(_report(), "cpu-lab", "sre-oncall")
    alerts = {r["alert"]: r for r in rules["groups"][0]["rules"]}
    assert set(alerts) == {"VllmAcceptanceRecheckReopen", "VllmAcceptanceRecheckDrifted",
                           "VllmAcceptanceRecheckNoVerdict", "VllmAcceptanceRecheckNotRun",
                           "VllmAcceptanceRecheckAbsent"}
    for name, rule in alerts.items():
        assert rule["annotations"]["runbook"] and rule["labels"]["acceptance_run"] == "run-1", name
    assert f"monitoring/{rmon.RECHECK_RULES_FILE}" in mon.monitoring_files()


def test_promtool_runs_the_recheck_alerts_against_the_writers_series(tmp_path: Path) -> None:
    promtool = need_promtool()
    rules = rmon.generate_recheck_rules(_report(), "cpu-lab", "sre-oncall")
    tests = rmon.recheck_promtool_tests(_report(), "cpu-lab", "sre-oncall", "rules.yml")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False, width=1000))
    names = {t["name"] for t in tests["tests"]}
    assert "VllmAcceptanceRecheckReopen fires on a reopen result" in names
    assert "VllmAcceptanceRecheckNotRun fires when the file stopped being rewritten" in names
    assert "VllmAcceptanceRecheckNoVerdict fires on a run that failed before a verdict (exit 1)" in names
    check = subprocess.run([promtool, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]


def test_promtool_tests_catch_rules_that_ignore_a_verdict(tmp_path: Path) -> None:
    """The tests can fail: a drifted alert that looks at the wrong verdict misses the drifted series."""
    promtool = need_promtool()
    rules = rmon.generate_recheck_rules(_report(), "cpu-lab", "sre-oncall")
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "VllmAcceptanceRecheckDrifted":
            rule["expr"] = rule["expr"].replace('"drifted"', '"incomplete"')
        if rule["alert"] == "VllmAcceptanceRecheckNotRun":
            rule["expr"] = rule["expr"].replace("* 1.5", "* 1000")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
    tests = rmon.recheck_promtool_tests(_report(), "cpu-lab", "sre-oncall", "rules.yml")
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False, width=1000))
    run = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "VllmAcceptanceRecheckDrifted" in out and "VllmAcceptanceRecheckNotRun" in out
