"""vLLM's own argument checks of every node's `vllm serve` command, before the cluster is booked.

vLLM's checks are called, not rewritten: serve/vllm_argcheck.py runs vLLM's parser, `validate_parsed_serve_args`,
`ServeSubcommand.cmd`'s load-balancing and headless logic and the chosen launcher's own checks (its docstring says
exactly which, and which need the model's files or the target platform and are not run). It is run by a Python
that has vLLM:

- on the controller, `plan`, `validate` and accept.yml's validate play (playbooks/validate.yml) run it with the
  configured vLLM Python: the inventory's `acceptance_vllm_check_python` (`vllm-acceptance plan|validate
  --vllm-python`), else the project's lab venv (.venv-lab/bin/python) where it exists; `none` turns it off.
  What it refuses is refused before any node is touched (exit 2), vLLM's message quoted, with the version that
  judged. That version stands in for the one that will run: the image's vLLM is known only at preflight, the
  process runtime's is the same interpreter or another (said either way);
- at preflight, inside the image on the head node (roles/preflight: `launch_args_check`), judged as
  `compat.launch_args` (rules/launch_args.py): the image's own vLLM is the authority.

One subprocess judges every node (and, for the tests, every deployment) at once: importing vLLM costs seconds
(docs/plan.md "vLLM's own checks" has the measured cost). Where `VLLM_ACCEPTANCE_ARGCHECK_CACHE` names a directory
(the test suite and `make rehearsal` set it), an answer is kept there and reused for the same question to the same
installation (`answer_key`: the interpreter, its import path's directories as they stand, the script, the nodes'
commands and the VLLM_* environment); unset, every check runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.profile import ConfigError, Profile, load_profile
from ..core.redact import is_secret_name, redact_obj, redact_text
from ..parsers.vllm_argcheck import parse_answer
from . import launch

SCRIPT = Path(__file__).with_name("vllm_argcheck.py")
VARIABLE = "acceptance_vllm_check_python"
LAB_PYTHON = ".venv-lab/bin/python"
OFF = ("none", "off", "false", "no")
DEFAULT_TIMEOUT_S = 300
CACHE_VARIABLE = "VLLM_ACCEPTANCE_ARGCHECK_CACHE"
# What the judging installation is, read without importing vLLM: each import-path directory and vLLM's package
# directory with their modification times (an install, upgrade or removal changes them).
_INSTALLATION = ("import importlib.util, json, os, sys\n"
                 "spec = importlib.util.find_spec('vllm')\n"
                 "where = [p for p in sys.path if os.path.isdir(p)]\n"
                 "where += list(spec.submodule_search_locations or []) if spec else []\n"
                 "print(json.dumps([sys.version, [[p, os.stat(p).st_mtime_ns] for p in where]]))")


@dataclass
class NodeVerdict:
    """One node's command as vLLM judged it: accepted True/False, or None (not judged: why in not_judged)."""

    host: str
    role: str
    accepted: bool | None
    stage: str | None = None
    message: str | None = None
    where: str | None = None
    mode: str | None = None
    not_judged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def describe(self, version: str | None) -> str:
        who = f"{self.host} ({self.role})"
        if self.accepted is False:
            at = f" [{self.where}]" if self.where else ""
            return f"{who}: vLLM {version} refuses it at {self.stage}: {self.message}{at}"
        if self.accepted is None:
            return f"{who}: not judged ({'; '.join(self.not_judged) or self.stage or 'no answer'})"
        return f"{who}: vLLM {version} accepts it ({self.mode})"


@dataclass
class ArgCheck:
    """The answer of one vllm_argcheck.py run (or why it could not run: `error`)."""

    python: str | None
    vllm_version: str | None = None
    platform: str | None = None
    target: dict[str, Any] = field(default_factory=dict)
    deployments: dict[str, list[NodeVerdict]] = field(default_factory=dict)
    error: str | None = None
    import_s: float | None = None
    wall_s: float | None = None
    not_run: str | None = None
    will_run: str = ""
    reused: bool = False        # the answer kept from the same question to the same installation (CACHE_VARIABLE)

    @property
    def ran(self) -> bool:
        return self.error is None

    def nodes(self, key: str = "launch") -> list[NodeVerdict]:
        return list(self.deployments.get(key) or [])

    def refused(self, key: str = "launch") -> list[NodeVerdict]:
        return [n for n in self.nodes(key) if n.accepted is False]

    def judged_by(self) -> str:
        platform = f", {self.platform} build" if self.platform is not None else ""
        return f"vLLM {self.vllm_version}{platform} at {self.python}"

    def to_dict(self) -> dict[str, Any]:
        """As recorded and printed: a value vLLM quotes from a secret flag is redacted (core/redact.py)."""
        return redact_obj({**asdict(self), "judged_by": self.judged_by() if self.ran else None})


def judge_python(configured: Any, project: Path) -> tuple[str | None, str]:
    """(the vLLM Python that judges, or None; how it was chosen or why there is none)."""
    if configured is not None and str(configured).strip().lower() in OFF:
        return None, f"{VARIABLE} is {configured!r}: the controller does not run vLLM's checks"
    if configured:
        path = Path(str(configured))
        path = path if path.is_absolute() else project / path
        if not path.exists():
            raise ConfigError(f"{VARIABLE} {configured!r}: no such Python ({path}); give the path of a Python "
                              "with vLLM installed (the image's version), or `none` to leave the check to "
                              "preflight (compat.launch_args)")
        return str(path), f"{VARIABLE}"
    lab = project / LAB_PYTHON
    if lab.exists():
        return str(lab), f"the lab venv ({LAB_PYTHON}, the default where present)"
    return None, (f"no vLLM Python: {LAB_PYTHON} is absent and {VARIABLE} is not set (preflight still judges "
                  "every command inside the image: compat.launch_args)")


def _public_env(env: dict[str, str]) -> dict[str, str]:
    """The launch environment without secret-named variables (vLLM's argument checks never need them)."""
    return {str(k): str(v) for k, v in env.items() if not is_secret_name(str(k))}


def node_inputs(profile: Profile, facts: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node's `vllm serve` arguments and environment as the serve role would launch them (the same code:
    serve/launch.py for containers, runtime/process.py for the process runtime); [] for an attached server."""
    if facts.get("mode") == "attach":
        return []
    if profile.model.pd is not None:     # a P/D deployment: each pool's servers, as serve/pools.py launches them
        from .pools import POOLS, pool_profile

        nodes = []
        for pool in POOLS:      # each pool on its own nodes (pd.<pool>.nodes), not the inventory's head + workers
            count = getattr(profile.model.pd, pool).nodes
            workers = [f"{pool}-node-{i}" for i in range(2, count + 1)]
            pool_facts = {k: v for k, v in facts.items() if k != "workers"}
            pool_facts.update({"head": f"{pool}-node-1", **({"workers": workers} if workers else {})})
            nodes += [{**node, "pool": pool} for node in node_inputs(pool_profile(profile, pool), pool_facts)]
        return nodes
    runtime = str(facts.get("runtime") or profile.model.launch.runtime)
    head = str(facts.get("head") or "head")
    if runtime == "process":
        spec = launch.process_spec(profile, facts)
        command = spec.command()
        # runtime/process.py: `python -m vllm.entrypoints.cli.main serve MODEL ...` (data parallel: vllm serve's own
        # API servers) or `python -m vllm.entrypoints.openai.api_server --model MODEL ...`
        serve = command[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
        return [{"host": head, "role": "head", "entry": "serve" if serve else "api_server",
                 "serve_args": command[4:] if serve else command[3:], "env": _public_env(spec.env)}]
    if facts.get("workers"):
        return [{"host": c.host, "role": c.role, "entry": "serve", "serve_args": c.serve_args,
                 "env": _public_env(c.env)} for c in launch.node_commands(profile, facts).values()]
    return [{"host": head, "role": "head", "entry": "serve", "serve_args": launch.single_serve_args(profile, facts),
             "env": _public_env({str(k): str(v) for k, v in profile.model.launch.env.items()})}]


def target_of(profile: Profile, facts: dict[str, Any], python: str | None) -> dict[str, Any]:
    """What will run the commands: its platform, and whether the judging Python is that very installation."""
    device = "cpu" if profile.model.hardware.accelerator == "none" else "cuda"
    runtime = str(facts.get("runtime") or profile.model.launch.runtime)
    same = False
    if runtime == "process" and python:
        serve_python = Path(str(facts.get("python") or LAB_PYTHON))
        serve_python = serve_python if serve_python.is_absolute() else Path(str(facts.get("project") or ".")) / \
            serve_python
        same = os.path.realpath(serve_python) == os.path.realpath(python)
    return {"device": device, "same_build": same, "on_node": same, "runtime": runtime}


def will_run(profile: Profile, target: dict[str, Any], check: ArgCheck) -> str:
    """The version that will run beside the one that judged, in words."""
    if target.get("same_build"):
        return f"the process runtime runs this very vLLM ({check.vllm_version})"
    minimum = str(profile.model.vllm.min_version or "")
    if target.get("runtime") == "process":
        return (f"the process runtime runs another Python (vllm_serve_python); vLLM {check.vllm_version} judged "
                "as its stand-in")
    return (f"the image's vLLM is read at preflight (compat.vllm_version, profile minimum {minimum or 'none'}) and "
            f"re-judges every command there (compat.launch_args); vLLM {check.vllm_version} "
            f"({check.platform} build) judged as its stand-in")


def answer_key(python: str, payload: str) -> str | None:
    """The cache key of one question to one installation; None when the installation cannot be read (no reuse)."""
    try:
        done = subprocess.run([python, "-c", _INSTALLATION], capture_output=True, text=True, check=False,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith("VLLM_") and k != CACHE_VARIABLE)
    question = [os.path.realpath(python), done.stdout.strip(), SCRIPT.read_text(), payload, environment]
    return hashlib.sha256(json.dumps(question).encode()).hexdigest()


def _cached(folder: str, key: str | None) -> dict[str, Any] | None:
    if key is None:
        return None
    try:
        kept = json.loads((Path(folder) / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def _keep(folder: str, key: str | None, answer: dict[str, Any]) -> None:
    """Keep an answer that judged (never an error: a timeout or a broken import is asked again)."""
    if key is None:
        return
    path = Path(folder) / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    partial.write_text(json.dumps(answer))
    partial.replace(path)


def run(deployments: dict[str, list[dict[str, Any]]], python: str, target: dict[str, Any],
        timeout_s: int = DEFAULT_TIMEOUT_S) -> ArgCheck:
    """Judge every node of every deployment in one vllm_argcheck.py subprocess of `python` (or reuse the kept
    answer to the same question: CACHE_VARIABLE)."""
    payload = json.dumps({"target": target, "deployments": deployments})
    started = time.monotonic()
    check = ArgCheck(python=python, target=target)
    folder = os.environ.get(CACHE_VARIABLE)
    key = answer_key(python, payload) if folder else None
    kept = _cached(folder, key) if folder else None
    if kept is not None:
        check.reused = True
        check.wall_s = round(time.monotonic() - started, 2)
        return read_answer(kept["stdout"], kept["stderr"], kept["returncode"], check)
    try:
        done = subprocess.run([python, str(SCRIPT), "-"], input=payload, capture_output=True, text=True,
                              check=False, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        check.error = f"{python} could not run vLLM's checks: {exc}"
        return check
    check.wall_s = round(time.monotonic() - started, 2)
    read_answer(done.stdout, done.stderr, done.returncode, check)
    if folder and check.ran:
        _keep(folder, key, {"stdout": done.stdout, "stderr": done.stderr, "returncode": done.returncode})
    return check


def read_answer(stdout: str, stderr: str, returncode: int, check: ArgCheck) -> ArgCheck:
    """The MARK line of vllm_argcheck.py's output into `check`; no line: `error` says why (never accepted)."""
    answer, why = parse_answer(stdout)
    if answer is None:
        tail = (stderr or stdout or "").strip()[-600:]
        check.error = f"{check.python} gave no answer (exit {returncode}; {why}): {tail or 'no output'}"
        return check
    check.vllm_version = answer.get("vllm_version")
    check.platform = answer.get("platform")
    check.import_s = answer.get("import_s")
    check.not_run = answer.get("not_run")
    check.python = answer.get("python") or check.python
    if answer.get("error"):
        check.error = f"vLLM at {check.python} could not judge: {answer['error']}"
        return check
    check.deployments = {key: [verdict(node) for node in nodes]
                         for key, nodes in (answer.get("deployments") or {}).items()}
    return check


def verdict(node: dict[str, Any]) -> NodeVerdict:
    return NodeVerdict(**{k: v for k, v in node.items() if k in NodeVerdict.__dataclass_fields__})


def check_launch(profile: Profile, facts: dict[str, Any], configured: Any, project: Path) -> ArgCheck | None:
    """The launch of `profile` with these facts, judged by the configured vLLM Python; None when none is
    configured or found (the reason: `why_not_checked`)."""
    python, _how = judge_python(configured, project)
    nodes = node_inputs(profile, facts)
    if python is None or not nodes:
        return None
    target = target_of(profile, {**facts, "project": str(project)}, python)
    check = run({"launch": nodes}, python, target)
    check.will_run = will_run(profile, target, check) if check.ran else ""
    return check


def refusal(check: ArgCheck, source: str) -> str | None:
    """The refusal text of a check whose vLLM refused a node's command; None when every node passed."""
    refused = check.refused()
    if not refused:
        return None
    lines = [f"{source}: {node.describe(check.vllm_version)}" for node in refused]
    lines.append(f"judged by {check.judged_by()}; {check.will_run}")
    lines.append("fix: change the launch (the profile's launch.args, or the inventory's vllm_serve_extra_args / "
                 "vllm_parallel) until vLLM accepts every node's command; if the image runs another vLLM version, "
                 f"set {VARIABLE} to a Python with that version, or to `none` to leave the judgement to preflight "
                 "(compat.launch_args, inside the image)")
    return redact_text("vLLM refuses the launch:\n  " + "\n  ".join(lines))


def summary(check: ArgCheck | None, why_not: str) -> list[str]:
    """The lines `plan` and `validate` print about the check."""
    if check is None:
        return [f"vLLM's own checks not run on the controller: {why_not}"]
    if not check.ran:
        return [f"vLLM's own checks could not run: {check.error}"]
    reused = ", the answer kept from the same question earlier" if check.reused else ""
    lines = [f"vLLM's own checks ({check.judged_by()}, {check.wall_s} s{reused}): " + "; ".join(
        n.describe(check.vllm_version) for n in check.nodes())]
    for node in check.nodes():
        lines += [f"  {node.host}: not judged here: {what}" for what in node.not_judged]
    lines.append(f"  {check.will_run}")
    if check.not_run:
        lines.append(f"  not run: {check.not_run}")
    return [redact_text(line) for line in lines]


# --- preflight: the same check inside the image on the head node (roles/preflight, compat.launch_args) ----------

IN_IMAGE = {"device": "cuda", "same_build": True, "on_node": True}


def preflight_request(profile: Profile, launch_vars: dict[str, Any]) -> dict[str, Any]:
    """What roles/preflight runs inside the image on the head node: {"state": planned | nothing (attached, no
    vllm_head) | unplannable, "host": the head ("" unless planned), "why", "payload" (the JSON argument of
    vllm_argcheck.py), "script" (its text)}. `launch_vars`: {"head", "workers", "hostvars"} as
    playbooks/preflight.yml gives them."""
    head = launch_vars.get("head")
    out: dict[str, Any] = {"state": "nothing", "host": "", "why": "", "payload": "", "script": ""}
    if not head:
        out["why"] = "no vllm_head group: this run launches nothing to judge"
        return out
    facts = launch.facts_from_hostvars(profile, str(head), [str(w) for w in launch_vars.get("workers") or []],
                                       {str(h): dict(v or {}) for h, v in (launch_vars.get("hostvars") or {}).items()})
    if facts.get("mode") == "attach":
        out["why"] = "attach: the server runs with its own command line (compat.actual_config judges what it runs)"
        return out
    try:
        nodes = node_inputs(profile, facts)
    except ConfigError as exc:
        out.update(state="unplannable", why=f"the launch cannot be planned: {exc}")
        return out
    device = "cpu" if profile.model.hardware.accelerator == "none" else "cuda"
    target = {**IN_IMAGE, "device": device}
    payload = {"target": target, "deployments": {"launch": redact_obj(nodes)}}
    out.update(state="planned", host=str(head), why="", payload=json.dumps(payload, separators=(",", ":")),
               script=SCRIPT.read_text())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.serve.vllm_check",
                                     description="vLLM's own checks of every node's command (docs/plan.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("preflight-request", help="the JSON roles/preflight runs inside the image on the head")
    req.add_argument("--profile", required=True)
    req.add_argument("--launch", required=True, help='JSON: {"head", "workers", "hostvars"}')
    args = parser.parse_args(argv)
    try:
        launch_vars = json.loads(args.launch)
        if not isinstance(launch_vars, dict):
            raise ConfigError("--launch must be a JSON object")
        print(json.dumps(preflight_request(load_profile(args.profile), launch_vars)))
    except (ConfigError, ValueError, OSError) as exc:
        print(f"cannot make the launch check: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
