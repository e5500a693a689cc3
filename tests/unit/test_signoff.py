"""Sign-off record, reopen detection, the checklist's three groups and the views people read (no lab)."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.report import checklist, views
from vllm_acceptance.report.build import build_report
from vllm_acceptance.report.diff import diff_runs, render_diff_text
from vllm_acceptance.report.render_html import compat_matrix, render_html
from vllm_acceptance.report.reopen import reopen_status
from vllm_acceptance.report.sign import sign_run
from vllm_acceptance.report.signoff import SignRefused, more_permissive, parse_confirmations
from vllm_acceptance.report.write import write_reports

SAMPLES_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples_signoff", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)


def written(kind: str, root: Path, *, preset_signoff: bool = True) -> Path:
    run_dir, report = samples.build(kind, root)
    if not preset_signoff:
        strip_preset_signoff(run_dir)
        report = build_report(run_dir, load_profile(run_dir / "evidence" / "profile.yml"))
    write_reports(run_dir, report)
    return run_dir


def strip_preset_signoff(run_dir: Path) -> None:
    """The `release` sample carries a paper sign-off in run.json; these tests sign through the record. Done before
    the verdict is taken: run.json's fields are bound to the verdict (issue 42, item 7)."""
    run = json.loads((run_dir / "run.json").read_text())
    run["signoff"] = {"deployment_engineer": "A. Ivanova"}
    (run_dir / "run.json").write_text(json.dumps(run))


# --- sign -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("decision,verdict,permissive", [
    ("release", "limited_observation", True), ("limited_observation", "limited_observation", False),
    ("limited_observation", "release", False), ("expand_capacity", "rebuild_environment", True),
    ("rebuild_environment", "incomplete", False), ("release", "incomplete", True),
])
def test_permissiveness_follows_the_decision_table(decision: str, verdict: str, permissive: bool) -> None:
    assert more_permissive(decision, verdict) is permissive


def test_sign_refuses_a_more_permissive_decision_unless_overridden(tmp_path: Path) -> None:
    run_dir = written("limited", tmp_path)
    html_before = (run_dir / "report.html").read_text()
    with pytest.raises(SignRefused, match="--override-reason"):
        sign_run(run_dir, reviewer="L. Chen (SRE)", decision="release")
    assert not (run_dir / "signoff.json").exists() and (run_dir / "report.html").read_text() == html_before
    record = sign_run(run_dir, reviewer="L. Chen (SRE)", decision="release", override_reason="launch event")
    assert record["override"] is True and record["override_reason"] == "launch event"
    assert record["report_sha256"] == hashlib.sha256((run_dir / "report.json").read_bytes()).hexdigest()
    html = (run_dir / "report.html").read_text()
    assert 'id="override">OVERRIDE of the verdict limited_observation: launch event' in html
    assert ".signed-state.override" in html  # the red box of report.css


def test_sign_limited_takes_the_runs_limits_and_needs_one(tmp_path: Path) -> None:
    run_dir = written("limited", tmp_path)
    record = sign_run(run_dir, reviewer="L. Chen", decision="limited_observation")
    assert "max_num_seqs=48" in record["limits"] and record["override"] is False
    release_dir = written("release", tmp_path, preset_signoff=False)
    with pytest.raises(SignRefused, match="traffic cap"):
        sign_run(release_dir, reviewer="L. Chen", decision="limited_observation")
    ok = sign_run(release_dir, reviewer="L. Chen", decision="limited_observation", limits=["max_num_seqs=32"])
    assert ok["limits"] == ["max_num_seqs=32"]


def test_sign_refuses_the_engineer_as_reviewer_and_bad_fields(tmp_path: Path) -> None:
    run_dir = written("release", tmp_path)
    with pytest.raises(SignRefused, match="another person"):
        sign_run(run_dir, reviewer="A. Ivanova", decision="release")  # she ran it (run.json)
    with pytest.raises(SignRefused, match="--reviewer"):
        sign_run(run_dir, reviewer=" ", decision="release")
    with pytest.raises(SignRefused, match="allowed: maintenance_window"):
        parse_confirmations(["window=tonight"])
    with pytest.raises(SignRefused, match="no report.json"):
        sign_run(tmp_path / "nowhere", reviewer="x", decision="release")


def test_a_changed_report_json_breaks_the_signature(tmp_path: Path) -> None:
    run_dir = written("limited", tmp_path)
    sign_run(run_dir, reviewer="L. Chen", decision="limited_observation")
    report = json.loads((run_dir / "report.json").read_text())
    report["verdict_reasons"].append("edited after signing")
    (run_dir / "report.json").write_text(json.dumps(report))
    from vllm_acceptance.report.sign import rerender

    rerender(run_dir)
    html = (run_dir / "report.html").read_text()
    assert "report.json changed after signing" in html and "changed since signing" in html


# --- reopen ---------------------------------------------------------------------------------------

def test_reopen_names_the_driver_change_since_the_signed_release(tmp_path: Path) -> None:
    release = written("release", tmp_path, preset_signoff=False)
    first = reopen_status(release, json.loads((release / "report.json").read_text()))
    assert first["status"] == "no_baseline"
    sign_run(release, reviewer="L. Chen", decision="release")
    same = written("limited", tmp_path)  # same nodes, image, driver, contract, recipe
    assert json.loads((same / "report.json").read_text())["reopen"]["status"] == "unchanged"
    changed = written("rebuild", tmp_path)  # node2 on R575
    reopen = json.loads((changed / "report.json").read_text())["reopen"]
    assert reopen["status"] == "reopened" and reopen["baseline"]["run_id"] == release.name
    assert [t["trigger"] for t in reopen["fired"]] == ["driver"]
    assert "575.57.08" in json.dumps(reopen["fired"][0]["now"])
    assert 'data-trigger="driver"' in (changed / "report.html").read_text()
    text = render_diff_text(diff_runs(release, changed))
    assert "reopen triggers fired: 1" in text and "host driver version" in text


def test_reopen_ignores_runs_not_signed_for_traffic(tmp_path: Path) -> None:
    rebuild = written("rebuild", tmp_path)
    sign_run(rebuild, reviewer="L. Chen", decision="rebuild_environment")  # not an acceptance
    later = written("limited", tmp_path)
    assert json.loads((later / "report.json").read_text())["reopen"]["status"] == "no_baseline"


# --- checklist groups -------------------------------------------------------------------------------

def lab_like(report: dict[str, Any]) -> dict[str, Any]:
    """GPU checks not applicable as on the CPU lab (reasons as the lab's rules write them)."""
    report = copy.deepcopy(report)
    for f in report["findings"]:
        if f["check"] in ("compat.driver_branch", "compat.gpu_visibility", "compat.fabric_manager"):
            f.update(status="not_applicable", reason="profile hardware.accelerator is none (no GPU on this deployment)")
    return report


def test_checklist_keeps_not_provable_and_person_items_apart(tmp_path: Path) -> None:
    _, report = samples.build("limited", tmp_path)
    rows = {r.item.ref: r for r in checklist.coverage(lab_like(report))}
    assert (rows["000#4"].status, rows["000#4"].category) == ("not_applicable", "not_provable")
    assert "no GPU on this deployment" in rows["000#4"].detail
    assert (rows["001#3"].status, rows["001#3"].category) == ("to_confirm", "person")  # spare node
    real = {r.item.ref: r for r in checklist.coverage(report)}
    assert (real["000#4"].status, real["000#4"].category) == ("pass", "run")
    report["signed"] = {"decision": "limited_observation", "reviewer": "L. Chen", "report_intact": True,
                        "confirmations": {"spare_node": "gb300-node9"}, "monitoring_owner": "sre-oncall"}
    confirmed = {r.item.ref: r for r in checklist.coverage(report)}
    assert confirmed["001#3"].status == "pass" and "gb300-node9" in confirmed["001#3"].detail
    assert confirmed["000#19"].status == "pass"


def test_no_oom_is_fine_only_when_the_load_stages_ran(tmp_path: Path) -> None:
    _, report = samples.build("limited", tmp_path)
    rows = {r.item.ref: r for r in checklist.coverage(report)}
    assert rows["003#8"].status == "not_applicable" and "no OOM or crash occurred" in rows["003#8"].detail
    _, early = samples.build("early_death", tmp_path)
    rows = {r.item.ref: r for r in checklist.coverage(early)}
    assert rows["003#8"].status == "missing"


# --- views ------------------------------------------------------------------------------------------

def test_observed_values_become_tables_with_raw_json_folded() -> None:
    startup = {"check": "compat.startup_log", "observed": {
        "version": "0.32.0", "tp_size": 1, "pp_size": 1, "dp_size": 1, "world_size": 1, "dist_backend": "gloo",
        "kv_cache_tokens": 524288, "max_concurrency": 256.0, "max_concurrency_len": 2048,
        "warnings": ["13: Found ulimit of 20000", "17: Enforce eager set"], "errors": [], "fallbacks": [],
        "nccl_errors": []}}
    view = views.observed_view(startup)
    assert dict(view["pairs"])["warnings"] == 2 and view["folded"] == ["13: Found ulimit of 20000",
                                                                        "17: Enforce eager set"]
    assert "524,288 tokens, max concurrency 256 at 2048 tokens" in dict(view["pairs"])["KV cache"]
    ramp = views.observed_view({"check": "capacity.ramp", "observed": {"knee": 4, "contract": 4, "steps": [
        {"concurrency": 1, "ttft_p95": 0.17, "timed_out": []}, {"concurrency": 2, "ttft_p95": 0.11}]}})
    assert ramp["kind"] == "table" and ramp["cols"][:2] == ["concurrency", "ttft_p95"] and ramp["raw"]
    assert views.observed_view({"check": "x", "observed": "ok"}) == {"kind": "text", "value": "ok"}


def test_matrix_groups_alike_nodes_and_puts_deviations_first() -> None:
    hosts = [f"n{i:02d}" for i in range(1, 11)]
    findings = [{"check": c, "host": h, "status": "fail" if (h, c) == ("n07", "compat.driver_branch") else "pass",
                 "observed": "575" if h == "n07" else "580", "expected": ">= 580"}
                for h in hosts for c in ("compat.driver_branch", "compat.gpu_visibility")]
    matrix = compat_matrix({"hosts": hosts, "findings": findings, "unreachable_hosts": []})
    assert [g["label"] for g in matrix["groups"]] == ["n07", "9 nodes alike"]
    assert matrix["deviations"][0]["host"] == "n07" and len(matrix["rows"]) == 10
    html = render_html({"verdict": "rebuild_environment", "hosts": hosts, "findings": findings, "run_id": "r"})
    assert "9 nodes alike" in html and "Full grid: every node (10 rows)" in html


@pytest.mark.parametrize("decision", ["rebuild_environment", "expand_capacity", "release"])
def test_sign_refuses_every_decision_on_a_run_the_report_says_cannot_be_signed(tmp_path: Path, decision: str) -> None:
    """An incomplete run's report says "Incomplete: no decision can be signed" (issue 43 item 6): before, the least
    permissive decision (rebuild_environment) was recorded on it all the same. No decision, override or not."""
    run_dir = written("incomplete", tmp_path)
    html = (run_dir / "report.html").read_text()
    assert "no decision can be signed" in html
    # and the report offers no sign command for it
    assert 'id="sign-command"' not in html and 'id="cannot-sign">Cannot be signed:' in html
    assert "**Cannot be signed:**" in (run_dir / "report.md").read_text()
    for override in (None, "launch event"):
        with pytest.raises(SignRefused, match="is incomplete: its report says no decision can be signed"):
            sign_run(run_dir, reviewer="L. Chen (SRE)", decision=decision, limits=["max_num_seqs=8"],
                     override_reason=override)
    assert not (run_dir / "signoff.json").exists()
