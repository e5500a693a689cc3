"""Progress a person can follow, and the same as JSON lines: the logic behind the `progress` callback.

The callback (plugins/callback/progress.py) hands Ansible's events to `Progress`; it answers with lines for
the terminal and appends events to `<run dir>/events.jsonl` (docs/internals.md "Following a run"):

    [00:03] preflight | started (bound: none from the profile)
    [00:41] serve     | waiting for /health: 45 s of at most 300 s
    [01:02] serve     | findings: 7 pass, 1 warn (findings/serve.json)
    [01:02] serve     | done in 21 s
    [03:10] report    | verdict release: .../report.html

The stage is read from what Ansible already says (the task's role, its playbook file, the module, the
probe named in the task name), so the playbooks need no markers. Bounds come from the run's profile.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_acceptance.core.bounds import RampBound, ramp_bound, request_bound_s
from vllm_acceptance.core.probes import probe_names
from vllm_acceptance.core.profile_model import ProfileModel
from vllm_acceptance.core.redact import redact_obj, redact_text

if TYPE_CHECKING:
    from vllm_acceptance.core.rundir import RunDir

EVENTS_FILE = "events.jsonl"
PROBES = probe_names()   # core/probes.py, in run order
PIPELINE = ("validate", "preflight", "serve", *PROBES, "report")

# Where a task belongs, from the evidence Ansible gives: its module, role, or playbook file.
MODULE_STAGES = {"acceptance_run": "validate", "acceptance_preflight": "preflight", "acceptance_serve": "serve",
                 "acceptance_report": "report", "acceptance_monitoring": "report",
                 "acceptance_loadmerge": "load"}
ROLE_STAGES = {"preflight": "preflight", "vllm_serve": "serve"}
FILE_STAGES = {"validate": "validate", "preflight": "preflight", "serve": "serve", "probes": "probes",
               "report": "report", "loadgen": "load", "monitoring": "monitoring", "rebuild": "rebuild",
               "rollback": "rollback", "rebuild_node": "rebuild", "build_image": "build_image"}
# The last play of accept.yml (playbooks/verdict_gate.yml): its failure is the verdict's gate for CI, not a stage that
# broke; the run's final line says it (issue 43 items 2 and 6).
GATE_TASK = "Fail the run on a verdict the inventory does not accept (acceptance_fail_on)"
_PROBE_IN_NAME = re.compile(r"\bprobe\b[^:]*:\s*(" + "|".join(map(re.escape, PROBES)) + r")\b", re.IGNORECASE)
_WAITED_ON = re.compile(r"(/[A-Za-z0-9_./-]*[A-Za-z0-9_])")


@dataclass
class TaskInfo:
    """What the callback knows about a task when it starts or ends."""

    name: str
    action: str = ""
    role: str | None = None
    path: str | None = None


def module_name(action: str) -> str:
    return action.rsplit(".", 1)[-1]


def stage_of(task: TaskInfo) -> str | None:
    """The pipeline stage a task belongs to, or None when it says nothing new (e.g. a debug line)."""
    probe = _PROBE_IN_NAME.search(task.name or "")
    if probe:
        return probe.group(1).lower()
    if module_name(task.action) in MODULE_STAGES:
        return MODULE_STAGES[module_name(task.action)]
    if task.role and task.role.rsplit(".", 1)[-1] in ROLE_STAGES:
        return ROLE_STAGES[task.role.rsplit(".", 1)[-1]]
    if task.path:
        stem = Path(task.path.split(":", 1)[0]).stem
        if stem in FILE_STAGES:
            return FILE_STAGES[stem]
    return None


def stage_bounds(profile: Mapping[str, Any] | None) -> dict[str, str]:
    """Each stage's bound, in words, from the profile's timeouts (docs/internals.md "Following a run")."""
    if not profile:
        return {}

    def get(dotted: str) -> Any:
        node: Any = profile
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    bounds: dict[str, str] = {}
    ready = get("launch.ready_timeout_s")
    if ready is not None:
        bounds["serve"] = f"ready within {fmt_s(float(ready))} (launch.ready_timeout_s)"
    load_req = get("load.request_timeout_s")
    for kind in (k for k in PROBES if k != "load"):   # the load probe has its own bounds below
        own = get(f"{kind}.request_timeout_s")
        value, source = (own, f"{kind}.request_timeout_s") if own is not None else (load_req, "load.request_timeout_s")
        if value is not None:
            bounds[kind] = f"each request at most {fmt_s(float(value))} ({source})"
    step, soak = get("load.stage_timeout_s"), get("load.soak_s")
    if step is not None:
        ramp = load_ramp_bound(get)
        bounds["load"] = (f"ramp {ramp.describe()} ({len(ramp.always) + len(ramp.budgeted)} steps), each at most "
                          f"{fmt_s(max(ramp.step_s.values()))} (load.stage_timeout_s {fmt_s(float(step))} caps a "
                          f"step), the ramp at most {fmt_s(ramp.bound_s)}"
                          + (f", soak {fmt_s(float(soak))} (load.soak_s)" if soak is not None else ""))
    return bounds


def load_ramp_bound(get: Callable[[str], Any]) -> RampBound:
    """The load probe's ramp and its bound as `plan` states them (core/bounds.py; probes/load/plan.py), from the
    run's profile (a field it leaves out: the model's default, core/profile_model.py)."""

    def value(dotted: str) -> Any:
        found = get(dotted)
        return found if found is not None else ProfileModel.default_of(dotted)

    contract = int(value("contract.concurrency"))
    max_step = value("load.max_step")
    output = value("contract.max_output_tokens")
    timeout = float(value("load.request_timeout_s"))
    request_s = request_bound_s(dict(value("contract.slo") or {}), int(output), timeout)[0] if output else timeout
    return ramp_bound([int(c) for c in value("load.ramp")], contract,
                      int(max_step) if max_step is not None else 4 * contract, int(value("load.requests_per_step")),
                      request_s, float(value("load.stage_timeout_s")), float(value("load.ramp_budget_s")))


def wait_bound(attempts: int, retries: int, delay: float, waited: float, per_attempt_s: float | None) -> float | None:
    """The most a bounded wait takes: `retries` attempts with `delay` between them. An attempt's own time is
    the module's `wait_s` when it has one, else what the attempts so far took (counted when over a second)."""
    if retries <= 0:
        return None
    run = per_attempt_s
    if run is None and attempts > 0:
        measured = (waited - (attempts - 1) * delay) / attempts
        run = measured if measured > 1 else 0.0
    bound = (retries - 1) * delay + retries * (run or 0.0)
    return bound if bound > 0 else None


def fmt_s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 120:
        return f"{minutes} min {sec} s" if sec else f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def clock_label(seconds: float) -> str:
    minutes, sec = divmod(int(seconds), 60)
    return f"{minutes:02d}:{sec:02d}" if minutes < 60 else f"{minutes // 60}:{minutes % 60:02d}:{sec:02d}"


def first_line(text: Any, limit: int = 300) -> str:
    """The one line that says why: the first non-empty line of a module's msg (or its stderr)."""
    header = ""
    for line in str(text or "").splitlines():
        line = line.strip()
        if line in ("invalid inventory:", "invalid profile:"):
            header = header or line + " "          # kept in front of the refusal it introduces (gate.py)
        elif line:
            line = header + line
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


# A refusal's line carries its field and its fix whole (gate.py messages run to a few hundred characters); only a
# module's crash output is cut.
REASON_LIMIT = 1200


def failure_reason(result: Mapping[str, Any]) -> str:
    for key in ("msg", "stderr", "reason", "exception"):
        line = first_line(result.get(key), REASON_LIMIT)
        if line:
            return line
    return "failed without a message (run with -v for the full result)"


def failure_detail(result: Mapping[str, Any], limit: int = 20) -> list[str]:
    """The lines of a module's message after the one failure_reason shows (every error of a refused inventory, say):
    printed once under the failure line, since the compact output no longer repeats Ansible's own error block."""
    text = str(result.get("msg") or "")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = failure_reason(result)
    rest = [line for line in lines if line not in ("invalid inventory:", "invalid profile:")]
    if rest and rest[0][:50] in first:
        rest = rest[1:]
    return [line if len(line) <= REASON_LIMIT else line[:REASON_LIMIT - 3] + "..." for line in rest[:limit]] + (
        [f"... {len(rest) - limit} more lines (run with -v for the full result)"] if len(rest) > limit else [])


def count_statuses(findings: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in findings if isinstance(findings, list) else []:
        if isinstance(item, Mapping):
            status = str(item.get("status", "unknown"))
            counts[status] = counts.get(status, 0) + 1
    return counts


STATUS_ORDER = ("fail", "missing", "inconclusive", "warn", "pass", "not_applicable")


def format_counts(counts: Mapping[str, int]) -> str:
    order = [s for s in STATUS_ORDER if s in counts] + sorted(s for s in counts if s not in STATUS_ORDER)
    return ", ".join(f"{counts[s]} {s}" for s in order) or "none"


@dataclass
class Progress:
    """Turns Ansible's events into progress lines and JSON events (one instance per playbook run)."""

    write: Callable[[str], None]
    events_path: Path | None = None          # a second copy of the events (the Python entry point reads it)
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    stage: str | None = None
    stage_started: float = 0.0
    run_dir: Path | None = None
    bounds: dict[str, str] = field(default_factory=dict)
    verdict: str | None = None
    report: str | None = None
    check: bool = False                      # --check: nothing is measured, no verdict; the scratch dir is removed
    gate: str | None = None                  # the verdict gate's message when it failed the playbook
    failures: list[dict[str, Any]] = field(default_factory=list)
    _seen: dict[str, tuple[float, int]] = field(default_factory=dict)
    _pending: list[dict[str, Any]] = field(default_factory=list)
    _task_started: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.started = self.clock()

    # --- output ---------------------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self.started

    def say(self, text: str, stage: str | None = None) -> None:
        label = stage or self.stage or "run"
        # every progress line redacted (core/redact.py): a reason may quote a URL, an argv or a log line
        self.write(redact_text(f"[{clock_label(self.elapsed())}] {label:<9} | {text}"))

    def emit(self, event: str, **data: Any) -> None:
        record = {"time": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                  "elapsed_s": round(self.elapsed(), 3), "event": event, "stage": self.stage, **redact_obj(data)}
        line = json.dumps(record, default=str)
        if self.events_path is not None:
            _append(self.events_path, line)
        if self.run_dir is None:
            self._pending.append(record)
        elif not self.check:                 # a check run's scratch directory is removed at its end: nothing kept
            _append(_events_file(self.run_dir), line)

    # --- run directory ----------------------------------------------------------------------------------
    def attach_run(self, run_dir: str | Path, profile: Mapping[str, Any] | None = None) -> None:
        """The run directory is known (acceptance_run's result, or -e acceptance_run_dir)."""
        if self.run_dir is not None and Path(run_dir) == self.run_dir:
            return
        self.run_dir = Path(run_dir)
        if profile is None:
            profile = _read_profile(self.run_dir)
        self.bounds = stage_bounds(profile)
        pending, self._pending = self._pending, []
        for record in pending if not self.check else []:
            _append(_events_file(self.run_dir), json.dumps(record, default=str))
        self.emit("run", run_dir=str(self.run_dir), profile=(profile or {}).get("name"))

    def scan_findings(self) -> None:
        """Counts by status of each findings/<stage>.json that is new or changed since the last look."""
        if self.run_dir is None or not _run(self.run_dir).findings_dir.is_dir():
            return
        for path in sorted(_run(self.run_dir).findings_dir.glob("*.json")):
            try:
                stat = path.stat()
                mark = (stat.st_mtime, stat.st_size)
                if self._seen.get(path.name) == mark:
                    continue
                counts = count_statuses(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue                      # being replaced right now: the next look reads it
            self._seen[path.name] = mark
            self.say(f"findings: {format_counts(counts)} (findings/{path.name})", stage=path.stem)
            self.emit("findings", file=f"findings/{path.name}", findings_stage=path.stem, counts=counts)

    # --- Ansible's events -------------------------------------------------------------------------------
    def task_start(self, task: TaskInfo) -> None:
        stage = stage_of(task)
        if stage == "probes" and self.stage in PROBES:
            return                            # the memory sampler's collection after the probes: same stage
        if stage and stage != self.stage:
            self.enter(stage)

    def enter(self, stage: str) -> None:
        if self.stage is not None:
            took = self.clock() - self.stage_started
            self.say(f"done in {fmt_s(took)}")
            self.emit("stage_end", took_s=round(took, 3))
        self.stage, self.stage_started = stage, self.clock()
        bound = self.bounds.get(stage)
        self.say("started" + (f"; bound: {bound}" if bound else ""))
        self.emit("stage_start", bound=bound)

    def host_start(self, host: str, task_uuid: str) -> None:
        self._task_started[f"{host}/{task_uuid}"] = self.clock()

    def ok(self, host: str, task: TaskInfo, result: Mapping[str, Any]) -> None:
        module = module_name(task.action)
        if module == "acceptance_run" and result.get("run_dir"):
            self.attach_run(result["run_dir"], result.get("profile") if isinstance(result.get("profile"), Mapping)
                            else None)
            self.say(f"run {result.get('run_id')}: profile {(result.get('profile') or {}).get('name')}, "
                     f"evidence in {result['run_dir']}")
        if module == "acceptance_report" and result.get("verdict") and self.check:
            self.say("no verdict in check mode: nothing was measured")
            self.emit("verdict", verdict=None, check=True)
        elif module == "acceptance_report" and result.get("verdict"):
            self.verdict, self.report = str(result["verdict"]), result.get("report")
            reasons = [str(r) for r in result.get("reasons") or []]
            self.say(f"verdict {self.verdict}" + (f": {verdict_line(reasons)}" if reasons else "")
                     + (f" - report {self.report}" if self.report else ""))
            self.emit("verdict", verdict=self.verdict, report=self.report, reasons=reasons[:5])
        self.scan_findings()

    def failed(self, host: str, task: TaskInfo, result: Mapping[str, Any], ignored: bool = False,
               unreachable: bool = False) -> None:
        reason = failure_reason(result)
        record = {"host": host, "task": task.name, "reason": reason, "unreachable": unreachable, "ignored": ignored}
        if task.name == GATE_TASK and not ignored:
            self.gate = reason               # said once, as the run's final line (end)
            self.emit("gate", host=host, task=task.name, reason=reason)
            return
        kind = "unreachable" if unreachable else ("failed (ignored)" if ignored else "failed")
        self.say(f"{kind} on {host}: {task.name}: {reason}")
        for line in failure_detail(result) if not ignored else []:
            self.write(redact_text(f"{'':>18}{line}"))
        if not ignored:
            self.failures.append({**record, "stage": self.stage})
        self.emit("failed", **record)
        self.scan_findings()

    def retry(self, host: str, task: TaskInfo, task_uuid: str, attempts: int, retries: int, delay: float,
              per_attempt_s: float | None = None) -> None:
        """A bounded wait in words instead of "FAILED - RETRYING": what, how long so far, the most it takes."""
        began = self._task_started.get(f"{host}/{task_uuid}")
        waited = self.clock() - began if began is not None else attempts * (delay + (per_attempt_s or 0))
        bound = wait_bound(attempts, retries, delay, waited, per_attempt_s)
        target = _WAITED_ON.search(task.name or "")
        what = target.group(1) if target else (task.name or "the task")
        text = f"waiting for {what}: {fmt_s(waited)}" + (f" of at most {fmt_s(bound)}" if bound else "") \
            + f" (attempt {attempts} of {retries}, {host})"
        self.say(text)
        self.emit("waiting", host=host, task=task.name, waited_s=round(waited, 1), bound_s=bound,
                  attempt=attempts, attempts=retries)

    def end(self, failed_hosts: list[str]) -> None:
        self.scan_findings()
        if self.stage is not None:
            took = self.clock() - self.stage_started
            self.say(f"done in {fmt_s(took)}")
            self.emit("stage_end", took_s=round(took, 3))
        total = fmt_s(self.elapsed())
        if self.gate:
            self.say(f"finished in {total}: {self.gate}", stage="end")
        elif failed_hosts and self.failures:
            why = self.failures[-1]           # its reason is the failure line above: named, not repeated
            self.say(f"stopped after {total} in stage {why['stage'] or 'run'}: {why['task']} failed on {why['host']} "
                     "(why: above)", stage="end")
        elif self.check:
            self.say(f"finished in {total}: check mode, no verdict (nothing was measured)", stage="end")
        elif self.verdict:
            self.say(f"finished in {total}: verdict {self.verdict}", stage="end")
        else:
            self.say(f"finished in {total}", stage="end")
        self.emit("end", verdict=self.verdict, report=self.report, failed_hosts=failed_hosts, gate=self.gate,
                  run_dir=str(self.run_dir) if self.run_dir else None)
        self.stage = None        # ansible-playbook A.yml B.yml: the next playbook goes on in the same run


def verdict_line(reasons: list[str]) -> str:
    """The verdict's first reason, and what else is certain or unverified beside it (verdict.py's "also failed: ",
    "also unverified: "), each cut to one line."""
    extra = [first_line(r, 200) for r in reasons[1:] if r.startswith(("also failed: ", "also unverified: "))]
    return "; ".join([first_line(reasons[0], 300), *extra])


def _append(path: Path, line: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            handle.write(line + "\n")
    except OSError:
        pass                                  # progress never breaks a run


def _run(run_dir: Path) -> RunDir:
    from vllm_acceptance.core.rundir import RunDir  # here: the callback plugin loads this module light

    return RunDir(run_dir)


def _events_file(run_dir: Path) -> Path:
    return _run(run_dir).at(EVENTS_FILE)


def _read_profile(run_dir: Path) -> dict[str, Any] | None:
    import yaml

    try:
        data = yaml.safe_load(_run(run_dir).profile_path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def read_events(path: Path) -> list[dict[str, Any]]:
    events = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events
