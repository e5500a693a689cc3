"""The attached server's argv without a named pid (issue 42 item 3): the serve stage reads it from the process the
preflight found listening on the server's port on the head (evidence/preflight/HOST/live_process), so the startup
log is compared with what runs (serve/log_argv.py) and never left unbound when root could see the process.
The records are in the shape roles/preflight/files/live_process.py writes (the rehearsal's soak-host-memory-rising
run, cut to the fields read)."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_acceptance.serve.stage import ServeFacts, _attached_argv

ARGV = ["/opt/venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny-agent",
        "--port", "8000", "--max-model-len=2048"]


def node_record(run_dir: Path, host: str, answer: dict, rc: int = 0) -> None:
    base = run_dir / "evidence" / "preflight" / host
    base.mkdir(parents=True)
    (base / "live_process.txt").write_text(json.dumps(answer))
    (base / "live_process.json").write_text(json.dumps({"rc": rc, "stderr": "", "missing": False,
                                                        "timed_out": False}))


def test_the_preflights_listener_gives_the_argv_when_no_pid_is_named(tmp_path: Path) -> None:
    node_record(tmp_path, "gb300-a01", {"port": 8000, "pid": 16106, "argv": ARGV, "env": {},
                                        "source": "ss -ltnpH; /proc/16106/cmdline"})
    facts = ServeFacts(base_url="http://10.213.1.10:8000/v1", host="gb300-a01", mode="attach")
    source = _attached_argv(tmp_path, facts)
    assert facts.process_args == ARGV
    assert source is not None and "gb300-a01" in source and "pid 16106" in source


def test_a_listener_this_user_cannot_see_gives_no_argv(tmp_path: Path) -> None:
    node_record(tmp_path, "gb300-a01", {"port": 8000, "pid": None, "argv": None,
                                        "reason": "a process listens on port 8000 but ss shows no pid"})
    facts = ServeFacts(base_url="http://10.213.1.10:8000/v1", host="gb300-a01", mode="attach")
    assert _attached_argv(tmp_path, facts) is None
    assert facts.process_args is None


def test_a_failed_node_script_or_no_record_gives_no_argv(tmp_path: Path) -> None:
    node_record(tmp_path, "gb300-a01", {"port": 8000, "pid": 16106, "argv": ARGV}, rc=1)
    facts = ServeFacts(base_url="http://x:8000/v1", host="gb300-a01", mode="attach")
    assert _attached_argv(tmp_path, facts) is None and facts.process_args is None
    other = ServeFacts(base_url="http://x:8000/v1", host="gb300-a02", mode="attach")
    assert _attached_argv(tmp_path, other) is None and other.process_args is None


def test_a_named_pid_wins_and_a_launch_reads_its_own(tmp_path: Path) -> None:
    node_record(tmp_path, "gb300-a01", {"port": 8000, "pid": 16106, "argv": ARGV})
    named = ServeFacts(base_url="http://x:8000/v1", host="gb300-a01", mode="attach", process_args=["vllm", "serve"])
    assert _attached_argv(tmp_path, named) == "vllm_serve_pid (/proc/PID/cmdline)"
    assert named.process_args == ["vllm", "serve"]
    launched = ServeFacts(base_url="http://x:8000/v1", host="gb300-a01", mode="launch")
    assert _attached_argv(tmp_path, launched) is None and launched.process_args is None
