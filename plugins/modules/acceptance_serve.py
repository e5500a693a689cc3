#!/usr/bin/python
"""Ansible module: judge the serve stage on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_serve
short_description: Judge the serve stage (startup log, actual configuration, model load)
description:
  - Saves the startup log and the launch command as evidence (secrets redacted), scans the log against the
    profile, reads the running server's actual configuration (C(vllm:cache_config_info), the process
    arguments, C(/v1/models)) and writes C(findings/serve.json) and C(stages/serve.json) in the run directory.
options:
  base_url:
    description: The server's OpenAI base URL.
    type: str
    required: true
  host:
    description: The inventory host that serves.
    type: str
  mode:
    description: C(launch) or C(attach).
    type: str
    choices: [launch, attach]
    default: launch
  launch_command:
    description: The exact launch command.
    type: str
  startup_log_path:
    description: A file on the controller holding the full startup log.
    type: path
  startup_log_text:
    description:
      - The startup log itself (attach - the output of vllm_serve_attach_log_command); wins over startup_log_path.
      - Never shown; saved redacted.
    type: str
  startup_log_error:
    description: Why the attached server's log command gave no log (its exit status); recorded as missing evidence.
    type: str
  startup_log_source:
    description:
      - Where an attached server's startup log came from (a file, a command on a host), named in the findings.
      - In attach mode such a log is used only when it matches the running server (compat.startup_log_identity).
    type: str
  ready_s:
    description: Seconds from launch to ready.
    type: float
  launch_error:
    description: Why the launch failed, when it did.
    type: str
  process_args:
    description: The running process's argv.
    type: list
    elements: str
  metrics_url:
    description: The server's C(/metrics) URL (default from base_url).
    type: str
  api_key:
    description: The server's API key, if any. Never written anywhere.
    type: str
  pools:
    description: A P/D deployment's pools (serve/pools.py serve_record), recorded in the serve stage's details.
    type: dict
    default: {}
extends_documentation_fragment:
  - vllm.acceptance.acceptance
  - vllm.acceptance.acceptance.profile
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Judge the serve stage
  acceptance_serve:
    run_dir: "{{ acceptance_run_dir }}"
    base_url: http://127.0.0.1:8011/v1
    startup_log_path: .lab/vllm.log
    ready_s: 44.2
"""

RETURN = r"""
statuses:
  description: Status of each serve finding by check id.
  returned: always
  type: dict
"""

import traceback
from pathlib import Path

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.serve.stage import ServeFacts, judge_serve
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def main() -> None:
    module = AcceptanceModule(
        argument_spec={
            "base_url": {"type": "str", "required": True},
            "host": {"type": "str"},
            "mode": {"type": "str", "choices": ["launch", "attach"], "default": "launch"},
            "launch_command": {"type": "str"},
            "startup_log_path": {"type": "path"},
            "startup_log_text": {"type": "str", "no_log": True},
            "startup_log_source": {"type": "str"},
            "startup_log_error": {"type": "str"},
            "ready_s": {"type": "float"},
            "launch_error": {"type": "str"},
            "process_args": {"type": "list", "elements": "str"},
            "metrics_url": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "pools": {"type": "dict", "default": {}},
        },
        profile=True, import_error=IMPORT_ERROR,
    )
    if module.check_mode:
        module.exit_json(changed=False, statuses={})
    p = module.params
    log_path = Path(p["startup_log_path"]) if p["startup_log_path"] else None
    log_text = log_path.read_text(errors="replace") if log_path and log_path.is_file() else None
    source = p["startup_log_source"] or (f"the file {log_path}" if log_path else None)
    if p["startup_log_text"] is not None:
        log_text = p["startup_log_text"]
    run, profile = module.run(), module.profile()
    facts = ServeFacts(base_url=p["base_url"], host=p["host"], mode=p["mode"], launch_command=p["launch_command"],
                       startup_log=log_text, ready_s=p["ready_s"], launch_error=p["launch_error"],
                       process_args=p["process_args"], metrics_url=p["metrics_url"], api_key=p["api_key"],
                       startup_log_source=source, startup_log_error=p["startup_log_error"], pools=p["pools"] or {})
    findings = module.guard(judge_serve, run.path, profile, facts)
    module.exit_json(changed=True, statuses={f.check: f.status.value for f in findings})


if __name__ == "__main__":
    main()
