"""recheck/judge.py and recheck/report.py on pairs of run directories (issue 46 items 2 and 3).

Every pair is generated from a real recorded lab run (tests/support/recheck_pairs.py): the signed baseline is the
recorded lab run, today's run its copy with ONE fact altered per test (the test's name says which).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.core.profile import ConfigError
from vllm_acceptance.core.rundir import RunDir
from vllm_acceptance.recheck.judge import Count, judge, judge_rate
from vllm_acceptance.recheck.outcome import RECHECK_EXIT_CODES
from vllm_acceptance.recheck.report import read_lineage, write_recheck

from support.recheck_pairs import BASE_ID, DIGEST, SECRET, args_of, finding, pair, sign, window


def test_an_unchanged_deployment_is_still_accepted(tmp_path: Path) -> None:
    outcome = judge(*pair(tmp_path, rates=True))
    assert outcome.verdict == "still_accepted", (outcome.reasons, outcome.missing)
    assert outcome.signed_decision_holds and outcome.exit_code == 0 and not outcome.drifts
    assert outcome.signed_decision == "release" and outcome.baseline_run == f"lab/{BASE_ID}"
    assert outcome.details["rates"]["agent.tool_call"]["judged"] == "held"


def test_another_image_digest_reopens_naming_it(tmp_path: Path) -> None:
    def image(report: dict[str, Any], digest: str) -> None:
        report["stages"] = {"preflight": {"hosts": {"localhost": {"image": "vllm/vllm-openai:v0.32.0",
                                                                  "image_digest": digest}}}}

    base_dir, today_dir = pair(tmp_path, lambda r: image(r, DIGEST))
    base = json.loads(RunDir(base_dir).report_json.read_text())
    image(base, "sha256:" + "1" * 64)
    RunDir(base_dir).report_json.write_text(json.dumps(base))
    sign(base_dir)
    outcome = judge(base_dir, today_dir)
    assert outcome.verdict == "reopen" and outcome.exit_code == 60 and not outcome.signed_decision_holds
    [drift] = outcome.drifts
    assert drift.check == "drift.image" and drift.consequence == "reopen" and "reopen rule `image`" in drift.reason
    assert drift.baseline == [f"vllm/vllm-openai:v0.32.0@sha256:{'1' * 64}"]
    assert drift.today == [f"vllm/vllm-openai:v0.32.0@{DIGEST}"]


def test_a_capacity_flag_added_reopens_and_a_logging_flag_drifts_naming_each(tmp_path: Path) -> None:
    outcome = judge(*pair(tmp_path, lambda r: args_of(r).update(max_num_seqs=2)))
    assert outcome.verdict == "reopen"
    [drift] = outcome.drifts
    assert drift.what == "--max-num-seqs: added" and drift.today == 2 and drift.baseline is None
    assert "reopen rule `context_limit`" in drift.reason

    outcome = judge(*pair(tmp_path / "b", lambda r: args_of(r).update(enable_log_requests=True)))
    assert outcome.verdict == "drifted" and outcome.exit_code == 50 and outcome.signed_decision_holds
    [drift] = outcome.drifts
    assert drift.check == "drift.serve_args" and drift.what == "--enable-log-requests: added"
    assert drift.consequence == "drifted"


def test_another_model_revision_reopens(tmp_path: Path) -> None:
    outcome = judge(*pair(tmp_path, lambda r: args_of(r).update(revision="3f1c2a9")))
    assert outcome.verdict == "reopen"
    [drift] = outcome.drifts
    assert drift.check == "drift.served_model" and drift.what == "--revision: added" and drift.today == "3f1c2a9"
    assert "served identity" in drift.reason


def served(report: dict[str, Any], revision: str) -> None:
    """compat.served_model as rules/served_model.py records it, the server loading a hub snapshot (generated)."""
    root = f"/models/hub/models--Qwen--Qwen3-0.6B/snapshots/{revision}"
    report["findings"].append({"check": "compat.served_model", "status": "pass", "host": "localhost",
                               "observed": {"v1_models": [{"id": "tiny-agent", "root": root, "parent": None}],
                                            "startup_log": {}, "checkpoint_config": None,
                                            "hub_snapshot_revision": [revision]}})


def test_another_served_snapshot_reopens(tmp_path: Path) -> None:
    base_dir, today_dir = pair(tmp_path, lambda r: served(r, "c1f0e3b2a9"))
    base = json.loads(RunDir(base_dir).report_json.read_text())
    served(base, "a7d4e5f6b1")
    RunDir(base_dir).report_json.write_text(json.dumps(base))
    sign(base_dir)
    outcome = judge(base_dir, today_dir)
    assert outcome.verdict == "reopen"
    [drift] = outcome.drifts
    assert drift.check == "drift.served_model" and drift.what == "served weights"
    assert (drift.baseline["revision"], drift.today["revision"]) == (["a7d4e5f6b1"], ["c1f0e3b2a9"])


def test_another_tool_parser_reopens_naming_it(tmp_path: Path) -> None:
    outcome = judge(*pair(tmp_path, lambda r: args_of(r).update(tool_call_parser="llama3_json")))
    assert outcome.verdict == "reopen"
    [drift] = outcome.drifts
    assert drift.check == "drift.parser" and drift.what == "--tool-call-parser: changed"
    assert (drift.baseline, drift.today) == ("hermes", "llama3_json")


def test_an_agent_rate_outside_its_interval_drifts_with_its_bounds(tmp_path: Path) -> None:
    def broken(report: dict[str, Any]) -> None:
        rate = finding(report, "agent.tool_call")["observed"]["rate"]
        rate.update(events=31, n=299, value=31 / 299)

    def failed(report: dict[str, Any]) -> None:      # as the probe judges it today: the check fails on its rate
        broken(report)
        finding(report, "agent.tool_call").update(status="fail", reason="31 of 299 turns in error: 0.1037 > 0.01")

    outcome = judge(*pair(tmp_path, failed, rates=True))
    assert outcome.verdict == "drifted" and not outcome.signed_decision_holds
    [drift] = outcome.drifts                          # the rate's drift, not a second one for the failed check
    assert drift.check == "drift.agent_rate" and drift.consequence == "drifted"
    assert drift.baseline["events"] == 0 and drift.baseline["n"] == 299 and drift.today["events"] == 31
    low, high = drift.today["interval_95"]
    assert low > drift.baseline["interval_95"][1] and high < 1
    assert "outside the baseline's interval" in drift.reason


def test_a_small_sample_is_incomplete_never_still_accepted(tmp_path: Path) -> None:
    def small(report: dict[str, Any]) -> None:
        finding(report, "agent.tool_call")["observed"]["rate"].update(events=0, n=12, value=0.0)

    outcome = judge(*pair(tmp_path, small, rates=True))
    assert outcome.verdict == "incomplete" and outcome.exit_code == 40 and not outcome.signed_decision_holds
    assert any("agent.tool_call" in m and "12 sample(s) today, under the 20" in m for m in outcome.missing), \
        outcome.missing

    def unmeasured(report: dict[str, Any]) -> None:
        finding(report, "agent.separation")["observed"] = "separated"

    outcome = judge(*pair(tmp_path / "b", unmeasured, rates=True))
    assert outcome.verdict == "incomplete"
    assert outcome.missing == ["agent.separation rate: measured when signed (0/299), not today"]


def test_the_rate_rule_on_counts() -> None:
    base = Count(0, 299, "max", 0.01)
    assert judge_rate(base, Count(0, 299))[0] == "held"
    assert judge_rate(base, Count(1, 20))[0] == "inconclusive"      # past the accepted level, not proven worse
    # a light sample with no error holds (not proven worse, within the level) and states its resolution
    state, why = judge_rate(base, Count(0, 27))
    assert state == "held" and "resolves the rate to its 95 % bound 0.1" in why
    assert judge_rate(base, Count(0, 12))[0] == "inconclusive"      # under MIN_RATE_SAMPLES
    # a mechanism judged on a handful when signed (the cache's hot requests): held when none failed today
    mechanism = Count(3, 3, "min")
    assert judge_rate(mechanism, Count(1, 1, "min"))[0] == "held"
    assert judge_rate(mechanism, Count(0, 1, "min"))[0] == "inconclusive"
    assert judge_rate(base, Count(5, 40))[0] == "regressed"
    accuracy = Count(299, 299, "min", 0.99)
    assert judge_rate(accuracy, Count(250, 299, "min"))[0] == "regressed"
    assert judge_rate(accuracy, Count(299, 299, "min"))[0] == "held"


def test_an_unsigned_or_changed_baseline_is_refused(tmp_path: Path) -> None:
    base_dir, today_dir = pair(tmp_path, signed=False)
    with pytest.raises(ConfigError, match="never signed.*vllm-acceptance sign"):
        judge(base_dir, today_dir)
    sign(base_dir, decision="rebuild_environment")
    with pytest.raises(ConfigError, match="lets no traffic through"):
        judge(base_dir, today_dir)
    sign(base_dir)
    RunDir(base_dir).report_json.write_text(RunDir(base_dir).report_json.read_text() + " ")
    with pytest.raises(ConfigError, match="signature does not hold"):
        judge(base_dir, today_dir)


def test_a_today_run_of_another_inventory_is_refused(tmp_path: Path) -> None:
    base_dir, today_dir = pair(tmp_path, lambda r: r.update(inventory="prod"))
    with pytest.raises(ConfigError, match="inventory 'prod'.*-i lab"):
        judge(base_dir, today_dir)
    with pytest.raises(ConfigError, match="is the baseline itself"):
        judge(base_dir, base_dir)


def test_an_unreachable_node_or_a_missing_finding_is_incomplete(tmp_path: Path) -> None:
    outcome = judge(*pair(tmp_path, lambda r: r.update(unreachable_hosts=["localhost"])))
    assert outcome.verdict == "incomplete" and "node localhost: unreachable" in outcome.missing

    def lost(report: dict[str, Any]) -> None:
        finding(report, "cache.prefill_gain").update(status="missing", reason="the cache probe stopped")

    outcome = judge(*pair(tmp_path / "b", lost))
    assert outcome.verdict == "incomplete" and any(m.startswith("cache.prefill_gain") for m in outcome.missing)


def test_environment_drift_is_named_and_secrets_never_written(tmp_path: Path) -> None:
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": SECRET, "LANG": "C.UTF-8"}
    today_env = {**env, "VLLM_CPU_KVCACHE_SPACE": "4", "HF_TOKEN": SECRET + "x"}
    base_dir, today_dir = pair(tmp_path, env=env, today_env=today_env)
    outcome = judge(base_dir, today_dir)
    assert outcome.verdict == "drifted" and not outcome.signed_decision_holds
    by = {d.what: d for d in outcome.drifts}
    assert (by["environment VLLM_CPU_KVCACHE_SPACE: changed"].baseline, by[
        "environment VLLM_CPU_KVCACHE_SPACE: changed"].today) == ("1", "4")
    assert by["environment HF_TOKEN: changed"].today == "***REDACTED***"
    written = write_recheck(base_dir, today_dir, outcome)
    for path in written:
        assert SECRET not in path.read_text(), path
    record = json.loads(RunDir(today_dir).report_file("recheck.json").read_text())
    assert "environment HF_TOKEN: changed" in [d["what"] for d in record["drifts"]]   # named, its value not


def test_a_secret_argument_is_named_never_written(tmp_path: Path) -> None:
    key = "sk-live-" + SECRET
    base_dir, today_dir = pair(tmp_path, lambda r: args_of(r).update(api_key=key))
    outcome = judge(base_dir, today_dir)
    [drift] = outcome.drifts
    assert drift.what == "--api-key: added" and drift.today == "***REDACTED***" and outcome.verdict == "drifted"
    for path in write_recheck(base_dir, today_dir, outcome):
        assert SECRET not in path.read_text(), path
    assert "--api-key: added" in RunDir(today_dir).report_file("recheck.md").read_text()


def test_the_report_files_and_the_lineage(tmp_path: Path) -> None:
    base_dir, today_dir = pair(tmp_path, lambda r: args_of(r).update(tool_call_parser="llama3_json"))
    written = write_recheck(base_dir, today_dir, judge(base_dir, today_dir))
    names = sorted(p.name for p in written)
    assert names == ["junit.xml", "recheck.html", "recheck.json", "recheck.md", "rechecks.jsonl"]
    record = json.loads(RunDir(today_dir).report_file("recheck.json").read_text())
    assert record["schema_version"] == "recheck/1" and record["verdict"] == "reopen"
    assert record["exit_code"] == RECHECK_EXIT_CODES["reopen"]
    html = RunDir(today_dir).report_file("recheck.html").read_text()
    assert "exit code 60" in html and "--tool-call-parser: changed" in html and "llama3_json" in html
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert 'failures="1"' in RunDir(today_dir).report_file("junit.xml").read_text()
    # a second re-check of the same signed run lists the first
    second = tmp_path / "reports" / "lab" / "20261208T030000Z-generated"
    second.mkdir()
    RunDir(second).report_json.write_text(RunDir(base_dir).report_json.read_text().replace(
        BASE_ID, second.name))
    write_recheck(base_dir, second, judge(base_dir, second))
    lineage = read_lineage(base_dir)
    assert [x["verdict"] for x in lineage] == ["reopen", "still_accepted"]
    assert RunDir(base_dir).rechecks_log.is_file()
    html = RunDir(second).report_file("recheck.html").read_text()
    assert "20261207T030000Z-generated" in html and 'class="previous"' in html
    md = RunDir(second).report_file("recheck.md").read_text()
    assert "20261207T030000Z-generated `reopen`" in md


def test_the_window_metrics_against_the_baseline(tmp_path: Path) -> None:
    healthy = {"requests": 400, "errors": 0, "preemptions": 0, "prefix_cache_queries": 20000,
               "prefix_cache_hits": 6000, "tool_calls": 299, "tool_parse_failures": 0}
    outcome = judge(*pair(tmp_path, lambda r: window(r, **healthy), rates=True))
    assert outcome.verdict == "still_accepted", (outcome.reasons, outcome.missing)
    assert outcome.details["rates"]["tool_parse_failures"]["judged"] == "held"

    failing = {**healthy, "tool_parse_failures": 45, "errors": 80, "prefix_cache_hits": 1000}
    outcome = judge(*pair(tmp_path / "b", lambda r: window(r, **failing), rates=True))
    assert outcome.verdict == "drifted" and not outcome.signed_decision_holds
    checks = {d.check: d for d in outcome.drifts}
    assert set(checks) == {"drift.tool_parse_failures", "drift.error_rate", "drift.cache_rate"}
    assert checks["drift.tool_parse_failures"].today["events"] == 45
    assert checks["drift.cache_rate"].today == 0.05 and checks["drift.cache_rate"].baseline[0] > 0.13
    assert not outcome.missing

    # a proven regression is certain whatever else is missing: drifted, the unresolved rate listed
    unresolved = {**healthy, "errors": 30, "tool_parse_failures": 45}
    outcome = judge(*pair(tmp_path / "c", lambda r: window(r, **unresolved), rates=True))
    assert outcome.verdict == "drifted" and [d.check for d in outcome.drifts] == ["drift.tool_parse_failures"]
    assert any(m.startswith("request error rate") and "not proven worse" in m for m in outcome.missing)
    # ... and without the regression it is incomplete
    outcome = judge(*pair(tmp_path / "d", lambda r: window(r, **{**healthy, "errors": 30}), rates=True))
    assert outcome.verdict == "incomplete"
