"""roles/vllm_serve/tasks/relaunch.yml when the launch with the limit's flags is refused.

The limit relaunch stops the server this run launched and starts it again with a proposed limit's flags; the load
probe then measures "the relaunched server". When the start is refused (here: another process holds the port, as a
P/D run's router held it before playbooks/vars/probes.yml stopped relaunching P/D deployments), /health on that port
still answers 200 -- from the other process. The relaunch must be recorded as failed with vLLM's own reason, never
as a server relaunched with the limit (docs/checks.md capacity.verified_limit)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from support.hosts import REPO, ansible_bin, ansible_env

PLAY = """
- name: Relaunch at a limit
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Relaunch with the limit's flags
      ansible.builtin.include_role:
        name: vllm_serve
        tasks_from: relaunch
      vars:
        vllm_serve_relaunch_flags: [--max-num-seqs, "1"]
    - name: Keep what the relaunch recorded
      ansible.builtin.copy:
        content: "{{ vllm_serve_relaunch | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def port_held() -> Iterator[int]:
    """Another process's server on the port: answers /health 200 (as vllm-router does)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


def test_a_refused_relaunch_is_recorded_failed_though_the_port_answers(port_held: int, tmp_path: Path) -> None:
    play = tmp_path / "relaunch.yml"
    play.write_text(PLAY)
    out = tmp_path / "relaunch.json"
    extra = {"out": str(out), "ansible_python_interpreter": sys.executable, "vllm_serve_runtime": "process",
             "vllm_serve_state_dir": str(tmp_path / "state"),
             "vllm_serve_python": sys.executable, "vllm_serve_model_path": str(REPO / ".lab" / "models" / "tiny-agent"),
             "vllm_serve_served_name": "tiny-agent", "vllm_serve_listen_host": "127.0.0.1",
             "vllm_serve_client_host": "127.0.0.1", "vllm_serve_port": port_held, "vllm_serve_args": [],
             "vllm_serve_env": {}, "vllm_serve_ready_timeout_s": 30}
    (tmp_path / "state").mkdir()
    proc = subprocess.run([ansible_bin(), "-i", "localhost,", "-c", "local", str(play), "-e", json.dumps(extra)],
                          cwd=REPO, env=ansible_env(ANSIBLE_ROLES_PATH=str(REPO / "roles")), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["ok"] is False, record
    assert "already in use" in record["error"], record
    assert record["args"] == ["--max-num-seqs", "1"], record
