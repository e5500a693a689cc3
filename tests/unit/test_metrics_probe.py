"""The metrics probe (probes/metrics/, docs/checks.md capacity.alert_series), judged on real /metrics captures
(tests/fixtures/real/metrics/, each with its source): the lab's vLLM 0.32 exports every series the generated
monitoring reads; the same server started with --disable-log-stats, and a vLLM 0.7 V1 server, do not."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.monitoring.generate import generate_dashboard, generate_rules
from vllm_acceptance.monitoring.series import DASHBOARD_SERIES, RULE_SERIES
from vllm_acceptance.probes.metrics import MetricsProbeConfig, judge_series, run_metrics_probe
from vllm_acceptance.report.build import collect_findings
from vllm_acceptance.runtime.metrics import DirectMetrics, parse_exposition

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "reports"))
import samples  # noqa: E402 - the sample run builder lives with the fixtures

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real" / "metrics"
CFG = MetricsProbeConfig()


def _judge(name: str):  # noqa: ANN202 - a Finding
    snap = parse_exposition((REAL / name).read_text())
    return judge_series(snap, CFG.rule_series, CFG.dashboard_series, CFG.older_names, source=name, evidence=[name])


def test_the_lab_server_exports_every_series_the_monitoring_reads() -> None:
    finding = _judge("vllm-0.32-cpu-lab.prom")
    assert finding.status == Status.PASS
    assert finding.observed["missing_rule_series"] == [] and finding.observed["missing_dashboard_series"] == []


def test_disable_log_stats_leaves_every_alert_without_its_series() -> None:
    finding = _judge("vllm-0.32-cpu-lab-disable-log-stats.prom")
    assert finding.status == Status.FAIL and finding.consequence == Consequence.LIMIT
    assert finding.observed["missing_rule_series"] == list(RULE_SERIES)
    # the parser's counter survives the flag: the dashboard's one series of its own is still there
    assert finding.observed["missing_dashboard_series"] == []
    assert "vllm:kv_cache_usage_perc" in finding.reason and "--disable-log-stats" in finding.action


def test_an_older_vllm_is_named_by_the_older_series_it_exports() -> None:
    finding = _judge("vllm-0.7-router-v1-gpu-cache-usage.prom")
    assert finding.status == Status.FAIL
    assert "vllm:kv_cache_usage_perc" in finding.observed["missing_rule_series"]
    assert "vllm:num_requests_running" not in finding.observed["missing_rule_series"]
    assert finding.observed["older_names_exported"] == {"vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc"}
    assert "vllm:gpu_cache_usage_perc for vllm:kv_cache_usage_perc" in finding.reason


def test_a_dashboard_only_series_missing_is_a_warning() -> None:
    text = "\n".join(line for line in (REAL / "vllm-0.32-cpu-lab.prom").read_text().splitlines()
                     if "tool_call_parser_invocations" not in line) + "\n"
    finding = judge_series(parse_exposition(text), CFG.rule_series, CFG.dashboard_series, CFG.older_names,
                           source="edited", evidence=[])
    assert finding.status == Status.WARN
    assert finding.observed["missing_dashboard_series"] == ["vllm:tool_call_parser_invocations_total"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_that_cannot_be_read_are_missing_never_a_pass(tmp_path: Path) -> None:
    source = DirectMetrics(f"http://127.0.0.1:{_closed_port()}/metrics", timeout_s=2)
    findings, details = run_metrics_probe(source, CFG, EvidenceStore(tmp_path))
    assert [f.status for f in findings] == [Status.MISSING] and "cannot read" in details["error"]


def test_families_declared_without_samples_are_missing(tmp_path: Path) -> None:
    class Recorded(DirectMetrics):
        def snapshot(self):  # noqa: ANN202 - the recorded text through the same parser
            return parse_exposition((REAL / "vllm-0.5-families-declared-no-samples.prom").read_text())

    findings, _ = run_metrics_probe(Recorded("recorded"), CFG, EvidenceStore(tmp_path))
    assert [f.status for f in findings] == [Status.MISSING] and "no samples" in findings[0].reason


@pytest.mark.parametrize("kind", samples.KINDS)
def test_the_series_lists_are_what_the_generated_monitoring_reads(kind: str, tmp_path: Path) -> None:
    """monitoring/series.py in step with the generated rule file and dashboard, for every profile."""
    _, report = samples.build(kind, tmp_path)
    read = re.compile(r"vllm:([a-z0-9_]+)")
    all_read: set[str] = set()
    for path in sorted((ROOT / "profiles").glob("*.yml")):
        profile = load_profile(path)
        rules = {f"vllm:{n}" for n in read.findall(json.dumps(generate_rules(report, profile)))}
        panels = {f"vllm:{n}" for n in read.findall(json.dumps(generate_dashboard(report, profile)))}
        assert rules <= set(RULE_SERIES), (path.name, rules - set(RULE_SERIES))
        assert panels - rules <= set(DASHBOARD_SERIES), (path.name, panels - rules)
        all_read |= rules
    assert all_read == set(RULE_SERIES)


def test_an_opt_in_probe_is_required_only_when_the_inventory_names_it(tmp_path: Path) -> None:
    run_dir, _ = samples.build("release", tmp_path)
    findings, _ = collect_findings(run_dir)
    assert not [f for f in findings if f.check in ("capacity.alert_series", "capacity.metrics_probe")]
    meta = json.loads((run_dir / "run.json").read_text())
    meta.setdefault("inventory_vars", {})["acceptance_probes"] = ["cache", "agent", "load", "metrics"]
    (run_dir / "run.json").write_text(json.dumps(meta))
    findings, _ = collect_findings(run_dir)
    named = [f for f in findings if f.check in ("capacity.alert_series", "capacity.metrics_probe")]
    assert [(f.check, f.status) for f in named] == [("capacity.alert_series", Status.MISSING)]
