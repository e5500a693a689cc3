"""reports/<inventory>/latest always points at a run directory, also when re-reporting through `latest`."""

from __future__ import annotations

from pathlib import Path

from vllm_acceptance.report.build import point_latest


def test_latest_points_at_the_run_and_survives_being_passed_itself(tmp_path: Path) -> None:
    run = tmp_path / "lab" / "20261130T000000Z-abc123"
    run.mkdir(parents=True)
    point_latest(run)
    latest = tmp_path / "lab" / "latest"
    assert latest.resolve() == run.resolve()
    point_latest(latest)  # `vllm-acceptance report --run-dir reports/lab/latest`
    assert latest.is_symlink() and latest.resolve() == run.resolve()
    other = tmp_path / "lab" / "20261130T000001Z-def456"
    other.mkdir()
    point_latest(other)
    assert latest.resolve() == other.resolve()
