#!/usr/bin/python
"""Ansible module: run vLLM as a detached process (the lab's `process` runtime) and wait for it."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_process
short_description: Start or stop a detached vLLM OpenAI server process and wait until it is ready
description:
  - The C(process) runtime of the vllm_serve role (the lab; a bare-metal node without containers).
    Starts C(python -m vllm.entrypoints.openai.api_server) in its own session, writes a pid file and the
    full startup log from its first line, and waits for C(/health) with a bounded timeout.
  - Fails, with the startup log's last lines, when the process exits before it is ready. It never retries.
  - With O(wait=false) it returns right after the start; O(state=ready) then waits a slice of O(wait_s)
    seconds at a time, so that a role can loop on it and show progress while vLLM loads (minutes on a
    large model). O(state=ready) never fails on a slow start; it returns C(ready), C(exited) and the
    startup log's last line, and the caller decides.
  - Runs on the host that serves; in the lab that is localhost.
options:
  state:
    description: C(started), C(ready) (wait a slice for the started process) or C(stopped).
    type: str
    choices: [started, ready, stopped]
    default: started
  python:
    description: The interpreter of the vLLM environment.
    type: path
  model:
    description: Model path or name.
    type: str
  served_model_name:
    description: The name clients use.
    type: str
  host:
    description: Listen address.
    type: str
    default: 127.0.0.1
  port:
    description: Listen port.
    type: int
    default: 8000
  args:
    description: vLLM flags (the profile's launch args plus site extras).
    type: list
    elements: str
    default: []
  env:
    description: Environment for the server (the profile's launch env). Values are never logged.
    type: dict
    default: {}
  log_path:
    description: Where the startup log goes.
    type: path
    required: true
  pid_path:
    description: The pid file.
    type: path
    required: true
  ready_timeout_s:
    description: Seconds to wait for C(/health) (O(state=started) with O(wait=true)).
    type: float
    default: 300
  wait:
    description: With O(state=started), wait for C(/health) before returning.
    type: bool
    default: true
  wait_s:
    description: With O(state=ready), the slice of seconds to wait in this call.
    type: float
    default: 15
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Start the lab server
  acceptance_process:
    python: .venv-lab/bin/python
    model: .lab/models/tiny-agent
    served_model_name: tiny-agent
    port: 8011
    args: [--enable-prefix-caching, --max-model-len=2048]
    log_path: .lab/vllm.log
    pid_path: .lab/vllm.pid

- name: Start without waiting, then wait in slices (a retry line every 15 s shows progress)
  acceptance_process:
    python: .venv-lab/bin/python
    model: .lab/models/tiny-agent
    served_model_name: tiny-agent
    port: 8011
    wait: false
    log_path: .lab/vllm.log
    pid_path: .lab/vllm.pid
- name: Wait for /health
  acceptance_process:
    state: ready
    port: 8011
    log_path: .lab/vllm.log
    pid_path: .lab/vllm.pid
  register: ready
  until: ready.ready or ready.exited
  retries: 20
  delay: 0
"""

RETURN = r"""
pid:
  description: The server's process id.
  returned: when started
  type: int
base_url:
  description: The OpenAI base URL.
  returned: when started
  type: str
ready_s:
  description: Seconds from start to ready.
  returned: when started and ready
  type: float
ready:
  description: C(/health) answered.
  returned: with state=ready
  type: bool
exited:
  description: The process ended before it was ready (C(msg) carries the log tail).
  returned: with state=ready
  type: bool
last_log_line:
  description: The startup log's last line (what vLLM is doing now), secrets redacted.
  returned: with state=ready
  type: str
command:
  description: The launch command, secrets redacted.
  returned: when started
  type: str
"""

import time
import traceback
from pathlib import Path

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.core.redact import redact_text
    from vllm_acceptance.runtime import process as server
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def main() -> None:
    module = AcceptanceModule(
        argument_spec={
            "state": {"type": "str", "choices": ["started", "ready", "stopped"], "default": "started"},
            "python": {"type": "path"},
            "model": {"type": "str"},
            "served_model_name": {"type": "str"},
            "host": {"type": "str", "default": "127.0.0.1"},
            "port": {"type": "int", "default": 8000},
            "args": {"type": "list", "elements": "str", "default": []},
            # Not no_log: Ansible would then mask every "1" in all output; the profile env holds no secrets
            # and the launch command is redacted by the package before it is shown or saved.
            "env": {"type": "dict", "default": {}},
            "log_path": {"type": "path", "required": True},
            "pid_path": {"type": "path", "required": True},
            "ready_timeout_s": {"type": "float", "default": 300},
            "wait": {"type": "bool", "default": True},
            "wait_s": {"type": "float", "default": 15},
        },
        required_if=[("state", "started", ("python", "model", "served_model_name"))],
        run_dir=False, import_error=IMPORT_ERROR,
    )
    p = module.params
    pid_path = Path(p["pid_path"])
    if p["state"] == "stopped":
        running = server.read_pid(pid_path)
        if module.check_mode or not running:
            module.exit_json(changed=bool(running))
        module.exit_json(changed=server.stop(pid_path))
    if p["state"] == "ready":
        _wait_slice(module)
    if not Path(p["python"]).is_file():
        module.fail_json(msg=f"vLLM interpreter {p['python']} not found: "
                             "set vllm_serve_python, or run `make lab-venv`")
    spec = server.LaunchSpec(python=p["python"], model_path=p["model"], served_name=p["served_model_name"],
                             host=p["host"], port=p["port"], args=p["args"],
                             env={k: str(v) for k, v in p["env"].items()},
                             log_path=Path(p["log_path"]), pid_path=pid_path)
    command = redact_text(" ".join(spec.command()))
    if module.check_mode:
        module.exit_json(changed=True, command=command, base_url=spec.base_url)
    try:
        pid = server.start(spec)
        if not p["wait"]:
            module.exit_json(changed=True, pid=pid, base_url=spec.base_url, command=command)
        ready = server.wait_ready(spec.base_url, pid, p["ready_timeout_s"], spec.log_path)
    except server.LaunchError as exc:
        server.stop(pid_path)
        module.fail_json(msg=f"vLLM did not start: {exc}", command=command, log_path=str(spec.log_path))
    module.exit_json(changed=True, pid=pid, base_url=spec.base_url, ready_s=round(ready, 2), command=command)


def _wait_slice(module: AcceptanceModule) -> None:
    """state=ready: wait up to wait_s for the started process; report, never fail on slowness."""
    p = module.params
    pid_path, log_path = Path(p["pid_path"]), Path(p["log_path"])
    try:
        pid = int(pid_path.read_text().strip())
        started = pid_path.stat().st_mtime
    except (OSError, ValueError):
        module.fail_json(msg=f"no started vLLM process: {pid_path} is missing or empty; start it with "
                             "state=started first")
    base_url = f"http://{p['host']}:{p['port']}/v1"
    last = redact_text(server.tail_lines(log_path, 1).strip())[:300]
    if module.check_mode:
        module.exit_json(changed=False, ready=False, exited=False, last_log_line=last)
    try:
        server.wait_ready(base_url, pid, p["wait_s"], log_path)
    except server.ServerExited as exc:
        module.exit_json(changed=False, ready=False, exited=True, msg=f"vLLM did not start: {exc}",
                         last_log_line=last, pid=pid)
    except server.LaunchError:
        waited = time.time() - started
        module.exit_json(changed=False, ready=False, exited=False, pid=pid, waited_s=round(waited, 1),
                         last_log_line=redact_text(server.tail_lines(log_path, 1).strip())[:300],
                         msg=f"vLLM at {base_url} not ready after {waited:.0f} s; last log line: {last}")
    module.exit_json(changed=False, ready=True, exited=False, pid=pid, base_url=base_url,
                     ready_s=round(time.time() - started, 2))


if __name__ == "__main__":
    main()
