"""A run's files bound together (issue 42, item 7): run.json records the sha256 of the frozen profile when the run
is opened and of every file the verdict judged when it is taken; `report`, `sign` and `diff` refuse (exit 2) a run
whose files changed since, naming the file; an untouched run signs; a run opened before the binding is readable by
`report` and never signed."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from vllm_acceptance import cli
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.core.rundir import JUDGED_KEY, PROFILE_SHA_KEY, open_run, read_binding
from vllm_acceptance.report.build import build_report
from vllm_acceptance.report.write import write_reports

REPO = Path(__file__).resolve().parents[2]
SAMPLES_PATH = REPO / "tests" / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples_binding", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)

SIGN = ["--reviewer", "L. Chen (SRE)", "--decision", "limited_observation"]


def finished(kind: str, root: Path) -> Path:
    """A finished run: opened (profile frozen and bound, as open_run does), judged, its four documents written."""
    run_dir, report = samples.build(kind, root)
    write_reports(run_dir, report)
    return run_dir


def relabel(run_dir: Path) -> None:
    """The edit the issue names: the frozen profile renamed (and loosened) after the run, before signing."""
    frozen = run_dir / "evidence" / "profile.yml"
    text = frozen.read_text()
    assert "name: kimi-k3\n" in text
    frozen.write_text(text.replace("name: kimi-k3\n", "name: kimi-k3-approved\n"))


def test_open_run_records_the_frozen_profiles_sha256(tmp_path: Path) -> None:
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path, inventory="lab", hosts=[],
                          variables={"acceptance_profile": "cpu-lab", "acceptance_owner": "me",
                                     "vllm_serve_mode": "launch"})
    run = json.loads((run_dir / "run.json").read_text())
    assert run[PROFILE_SHA_KEY] == hashlib.sha256((run_dir / "evidence" / "profile.yml").read_bytes()).hexdigest()
    assert read_binding(run_dir).state == "open" and read_binding(run_dir).intact


def test_the_verdict_records_every_judged_file(tmp_path: Path) -> None:
    run_dir = finished("limited", tmp_path)
    judged = json.loads((run_dir / "run.json").read_text())[JUDGED_KEY]
    on_disk = {p.relative_to(run_dir).as_posix() for top in ("evidence", "findings", "stages")
               for p in (run_dir / top).rglob("*") if p.is_file()}
    assert set(judged["manifest"]) == on_disk and "evidence/profile.yml" in on_disk
    assert judged["manifest"]["findings/load.json"] == hashlib.sha256(
        (run_dir / "findings" / "load.json").read_bytes()).hexdigest()
    assert judged["report_sha256"] == hashlib.sha256((run_dir / "report.json").read_bytes()).hexdigest()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run_files"]["state"] == "bound" and report["run_files"]["files"] == len(on_disk)


def test_an_untouched_run_reports_diffs_and_signs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = finished("limited", tmp_path)
    other = finished("release", tmp_path)
    assert cli.main(["report", "--run-dir", str(run_dir)]) == 10          # judged again: same files, same verdict
    assert cli.main(["diff", str(run_dir), str(other)]) == 0
    assert cli.main(["sign", str(run_dir), *SIGN]) == 0
    signoff = json.loads((run_dir / "signoff.json").read_text())
    assert signoff["run_files"]["files"] > 0 and signoff["run_files"]["profile_sha256"]
    assert "refused" not in capsys.readouterr().err


def test_a_relabelled_profile_is_refused_by_report_sign_and_diff(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = finished("limited", tmp_path)
    other = finished("release", tmp_path)
    report_before = (run_dir / "report.json").read_text()
    relabel(run_dir)
    for argv in (["report", "--run-dir", str(run_dir)], ["sign", str(run_dir), *SIGN],
                 ["diff", str(other), str(run_dir)]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "evidence/profile.yml: changed" in err and "re-run the acceptance" in err, (argv, err)
    assert (run_dir / "report.json").read_text() == report_before          # nothing judged again
    assert not (run_dir / "signoff.json").exists()


def test_profile_edited_before_the_verdict_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Between open_run and the report stage the frozen profile is bound already: a relabel there is refused too."""
    run_dir, _ = samples.build("limited", tmp_path)       # opened and bound, not yet reported
    relabel(run_dir)
    assert cli.main(["report", "--run-dir", str(run_dir)]) == 2
    assert "evidence/profile.yml: changed since the run was opened" in capsys.readouterr().err
    assert not (run_dir / "report.json").exists()


@pytest.mark.parametrize("edit,named", [
    (lambda d: (d / "findings" / "load.json").write_text("[]\n"), "findings/load.json: changed"),
    (lambda d: (d / "stages" / "agent.json").unlink(), "stages/agent.json: removed"),
    (lambda d: (d / "findings" / "extra.json").write_text("[]\n"), "findings/extra.json: added"),
    (lambda d: (d / "report.json").write_text((d / "report.json").read_text().replace(
        '"verdict": "limited_observation"', '"verdict": "release"')), "report.json: changed"),
])
def test_any_judged_file_changed_since_the_verdict_stops_signing(tmp_path: Path, edit, named: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = finished("limited", tmp_path)
    edit(run_dir)
    assert cli.main(["sign", str(run_dir), *SIGN]) == 2
    err = capsys.readouterr().err
    assert named in err and "re-run the acceptance" in err
    assert not (run_dir / "signoff.json").exists()


def test_a_run_from_before_the_binding_is_readable_but_never_signed(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = samples.make_run("limited", tmp_path)       # as runs were written before: no profile_sha256
    (run_dir / "evidence" / "profile.yml").write_text(samples.profile_for("limited", tmp_path).read_text())
    assert cli.main(["report", "--run-dir", str(run_dir)]) == 10
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "limited_observation" and report["run_files"]["state"] == "unbound"
    assert JUDGED_KEY not in json.loads((run_dir / "run.json").read_text())   # never bound after the fact
    assert cli.main(["sign", str(run_dir), *SIGN]) == 2
    assert "cannot be proven" in capsys.readouterr().err
    assert not (run_dir / "signoff.json").exists()


def test_build_report_through_the_api_refuses_a_changed_run(tmp_path: Path) -> None:
    run_dir = finished("limited", tmp_path)
    profile = load_profile(run_dir / "evidence" / "profile.yml")
    (run_dir / "evidence" / "serve" / "planted.txt").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "evidence" / "serve" / "planted.txt").write_text("ok\n")
    with pytest.raises(cli.ConfigError, match="evidence/serve/planted.txt: added since the verdict"):
        build_report(run_dir, profile)
