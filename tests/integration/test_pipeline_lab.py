"""The whole pipeline on the lab inventory: accept.yml through ansible-runner against real vLLM.

Runs in attach mode against the session's lab server (started once); `make demo` runs the same
playbook in launch mode.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from vllm_acceptance.core.profile import load_schema
from vllm_acceptance.core.redact import ENV_READ_PREFIXES, NOT_RECORDED, REDACTED
from vllm_acceptance.core.stage_details import StageDetails

from support.story import OTHER_SECRETS, PLANTED, SECRET_KEY, URL_SECRETS

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab_run(lab_accept_run: Path) -> Path:
    return lab_accept_run  # one accept.yml run per session (conftest), shared with the report tests


def test_report_contract(lab_run: Path) -> None:
    report = json.loads((lab_run / "report.json").read_text())
    jsonschema.validate(report, load_schema("report"))
    for key in ("schema_version", "inventory", "profile", "run_id", "started", "finished", "verdict", "findings"):
        assert key in report
    assert report["inventory"] == "lab" and report["profile"] == "cpu-lab" and report["run_id"] == lab_run.name
    assert report["verdict"] in {"release", "limited_observation", "rebuild_environment", "expand_capacity",
                                 "incomplete"}
    families = {f["check"].split(".")[0] for f in report["findings"]}
    assert {"compat", "capacity", "cache", "agent"} <= families
    for finding in report["findings"]:
        for path in finding["evidence"]:
            assert (lab_run / path).exists(), f"{finding['check']}: {path} missing"
        if finding["status"] in ("pass", "fail"):
            assert finding["evidence"], f"{finding['check']} judged without evidence"
    for name in ("report.html", "report.md", "junit.xml"):
        assert (lab_run / name).stat().st_size > 0
    assert report["server"]["state"] == "attached"      # not launched by the run: left running, and said so
    # What the nodes recorded was judged into the load stage after the probes (playbooks/probes.yml), once.
    after = json.loads((lab_run / "stages" / "load.json").read_text())["after_probes"]
    assert after["judged_at"] and after["memory_rows"] == 0 and after["changed"] == []  # CPU lab: no GPU series


def test_each_family_judged_from_real_evidence(lab_run: Path) -> None:
    findings = {(f["check"], f["host"]): f for f in json.loads((lab_run / "report.json").read_text())["findings"]}
    # GPU checks are explicitly not applicable on the CPU lab, never silently skipped.
    assert findings[("compat.driver_branch", "localhost")]["status"] == "not_applicable"
    assert findings[("compat.actual_config.prefix_caching", "localhost")]["status"] == "pass"
    # every cpu-lab flag is shown by the running server's own startup record (non-default args)
    assert findings[("compat.actual_config.flags", "localhost")]["status"] == "pass"
    # every other argument it runs with is listed; none limits capacity on the healthy lab (issue 28, item 4)
    unlisted = findings[("compat.actual_config.unlisted_args", "localhost")]
    assert unlisted["status"] == "pass" and "port" in unlisted["observed"]["unlisted"], unlisted
    assert findings[("cache.hot_reuse", None)]["status"] == "pass"
    assert findings[("capacity.context_contract", None)]["status"] == "pass"
    assert findings[("agent.tool_schemas", None)]["status"] == "pass"
    cache = json.loads((lab_run / "stages" / "cache.json").read_text())
    assert cache["requests"] and all(r["clean"] for r in cache["requests"])


def test_html_is_self_contained(lab_run: Path) -> None:
    html = (lab_run / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(http" not in html


def test_secrets_never_reach_evidence_or_reports(lab_signoff_story: dict) -> None:
    """A server that requires an API key, an HF token, URLs with credentials and other secret-bearing
    variables in the environment (the sign-off story's run B, tests/support/story.py): the run works with the
    key, and no planted value appears in any file the run wrote (its sign-off and restore record included),
    while the URLs' scheme, host, port and path stay readable in the node's env dump."""
    run_dir = lab_signoff_story["b"]
    report = json.loads((run_dir / "report.json").read_text())
    statuses = {f["check"]: f["status"] for f in report["findings"]}
    assert statuses["cache.hot_reuse"] == "pass"  # the key was used: the server answered
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(written) > 20
    for path in written:
        data = path.read_bytes()
        for secret in PLANTED:
            assert secret.encode() not in data, f"planted secret {secret} leaked into {path}"
    # The env dump is evidence (preflight on the lab node), written by allow-list (issue 42 item 6): a variable no
    # check reads is there by name only; a read one (VLLM_*) keeps its URL, credentials replaced, host and path kept.
    dumps = [p.read_text().splitlines() for p in written if p.name == "env.txt"]
    assert dumps, "no env dump among the evidence"
    for name in [*URL_SECRETS, *OTHER_SECRETS]:
        if name.startswith(ENV_READ_PREFIXES):
            continue
        assert any(f"{name}={NOT_RECORDED}" in d for d in dumps), name
    assert any(f"NCCL_AUTH_CREDENTIAL={REDACTED}" in d for d in dumps)
    assert any("VLLM_REMOTE_URL=http://***REDACTED***@remote.invalid:8000/v1" in d for d in dumps)
    # The startup log became evidence (redacted copy), accepted as this server's; our launch line in the raw log is
    # redacted too.
    assert (run_dir / "evidence" / "serve" / "startup.log").is_file()
    assert statuses["compat.startup_log_identity"] == "pass" and statuses["compat.startup_log"] != "missing"
    assert statuses["compat.server_location"] == "pass"   # the node judged (localhost) listens on the URL's port
    # read again after the probes by the same command: it grew (their requests), so it is kept for the soak window
    assert (run_dir / "evidence" / "serve" / "after-probes" / "localhost.log").is_file()
    assert f"--api-key {SECRET_KEY}" not in lab_signoff_story["b_log_first_line"]


def test_launch_mode_starts_judges_and_stops_the_lab_server(lab_launch_run: dict) -> None:
    """The demo's path: accept.yml launches vLLM from the profile, keeps the startup log, stops it at the end
    (the session's launch-mode run, conftest.lab_launch_run: the cache and load probes)."""
    run_dir, port = lab_launch_run["run_dir"], lab_launch_run["port"]
    serve = {f["check"]: f for f in json.loads((run_dir / "findings" / "serve.json").read_text())}
    assert serve["capacity.model_load"]["status"] == "pass" and serve["capacity.model_load"]["observed"]["ready_s"] > 0
    assert serve["compat.startup_log"]["status"] in ("pass", "warn")
    assert "--enable-prefix-caching" in (run_dir / "evidence" / "serve" / "launch-command.txt").read_text()
    pid_file = lab_launch_run["state_dir"] / "vllm.pid"
    assert not pid_file.exists(), "the server this run launched is still recorded as running"
    # gone, not only forgotten: its process is dead, its port closed, and the report says it was stopped
    record = json.loads((run_dir / "stages" / "teardown.json").read_text())
    assert record["action"] == "stopped" and record["runtime"] == "process" and record["gone"] is True
    with pytest.raises(ProcessLookupError):
        os.kill(int(record["pid"]), 0)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
    assert json.loads((run_dir / "report.json").read_text())["server"]["state"] == "stopped"
    report = json.loads((run_dir / "report.json").read_text())
    assert {f["check"] for f in report["findings"] if f["status"] == "missing"} >= {"agent.tool_call"}  # not run
    # The run launched the server, so the cache protocol's last request came after a real restart (the same
    # launch again, between two probe calls): a new process, an empty device cache.
    restart = next(f for f in report["findings"] if f["check"] == "cache.restart")
    assert restart["status"] == "pass", restart
    assert restart["observed"]["after"]["process_start"] > restart["observed"]["before"]["process_start"]
    assert "stopped and started again" in (run_dir / "probes" / "cache" / "restart.log").read_text()
    assert json.loads((run_dir / "stages" / "cache.json").read_text())["restart"]["prompt_tokens"] > 0
    # 24 KV blocks: the last session's hot B and control, sent between its hot A and round 1, need more than the
    # cache holds and evict hot A's tail (round 1 hits 1,152 of 1,664); round 1 is not judged, rounds 2 and 3
    # (each after the one before alone) hit the whole prefix (docs/checks.md cache.repeat_rounds).
    rounds = next(f for f in report["findings"] if f["check"] == "cache.repeat_rounds")
    assert rounds["status"] == "pass", rounds
    assert rounds["observed"][0]["judged"] is False and rounds["observed"][0]["window_blocks"] > 23
    assert [r["hits"] for r in rounds["observed"][1:]] == [r["expected"] for r in rounds["observed"][1:]]
    # The opt-in metrics probe, named in acceptance_probes, ran through the generic probe task after load: the
    # real server exports every series the generated monitoring reads (docs/checks.md capacity.alert_series).
    series = next(f for f in report["findings"] if f["check"] == "capacity.alert_series")
    assert series["status"] == "pass", series
    assert series["observed"]["series_read"] > 20 and series["evidence"] == ["probes/metrics/metrics.prom"]
    assert "vllm:kv_cache_usage_perc" in (run_dir / "probes" / "metrics" / "metrics.prom").read_text()
    # The report's readers take the stage details typed (core/stage_details.py): this real run's read back exactly.
    typed = StageDetails.of(report)
    for name, raw in report["stages"].items():
        if hasattr(typed, name) and isinstance(raw, dict):
            assert json.dumps(getattr(typed, name).document(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    assert typed.serve.max_model_len and typed.load.steps and typed.cache.requests
    assert typed.teardown.action == "stopped"


def test_check_mode_changes_nothing_and_shows_the_plan(tmp_path: Path) -> None:
    """--check: inputs validated, nodes read, the launch shown, no server started, no probe traffic,
    reports/ untouched."""
    reports = tmp_path / "reports"
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
           "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "--check", "-i",
                           str(REPO / "inventories" / "lab"), str(REPO / "accept.yml"),
                           "-e", f"acceptance_reports_dir={reports}", "-e", "vllm_serve_port=8028"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "would start:" in proc.stdout and "--enable-prefix-caching" in proc.stdout
    # The plan (playbooks/plan.yml, docs/plan.md): the launch as the run resolved it (-e outranks the inventory),
    # then the stages and their cost.
    plan = proc.stdout[proc.stdout.index("plan: inventory"):]
    assert "--port 8028" in plan.split("model_load", 1)[0]
    assert "soak" in plan and "total" in plan
    assert proc.stdout.count("probe sends no traffic") == 3
    assert "failed=0" in proc.stdout and "fatal:" not in proc.stdout
    assert "Using a template for task args is unsafe" not in proc.stdout + proc.stderr   # probe.yml names its args
    assert not reports.exists() or not any(reports.rglob("report.json"))
