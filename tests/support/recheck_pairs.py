"""Pairs of run directories for the re-check's tests (tests/unit/test_recheck_judge.py,
tests/integration/test_recheck_chromium.py), generated from a real recorded lab run.

tests/fixtures/remediation/lab-release/report.json (run 20261201T162047Z-09f889 of accept.yml on the lab inventory,
released; that folder's README.md) is the signed baseline, signed here with report/signoff.py's record shape;
today's run is a copy of it with ONE fact altered per test. The agent rates come from the real lab run of
tests/fixtures/remediation/lab-flags-fail/report.json (0 of 299 format errors on the same cpu-lab profile), the
recorded lab-release predating the rate record. Today's run directory says `generated` in its name.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vllm_acceptance.core.rundir import RunDir
from vllm_acceptance.report.reopen import sha256_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "remediation"
RECORDED = json.loads((FIXTURES / "lab-release" / "report.json").read_text())
RATED = json.loads((FIXTURES / "lab-flags-fail" / "report.json").read_text())
BASE_ID = RECORDED["run_id"]
DIGEST = "sha256:9f2c4e1b7d3a5c6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
SECRET = "hf_QmV9sXy7TtZkP2wLr4NcA8dE"
Alter = Callable[[dict[str, Any]], None]


def finding(report: dict[str, Any], check: str) -> dict[str, Any]:
    return next(f for f in report["findings"] if f["check"] == check)


def with_real_rates(report: dict[str, Any]) -> None:
    """The agent rate records of the real lab run lab-flags-fail (same profile) on the baseline's agent checks."""
    for check in ("agent.tool_call", "agent.schema_accuracy", "agent.separation"):
        real = finding(RATED, check)
        mine = finding(report, check) if any(f["check"] == check for f in report["findings"]) else None
        if mine is None:
            report["findings"].append(copy.deepcopy(real))
        else:
            mine["observed"] = copy.deepcopy(real["observed"])


def write_run(root: Path, run_id: str, report: dict[str, Any]) -> Path:
    run_dir = root / "reports" / "lab" / run_id
    run_dir.mkdir(parents=True)
    report = {**report, "run_id": run_id}
    RunDir(run_dir).report_json.write_text(json.dumps(report, indent=2))
    return run_dir


def live_process(run_dir: Path, env: dict[str, str]) -> None:
    """The preflight's live_process record (roles/preflight/files/live_process.py shape, tests/unit/
    test_attached_argv.py) of the serving process."""
    base = RunDir(run_dir).at("evidence", "preflight", "localhost")
    base.mkdir(parents=True)
    (base / "live_process.txt").write_text(json.dumps({"port": 8521, "pid": 4242, "argv": ["vllm", "serve"],
                                                       "env": env, "notes": [], "listeners": []}))
    (base / "live_process.json").write_text(json.dumps({"rc": 0, "stderr": "", "missing": False}))


def sign(run_dir: Path, decision: str = "release") -> None:
    record = {"schema": "signoff/1", "inventory": "lab", "run_id": run_dir.name, "reviewer": "sre-lead",
              "decision": decision, "verdict": "release", "signed_at": "2026-12-01T17:00:00Z", "limits": [],
              "report_sha256": sha256_file(RunDir(run_dir).report_json)}
    RunDir(run_dir).report_file("signoff.json").write_text(json.dumps(record))


def pair(tmp_path: Path, alter: Alter | None = None, *, rates: bool = False, env: dict[str, str] | None = None,
         today_env: dict[str, str] | None = None, signed: bool = True) -> tuple[Path, Path]:
    """A signed baseline (the recorded lab run) and today's run: its copy with `alter` applied."""
    base = copy.deepcopy(RECORDED)
    if rates:
        with_real_rates(base)
    base_dir = write_run(tmp_path, BASE_ID, base)
    today = copy.deepcopy(base)
    today["started"], today["finished"] = "2026-12-07T03:00:00+00:00", "2026-12-07T03:04:10Z"
    if alter:
        alter(today)
    today_dir = write_run(tmp_path, "20261207T030000Z-generated", today)
    if env is not None:
        live_process(base_dir, env)
        live_process(today_dir, today_env if today_env is not None else env)
    if signed:
        sign(base_dir)
    return base_dir, today_dir


def args_of(report: dict[str, Any]) -> dict[str, Any]:
    return finding(report, "compat.startup_log")["observed"]["non_default_args"]


def window(report: dict[str, Any], **counters: int) -> None:
    """Today's server counters over the re-check's window (report.json stages.window, recheck/run.py)."""
    report.setdefault("stages", {})["window"] = counters
