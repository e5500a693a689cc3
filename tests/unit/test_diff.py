"""diff_runs: what changed between two acceptance runs (verdict, versions, findings, figures)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.report.diff import RunNotFound, diff_runs, render_diff_text

SAMPLES_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples_diff", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run directories with report.json written the way build_report makes it (no rendering needed)."""
    root = tmp_path_factory.mktemp("diffruns")
    out = {}
    for kind in ("release", "limited", "rebuild", "incomplete"):
        run_dir, report = samples.build(kind, root)
        (run_dir / "report.json").write_text(json.dumps(report, default=str))
        out[kind] = run_dir
    return out


def by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in rows}


def test_verdict_findings_and_figures_release_to_limited(runs: dict[str, Path]) -> None:
    d = diff_runs(runs["release"], runs["limited"])
    assert d["verdict"] == {"a": "release", "b": "limited_observation", "changed": True}
    changed = {r["id"]: (r["a"], r["b"]) for r in d["findings"]["changed"]}
    assert changed == {"capacity.ramp": ("pass", "fail"), "agent.tool_call": ("pass", "warn")}
    assert d["findings"]["added"] == [] and d["findings"]["removed"] == []
    figures = by_key(d["figures"])
    assert figures["load.knee"]["a"] == 64 and figures["load.knee"]["b"] == 48
    assert figures["load.knee"]["delta"] == -16
    assert figures["agent.schema_accuracy"]["b"] == pytest.approx(0.994)
    assert "load.contract_concurrency" not in figures  # unchanged figures are not listed
    text = render_diff_text(d)
    assert "verdict: release -> limited_observation" in text
    assert "~ capacity.ramp: pass -> fail" in text
    assert "load.knee: 64 -> 48  (-16)" in text


def test_versions_and_gates_release_to_rebuild(runs: dict[str, Path]) -> None:
    d = diff_runs(runs["release"], runs["rebuild"])
    env = by_key(d["environment"])
    assert env["node.gb300-node2.driver_version"]["a"] == "580.82.07"
    assert env["node.gb300-node2.driver_version"]["b"] == "575.57.08"
    assert env["node.gb300-node1.cuda_runtime"]["b"] == "12.9"
    assert "node.gb300-node1.driver_version" not in env  # node1 kept its driver
    assert d["gates"]["text"] == {"a": True, "b": False, "changed": True}
    text = render_diff_text(d)
    assert "node.gb300-node2.driver_version: 580.82.07 -> 575.57.08" in text
    assert "text traffic gate: open -> blocked" in text


def test_added_and_removed_findings(runs: dict[str, Path]) -> None:
    d = diff_runs(runs["release"], runs["incomplete"])
    removed = {r["id"] for r in d["findings"]["removed"]}
    changed = {r["id"]: (r["a"], r["b"]) for r in d["findings"]["changed"]}
    assert "compat.driver_branch@gb300-node2" in removed  # the unreachable node left no findings
    assert {"interconnect.nccl_bandwidth", "agent.separation", "agent.structured_output"} <= removed
    assert changed["agent.tool_call"] == ("pass", "missing")  # the skipped agent stage stands as missing
    assert d["findings"]["added"] == []
    text = render_diff_text(d)
    assert "- compat.driver_branch@gb300-node2: was pass" in text


def test_same_run_has_no_change_and_latest_link_works(runs: dict[str, Path]) -> None:
    latest = runs["limited"].parent / "latest-test"
    latest.symlink_to(runs["limited"].name)
    d = diff_runs(runs["limited"], latest / "report.json")
    assert not d["verdict"]["changed"]
    assert d["environment"] == [] and d["figures"] == []
    assert d["findings"] == {"added": [], "removed": [], "changed": []}
    assert "findings: no status change" in render_diff_text(d)


def test_not_a_run_directory(tmp_path: Path, runs: dict[str, Path]) -> None:
    with pytest.raises(RunNotFound, match="no report.json"):
        diff_runs(tmp_path, runs["release"])
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(RunNotFound, match="not valid JSON"):
        diff_runs(tmp_path, runs["release"])
