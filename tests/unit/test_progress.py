"""The progress callback: stages, bounds, findings as they land, bounded waits in words, the one line that
says why, and the same as JSON lines. A real ansible-playbook run with the callback, plus its pure logic."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_acceptance.progress import Progress, TaskInfo, stage_bounds, stage_of, wait_bound

REPO = Path(__file__).resolve().parents[2]
PROFILE = {"name": "p", "launch": {"ready_timeout_s": 900}, "load": {"request_timeout_s": 60, "stage_timeout_s": 300,
                                                                     "soak_s": 20, "ramp": [1, 2, 4]}}


def test_stage_is_read_from_module_role_file_and_probe_name() -> None:
    assert stage_of(TaskInfo("Open the run", action="acceptance_run")) == "validate"
    assert stage_of(TaskInfo("x", action="vllm.acceptance.acceptance_report")) == "report"
    serve = TaskInfo("Read /v1/models", action="ansible.builtin.uri", role="vllm.acceptance.vllm_serve")
    assert stage_of(serve) == "serve"
    assert stage_of(TaskInfo("Run the probe: load", action="acceptance_probe")) == "load"
    assert stage_of(TaskInfo("Stop", action="acceptance_process", path="/p/playbooks/report.yml:40")) == "report"
    assert stage_of(TaskInfo("Show it", action="ansible.builtin.debug")) is None


def test_events_written_to_disk_are_redacted(tmp_path: Path) -> None:
    """A failure reason can carry an SSH or proxy error with credentials in a URL: events.jsonl never keeps them."""
    events = tmp_path / "events.jsonl"
    progress = Progress(write=lambda _line: None, events_path=events)
    progress.emit("failed", host="gb300-a01", why="proxy http://alice:s3cr3t-pw@proxy:3128 refused; HF_TOKEN=hf_abc123")
    text = events.read_text()
    assert "s3cr3t-pw" not in text and "hf_abc123" not in text
    assert "proxy:3128" in text and "gb300-a01" in text


def test_bounds_come_from_the_profile() -> None:
    bounds = stage_bounds(PROFILE)
    assert bounds["serve"] == "ready within 15 min (launch.ready_timeout_s)"
    assert bounds["cache"] == "each request at most 60 s (load.request_timeout_s)"
    # the ramp as the load probe walks it (core/bounds.py ramp_plan: [1, 2, 4] to the default contract 4, then
    # doubling to 4 x 4), each step at most its stage timeout
    assert bounds["load"].startswith("ramp 1, 2, 4 then 8, 16 while under the ramp budget (5 steps), "
                                     "each at most 5 min")
    assert "soak 20 s" in bounds["load"]
    assert stage_bounds({**PROFILE, "cache": {"request_timeout_s": 30}})["cache"].endswith("(cache.request_timeout_s)")


def test_wait_bound_of_the_readiness_loops() -> None:
    # process runtime: 60 attempts of a 15 s module wait, no delay; container: 91 attempts 10 s apart
    assert wait_bound(3, 60, 0, 45.0, 15) == 900
    assert wait_bound(4, 91, 10, 30.2, None) == 900
    assert wait_bound(1, 0, 0, 1.0, None) is None


def test_findings_counts_and_events_land_in_the_run_dir(tmp_path: Path) -> None:
    lines: list[str] = []
    now = [0.0]
    progress = Progress(write=lines.append, clock=lambda: now[0])
    progress.task_start(TaskInfo("Open", action="acceptance_run"))
    now[0] = 2.0
    progress.ok("localhost", TaskInfo("Open", action="acceptance_run"),
                {"run_dir": str(tmp_path), "run_id": "r1", "profile": PROFILE})
    progress.task_start(TaskInfo("Judge", action="acceptance_serve"))
    (tmp_path / "findings").mkdir()
    (tmp_path / "findings" / "serve.json").write_text(json.dumps(
        [{"status": "pass"}, {"status": "pass"}, {"status": "fail"}]))
    now[0] = 47.0
    progress.host_start("localhost", "u1")
    now[0] = 92.0
    progress.retry("localhost", TaskInfo("Wait for /health (bounded)"), "u1", 3, 60, 0, 15)
    progress.ok("localhost", TaskInfo("Judge", action="acceptance_serve"), {})
    progress.end([])
    text = "\n".join(lines)
    assert "[00:02] serve     | started; bound: ready within 15 min (launch.ready_timeout_s)" in text
    assert "waiting for /health: 45 s of at most 15 min (attempt 3 of 60, localhost)" in text
    assert "findings: 1 fail, 2 pass (findings/serve.json)" in text
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["stage_start", "run"] and "waiting" in kinds and kinds[-1] == "end"
    assert next(e for e in events if e["event"] == "findings")["counts"] == {"pass": 2, "fail": 1}


PLAYBOOK = """
- name: Progress demo
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Judge the serve stage (writes findings, as acceptance_serve does)
      ansible.builtin.copy:
        dest: "{{ acceptance_run_dir }}/findings/serve.json"
        content: '[{"status": "pass"}, {"status": "warn"}]'
        mode: "0644"
    - name: Wait for /health (bounded)
      ansible.builtin.shell: >-
        echo x >> {{ acceptance_run_dir }}/tries; test $(wc -l < {{ acceptance_run_dir }}/tries) -ge 3
      register: wait
      until: wait.rc == 0
      retries: 4
      delay: 1
      changed_when: false
    - name: Stop for a reason
      ansible.builtin.fail:
        msg: "the server exited before it was ready: CUDA error\\nsecond line"
"""


def test_a_real_playbook_run_shows_stages_waits_findings_and_why(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    (run_dir / "evidence").mkdir()
    (run_dir / "evidence" / "profile.yml").write_text(json.dumps(PROFILE))
    book = tmp_path / "serve.yml"                      # the file name says the stage, as playbooks/serve.yml
    book.write_text(PLAYBOOK)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "progress",
           "ANSIBLE_NOCOLOR": "1", "VLLM_ACCEPTANCE_EVENTS": str(tmp_path / "copy.jsonl"),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"acceptance_run_dir={run_dir}", "-e", f"ansible_python_interpreter={sys.executable}",
                           str(book)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 2, out + proc.stderr
    assert "serve     | started; bound: ready within 15 min (launch.ready_timeout_s)" in out
    assert "findings: 1 warn, 1 pass (findings/serve.json)" in out
    assert "waiting for /health:" in out and "(attempt 2 of 5, localhost)" in out
    assert "FAILED - RETRYING" not in out and "TASK [" not in out
    assert "failed on localhost: Stop for a reason: the server exited before it was ready: CUDA error" in out
    # Said once (issue 43 item 6): the failure line and the message's other lines under it; the last line names the
    # task, Ansible's own error block does not repeat the message.
    assert out.count("the server exited before it was ready") == 1 and out.count("second line") == 1, out
    assert "[ERROR]" not in out + proc.stderr
    assert "stopped after" in out and "in stage serve: Stop for a reason failed on localhost (why: above)" in out
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == [json.loads(x)["event"] for x in
                                            (tmp_path / "copy.jsonl").read_text().splitlines()]
    assert {"stage_start", "findings", "waiting", "failed", "end"} <= {e["event"] for e in events}


SHORT_PLAYBOOK = """
- name: Short
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Write something
      ansible.builtin.copy:
        dest: "{{ out }}/x"
        content: "x"
        mode: "0644"
    - name: Say what would start
      ansible.builtin.debug:
        msg: "would start: vllm serve m --port 8000"
    - name: Say it per item
      ansible.builtin.debug:
        msg: "probe {{ item }} sends no traffic"
      loop: [cache, agent]
    - name: Quiet unless -vv
      ansible.builtin.debug:
        msg: "a detail"
        verbosity: 2
"""


def test_the_checkouts_default_is_progress_for_accept_yml_only(tmp_path: Path) -> None:
    """ansible.cfg sets the progress callback (issue 30): accept.yml prints the compact lines, keeping what debug
    tasks say and the recap; any other playbook keeps the default output (TASK [...] banners)."""
    env = {k: v for k, v in os.environ.items() if k != "ANSIBLE_STDOUT_CALLBACK"}
    env.update({"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    outputs = {}
    for name in ("accept.yml", "other.yml"):
        book = tmp_path / name
        book.write_text(SHORT_PLAYBOOK)
        proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                               "-e", f"out={tmp_path}", "-e", f"ansible_python_interpreter={sys.executable}",
                               str(book)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs[name] = proc.stdout
    compact, default = outputs["accept.yml"], outputs["other.yml"]
    assert "TASK [" not in compact and "TASK [Write something]" in default
    assert "localhost: would start: vllm serve m --port 8000" in compact
    assert compact.count("sends no traffic") == 2 and "a detail" not in compact
    for out in (compact, default):
        assert "PLAY RECAP" in out and "failed=0" in out
    assert len(compact.splitlines()) < len(default.splitlines())


# --- issue 43 item 6: one final line, said once ------------------------------------------------------------------

def _opened(tmp_path: Path, **kwargs: object) -> tuple[Progress, list[str]]:
    lines: list[str] = []
    progress = Progress(write=lines.append, clock=lambda: 0.0, **kwargs)  # type: ignore[arg-type]
    progress.task_start(TaskInfo("Open", action="acceptance_run"))
    progress.ok("localhost", TaskInfo("Open", action="acceptance_run"),
                {"run_dir": str(tmp_path / "run"), "run_id": "r1", "profile": PROFILE})
    progress.task_start(TaskInfo("Decide", action="acceptance_report"))
    return progress, lines


def test_check_mode_claims_no_verdict_and_keeps_nothing_in_its_scratch_directory(tmp_path: Path) -> None:
    """Before: "verdict incomplete" and "finished: verdict incomplete", then the CLI's "verdict: none (check mode)";
    and events.jsonl written into the check run's scratch directory (which is removed at its end)."""
    progress, lines = _opened(tmp_path, check=True)
    progress.ok("localhost", TaskInfo("Decide", action="acceptance_report"),
                {"verdict": "incomplete", "reasons": ["check mode: nothing was measured"]})
    progress.end([])
    text = "\n".join(lines)
    assert "verdict incomplete" not in text and progress.verdict is None
    assert lines[-1].endswith("end       | finished in 0 s: check mode, no verdict (nothing was measured)")
    assert not (tmp_path / "run").exists()


def test_the_verdict_gate_is_the_runs_one_final_line(tmp_path: Path) -> None:
    from vllm_acceptance.progress import GATE_TASK

    progress, lines = _opened(tmp_path)
    progress.ok("localhost", TaskInfo("Decide", action="acceptance_report"),
                {"verdict": "incomplete", "report": "/r/report.html", "reasons": ["missing or inconclusive evidence: "
                                                                                  "cache.reuse", "also failed: "
                                                                                  "capacity.soak"]})
    gate = "verdict incomplete fails this run (acceptance_fail_on: every verdict but release, the default): report " \
           "/r/report.html"
    progress.failed("localhost", TaskInfo(GATE_TASK, action="ansible.builtin.fail"), {"msg": gate})
    progress.end(["localhost"])
    assert "verdict incomplete: missing or inconclusive evidence: cache.reuse; also failed: capacity.soak" in lines[-3]
    assert lines[-1].endswith(f"end       | finished in 0 s: {gate}")
    assert sum(gate in line for line in lines) == 1 and not any("failed on" in line for line in lines)


def test_a_refusal_is_said_once_with_every_line_of_it(tmp_path: Path) -> None:
    lines: list[str] = []
    progress = Progress(write=lines.append, clock=lambda: 0.0)
    progress.task_start(TaskInfo("Open the run directory", action="acceptance_run"))
    progress.failed("localhost", TaskInfo("Open the run directory", action="acceptance_run"),
                    {"msg": "invalid inventory:\n  acceptence_owner: did you mean `acceptance_owner`?\n"
                            "  vllm_serve_port: 'eighty' is not an integer"})
    progress.end(["localhost"])
    text = "\n".join(lines)
    assert text.count("did you mean `acceptance_owner`") == 1 and text.count("'eighty' is not an integer") == 1
    assert "stopped after 0 s in stage validate: Open the run directory failed on localhost (why: above)" in lines[-1]
