"""The Python entry point for CI: run the acceptance through ansible-runner, stream its progress, and
return the verdict, the run directory and an exit code per verdict (README "Exit codes").

    from vllm_acceptance.api import accept
    result = accept("inventories/site")            # streams the progress lines to stdout
    sys.exit(result.exit_code)                       # 0 release, 10, 20, 30, 40 ... (EXIT_CODES)

`vllm-acceptance run -i INVENTORY [--check]` is the same from a shell.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.inventory_yaml import check_inventory_yaml
from .core.inventory_yaml import inventory_yaml_files as _inventory_yaml_files  # noqa: F401 - kept importable
from .core.profile import ConfigError
from .core.redact import redact_obj, redact_text
from .core.rundir import RunDir, new_run_id
from .progress import read_events

# One exit code per verdict, spaced so CI can test ranges; documented in the README ("Exit codes").
EXIT_CODES: dict[str, int] = {
    "release": 0,
    "limited_observation": 10,
    "expand_capacity": 20,
    "rebuild_environment": 30,
    "incomplete": 40,
}
EXIT_RUN_FAILED = 1       # the playbook failed before a verdict (a node error, a crash): see the progress lines
EXIT_INPUT_ERROR = 2      # the inputs were refused (inventory or profile), nothing was touched
EXIT_CHECK_OK = 0         # --check: the dry run went through (no verdict is decided in check mode)



@dataclass
class AcceptResult:
    """What one acceptance run gave."""

    verdict: str | None
    run_dir: Path | None
    exit_code: int
    check: bool
    status: str                                   # ansible-runner's status (successful, failed, ...)
    rc: int
    reason: str | None = None                     # the one line that says why, when there is no verdict
    report: Path | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "run_dir": str(self.run_dir) if self.run_dir else None,
                "exit_code": self.exit_code, "check": self.check, "status": self.status, "rc": self.rc,
                "reason": self.reason, "report": str(self.report) if self.report else None}


def _project_above(start: Path) -> Path | None:
    """`start` or the nearest directory above it that holds a project (accept.yml and playbooks/validate.yml)."""
    for directory in (start, *start.parents):
        if (directory / "accept.yml").is_file() and (directory / "playbooks" / "validate.yml").is_file():
            return directory
    return None


def _installed_collection() -> Path | None:
    """vllm.acceptance installed where ansible-galaxy puts collections (ANSIBLE_COLLECTIONS_PATH first)."""
    configured = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS") or ""
    roots = [Path(p).expanduser() for p in configured.split(":") if p]
    roots += [Path("~/.ansible/collections").expanduser(), Path("/usr/share/ansible/collections")]
    for root in roots:
        candidate = root / "ansible_collections" / "vllm" / "acceptance"
        if (candidate / "playbooks" / "validate.yml").is_file():
            return candidate
    return None


def default_project_dir(inventory: str | Path | None = None) -> Path:
    """The project the user is in (issue 30, 3): the current directory or the nearest above it holding accept.yml;
    else the one holding the inventory; else an installed vllm.acceptance collection. Never the checkout this
    package happens to be installed from: its playbooks and reports are another tree's."""
    starts = [Path.cwd()] + ([Path(inventory).resolve().parent] if inventory is not None else [])
    for start in starts:
        found = _project_above(start)
        if found is not None:
            return found
    collection = _installed_collection()
    if collection is not None:
        return collection
    raise ConfigError("no project here: run from a checkout of vllm-acceptance (the directory holding accept.yml, "
                      "or below it), keep the inventory inside one, or pass --project DIR (a checkout or an installed "
                      "collection, e.g. ~/.ansible/collections/ansible_collections/vllm/acceptance)")


def _is_collection(project: Path) -> bool:
    return project.parent.name != "" and project.parent.parent.name == "ansible_collections"


def _environment(project: Path, events: Path, env: Mapping[str, str] | None) -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    base = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", "VLLM_ACCEPTANCE_EVENTS": str(events),
            "ANSIBLE_STDOUT_CALLBACK": "vllm.acceptance.progress" if _is_collection(project) else "progress",
            "ANSIBLE_NOCOLOR": "1", "PYTHONUNBUFFERED": "1"}
    if (project / "ansible.cfg").is_file() and not _is_collection(project):
        base["ANSIBLE_CONFIG"] = str(project / "ansible.cfg")
        # ansible-runner adds its own callback directory through this variable, which outranks ansible.cfg.
        base["ANSIBLE_CALLBACK_PLUGINS"] = str(project / "plugins" / "callback")
    elif _is_collection(project):
        base["ANSIBLE_COLLECTIONS_PATH"] = ":".join(
            [str(project.parents[2]), os.environ.get("ANSIBLE_COLLECTIONS_PATH", "")]).rstrip(":")
    if "VLLM_API_KEY" in os.environ:
        base["VLLM_API_KEY"] = os.environ["VLLM_API_KEY"]
    return {**base, **(env or {})}


def resolve_playbook(playbook: str | Path | None, project: Path) -> str:
    """A path (absolute, from the current directory, or from the project), else an FQCN playbook such as
    vllm.acceptance.accept; default accept.yml of the checkout, vllm.acceptance.accept of a collection."""
    if playbook is None:
        return "vllm.acceptance.accept" if _is_collection(project) else str(project / "accept.yml")
    for candidate in (Path(playbook), Path.cwd() / playbook, project / playbook):
        if candidate.is_file():
            return str(candidate.resolve())
    if str(playbook).endswith((".yml", ".yaml")):
        raise ConfigError(f"playbook {playbook}: no such file (relative paths are tried from here and from {project})")
    return str(playbook)


def exit_code_for(verdict: str | None, *, check: bool, rc: int, events: list[dict[str, Any]]) -> int:
    """The documented exit code (EXIT_CODES); input errors and failed runs have their own."""
    refused = any(e.get("event") == "failed" and e.get("stage") == "validate" and not e.get("ignored")
                  for e in events)
    if refused:
        return EXIT_INPUT_ERROR
    if check:
        return EXIT_CHECK_OK if rc == 0 else EXIT_RUN_FAILED
    if verdict in EXIT_CODES and rc == 0:
        return EXIT_CODES[verdict]
    return EXIT_RUN_FAILED


def accept(inventory: str | Path, *, check: bool = False, extra_vars: Mapping[str, Any] | None = None,
           playbook: str | Path | None = None, project_dir: str | Path | None = None,
           reports_dir: str | Path | None = None, env: Mapping[str, str] | None = None,
           on_line: Callable[[str], None] | None = print,
           on_event: Callable[[dict[str, Any]], None] | None = None) -> AcceptResult:
    """Run accept.yml (or `playbook`) on `inventory` with the progress callback; return the verdict.

    `on_line` gets each progress line as it is printed (None: silent); `on_event` each JSON event of
    events.jsonl as it lands. `project_dir` defaults to the project the current directory is in
    (default_project_dir). `reports_dir` defaults to ./reports of the current directory for an installed
    collection and to the project's reports/ otherwise. An inventory whose YAML does not parse raises
    ConfigError naming the file, line and column before anything runs.
    """
    import ansible_runner

    inventory_path = Path(inventory).resolve()
    if not inventory_path.exists():
        raise ConfigError(f"inventory {inventory}: no such file or directory")
    project = Path(project_dir).resolve() if project_dir else default_project_dir(inventory_path)
    check_inventory_yaml(inventory_path)
    playbook_arg = resolve_playbook(playbook, project)
    reports = Path(reports_dir).resolve() if reports_dir else (
        Path.cwd() / "reports" if _is_collection(project) else project / "reports")
    variables: dict[str, Any] = {"acceptance_reports_dir": str(reports), **(extra_vars or {})}
    # The exit code says the verdict (EXIT_CODES): accept.yml's verdict gate for plain ansible-playbook
    # (playbooks/verdict_gate.yml, acceptance_fail_on) is off here, so a verdict never reads as a failed run.
    variables["acceptance_fail_on"] = []
    if not check:
        variables.setdefault("acceptance_run_id", new_run_id())

    work = Path(tempfile.mkdtemp(prefix="vllm-acceptance-runner-"))
    events_file = work / "events.jsonl"
    (work / "runner").mkdir()
    seen = 0

    def forward_events() -> None:
        nonlocal seen
        if on_event is None or not events_file.is_file():
            return
        lines = events_file.read_text().splitlines()
        for line in lines[seen:]:
            try:
                on_event(redact_obj(json.loads(line)))
            except ValueError:
                continue
        seen = len(lines)

    def handler(event: dict[str, Any]) -> bool:
        text = event.get("stdout") or ""
        if on_line is not None:
            for line in text.splitlines():
                if line.strip():
                    on_line(redact_text(line))   # every progress line as printed (core/redact.py)
        forward_events()
        return True

    try:
        result = ansible_runner.run(
            private_data_dir=str(work / "runner"), project_dir=str(project), playbook=playbook_arg,
            inventory=str(inventory_path), extravars=variables, cmdline="--check" if check else None,
            envvars=_environment(project, events_file, env), quiet=True, event_handler=handler)
        forward_events()
        events = read_events(events_file)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _result(events, check=check, status=str(result.status), rc=int(result.rc or 0))


def _result(events: list[dict[str, Any]], *, check: bool, status: str, rc: int) -> AcceptResult:
    run_dirs = [e["run_dir"] for e in events if e.get("event") == "run" and e.get("run_dir")]
    run_dir = Path(run_dirs[-1]) if run_dirs else None
    if check and run_dir is not None and not run_dir.exists():
        run_dir = None                       # the check run's scratch directory, removed at its end: nothing kept
    verdict, report = None, None
    if run_dir is not None and RunDir(run_dir).report_json.is_file() and not check:
        data = json.loads(RunDir(run_dir).report_json.read_text())
        verdict = data.get("verdict")
        report = RunDir(run_dir).report_file("report.html")
    failures = [e for e in events if e.get("event") == "failed" and not e.get("ignored")]
    reason = None
    if verdict is None or rc != 0:
        reason = failures[-1]["reason"] if failures else (None if rc == 0 else f"ansible-playbook ended with rc {rc}")
    code = exit_code_for(verdict, check=check, rc=rc, events=events)
    return AcceptResult(verdict=verdict, run_dir=run_dir, exit_code=code, check=check, status=status, rc=rc,
                        reason=redact_text(reason) if reason else reason, report=report, events=redact_obj(events))
