"""Tool-call parse failures read from a vLLM server's log over a window (parsers/tool_parse_log.py; the re-check's
server window, recheck/run.py server_log_window). Fixtures: real vLLM 0.32 output (tests/fixtures/tool-parse-log/)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from vllm_acceptance.parsers.tool_parse_log import tool_parse_failures
from vllm_acceptance.recheck.run import server_log_window

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tool-parse-log"
FAILURE = (FIXTURES / "vllm-0.32-hermes-parse-failure.log").read_text()
HEALTHY = (FIXTURES / "vllm-0.32-lab-server-start.log").read_text()


def test_one_parse_failure_counts_once_not_per_traceback_line() -> None:
    window = tool_parse_failures(FAILURE)
    assert window.failures == 1 and window.streaming == 0
    assert window.first == window.last == "12-07 04:55:23"
    assert "Error in extracting tool call from response." in window.examples[0]
    assert window.lines_in_window == len(FAILURE.splitlines())


def test_a_healthy_server_log_has_none() -> None:
    window = tool_parse_failures(HEALTHY)
    assert window.failures == 0 and window.lines_in_window > 20   # the lines vLLM's logger wrote (not warnings.warn)


def test_the_window_bounds_what_is_counted() -> None:
    assert tool_parse_failures(FAILURE, since="12-07 04:55:24").failures == 0
    assert tool_parse_failures(FAILURE, until="12-07 04:55:22").failures == 0
    assert tool_parse_failures(FAILURE, since="12-07 04:55:23", until="12-07 04:55:23").failures == 1


def test_the_recheck_reads_the_server_log_over_its_window(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"inventory_vars": {"vllm_serve_startup_log": str(FIXTURES /
                                                                  "vllm-0.32-hermes-parse-failure.log")}}))
    start = time.mktime(time.strptime("2026-12-07 04:55:20", "%Y-%m-%d %H:%M:%S"))
    (run / "stages" / "serve.json").write_text(json.dumps({"judged_at": start}))
    seen = server_log_window(run, until=start + 10)
    assert seen["failures"] == 1 and seen["since"] == "12-07 04:55:20" and seen["until"] == "12-07 04:55:30"
    later = server_log_window(run, until=start + 60)
    (run / "stages" / "serve.json").write_text(json.dumps({"judged_at": start + 5}))
    assert server_log_window(run, until=start + 60)["failures"] == 0 and later["failures"] == 1


def test_no_log_is_said_never_zero(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"inventory_vars": {}}))
    (run / "stages" / "serve.json").write_text(json.dumps({"judged_at": time.time()}))
    seen = server_log_window(run)
    assert seen["failures"] is None and "no server log" in seen["reason"]
