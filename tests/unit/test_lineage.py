"""A self-built image's lineage, reproducibility, results against the official run, and release scope
(rebuild/lineage.py), on the records playbooks/build_image.yml wrote (tests/fixtures/remediation/lineage:
build.json is a build's lineage.json, rebuild-same-inputs.json its reproduction from the recorded inputs,
rebuild-unpinned.json a reproduction whose digest moved with the same inputs (the fake docker's
.state/unpinned), kimi-k3-cu129.yml the experimental profile that build wrote)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.rebuild.lineage import (
    lineage_checks,
    lineage_complete,
    official_diff,
    release_scope,
    reproducible,
)
from vllm_acceptance.verdict import decide

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "remediation"
LIN = FIX / "lineage"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "reports"))
import samples  # noqa: E402 - the sample run builder lives with the fixtures


def record(name: str) -> dict[str, Any]:
    return json.loads((LIN / name).read_text())


def exp_profile() -> dict[str, Any]:
    return yaml.safe_load((LIN / "kimi-k3-cu129.yml").read_text())


def test_the_recorded_build_has_a_complete_lineage() -> None:
    finding = lineage_complete(exp_profile()["lineage"], today=dt.date(2026, 12, 1))
    assert finding.status == Status.PASS


@pytest.mark.parametrize("absent", [("source_branch",), ("dependency_sources", "compile_options"), ("patches",)])
def test_a_missing_lineage_field_names_itself(absent: tuple[str, ...]) -> None:
    lineage = {k: v for k, v in exp_profile()["lineage"].items() if k not in absent}
    finding = lineage_complete(lineage, today=dt.date(2026, 12, 1))
    assert finding.status == Status.FAIL
    assert [p.split(" ", 1)[0] for p in finding.reason.split("; ")] == list(absent)


def test_no_patch_is_recorded_as_an_empty_list_not_as_missing() -> None:
    lineage = {**exp_profile()["lineage"], "patches": []}
    assert lineage_complete(lineage, today=dt.date(2026, 12, 1)).status == Status.PASS


def test_a_passed_exit_date_fails_the_lineage() -> None:
    finding = lineage_complete(exp_profile()["lineage"], today=dt.date(2099, 2, 1))
    assert finding.status == Status.FAIL and "exit_date 2099-01-31 has passed" in finding.reason


def test_rebuild_from_the_recorded_inputs_gives_the_same_digest() -> None:
    finding = reproducible(record("build.json"), record("rebuild-same-inputs.json"))
    assert finding.status == Status.PASS and finding.observed["differences"] == []


def test_an_unpinned_build_is_not_reproducible_with_the_same_inputs() -> None:
    finding = reproducible(record("build.json"), record("rebuild-unpinned.json"))
    assert finding.status == Status.FAIL and "not deterministic" in finding.reason
    assert finding.observed["recorded_digest"] != finding.observed["rebuilt_digest"]


def test_a_rebuild_from_other_inputs_lists_the_differences() -> None:
    rebuilt = record("rebuild-unpinned.json")  # the unpinned rebuild, its lock file edited here (generated)
    rebuilt["inputs"] = {**rebuilt["inputs"], "src/requirements/cuda.txt": "0" * 64}
    rebuilt["compile_options"] = {"CUDA_VERSION": "12.9.0"}
    finding = reproducible(record("build.json"), rebuilt)
    assert finding.status == Status.FAIL
    assert [d["field"] for d in finding.observed["differences"]] == ["compile_options", "inputs"]
    assert "compile_options:" in finding.reason


def test_without_a_rebuild_reproducibility_is_missing_never_pass() -> None:
    assert reproducible(record("build.json"), None).status == Status.MISSING


def test_results_against_the_official_run() -> None:
    official = json.loads((FIX / "lab-release" / "report.json").read_text())
    same = official_diff(copy.deepcopy(official), official)
    assert same.status == Status.PASS
    worse = json.loads((FIX / "lab-k3-flags-and-fallback-fail" / "report.json").read_text())
    diff = official_diff(worse, official)
    assert diff.status == Status.FAIL
    assert "agent.tool_failure_fallback pass -> fail" in diff.reason
    assert official_diff(worse, None).status == Status.MISSING


def scope_of(profile: dict[str, Any], rebuilt: str | None = "rebuild-same-inputs.json") -> Finding:
    return lineage_checks(profile, build=record("build.json"), rebuilt=record(rebuilt) if rebuilt else None,
                          today=dt.date(2026, 12, 1))["compat.lineage.release_scope"]


def test_experimental_release_allowed_on_its_own_profile_and_labelled() -> None:
    scope = scope_of(exp_profile())
    assert scope.status == Status.PASS and "only" in scope.reason and "never" in scope.reason
    decision = decide([Finding("compat.driver_branch", Status.PASS, host="n1"), scope], experimental=True)
    assert decision.verdict == "release"
    assert any(r.startswith("EXPERIMENTAL release") and "kimi-k3-cu129 only" in r for r in decision.reasons)


@pytest.mark.parametrize("case", ["named as the official profile", "not reproducible", "not reproduced"])
def test_experimental_release_refused(case: str) -> None:
    profile = exp_profile()
    rebuilt: str | None = "rebuild-same-inputs.json"
    if case == "named as the official profile":
        profile["name"] = profile["lineage"]["base_profile"]
    rebuilt = {"not reproducible": "rebuild-unpinned.json", "not reproduced": None}.get(case, rebuilt)
    scope = scope_of(profile, rebuilt)
    assert scope.status == Status.FAIL
    decision = decide([Finding("compat.driver_branch", Status.PASS, host="n1"), scope], experimental=True)
    assert decision.verdict == "limited_observation"


def test_the_official_profile_is_never_released_with_a_self_built_lineage() -> None:
    official = load_profile(REPO / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml").data
    assert release_scope(official, {}).status == Status.NOT_APPLICABLE
    claimed = {**official, "lineage": exp_profile()["lineage"]}  # a self-built image on the official profile
    scope = release_scope(claimed, {})
    assert scope.status == Status.FAIL
    assert decide([Finding("compat.driver_branch", Status.PASS, host="n1"), scope]).verdict == "limited_observation"


def test_report_of_an_experimental_run_shows_the_lineage_checks_and_label(tmp_path: Path) -> None:
    """The sample experimental GB300 run (generated, tests/fixtures/reports/samples.py) judged on the profile
    build_image.yml wrote, its lineage.json and reproduction.json beside its build log."""
    build_dir = tmp_path / "build" / "evidence" / "build"
    build_dir.mkdir(parents=True)
    (build_dir / "lineage.json").write_text((LIN / "build.json").read_text())
    (build_dir / "reproduction.json").write_text((LIN / "rebuild-same-inputs.json").read_text())
    profile = exp_profile()
    profile["lineage"]["build_log"] = str(build_dir / "build.log")
    path = tmp_path / "kimi-k3-cu129.yml"
    path.write_text(yaml.safe_dump(profile))
    from vllm_acceptance.report.build import build_report
    from vllm_acceptance.report.render_md import render_markdown

    run_dir = samples.make_run("experimental", tmp_path / "runs")
    report = build_report(run_dir, load_profile(path))
    assert report["verdict"] == "release" and report["experimental"] is True
    assert report["lineage_checks"]["compat.lineage.reproducible"]["status"] == "pass"
    # No official-profile run beside it on this inventory: the comparison is missing, and named.
    assert report["lineage_checks"]["compat.lineage.official_diff"]["status"] == "missing"
    assert "EXPERIMENTAL release on the profile `kimi-k3-cu129` only" in render_markdown(report)
    # The inventory's last official-profile run beside it: the results are compared.
    official_dir, official = samples.build("release", tmp_path / "runs")
    (official_dir / "report.json").write_text(json.dumps(official, default=str))
    diff = build_report(run_dir, load_profile(path))["lineage_checks"]["compat.lineage.official_diff"]
    assert diff["status"] == "pass" and diff["observed"]["official_run"] == official_dir.name
    (build_dir / "reproduction.json").write_text((LIN / "rebuild-unpinned.json").read_text())
    assert build_report(run_dir, load_profile(path))["verdict"] == "limited_observation"


def test_lineage_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_acceptance import cli

    build_dir = tmp_path / "evidence" / "build"
    build_dir.mkdir(parents=True)
    (build_dir / "lineage.json").write_text((LIN / "build.json").read_text())
    profile = exp_profile()
    profile["lineage"]["build_log"] = str(build_dir / "build.log")
    path = tmp_path / "kimi-k3-cu129.yml"
    path.write_text(yaml.safe_dump(profile))
    assert cli.main(["lineage", str(path)]) == 3  # not reproduced yet
    (build_dir / "reproduction.json").write_text((LIN / "rebuild-same-inputs.json").read_text())
    assert cli.main(["lineage", str(path)]) == 0
    assert cli.main(["lineage", str(path), "--rebuild", str(LIN / "rebuild-unpinned.json")]) == 1
    assert "not deterministic" in capsys.readouterr().out
