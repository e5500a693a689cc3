"""A run is judged on the profile it ran with (issue 28, item 2): `report --profile OTHER` is refused (exit 2)
and a report judged on another profile is never signed."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from vllm_acceptance import cli
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.report.build import build_report
from vllm_acceptance.report.sign import sign_run
from vllm_acceptance.report.signoff import SignRefused
from vllm_acceptance.report.write import write_reports

REPO = Path(__file__).resolve().parents[2]
SAMPLES_PATH = REPO / "tests" / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples_judged_profile", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)


def lab_run(root: Path) -> Path:
    """A recorded run (the release sample's findings) that ran with the CPU lab profile, frozen as open_run does."""
    run_dir = samples.make_run("release", root)
    run = json.loads((run_dir / "run.json").read_text())
    run.update(profile="cpu-lab", signoff={"deployment_engineer": "A. Ivanova"})
    (run_dir / "run.json").write_text(json.dumps(run))
    shutil.copy(REPO / "profiles" / "cpu-lab.yml", run_dir / "evidence" / "profile.yml")
    return run_dir


def test_report_with_another_profile_is_refused_naming_the_frozen_one(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = lab_run(tmp_path / "reports")
    code = cli.main(["report", "--run-dir", str(run_dir), "--profile", str(REPO / "profiles" / "kimi-k3.yml")])
    err = capsys.readouterr().err
    assert code == 2
    assert "'kimi-k3'" in err and "'cpu-lab'" in err and "evidence/profile.yml" in err
    assert not (run_dir / "report.json").exists()                    # nothing judged, nothing to sign


def test_report_without_profile_uses_the_frozen_one_and_the_same_profile_is_accepted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = lab_run(tmp_path / "reports")
    cli.main(["report", "--run-dir", str(run_dir)])
    assert json.loads((run_dir / "report.json").read_text())["profile"] == "cpu-lab"
    cli.main(["report", "--run-dir", str(run_dir), "--profile", str(REPO / "profiles" / "cpu-lab.yml")])
    assert "vllm-acceptance:" not in capsys.readouterr().err
    assert json.loads((run_dir / "report.json").read_text())["profile"] == "cpu-lab"


def test_an_edited_copy_of_the_run_profile_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = lab_run(tmp_path / "reports")
    edited = tmp_path / "cpu-lab.yml"
    edited.write_text((REPO / "profiles" / "cpu-lab.yml").read_text().replace("concurrency: 4", "concurrency: 1"))
    assert cli.main(["report", "--run-dir", str(run_dir), "--profile", str(edited)]) == 2
    assert "a different version of profile 'cpu-lab'" in capsys.readouterr().err


def test_sign_refuses_a_report_judged_on_another_profile(tmp_path: Path) -> None:
    run_dir = lab_run(tmp_path / "reports")
    report = build_report(run_dir, load_profile(REPO / "profiles" / "kimi-k3.yml"))   # the what-if, through the API
    write_reports(run_dir, report)
    with pytest.raises(SignRefused, match="judged on profile 'kimi-k3', but the run ran with 'cpu-lab'"):
        sign_run(run_dir, reviewer="L. Chen (SRE)", decision=report["verdict"], limits=["8 concurrent"])
    assert not (run_dir / "signoff.json").exists()
