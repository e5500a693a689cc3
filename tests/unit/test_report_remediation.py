"""A report whose compatibility chain failed names the remediation route and its command."""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_acceptance.report.write import write_reports

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "reports"))
import samples  # noqa: E402 - the sample run builder lives with the fixtures


def test_rebuild_report_names_route_and_command(tmp_path: Path) -> None:
    run_dir, report = samples.build("rebuild", tmp_path)
    assert report["verdict"] == "rebuild_environment"
    route = report["remediation"]
    assert route["name"] and route["command"].startswith("ansible-playbook")
    write_reports(run_dir, report)
    assert route["command"] in (run_dir / "report.html").read_text().replace("&lt;", "<").replace("&gt;", ">")
    assert "Remediation route" in (run_dir / "report.md").read_text()


def test_release_report_has_no_remediation(tmp_path: Path) -> None:
    _, report = samples.build("release", tmp_path)
    assert "remediation" not in report
