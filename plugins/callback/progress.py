# Apache-2.0 (see galaxy.yml)
"""Stdout callback: the pipeline stage, elapsed time, the stage's bound, findings as they land, the one line
that says why a task failed, and bounded waits in words; JSON lines in <run dir>/events.jsonl."""

from __future__ import annotations

DOCUMENTATION = r"""
name: progress
type: stdout
short_description: Pipeline progress of a vllm-acceptance run a person can follow
description:
  - >-
    Prints one line per event that matters - the stage entered (validate, preflight, serve, cache, agent, load,
    report) with its bound from the profile, the elapsed time, the counts of findings by status as each
    C(findings/<stage>.json) lands, the one line that says why a task failed, the verdict - and bounded waits
    as C(waiting for /health: 45 s of at most 900 s) instead of C(FAILED - RETRYING).
  - Writes the same as JSON lines to C(<run dir>/events.jsonl) (and to C($VLLM_ACCEPTANCE_EVENTS) when set).
  - With C(-v) or more it also prints everything the default callback prints.
  - The checkout's C(ansible.cfg) makes it the stdout callback; then the acceptance playbook (C(accept.yml)) gets the
    compact output and every other playbook the default output; set it explicitly
    (C(ANSIBLE_STDOUT_CALLBACK=progress)) to get the compact output for any playbook.
  - The compact output keeps the messages playbooks show on purpose (C(debug) tasks) and the play recap.
  - The stage is read from the task's module, role and playbook file, so playbooks need no markers.
  - Needs the vllm_acceptance package in the controller's Python (as the modules do).
version_added: "0.1.0"
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - set as stdout callback (C(stdout_callback = vllm.acceptance.progress), or C(progress) from the checkout)
"""

import json
import os
from pathlib import Path

from ansible.plugins.callback.default import CallbackModule as DefaultCallbackModule

try:
    from vllm_acceptance.core.redact import redact_text
    from vllm_acceptance.progress import Progress, TaskInfo
except ImportError as exc:  # the controller's Python lacks the package: fall back to the default output
    PROGRESS_IMPORT_ERROR: ImportError | None = exc

    def redact_text(text, extra_secrets=None):  # noqa: ARG001 - the default output, as Ansible shows it
        return text
else:
    PROGRESS_IMPORT_ERROR = None


# The pipeline playbooks whose output is compact when the callback is only the configured default (ansible.cfg).
ACCEPTANCE_PLAYBOOKS = ("accept.yml",)


QUIET_KEYS = ("changed", "failed", "item", "ansible_loop_var", "ansible_index_var", "ansible_loop")


def _chosen_explicitly():
    return os.environ.get("ANSIBLE_STDOUT_CALLBACK", "").rsplit(".", 1)[-1] == "progress"


def _shown_message(result):
    """What a debug task shows: its msg (or var) as text, or None for a debug line gated by verbosity."""
    return _message_of(result._result)


def _message_of(res):
    if res.get("skipped_reason") or res.get("skipped"):
        return None
    if isinstance(res.get("results"), list):  # a looped debug: each item's message
        shown = [_message_of(r) for r in res["results"] if isinstance(r, dict)]
        return "\n".join(m for m in shown if m) or None
    if "msg" in res:
        value = res["msg"]
    else:
        shown = {k: v for k, v in res.items() if not k.startswith("_") and k not in QUIET_KEYS}
        value = shown if shown else None
    if value is None:
        return None
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value, indent=2, default=str)


def _check_mode():
    try:
        from ansible import context

        return bool(context.CLIARGS.get("check"))
    except Exception:  # noqa: BLE001 - no CLI arguments (a test's Progress): not check mode
        return False


def _count_ignored_unreachable(stats, unreachable):
    """The recap counts a host that was unreachable as such. Ansible counts a task under `ignore_unreachable` (the
    preflight's reach task, so a run with every node down still reaches its report) as ok and ignored
    (ansible/plugins/strategy/__init__.py), and the recap showed unreachable=0 for a node that was down
    (issue 43 item 6): each such task moves from ok and ignored to unreachable."""
    for host, count in unreachable.items():
        for key, change in (("dark", count), ("ok", -count), ("ignored", -count)):
            counts = getattr(stats, key, None)
            if isinstance(counts, dict):
                counts[host] = max(0, counts.get(host, 0) + change)
    unreachable.clear()


def _task_info(task, name=None):
    role = getattr(task, "_role", None)
    try:
        path = task.get_path()
    except Exception:  # noqa: BLE001 - a task without a source position
        path = None
    return TaskInfo(name=name or task.get_name(), action=str(getattr(task, "action", "") or ""),
                    role=role.get_name() if role is not None else None, path=path)


class CallbackModule(DefaultCallbackModule):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "vllm.acceptance.progress"

    def __init__(self):
        super().__init__()
        self._progress = None
        self._compact_playbook = _chosen_explicitly()
        self._unreachable_ignored = {}   # host -> tasks it was unreachable on under ignore_unreachable (the recap)
        if PROGRESS_IMPORT_ERROR is not None:
            self._display.warning(f"progress callback: vllm_acceptance is not importable ({PROGRESS_IMPORT_ERROR}); "
                                  "showing the default output")

    # --- helpers ---------------------------------------------------------------------------------------
    def _compact(self):
        return self._progress is not None and self._compact_playbook and self._display.verbosity < 1

    def _line(self, text):
        self._display.display(redact_text(text))   # a debug message may quote a URL or a log line

    # --- playbook events -------------------------------------------------------------------------------
    def v2_playbook_on_start(self, playbook):
        name = os.path.basename(str(getattr(playbook, "_file_name", "") or ""))
        self._compact_playbook = self._compact_playbook or name in ACCEPTANCE_PLAYBOOKS
        if PROGRESS_IMPORT_ERROR is None and self._progress is None:
            events = os.environ.get("VLLM_ACCEPTANCE_EVENTS")
            self._progress = Progress(write=self._line, events_path=Path(events) if events else None,
                                      check=_check_mode())
        if not self._compact():
            super().v2_playbook_on_start(playbook)

    def v2_playbook_on_play_start(self, play):
        if self._progress is not None:
            extra = play.get_variable_manager().extra_vars if play.get_variable_manager() else {}
            if extra.get("acceptance_run_dir") and self._progress.run_dir is None:
                self._progress.attach_run(str(extra["acceptance_run_dir"]))
        if not self._compact():
            super().v2_playbook_on_play_start(play)
        else:
            self._play = play

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self._progress is not None:
            self._progress.task_start(_task_info(task))
        if not self._compact():
            super().v2_playbook_on_task_start(task, is_conditional)

    def v2_playbook_on_handler_task_start(self, task):
        if not self._compact():
            super().v2_playbook_on_handler_task_start(task)

    def v2_playbook_on_cleanup_task_start(self, task):
        if not self._compact():
            super().v2_playbook_on_cleanup_task_start(task)

    def v2_playbook_on_include(self, included_file):
        if not self._compact():
            super().v2_playbook_on_include(included_file)

    def v2_playbook_on_no_hosts_matched(self):
        if not self._compact():
            super().v2_playbook_on_no_hosts_matched()

    def v2_playbook_on_no_hosts_remaining(self):
        if not self._compact():
            super().v2_playbook_on_no_hosts_remaining()

    def v2_playbook_on_stats(self, stats):
        if self._progress is not None:
            failed = sorted(h for h in stats.processed if stats.failures.get(h) or stats.dark.get(h))
            self._progress.end(failed)
        _count_ignored_unreachable(stats, self._unreachable_ignored)
        super().v2_playbook_on_stats(stats)  # the recap, one line per host, in the compact output too

    # --- runner events ---------------------------------------------------------------------------------
    def v2_runner_on_start(self, host, task):
        if self._progress is not None:
            self._progress.host_start(host.get_name(), task._uuid)
        if not self._compact():
            super().v2_runner_on_start(host, task)

    def v2_runner_on_ok(self, result):
        if self._progress is not None:
            self._progress.ok(result.host.get_name(), _task_info(result.task, result.task_name), result.result)
        if self._compact():
            self._handle_warnings_and_exception(result)
            self._show_debug(result)
        else:
            super().v2_runner_on_ok(result)

    def _show_debug(self, result):
        """A debug task's message is meant for the person running the playbook: shown in the compact output."""
        if str(getattr(result.task, "action", "")).rsplit(".", 1)[-1] != "debug":
            return
        text = _shown_message(result)
        if text:
            host = result.host.get_name()
            self._line("\n".join(f"  {host}: {line}" if i == 0 else f"  {' ' * len(host)}  {line}"
                                  for i, line in enumerate(text.splitlines())))

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if self._progress is not None:
            self._progress.failed(result.host.get_name(), _task_info(result.task, result.task_name), result.result,
                                  ignored=ignore_errors)
        if self._compact():
            # The failure line above says why, every line of the message (progress.failure_detail): Ansible's own
            # error block would say it again (issue 43 item 6). A module that crashed keeps it (its traceback).
            self._handle_warnings(result.result)
            if result.result.get("module_stderr") or result.result.get("module_stdout"):
                self._handle_warnings_and_exception(result)
        else:
            super().v2_runner_on_failed(result, ignore_errors)

    def v2_runner_on_unreachable(self, result):
        if getattr(result.task, "ignore_unreachable", False):
            host = result.host.get_name()
            self._unreachable_ignored[host] = self._unreachable_ignored.get(host, 0) + 1
        if self._progress is not None:
            self._progress.failed(result.host.get_name(), _task_info(result.task, result.task_name), result.result,
                                  unreachable=True)
        if not self._compact():
            super().v2_runner_on_unreachable(result)

    def v2_runner_on_skipped(self, result):
        if not self._compact():
            super().v2_runner_on_skipped(result)

    def v2_runner_item_on_ok(self, result):
        if not self._compact():
            super().v2_runner_item_on_ok(result)

    def v2_runner_item_on_skipped(self, result):
        if not self._compact():
            super().v2_runner_item_on_skipped(result)

    def v2_runner_item_on_failed(self, result):
        if self._compact() and self._progress is not None:
            self._progress.failed(result.host.get_name(), _task_info(result.task, result.task_name), result.result,
                                  ignored=True)
        if not self._compact():
            super().v2_runner_item_on_failed(result)

    def v2_runner_retry(self, result):
        if self._progress is None:
            super().v2_runner_retry(result)
            return
        res = result.result
        args = (res.get("invocation") or {}).get("module_args") or {}
        per_attempt = args.get("wait_s") if isinstance(args.get("wait_s"), int | float) else None
        delay = float(result.task_fields.get("delay") or 0) if hasattr(result, "task_fields") else 0.0
        self._progress.retry(result.host.get_name(), _task_info(result.task, result.task_name), result.task._uuid,
                             int(res.get("attempts", 0)), int(res.get("retries", 0)), delay, per_attempt)
        if self._display.verbosity >= 2:
            super().v2_runner_retry(result)

    def v2_on_file_diff(self, result):
        if not self._compact():
            super().v2_on_file_diff(result)
