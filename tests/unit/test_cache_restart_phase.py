"""The cache stage's second call after a restart made between two probe calls (playbooks/probes.yml): what it
does when the restart failed or the protocol before it did not complete, without a server. The measured
path (a real restart of the launched lab server) is in tests/integration/test_pipeline_lab.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Status, read_findings
from vllm_acceptance.core.rundir import RunDir
from vllm_acceptance.probes.stage import run_cache_restart_stage
from vllm_acceptance.rules import registry

ROOT = Path(__file__).resolve().parents[2]
PROFILE = str(ROOT / "profiles" / "cpu-lab.yml")
NOWHERE = "http://127.0.0.1:9/v1"   # never contacted on these paths


def first_call(tmp_path: Path, restart_point: dict | None) -> RunDir:
    run = RunDir(tmp_path)
    before = registry.get("cache.restart").not_applicable(None, "no restart was made")
    passed = registry.get("cache.hot_reuse").passed(observed=[], expected="hits")
    run.write_findings("cache", [passed, before])
    run.write_stage("cache", {"status": "pass", "block_size": 128, "restart_point": restart_point})
    return run


def test_a_failed_restart_makes_cache_restart_inconclusive_with_its_error(tmp_path: Path) -> None:
    run = first_call(tmp_path, {"session": "abc-3", "process_start": 1764640000.0})
    status, statuses, _ = run_cache_restart_stage(
        tmp_path, profile_path=PROFILE, base_url=NOWHERE, model="tiny-agent",
        restart_error="Wait for /health: timed out", restart_log="docker restart vllm-acceptance: failed after 600 s")
    assert statuses == {"cache.hot_reuse": "pass", "cache.restart": "inconclusive"} and status == "inconclusive"
    restart = next(f for f in read_findings(run.findings_path("cache")) if f.check == "cache.restart")
    assert restart.status == Status.INCONCLUSIVE and "Wait for /health: timed out" in restart.reason
    assert restart.evidence == ["probes/cache/restart.log"]
    assert (tmp_path / "probes" / "cache" / "restart.log").read_text().startswith("docker restart")
    stage = json.loads(run.stage_path("cache").read_text())
    assert stage["restart_error"] == "Wait for /health: timed out" and stage["block_size"] == 128


def test_an_incomplete_protocol_is_not_judged_after_the_restart(tmp_path: Path) -> None:
    first_call(tmp_path, None)
    _, statuses, _ = run_cache_restart_stage(tmp_path, profile_path=PROFILE, base_url=NOWHERE, model="tiny-agent")
    assert statuses["cache.restart"] == "inconclusive"


def test_without_the_first_call_it_refuses(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run the cache probe before"):
        run_cache_restart_stage(tmp_path, profile_path=PROFILE, base_url=NOWHERE, model="tiny-agent")
