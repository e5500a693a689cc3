"""The decision after remediation on recorded runs (rebuild/decision.py; fixtures in tests/fixtures/remediation).

The runs are real: report.json of lab acceptance runs (real vLLM on CPU), real probe results of a server
started with --no-enable-prefix-caching and of a gateway that drops finish_reason, and rebuild records that
playbooks/rebuild.yml wrote on namespace hosts (tests/fixtures/remediation/README.md names each source).
A re-run that differs from a recorded run in one family is composed here from two real files, by name.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance import cli
from vllm_acceptance.rebuild.decision import (
    DECISION_FILE,
    KEEP_ISOLATED,
    KEEP_UPGRADED,
    REVERT,
    decide_after_remediation,
    record_manual_action,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "remediation"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "reports"))
import samples  # noqa: E402 - the sample run builder lives with the fixtures

HEALTHY, FLAGS_FAIL, K3_FAIL = "lab-release", "lab-flags-fail", "lab-k3-flags-and-fallback-fail"


def report_of(name: str) -> dict[str, Any]:
    return json.loads((FIX / name / "report.json").read_text())


def probe_findings(name: str) -> list[dict[str, Any]]:
    return json.loads((FIX / name).read_text())["findings"]


# The recorded runs were taken at other hours than the recorded rolls (18:14-18:17 UTC): their times are
# set around the roll here (the failed run before it, the re-run after it); the chronology test keeps them.
BEFORE_ROLL = {"started": "2026-12-01T17:00:00+00:00", "finished": "2026-12-01T17:30:00Z"}
AFTER_ROLL = {"started": "2026-12-01T19:00:00+00:00", "finished": "2026-12-01T19:30:00Z"}


def run(tmp: Path, name: str, *, family: str | None = None, with_probe: str | None = None,
        drop: tuple[str, ...] = (), when: str = "after", **extra: Any) -> Path:
    """A run directory holding the recorded run `name`; with `family` replaced by a real probe's findings
    (or removed), checks in `drop` removed, its times before or after the roll (or as recorded), and extra
    report fields."""
    report = report_of(name)
    report.update({"before": BEFORE_ROLL, "after": AFTER_ROLL}.get(when, {}))
    findings = report["findings"]
    if family:
        findings = [f for f in findings if not f["check"].startswith(family)]
        findings += probe_findings(with_probe) if with_probe else []
    report["findings"] = [f for f in findings if f["check"] not in drop]
    report.update(extra)
    out = tmp / f"{name}-{family or 'as-run'}-{with_probe or ''}-{len(drop)}-{len(list(tmp.iterdir()))}"
    out.mkdir()
    (out / "report.json").write_text(json.dumps(report))
    return out


def failed_before(tmp: Path) -> Path:
    """The lab run whose compat.actual_config.flags failed, as the run before the change."""
    return run(tmp, FLAGS_FAIL, when="before")


def record(tmp: Path, name: str = "rebuild-completed.json", *, manual: list[str] | None = None) -> Path:
    """A copy of a recorded rebuild.json; manual: None leaves it as the playbook wrote it (nothing stated)."""
    path = tmp / f"record-{len(list(tmp.iterdir()))}" / "rebuild.json"
    path.parent.mkdir()
    shutil.copy(FIX / name, path)
    if manual is not None:
        if not manual:
            record_manual_action(path, what=None, none=True)
        for what in manual:
            record_manual_action(path, what=what, host="node1", by="oncall")
    return path


def signs(decision: dict[str, Any]) -> dict[str, str]:
    return {name: sign["status"] for name, sign in decision["signs"].items()}


# --- sign 1: does the original error recur -----------------------------------------------------------

def test_original_error_fixed_in_the_rerun(tmp_path: Path) -> None:
    d = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path),
                                 record=record(tmp_path, manual=[]))
    sign = d["signs"]["recurrence"]
    assert sign["status"] == "pass"
    assert sign["observed"]["original_errors"] == ["compat.actual_config.flags@localhost"]
    assert sign["observed"]["fixed"] == ["compat.actual_config.flags@localhost"]



def test_every_sign_cites_the_report_files_it_read(tmp_path: Path) -> None:
    """A run given as a file (a copied report.json under another name) is cited by that file, never by a
    report.json beside it that was not read."""
    after_dir = run(tmp_path, HEALTHY)
    after_file = after_dir / "rerun-report.json"
    (after_dir / "report.json").rename(after_file)
    before_dir = failed_before(tmp_path)
    d = decide_after_remediation(after_file, before_dir=before_dir, record=record(tmp_path, manual=[]))
    assert d["signs"]["recurrence"]["evidence"] == [str(before_dir / "report.json"), str(after_file)]
    for name in ("prefix_cache", "agent"):
        assert d["signs"][name]["evidence"] == [str(after_file)], name

def test_original_error_recurs_and_the_choice_is_revert_naming_it(tmp_path: Path) -> None:
    d = decide_after_remediation(run(tmp_path, K3_FAIL), before_dir=failed_before(tmp_path),
                                 record=record(tmp_path, manual=[]))
    assert d["signs"]["recurrence"]["status"] == "fail"
    assert d["choice"] == REVERT
    assert "compat.actual_config.flags@localhost" in d["failed_checks"]
    assert any("fails again" in r for r in d["reasons"])


@pytest.mark.parametrize("case", ["no before run", "before run without a failure", "not judged again"])
def test_recurrence_without_evidence_is_never_fine(tmp_path: Path, case: str) -> None:
    before = {"no before run": None, "before run without a failure": run(tmp_path, HEALTHY, when="before"),
              "not judged again": failed_before(tmp_path)}[case]
    after = run(tmp_path, HEALTHY, drop=("compat.actual_config.flags",) if case == "not judged again" else ())
    d = decide_after_remediation(after, before_dir=before, record=record(tmp_path, manual=[]))
    assert d["signs"]["recurrence"]["status"] == "missing"
    assert d["choice"] is None
    assert any("recurrence (compat.remediation.recurrence)" in x for x in d["lacking_evidence"])


# --- sign 2: prefix caching ----------------------------------------------------------------------

def test_prefix_caching_off_in_the_rerun_fails_and_reverts(tmp_path: Path) -> None:
    after = run(tmp_path, HEALTHY, family="cache.", with_probe="probe-caching-off.json")
    d = decide_after_remediation(after, before_dir=failed_before(tmp_path), record=record(tmp_path, manual=[]))
    assert signs(d)["prefix_cache"] == "fail" and signs(d)["recurrence"] == "pass"
    assert d["choice"] == REVERT
    assert {"cache.config", "cache.reuse"} <= set(d["failed_checks"])


def test_prefix_cache_without_cache_findings_lacks_evidence(tmp_path: Path) -> None:
    after = run(tmp_path, HEALTHY, family="cache.")
    d = decide_after_remediation(after, before_dir=failed_before(tmp_path), record=record(tmp_path, manual=[]))
    assert signs(d)["prefix_cache"] == "missing" and d["choice"] is None
    assert "no passing cache. finding" in d["signs"]["prefix_cache"]["reason"]


# --- sign 3: agent tools and structured output -------------------------------------------------------

def test_structured_output_broken_by_a_gateway_fails_the_agent_sign(tmp_path: Path) -> None:
    after = run(tmp_path, HEALTHY, family="agent.", with_probe="probe-agent-drop-field.json")
    d = decide_after_remediation(after, before_dir=failed_before(tmp_path), record=record(tmp_path, manual=[]))
    assert signs(d)["agent"] == "fail" and d["choice"] == REVERT
    assert "agent.structured_output" in d["failed_checks"]


def test_agent_sign_needs_structured_output_evidence(tmp_path: Path) -> None:
    after = run(tmp_path, HEALTHY, drop=("agent.structured_output",))
    d = decide_after_remediation(after, before_dir=failed_before(tmp_path), record=record(tmp_path, manual=[]))
    assert signs(d)["agent"] == "missing" and d["choice"] is None
    assert "agent.structured_output" in d["signs"]["agent"]["reason"]


# --- sign 4: manual actions ----------------------------------------------------------------------

def test_manual_actions_not_stated_are_not_zero(tmp_path: Path) -> None:
    d = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path),
                                 record=record(tmp_path))  # the record as rebuild.yml wrote it
    assert signs(d)["manual_actions"] == "missing" and d["choice"] is None
    assert "never assumed zero" in d["signs"]["manual_actions"]["reason"]


def test_manual_actions_over_the_limit_fail_and_within_it_pass(tmp_path: Path) -> None:
    rec = record(tmp_path, manual=["reloaded nvidia_peermem by hand after the reboot"])
    over = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path), record=rec)
    assert signs(over)["manual_actions"] == "fail" and over["choice"] == REVERT
    assert over["failed_checks"] == ["compat.remediation.manual_actions"]
    assert "reloaded nvidia_peermem by hand after the reboot on node1 by oncall" in \
        over["signs"]["manual_actions"]["reason"]
    within = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path), record=rec,
                                      max_manual_actions=1)
    assert signs(within)["manual_actions"] == "pass" and within["choice"] == KEEP_UPGRADED


def test_none_cannot_hide_recorded_manual_actions(tmp_path: Path) -> None:
    rec = record(tmp_path, manual=["reseated a cable"])
    with pytest.raises(ValueError, match="would hide them"):
        record_manual_action(rec, what=None, none=True)


# --- the choices ---------------------------------------------------------------------------------

def test_every_sign_holds_after_a_completed_roll_keeps_the_upgraded_cluster(tmp_path: Path) -> None:
    d = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path),
                                 record=record(tmp_path, manual=[]))
    assert signs(d) == dict.fromkeys(("recurrence", "prefix_cache", "agent", "manual_actions"), "pass")
    assert d["route"] == "driver_upgrade" and d["choice"] == KEEP_UPGRADED and not d["failed_checks"]


def test_a_stopped_roll_reverts_naming_the_check_that_failed_on_the_node(tmp_path: Path) -> None:
    d = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path),
                                 record=record(tmp_path, "rebuild-stopped.json", manual=[]))
    assert d["choice"] == REVERT
    assert d["failed_checks"] == ["compat.gpu_visibility@node1"]
    assert any("the roll stopped at preflight on node1" in r for r in d["reasons"])


@pytest.mark.parametrize(("edit", "named"), [
    ("workload skipped on node2", "node2: the existing workload was not re-run ok (skipped)"),
    ("roll still running", "the roll is 'running', not completed"),
    ("no rollback plan", "no rollback plan documented in the record"),
])
def test_keeping_the_upgraded_cluster_needs_a_completed_proven_roll(tmp_path: Path, edit: str, named: str) -> None:
    rec = record(tmp_path, manual=[])
    data = json.loads(rec.read_text())  # the recorded roll, edited here as named
    if edit.startswith("workload"):
        next(s for s in data["nodes"]["node2"]["steps"] if s["step"] == "workload")["status"] = "skipped"
    elif edit.startswith("roll"):
        data["status"] = "running"
    else:
        data["plan"]["rollback_plan"] = ""
    rec.write_text(json.dumps(data))
    d = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path), record=rec)
    assert d["choice"] is None and f"roll: {named}" in d["lacking_evidence"]


def test_a_rollback_record_is_not_an_upgrade_to_keep(tmp_path: Path) -> None:
    d = decide_after_remediation(run(tmp_path, HEALTHY), before_dir=failed_before(tmp_path),
                                 record=record(tmp_path, "rollback-completed.json", manual=[]))
    assert d["choice"] is None and any("already reverted" in x for x in d["lacking_evidence"])


def test_isolated_environment_kept_with_owner_review_date_and_conditions(tmp_path: Path) -> None:
    iso = {"owner": "inference-team", "review_date": "2099-01-31", "move_back_criteria": "R580 on the shared cluster",
           "problems": [], "complete": True}
    d = decide_after_remediation(run(tmp_path, HEALTHY, isolated_environment=iso), before_dir=failed_before(tmp_path),
                                 record=record(tmp_path, manual=[]), route="isolated_environment")
    assert d["choice"] == KEEP_ISOLATED and d["terms"]["owner"] == "inference-team"
    lacking = {**iso, "owner": None, "problems": ["isolated_env_owner is not set"], "complete": False}
    d = decide_after_remediation(run(tmp_path, HEALTHY, isolated_environment=lacking),
                                 before_dir=failed_before(tmp_path), record=record(tmp_path, manual=[]),
                                 route="isolated_environment")
    assert d["choice"] is None and any("isolated_env_owner is not set" in x for x in d["lacking_evidence"])


def test_self_built_image_kept_on_its_lineage_terms(tmp_path: Path) -> None:
    lineage = {"owner": "inference-team", "exit_date": "2099-01-31", "base_profile": "kimi-k3"}
    d = decide_after_remediation(run(tmp_path, HEALTHY, experimental=True, lineage=lineage),
                                 before_dir=failed_before(tmp_path), record=record(tmp_path, manual=[]))
    assert d["route"] == "self_built_image" and d["choice"] == KEEP_ISOLATED
    assert d["terms"]["owner"] == "inference-team" and d["terms"]["review_date"] == "2099-01-31"
    d = decide_after_remediation(run(tmp_path, HEALTHY, experimental=True, lineage={"base_profile": "kimi-k3"}),
                                 before_dir=failed_before(tmp_path), record=record(tmp_path, manual=[]))
    assert d["choice"] is None and any("lineage.owner is not recorded" in x for x in d["lacking_evidence"])


def test_cli_refuses_a_run_without_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["remediation-decision", str(tmp_path)]) == 2
    assert "no report.json" in capsys.readouterr().err


def test_cli_writes_the_decision_and_the_report_shows_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    after_dir, before_dir = run(tmp_path, HEALTHY), failed_before(tmp_path)
    rec = record(tmp_path, manual=[])
    assert cli.main(["remediation-decision", str(after_dir), "--before", str(before_dir), "--record", str(rec)]) == 0
    assert json.loads((after_dir / DECISION_FILE).read_text())["choice"] == KEEP_UPGRADED
    assert json.loads(rec.read_text())["decision"]["choice"] == KEEP_UPGRADED  # the rebuild record says it too
    md, html = (after_dir / "report.md").read_text(), (after_dir / "report.html").read_text()
    assert "Decision after remediation: Keep the upgraded cluster" in md
    assert 'id="remediation-decision"' in html and "compat.remediation.manual_actions" in html
    # Without the record the choice is not made (exit 3), and says which sign lacks evidence.
    assert cli.main(["remediation-decision", str(after_dir), "--before", str(before_dir)]) == 3
    assert "manual_actions (compat.remediation.manual_actions)" in capsys.readouterr().out
    assert "No choice" in (after_dir / "report.md").read_text()
    # A stopped roll: exit 1, revert.
    rec = record(tmp_path, "rebuild-stopped.json", manual=[])
    assert cli.main(["remediation-decision", str(after_dir), "--before", str(before_dir), "--record", str(rec)]) == 1


def test_a_rerun_older_than_the_roll_proves_nothing(tmp_path: Path) -> None:
    """The recorded times as they were: the healthy lab run (16:20) is older than the roll (18:14) and than
    the failed run (18:07): it cannot show the remediated environment."""
    d = decide_after_remediation(run(tmp_path, HEALTHY, when="as recorded"),
                                 before_dir=run(tmp_path, FLAGS_FAIL, when="as recorded"),
                                 record=record(tmp_path, manual=[]))
    assert d["choice"] is None
    assert any("before the change ended" in x for x in d["lacking_evidence"])
    assert any("older than the run before the change" in x for x in d["lacking_evidence"])


def test_gpu_cluster_story_driver_below_minimum_fixed_by_the_upgrade(tmp_path: Path) -> None:
    """The sample two-node GB300 runs (generated, tests/fixtures/reports/samples.py): node2 on R575 before,
    every check passing after."""
    dirs = []
    for kind, when in (("rebuild", BEFORE_ROLL), ("release", AFTER_ROLL)):
        run_dir, report = samples.build(kind, tmp_path / kind)
        (run_dir / "report.json").write_text(json.dumps({**report, **when}, default=str))
        dirs.append(run_dir)
    d = decide_after_remediation(dirs[1], before_dir=dirs[0], record=record(tmp_path, manual=[]))
    assert "compat.driver_branch@gb300-node2" in d["signs"]["recurrence"]["observed"]["fixed"]
    assert d["choice"] == KEEP_UPGRADED
    d = decide_after_remediation(dirs[0], before_dir=dirs[0], record=record(tmp_path, manual=[]))
    assert d["choice"] == REVERT and "compat.driver_branch@gb300-node2" in d["failed_checks"]
