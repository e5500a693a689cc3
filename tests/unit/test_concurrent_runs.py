"""Two runs on the same inventory at once do not clobber each other: separate run directories,
complete reports written atomically, `latest` always pointing at a whole run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from vllm_acceptance.core.profile import load_schema

REPO = Path(__file__).resolve().parents[2]

WORKER = r"""
import sys
from pathlib import Path
from vllm_acceptance.core.findings import Finding, Status, write_findings
from vllm_acceptance.report.build import build_report, point_latest
from vllm_acceptance.report.write import write_reports
from vllm_acceptance.core.rundir import open_run

repo, reports = Path(sys.argv[1]), Path(sys.argv[2])
for i in range(int(sys.argv[3])):
    run_dir, profile = open_run(project_dir=repo, reports_dir=reports, inventory="lab", hosts=[],
                                variables={"acceptance_profile": "cpu-lab", "acceptance_owner": "me",
                                           "vllm_serve_mode": "launch"})
    write_findings(run_dir / "findings" / "cache.json",
                   [Finding(check="cache.hot_reuse", status=Status.PASS, evidence=["run.json"])])
    write_reports(run_dir, build_report(run_dir, profile))
    point_latest(run_dir)
"""


def test_parallel_runs_keep_separate_complete_reports(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(REPO), str(tmp_path), "4"]) for _ in range(3)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    runs = [p for p in (tmp_path / "lab").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(runs) == 12 and len({p.name for p in runs}) == 12
    schema = load_schema("report")
    for run in runs:
        report = json.loads((run / "report.json").read_text())
        jsonschema.validate(report, schema)
        assert report["run_id"] == run.name
        assert not list(run.rglob("*.tmp")) and not list(run.rglob(".*.tmp"))
    latest = tmp_path / "lab" / "latest"
    assert latest.is_symlink() and latest.resolve() in {r.resolve() for r in runs}
    assert (latest / "report.json").is_file()
