"""The run directory: opened once (inputs validated, profile frozen), then read and written by every stage.

Nothing touches a node before `open_run` succeeds: a bad profile or inventory value stops there with
the file, the field and what is allowed. Layout of reports/<inventory>/<run-id>/:

    run.json               run metadata (inventory, profile, run_id, started, hosts, unreachable hosts)
    evidence/profile.yml   the profile as judged: every later stage reads this frozen copy
    findings/<stage>.json  the findings of each stage, written when the stage ends
    stages/<stage>.json    the details of each stage (tables, plots), in one shape per stage
    evidence/...           raw evidence; findings point here (paths relative to the run directory)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .contract import extra_args_errors, launch_engines, limiting_args_errors, loadgen_errors
from .evidence import EvidenceStore, atomic_write
from .findings import Finding, read_findings, write_findings
from .model_identity import identity_args_errors, launches_process
from .profile import ConfigError, Profile, load_profile
from .redact import redact_obj, redact_text
from .variables import PREFIXES, validate_variables

INVENTORY_KEYS = PREFIXES


def resolve_profile_path(name_or_path: str, project_dir: Path) -> Path:
    """`cpu-lab` -> <project>/profiles/cpu-lab.yml; a path stays a path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yml", ".yaml"):
        return candidate if candidate.is_absolute() else project_dir / candidate
    path = project_dir / "profiles" / f"{name_or_path}.yml"
    if not path.is_file():
        known = sorted(p.stem for p in (project_dir / "profiles").glob("*.yml"))
        raise ConfigError(f"inventory field `acceptance_profile`: no profile {name_or_path!r} "
                          f"(allowed: {', '.join(known)} or a path to a .yml file)")
    return path


def validate_inventory_vars(variables: dict[str, Any], source: str, project_dir: Path | None = None,
                            host_variables: dict[str, dict[str, Any]] | None = None) -> None:
    """Every product variable declared and well typed (core/variables.py): a typo stops the run with the
    closest declared name. `project_dir` holds roles/*/meta/argument_specs.yml (the role options)."""
    validate_variables(variables, source, project_dir, host_variables)
    validate_probe_overrides(variables.get("acceptance_probe_overrides") or {}, source)


def validate_probe_overrides(overrides: dict[str, Any], source: str) -> None:
    """A probe override tunes its own probe (`load.soak_s`, `cache.request_timeout_s`); it never changes
    the contract or the pass rules the verdict signs (README 'Inventory variables')."""
    for kind, fields in overrides.items():
        for name in fields or {}:
            if not str(name).startswith(f"{kind}."):
                raise ConfigError(
                    f"invalid inventory:\n  {source}: field `acceptance_probe_overrides.{kind}.{name}`: a {kind} "
                    f"probe override may only tune `{kind}.*` settings (allowed: {kind}.<setting>); the contract "
                    "(contract.*), the pass rules (thresholds.*) and the model come from the profile: write "
                    "profiles/<site>.yml with the contract you test and set acceptance_profile to it")


def require_gpu_nodes(profile: Profile, hosts: list[str], source: str) -> None:
    """A GPU profile is judged on the `gpu_nodes` group: without it Ansible only warns, preflight judges nothing
    and the serve stage goes on to the head and workers (docs/acceptance.md "Unreachable nodes and refused
    inputs"). Refused before any node is touched."""
    accelerator = str(profile.model.hardware.accelerator or "none")
    if accelerator != "none" and not hosts:
        raise ConfigError(
            f"invalid inventory:\n  {source}: group `gpu_nodes` is missing or empty, but profile {profile.name} "
            f"runs on {accelerator} GPUs (hardware.accelerator): list every GPU node under "
            "all.children.gpu_nodes.hosts in the inventory (e.g. gpu_nodes: {hosts: {gpu-01: {ansible_host: "
            "10.0.0.11}}}), or pick a profile without GPUs")


def serve_mode(host: str, variables: dict[str, Any], host_variables: dict[str, dict[str, Any]] | None) -> str:
    """The head's vllm_serve_mode as its play sees it: its own (host_vars, -e) over group_vars; launch by default
    (roles/vllm_serve/defaults/main.yml)."""
    own = (host_variables or {}).get(host) or {}
    return str(own.get("vllm_serve_mode") or variables.get("vllm_serve_mode") or "launch")


def require_head_in_gpu_nodes(profile: Profile, groups: dict[str, list[str]], variables: dict[str, Any],
                              host_variables: dict[str, dict[str, Any]] | None, source: str) -> None:
    """In launch mode the run starts vLLM on `vllm_head` (and `vllm_workers`): each must be one of `gpu_nodes`, the
    nodes preflight judges and whose reachability it records. A head outside them is launched on unjudged, and
    when it is down the serve play ends the whole run before the report: no verdict, exit 1 (docs/inventory.md,
    docs/acceptance.md "Unreachable nodes and refused inputs"). Refused before any node is touched. Attach mode
    launches nothing: its head is reached at preflight instead (playbooks/preflight.yml)."""
    gpu_nodes = list(groups.get("gpu_nodes") or [])
    if not profile.has_gpus and not gpu_nodes:
        return
    lines = []
    for group, role in (("vllm_head", "the head (where vLLM serves)"), ("vllm_workers", "a worker (a headless rank)")):
        for host in groups.get(group) or []:
            if host in gpu_nodes or serve_mode(host, variables, host_variables) != "launch":
                continue
            listed = ", ".join(gpu_nodes) or "none"
            lines.append(
                f"{source}: host `{host}` is in group `{group}` but not in `gpu_nodes` (gpu_nodes: {listed}): in "
                f"launch mode the run starts vLLM on {role}, and only the gpu_nodes are preflighted (driver, CUDA, "
                "image, reachability), so it would run on a node nobody judged, and one that cannot be reached "
                f"would end the run with no verdict; add `{host}` under all.children.gpu_nodes.hosts, or put one of "
                f"the gpu_nodes in `{group}` instead")
    if lines:
        raise ConfigError("invalid inventory:\n  " + "\n  ".join(lines))


def require_contract_served(profile: Profile, variables: dict[str, Any], host_variables: dict[str, dict[str, Any]],
                            source: str, batched_tokens_default: int | None = None) -> None:
    """An inventory --max-model-len below the contract, a capacity-limiting launch argument the profile does not
    state, a loadgen_* value below the profile's load (core/contract.py) and an argument that changes the model
    that serves (core/model_identity.py) are refused before any node is touched.
    Per-engine arguments count once per engine of the launch (its data-parallel size); `batched_tokens_default` is
    vLLM's default --max-num-batched-tokens on the profile's hardware (hardware.py; None: unknown)."""
    engines = launch_engines(profile.data, variables)
    lines = extra_args_errors(profile.data, variables.get("vllm_serve_extra_args"), f"{source} (group_vars)")
    lines += limiting_args_errors(profile.data, variables, f"{source} (group_vars)", engines=engines,
                                  batched_tokens_default=batched_tokens_default)
    lines += loadgen_errors(profile.data, variables, f"{source} (group_vars)")
    lines += identity_args_errors(profile.data, variables, f"{source} (group_vars)",
                                  model_variables=launches_process(profile.data, variables))
    for host, host_vars in sorted(host_variables.items()):
        lines += extra_args_errors(profile.data, (host_vars or {}).get("vllm_serve_extra_args"),
                                   f"{source} (host {host})")
        own = {k: v for k, v in (host_vars or {}).items() if variables.get(k) != v}
        lines += limiting_args_errors(profile.data, own, f"{source} (host {host})",
                                      engines=launch_engines(profile.data, {**variables, **own}),
                                      batched_tokens_default=batched_tokens_default)
        lines += loadgen_errors(profile.data, own, f"{source} (host {host})")
        lines += identity_args_errors(profile.data, own, f"{source} (host {host})",
                                      model_variables=launches_process(profile.data, {**variables, **own}))
    if lines:
        raise ConfigError("invalid inventory:\n  " + "\n  ".join(lines))


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def open_run(*, project_dir: Path, reports_dir: Path, inventory: str, variables: dict[str, Any],
             hosts: list[str], run_id: str | None = None,
             host_variables: dict[str, dict[str, Any]] | None = None,
             groups: dict[str, list[str]] | None = None,
             batched_tokens_default: Any = None) -> tuple[Path, Profile]:
    """Validate, then open reports/<inventory>/<run-id>/. `groups`: the serve groups (`vllm_head`,
    `vllm_workers`) when the caller read them (the validate play): a launch on a head outside `hosts` (gpu_nodes)
    is refused. `batched_tokens_default`: vLLM's default --max-num-batched-tokens on the profile's hardware, or a
    function of the profile giving it (hardware.py vllm_batched_tokens_default, which core cannot import); None:
    unknown."""
    validate_inventory_vars(variables, f"inventory {inventory} (group_vars)", project_dir, host_variables)
    profile = load_profile(resolve_profile_path(str(variables["acceptance_profile"]), project_dir))
    require_gpu_nodes(profile, hosts, f"inventory {inventory}")
    if groups is not None:
        require_head_in_gpu_nodes(profile, {**groups, "gpu_nodes": hosts}, variables, host_variables,
                                  f"inventory {inventory}")
    default = batched_tokens_default(profile) if callable(batched_tokens_default) else batched_tokens_default
    require_contract_served(profile, variables, host_variables or {}, f"inventory {inventory}", default)
    run_id = run_id or new_run_id()
    run_dir = (reports_dir / inventory / run_id).resolve()
    try:
        run_dir.mkdir(parents=True, exist_ok=False)  # a run never writes into another run's directory
    except FileExistsError as exc:
        raise ConfigError(f"run directory {run_dir} already exists: another run with id {run_id}") from exc
    for sub in ("findings", "stages", "evidence"):
        (run_dir / sub).mkdir()
    run = {"inventory": inventory, "profile": profile.name, "profile_source": str(profile.source),
           "run_id": run_id, "started": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
           "hosts": hosts, "owner": variables.get("acceptance_owner"),
           "signoff": {"deployment_engineer": variables.get("acceptance_owner"),
                       "reviewer": variables.get("acceptance_reviewer") or None},
           "inventory_vars": redact_obj({k: v for k, v in variables.items() if k.startswith(INVENTORY_KEYS)}),
           # the frozen copy is merged: what its `extends` chain says about the official image and minimums is
           # kept here for the report (core/profile.py chain_deviations, issue 42 item 2)
           "recipe_deviations": list(profile.official_deviations)}
    atomic_write(RunDir(run_dir).run_json, json.dumps(redact_obj(run), indent=2, default=str) + "\n")
    record_profile(run_dir, profile)
    bind_profile(run_dir)
    return run_dir, profile


PROFILE_EVIDENCE = "evidence/profile.yml"


def record_profile(run_dir: Path, profile: Profile) -> str:
    """The profile as judged: the recipe record and every threshold are evidence of this run."""
    target = run_dir / PROFILE_EVIDENCE
    if not target.is_file():
        text = Path(profile.source).read_text()
        if profile.extends:          # a site profile over a generated one: the merged profile is what was judged
            text = (f"# {profile.source} merged over {', '.join(profile.extends)} (core/profile.py extends)\n"
                    + yaml.safe_dump(profile.data, sort_keys=False, allow_unicode=True, width=4096))
        atomic_write(target, redact_text(text))  # a token in launch.env stays out
    return PROFILE_EVIDENCE


# --- A run's files bound together (issue 42, item 7; docs/report.md "A run's files are bound") ----------------------
# open_run records the frozen profile's sha256 in run.json (`profile_sha256`); the verdict (report/write.py) records
# `judged_files`: the sha256 of every file under evidence/, findings/ and stages/ it judged (path -> sha256), of
# run.json's own fields and of the report.json it wrote. `report`, `sign` and `diff` check them (check_run_files):
# a file changed, removed or added since is refused, naming the file. A run opened before this binding existed
# records neither: `report` still reads it, `sign` refuses it (its files cannot be proven to be the judged ones).
BOUND_DIRS = ("evidence", "findings", "stages")
PROFILE_SHA_KEY = "profile_sha256"
JUDGED_KEY = "judged_files"


class RunFilesChanged(ConfigError):
    """A run's files no longer match what run.json bound (the message names each file and what to do)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def files_manifest(run_dir: Path) -> dict[str, str]:
    """path (relative to the run directory) -> sha256, for every regular file under evidence/, findings/, stages/
    (a link is recorded by its target's content; a temporary file of an atomic write is left out)."""
    root = Path(run_dir)
    out: dict[str, str] = {}
    for top in BOUND_DIRS:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and not (path.name.startswith(".") and path.name.endswith(".tmp")):
                out[path.relative_to(root).as_posix()] = sha256_of(path)
    return out


def _run_fields_sha256(run: dict[str, Any]) -> str:
    """run.json's fields other than the binding record itself, canonical JSON."""
    rest = {k: v for k, v in run.items() if k != JUDGED_KEY}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, default=str).encode()).hexdigest()


def bind_profile(run_dir: Path) -> str:
    """Record the frozen profile's sha256 in run.json (open_run, right after record_profile)."""
    digest = sha256_of(RunDir(run_dir).profile_path)
    update_run(run_dir, **{PROFILE_SHA_KEY: digest})
    return digest


@dataclass(frozen=True)
class RunBinding:
    """What run.json binds of a run: `state` `bound` (the verdict recorded its files), `open` (only the profile,
    before the verdict), `unbound` (a run opened before the binding existed); `changed`: one line per file that no
    longer matches."""

    state: str
    changed: tuple[str, ...] = ()
    profile_sha256: str | None = None
    files: int = 0

    @property
    def intact(self) -> bool:
        return not self.changed

    def summary(self) -> dict[str, Any]:
        return {"state": self.state, "intact": self.intact, "profile_sha256": self.profile_sha256,
                "files": self.files, "changed": list(self.changed)}


def read_binding(run_dir: Path, *, include_report: bool = True) -> RunBinding:
    """The run's files against what run.json bound (nothing is written). `include_report`: also compare
    report.json with the one the verdict wrote (sign, diff; `report` writes a new one anyway)."""
    run_dir = Path(run_dir)
    try:
        run = json.loads(RunDir(run_dir).run_json.read_text())
    except (OSError, ValueError):
        run = None
    if not isinstance(run, dict):     # no readable run.json: nothing bound, nothing proven (sign refuses it)
        return RunBinding(state="unbound")
    profile_sha = run.get(PROFILE_SHA_KEY)
    judged = run.get(JUDGED_KEY) if isinstance(run.get(JUDGED_KEY), dict) else None
    if not profile_sha and judged is None:
        return RunBinding(state="unbound")
    changed: list[str] = []
    frozen = RunDir(run_dir).profile_path
    if profile_sha:
        now = sha256_of(frozen) if frozen.is_file() else None
        if now is None:
            changed.append(f"{PROFILE_EVIDENCE}: removed (run.json recorded sha256 {profile_sha})")
        elif now != profile_sha:
            changed.append(f"{PROFILE_EVIDENCE}: changed since the run was opened (sha256 {now}, run.json recorded "
                           f"{profile_sha})")
    if judged is None:
        return RunBinding(state="open", changed=tuple(changed), profile_sha256=profile_sha)
    recorded = judged.get("manifest") if isinstance(judged.get("manifest"), dict) else {}
    current = files_manifest(run_dir)
    for path in sorted(set(recorded) | set(current)):
        if path not in current:
            changed.append(f"{path}: removed since the verdict")
        elif path not in recorded:
            changed.append(f"{path}: added since the verdict")
        elif current[path] != recorded[path] and not (path == PROFILE_EVIDENCE and profile_sha):
            changed.append(f"{path}: changed since the verdict")
    if judged.get("run_sha256") and _run_fields_sha256(run) != judged.get("run_sha256"):
        changed.append("run.json: its fields changed since the verdict")
    report = RunDir(run_dir).report_json
    if include_report and judged.get("report_sha256"):
        now_report = sha256_of(report) if report.is_file() else None
        if now_report != judged.get("report_sha256"):
            changed.append("report.json: " + ("removed" if now_report is None else "changed") + " since the verdict "
                           "wrote it")
    return RunBinding(state="bound", changed=tuple(changed), profile_sha256=profile_sha, files=len(recorded))


def refuse_changed(run_dir: Path, binding: RunBinding, command: str) -> None:
    """RunFilesChanged naming each file, when the run's files no longer match what run.json bound."""
    if binding.intact:
        return
    raise RunFilesChanged(
        f"{command}: refused: run {Path(run_dir)} no longer holds the files it was judged on: "
        + "; ".join(binding.changed)
        + ". A run's files are bound when it is opened and when its verdict is taken (run.json profile_sha256, "
          f"{JUDGED_KEY}); re-run the acceptance (a new run) rather than editing a finished one")


def check_run_files(run_dir: Path, command: str, *, include_report: bool = True) -> RunBinding:
    """read_binding, refused (RunFilesChanged, exit 2) when a bound file changed."""
    binding = read_binding(run_dir, include_report=include_report)
    refuse_changed(run_dir, binding, command)
    return binding


def verdict_record(run_dir: Path) -> dict[str, Any]:
    """What the verdict judged (nothing written): the manifest and run.json's fields; {} on a run whose profile was
    not bound at open_run (a run opened before the binding stays unbound: its files cannot be proven)."""
    run = json.loads(RunDir(run_dir).run_json.read_text())
    if not run.get(PROFILE_SHA_KEY):
        return {}
    return {"manifest": files_manifest(run_dir), "run_sha256": _run_fields_sha256(run),
            "at": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()}


def bind_verdict(run_dir: Path, record: dict[str, Any]) -> None:
    """Record verdict_record's record in run.json (`judged_files`), just before report.json is written."""
    path = RunDir(run_dir).run_json
    run = {k: v for k, v in json.loads(path.read_text()).items() if k != JUDGED_KEY}
    atomic_write(path, json.dumps({**run, JUDGED_KEY: record}, indent=2, default=str) + "\n")


def bind_report(run_dir: Path) -> None:
    """Record the sha256 of the report.json the verdict wrote (after it is written)."""
    path = RunDir(run_dir).run_json
    run = json.loads(path.read_text())
    judged = run.get(JUDGED_KEY)
    if not isinstance(judged, dict):
        return
    judged["report_sha256"] = sha256_of(RunDir(run_dir).report_json)
    atomic_write(path, json.dumps(run, indent=2, default=str) + "\n")


def update_run(run_dir: Path, **fields: Any) -> None:
    """Merge fields into run.json (e.g. unreachable hosts, environment) atomically."""
    path = RunDir(run_dir).run_json
    data = json.loads(path.read_text()) if path.is_file() else {}
    for key, value in fields.items():
        if isinstance(value, list) and isinstance(data.get(key), list):
            data[key] = sorted(set(data[key]) | set(value))
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    atomic_write(path, json.dumps(redact_obj(data), indent=2, default=str) + "\n")


@dataclass
class RunDir:
    """One run directory, as every stage after `open_run` sees it."""

    path: Path
    _profile: Profile | None = field(default=None, repr=False)

    @classmethod
    def existing(cls, path: str | Path) -> RunDir:
        run = cls(Path(path))
        if not run.path.is_dir():
            raise ConfigError(f"run directory {run.path} does not exist: run accept.yml first (or "
                              "playbooks/validate.yml, which opens a run) and pass its directory")
        return run

    def profile(self) -> Profile:
        """The run's frozen profile copy: what the run records is what every stage judges."""
        if self._profile is None:
            frozen = self.path / PROFILE_EVIDENCE
            if not frozen.is_file():
                raise ConfigError(f"run {self.path} has no {PROFILE_EVIDENCE}: it was not opened by open_run "
                                  "(run playbooks/validate.yml first)")
            self._profile = load_profile(frozen)
        return self._profile

    @property
    def profile_path(self) -> Path:
        return self.path / PROFILE_EVIDENCE

    @property
    def run_json(self) -> Path:
        """run.json: what open_run recorded (inventory, hosts, owner, the inventory's variables)."""
        return self.path / "run.json"

    @property
    def report_json(self) -> Path:
        return self.path / "report.json"

    def at(self, *parts: str | Path) -> Path:
        """A path the run records relative to its directory: a finding's evidence (`evidence/serve/args.json`),
        a folder a stage fills (`evidence/memory`, `probes/load-distributed`), a record beside report.json."""
        return self.path.joinpath(*parts)

    def report_file(self, name: str) -> Path:
        """A file the report stage writes beside report.json (report.html, remediation-decision.json, ...)."""
        return self.path / name

    @property
    def rechecks_log(self) -> Path:
        """rechecks.jsonl beside a signed run's report.json: one line per day-N re-check judged against this run
        (recheck/report.py), the lineage of its re-checks kept with the signed run."""
        return self.path / "rechecks.jsonl"

    @property
    def findings_dir(self) -> Path:
        return self.path / "findings"

    @property
    def stages_dir(self) -> Path:
        return self.path / "stages"

    def evidence_path(self, *parts: str) -> Path:
        """A file under evidence/ (evidence/serve/process-args.json: evidence_path("serve", "process-args.json"))."""
        return self.path.joinpath("evidence", *parts)

    def meta(self) -> dict[str, Any]:
        path = self.run_json
        return json.loads(path.read_text()) if path.is_file() else {}

    def inventory_vars(self) -> dict[str, Any]:
        """The inventory's product variables as open_run recorded them (redacted); {} when unreadable."""
        try:
            return dict(self.meta().get("inventory_vars") or {})
        except (OSError, ValueError, AttributeError, TypeError):
            return {}

    @property
    def monitoring_dir(self) -> Path:
        return self.path / "monitoring"

    def update(self, **fields: Any) -> None:
        update_run(self.path, **fields)

    def findings_path(self, stage: str) -> Path:
        return self.findings_dir / f"{stage}.json"

    def write_findings(self, stage: str, findings: list[Finding]) -> Path:
        path = self.findings_path(stage)
        write_findings(path, findings)
        return path

    def findings(self, stage: str) -> list[Finding] | None:
        """A stage's findings, or None when the stage left none."""
        path = self.findings_path(stage)
        return read_findings(path) if path.is_file() else None

    def stage_path(self, stage: str) -> Path:
        return self.stages_dir / f"{stage}.json"

    def write_stage(self, stage: str, details: dict[str, Any], secrets: list[str] | None = None) -> Path:
        path = self.stage_path(stage)
        atomic_write(path, json.dumps(redact_obj(details, secrets), indent=2, default=str) + "\n")
        return path

    def stage(self, stage: str) -> dict[str, Any] | None:
        path = self.stage_path(stage)
        return json.loads(path.read_text()) if path.is_file() else None

    def evidence(self, subdir: str = "", secrets: list[str] | None = None) -> EvidenceStore:
        return EvidenceStore(self.path, subdir, secrets)
