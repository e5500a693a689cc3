"""What an acceptance run will do and cost, before the cluster is booked (docs/plan.md).

`vllm-acceptance plan -i INVENTORY` (and the `--check` run of accept.yml, playbooks/plan.yml) reads the
inventory through Ansible's own `ansible-inventory` and the profile it names, and prints:

- the launch per node: the argv and environment the serve role would use (roles/vllm_serve), built by the
  same code (serve/launch.py for the container commands, runtime/process.py for the process runtime), the
  environment's secret-bearing values redacted;
- the GPUs booked (the GPUs each node's container holds: `--gpus all` hands over every GPU of the node) and
  whether the model's weights fit the GPUs that serve them (refused, with the figures and what would fit, when not);
- every stage the run goes through, its requests and its upper-bound wall time and GPU-hours, as each probe plans
  it (probes/load/plan.py, probes/cache/plan.py, probes/agent/plan.py, on core/bounds.py); with a total. This
  module only adds them up.

How each bound is computed (docs/plan.md): a request counts TTFT + its output tokens x ITL from the contract's SLO,
at most its timeout; a wave of requests at the concurrency one request; a server start its whole
`launch.ready_timeout_s`. The GPU-hours of a stage are its seconds x the GPUs booked / 3600: the whole cluster is
held for the whole run. Relaunches at proposed limits happen only when the contract does not hold: they are listed
apart (worst case) and not in the total.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .core.argv import parse_flags
from .core.bounds import StageBound
from .core.contract import launch_engines, per_engine_capacity
from .core.probes import default_probe_names
from .core.profile import ConfigError, Profile, load_profile
from .core.redact import redact_obj, redact_text
from .core.rundir import resolve_profile_path
from .hardware import load_hardware_table, profile_class
from .probes import registry as probe_registry
from .probes.agent.plan import agent_plan
from .probes.cache.plan import cache_plan
from .probes.load.plan import load_plan
from .probes.options import ProbeOptions
from .probes.quality.plan import quality_plan
from .recipe import layouts as recipe_layouts
from .serve import launch, vllm_check
from .validate import ansible_inventory_command, group_hosts

CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass
class Stage:
    name: str
    what: str
    requests: int | None
    wall_s: float
    gpu_hours: float = 0.0
    basis: str = ""
    in_total: bool = True
    steps: list[dict[str, Any]] = field(default_factory=list)   # the ramp's steps and each one's bound


@dataclass
class NodeLaunch:
    host: str
    role: str
    address: str
    argv: list[str]
    env: dict[str, str]


@dataclass
class Plan:
    inventory: str
    profile: str
    profile_path: str
    mode: str
    runtime: str
    base_url: str | None
    gpu_nodes: list[str]
    gpus_per_node: int
    gpus: int
    nodes: list[NodeLaunch] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    vllm_check: dict[str, Any] | None = None      # vLLM's own checks of every node's command (serve/vllm_check.py)
    vllm_check_lines: list[str] = field(default_factory=list)
    gpus_by_node: dict[str, int] = field(default_factory=dict)   # the GPUs the launch holds on each GPU node
    fit: list[str] = field(default_factory=list)                 # the weights (and the contract's KV) on them

    @property
    def total_s(self) -> float:
        return sum(s.wall_s for s in self.stages if s.in_total)

    @property
    def total_gpu_hours(self) -> float:
        return sum(s.gpu_hours for s in self.stages if s.in_total)

    def to_dict(self) -> dict[str, Any]:
        # as printed: the server URL's credentials and query secrets, any secret a note quotes, redacted
        return redact_obj({**asdict(self), "total_s": round(self.total_s, 1),
                           "total_gpu_hours": round(self.total_gpu_hours, 2)})


# --- the inventory, read by Ansible itself ---------------------------------------------------------


@dataclass
class Inventory:
    source: str
    groups: dict[str, list[str]]
    hostvars: dict[str, dict[str, Any]]

    def hosts(self, group: str) -> list[str]:
        return list(self.groups.get(group, []))

    def site_vars(self) -> dict[str, Any]:
        """The variables the plays on the controller see (localhost's; else the first GPU node's)."""
        for host in ("localhost", *self.hosts("vllm_head"), *self.hosts("gpu_nodes")):
            if host in self.hostvars:
                return self.hostvars[host]
        return {}


def read_inventory(source: Path) -> Inventory:
    """Groups and variables as Ansible resolves them (group_vars, host_vars), without contacting any host."""
    if not source.exists():
        raise ConfigError(f"inventory {source}: no such file or directory (pass -i inventories/<site>)")
    proc = subprocess.run([ansible_inventory_command(), "-i", str(source), "--list"], capture_output=True, text=True,
                          check=False, timeout=120)
    if proc.returncode != 0:
        raise ConfigError(f"inventory {source}: ansible-inventory failed: {proc.stderr.strip()[-800:]}")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"inventory {source}: ansible-inventory printed no JSON ({exc}): "
                          f"{proc.stdout[:300]!r}") from exc
    hostvars = data.get("_meta", {}).get("hostvars", {})
    return Inventory(str(source), _group_hosts(data), {str(h): dict(v) for h, v in hostvars.items()})


def _group_hosts(data: dict[str, Any], group: str = "all") -> dict[str, list[str]]:
    """Every group's hosts, children included (validate.py group_hosts)."""
    return group_hosts(data, group)


# --- the launch per node (roles/vllm_serve) --------------------------------------------------------


def serve_facts(profile: Profile, inv: Inventory) -> dict[str, Any]:
    """The facts roles/vllm_serve/tasks/multinode.yml passes to serve/launch.py, from the head's variables
    with the role's defaults (roles/vllm_serve/defaults/main.yml; serve/launch.py facts_from_hostvars)."""
    heads = inv.hosts("vllm_head")
    if not heads:
        raise ConfigError(f"inventory {inv.source}: no vllm_head group: put the host that serves in it")
    return launch.facts_from_hostvars(profile, heads[0], inv.hosts("vllm_workers"), inv.hostvars)


def node_launches(profile: Profile, facts: dict[str, Any]) -> list[NodeLaunch]:
    """The launch on each node, as the serve role would run it; nothing for an attached server."""
    if facts["mode"] == "attach":
        return []
    runtime = str(facts["runtime"])
    if runtime == "process":
        return [_process_launch(profile, facts)]
    if runtime not in ("docker", "podman"):
        raise ConfigError(f"launch.runtime {runtime!r}: the serve role launches process, docker or podman")
    if facts["workers"]:
        try:
            commands = launch.node_commands(profile, facts)
        except launch.LayoutRefusal as exc:        # with the layouts the profile's recipe allows on these nodes
            recipe = profile.model.recipe
            offered = recipe_layouts.suggestions(recipe.file, recipe.hardware, recipe.variant, exc.nodes,
                                                 keep=holds_weights(profile))
            raise ConfigError(f"{exc}\n{offered}" if offered else str(exc)) from exc
        return [_node(c.host, c.role, c.address, c.argv, c.env) for c in commands.values()]
    return [_container_launch(profile, facts)]


def _container_launch(profile: Profile, facts: dict[str, Any]) -> NodeLaunch:
    """roles/vllm_serve/tasks/container.yml: one container, the profile's args after the listen address."""
    env = {str(k): str(v) for k, v in profile.model.launch.env.items()}
    digest = str(facts.get("image_digest") or "")
    image = str(facts["image"]) + (f"@{digest}" if digest else "")
    serve = launch.single_serve_args(profile, facts)
    argv = launch._container_argv(str(facts["runtime"]), facts, env, image, serve)  # noqa: SLF001
    head = str(facts["head"])
    return _node(head, "head", str(facts["addresses"].get(head) or head), argv, env)


def _process_launch(profile: Profile, facts: dict[str, Any]) -> NodeLaunch:
    """roles/vllm_serve/tasks/process.yml: the lab's vLLM process (runtime/process.py LaunchSpec)."""
    spec = launch.process_spec(profile, facts)
    head = str(facts["head"])
    return _node(head, "head", str(facts["addresses"].get(head) or head), spec.command(), spec.env)


def _node(host: str, role: str, address: str, argv: list[str], env: dict[str, str]) -> NodeLaunch:
    """A node's launch as shown: secret flag values, URL credentials and secret-named variables redacted."""
    return NodeLaunch(host, role, address, [str(a) for a in redact_obj(list(argv))],
                      {str(k): str(v) for k, v in redact_obj(dict(env)).items()})


# --- the stages and their cost ---------------------------------------------------------------------


def _options(profile: Profile, kind: str, site: dict[str, Any]) -> ProbeOptions:
    """The probe's options as playbooks/tasks/probe.yml gives them: the profile, the inventory's
    acceptance_probe_overrides for this probe."""
    overrides = (site.get("acceptance_probe_overrides") or {}).get(kind) or {}
    model = str(profile.model.model.served)
    return ProbeOptions(kind=kind, base_url="http://planned/v1", model=model, out_dir=Path("."), profile=profile,
                        overrides=dict(overrides))


def _stage(bound: StageBound) -> Stage:
    return Stage(bound.name, bound.what, bound.requests, float(bound.bound_s), basis=bound.basis,
                 in_total=bound.in_total, steps=list(bound.steps))


def stages(profile: Profile, facts: dict[str, Any], site: dict[str, Any]) -> list[Stage]:
    """Every stage of the run in its order (accept.yml, playbooks/probes.yml), each as its probe plans it
    (probes/cache/plan.py, probes/agent/plan.py, probes/load/plan.py): this only adds them up."""
    ready = float(math.ceil(float(facts["ready_timeout_s"])))
    launched = facts["mode"] != "attach"
    probes = list(site.get("acceptance_probes") or default_probe_names())
    out: list[Stage] = []
    if launched:
        out.append(Stage("model_load", "launch and wait for /health", 0, ready,
                         basis=f"launch.ready_timeout_s {ready:g} s (the bound the serve role waits)"))
    if "cache" in probes:
        restart = launched and bool(site.get("acceptance_cache_restart", True))
        engines = launch_engines(profile.data, {"vllm_parallel": facts.get("parallel") or {}})
        out += [_stage(b) for b in cache_plan(_options(profile, "cache", site), engines, restart)]
    if "agent" in probes:
        out.append(_stage(agent_plan(_options(profile, "agent", site))))
    if "load" in probes:
        # playbooks/vars/probes.yml probe_relaunch: a launched single-node server (not a P/D deployment) is
        # relaunched at each limit; otherwise the client is driven at the limit on the server as launched.
        relaunch = (launched and bool(site.get("acceptance_limit_relaunch", True)) and not facts["workers"]
                    and profile.model.pd is None)
        cfg = probe_registry.get("load").config(_options(profile, "load", site), {})
        out += [_stage(b) for b in load_plan(cfg, ready if relaunch else None)]
    if "quality" in probes:
        out.append(_stage(quality_plan(_options(profile, "quality", site))))
    # A probe without its own plan is still shown, never costed as free (docs/plan.md).
    out += [Stage(name, f"the {name} probe", None, 0.0, basis="no estimate for this probe", in_total=False)
            for name in probes if name not in ("cache", "agent", "load", "quality")]
    return out


# --- the GPUs booked: what the launch holds ------------------------------------------------------------


def physical_gpus_per_node(profile: Profile, facts: dict[str, Any]) -> int:
    """A node's GPUs: the hardware class's node shape (data/hardware.yml), else the profile's
    hardware.gpus_per_node or the inventory's vllm_gpus_per_node (0 without accelerator)."""
    if profile.model.hardware.accelerator == "none":
        return 0
    row = profile_class(profile)
    if row is not None:
        return int(row.gpus_per_node)
    return int(facts.get("gpus_per_node") or profile.model.hardware.gpus_per_node or 0)


def held_gpus(argv: list[str], physical: int) -> int:
    """The GPUs a container launch hands to its container: `--gpus all` (or a CDI `--device nvidia.com/gpu=all`)
    every GPU of the node, `--gpus N` N, `--gpus device=0,1` the devices named; without a GPU flag the node's
    GPUs (the node is held for the run)."""
    held: int | None = None
    for index, arg in enumerate(argv):
        name, sep, value = str(arg).partition("=")
        if name not in ("--gpus", "--device") or (not sep and index + 1 >= len(argv)):
            continue
        value = (value if sep else str(argv[index + 1])).strip("\"'")
        if name == "--device":
            if value.endswith("gpu=all"):
                held = physical
            elif "/gpu=" in value:
                held = (held or 0) + 1
            continue
        if value == "all":
            held = physical
        elif value.isdigit():
            held = int(value)
        elif value.startswith("device="):
            held = len([d for d in value.split("=", 1)[1].split(",") if d.strip()])
    return physical if held is None else min(held, physical) if physical else held


def booked_gpus(profile: Profile, facts: dict[str, Any], gpu_nodes: list[str],
                nodes: list[NodeLaunch]) -> dict[str, int]:
    """{gpu node: the GPUs booked there}: on a node the launch runs on, the GPUs its container holds; on any other
    GPU node (preflight runs there; an attached deployment's nodes) every GPU of the node."""
    physical = physical_gpus_per_node(profile, facts)
    launched = {n.host: n for n in nodes}
    container = str(facts["runtime"]) in ("docker", "podman")
    return {host: held_gpus(launched[host].argv, physical) if host in launched and container else physical
            for host in gpu_nodes}


# --- does the model fit the GPUs booked -------------------------------------------------------------------------

VLLM_DEFAULT_UTILIZATION = 0.9   # vLLM's CacheConfig.gpu_memory_utilization default (--gpu-memory-utilization)


@dataclass
class Fit:
    """The model's weights against the memory of the GPUs that serve it (docs/plan.md "Does the model fit")."""

    weights_gb: float
    replicas: int               # the data-parallel engines that each hold the whole weights (no expert parallel)
    gpus: int                   # the GPUs the serving layout uses (tensor x pipeline x data)
    gpu_name: str
    gpu_memory_gb: float
    utilization: float
    context_tokens: int
    concurrency: int

    @property
    def needed_gb(self) -> float:
        return self.weights_gb * self.replicas

    @property
    def usable_gb(self) -> float:
        return self.gpus * self.gpu_memory_gb * self.utilization

    @property
    def fits(self) -> bool:
        return self.needed_gb <= self.usable_gb

    def lines(self) -> list[str]:
        per_gpu = self.needed_gb / max(1, self.gpus)
        usable_each = self.gpu_memory_gb * self.utilization
        kv_tokens = self.concurrency * self.context_tokens
        left = self.usable_gb - self.needed_gb
        out = [f"weights: {self.weights_gb:,.0f} GB (model.weights_gb)"
               + (f" x {self.replicas} data-parallel replicas" if self.replicas > 1 else "")
               + f" on {self.gpus} x {self.gpu_name} ({self.gpu_memory_gb:g} GB each = "
               f"{self.gpus * self.gpu_memory_gb:,.0f} GB; {self.usable_gb:,.0f} GB at --gpu-memory-utilization "
               f"{self.utilization:g}): {per_gpu:,.0f} GB per GPU of {usable_each:,.0f} GB usable"]
        if self.fits:
            out.append(f"KV cache for the contract: {self.concurrency} sessions x {self.context_tokens:,} tokens = "
                       f"{kv_tokens:,} tokens; the {left:,.0f} GB left after the weights hold "
                       f"{left * 1e9 / max(1, kv_tokens) / 1024:,.1f} KiB per token; the model's KV bytes per "
                       "token are not in the package's data: the load probe reads the capacity vLLM allocates")
        return out


def model_fit(profile: Profile, facts: dict[str, Any], nodes: list[NodeLaunch]) -> Fit | None:
    """The fit of the weights on the GPUs the launch serves with; None where it cannot be computed (an attached
    server, no accelerator, the weights or the GPU's memory not in the profile's data): the plan says so."""
    weights = profile.model.model.weights_gb or profile.model.hardware.memory_estimate_gb
    row = profile_class(profile)
    if facts["mode"] == "attach" or not nodes or profile.model.hardware.accelerator == "none" or not weights \
            or row is None or row.gpu_memory_gb is None:
        return None
    flags = parse_flags([*profile.model.launch.args, *(facts.get("extra_args") or [])])
    head = parse_flags(nodes[0].argv)
    merged = {**(profile.model.at("parallel") or {}), **(facts.get("parallel") or {})}

    def size(flag: str, key: str) -> int:
        value = head.get(flag, merged.get(key, 1))
        try:
            return max(1, int(value))
        except (TypeError, ValueError):
            return 1

    tensor, pipeline = size("tensor_parallel_size", "tensor"), size("pipeline_parallel_size", "pipeline")
    data = size("data_parallel_size", "data")
    expert = bool(head.get("enable_expert_parallel") or merged.get("expert"))
    try:
        utilization = float(flags.get("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION)
    except (TypeError, ValueError):
        utilization = VLLM_DEFAULT_UTILIZATION
    contract = profile.model.contract
    return Fit(weights_gb=float(weights), replicas=1 if expert else data, gpus=tensor * pipeline * data,
               gpu_name=row.gpu_name, gpu_memory_gb=float(row.gpu_memory_gb), utilization=utilization,
               context_tokens=int(contract.context_tokens) + int(contract.max_output_tokens),
               concurrency=int(contract.concurrency))


def _no_fit_reason(profile: Profile, facts: dict[str, Any]) -> str:
    if facts["mode"] == "attach":
        return "fit: not computed (attach: the deployment runs as it is)"
    if profile.model.hardware.accelerator == "none":
        return "fit: not computed (no accelerator)"
    if not (profile.model.model.weights_gb or profile.model.hardware.memory_estimate_gb):
        return "fit: not computed: the profile states no model.weights_gb (nor hardware.memory_estimate_gb)"
    return (f"fit: not computed: hardware.class {profile.model.hardware.class_ or '(none)'} has no GPU memory in "
            "data/hardware.yml")


def holds_weights(profile: Profile, utilization: float = VLLM_DEFAULT_UTILIZATION) -> Callable[[Any], bool]:
    """Whether a recipe layout's GPUs hold the profile's weights (once per data-parallel engine unless expert
    parallel), as model_fit judges a launch; a layout whose hardware has no memory figure is kept."""
    weights = float(profile.model.model.weights_gb or profile.model.hardware.memory_estimate_gb or 0)
    table = load_hardware_table()

    def keep(layout: Any) -> bool:
        row = table.get(layout.hardware)
        if not weights or row is None or not row.gpu_memory_gb:
            return True
        replicas = 1 if layout.expert else max(1, layout.data)
        return weights * replicas <= layout.gpus * row.gpu_memory_gb * utilization
    return keep


def what_fits(fit: Fit, profile: Profile, node_count: int) -> list[str]:
    """The least nodes of this hardware that hold the weights, and the hardware of the package's data that holds
    them on the nodes given (data/hardware.yml), at the same --gpu-memory-utilization."""
    row = profile_class(profile)
    out: list[str] = []
    if row is not None and row.gpu_memory_gb:
        per_node = row.gpus_per_node * row.gpu_memory_gb * fit.utilization
        least = math.ceil(fit.needed_gb / per_node)
        out.append(f"at least {least} node(s) of {row.key} ({least * row.gpus_per_node} x {row.gpu_name}, "
                   f"{least * per_node:,.0f} GB usable) with a layout that spans them")
    holds = [f"{r.key} ({node_count * r.gpus_per_node} x {r.gpu_name} of {r.gpu_memory_gb:g} GB, "
             f"{node_count * r.gpus_per_node * r.gpu_memory_gb * fit.utilization:,.0f} GB usable)"
             for r in load_hardware_table().values()
             if r.gpu_memory_gb and (row is None or (r.key != row.key and r.vendor == row.vendor))
             and node_count * r.gpus_per_node * r.gpu_memory_gb * fit.utilization >= fit.needed_gb]
    if holds:
        out.append(f"on the {node_count} node(s) given: " + ", ".join(holds))
    if row is not None and row.gpu_memory_gb:      # the recipe's layouts on that many nodes that hold the weights
        recipe = profile.model.recipe
        offered = recipe_layouts.suggestions(recipe.file, recipe.hardware, recipe.variant, least,
                                             keep=holds_weights(profile, fit.utilization))
        if offered:
            out.append(offered)
    return out


def fit_refusal(fit: Fit | None, profile: Profile, node_count: int) -> str | None:
    """Why the plan refuses (a ConfigError's message, exit 2), or None: the weights need more memory than the
    GPUs that serve them have (the figures, and what would fit)."""
    if fit is None or fit.fits:
        return None
    per_gpu = fit.needed_gb / max(1, fit.gpus)
    usable_each = fit.gpu_memory_gb * fit.utilization
    fixes = what_fits(fit, profile, node_count)
    return (f"profile {profile.name}: the model does not fit: {fit.needed_gb:,.0f} GB of weights (model.weights_gb"
            + (f" x {fit.replicas} data-parallel replicas" if fit.replicas > 1 else "")
            + f") on {fit.gpus} x {fit.gpu_name} = {fit.gpus * fit.gpu_memory_gb:,.0f} GB "
            f"({fit.usable_gb:,.0f} GB at --gpu-memory-utilization {fit.utilization:g}): {per_gpu:,.0f} GB per GPU "
            f"needed, {usable_each:,.0f} GB usable of {fit.gpu_memory_gb:g} GB"
            + (("; what fits: " + "; ".join(fixes)) if fixes else ""))


# --- the whole plan --------------------------------------------------------------------------------


def project_dir(given: Path | None = None) -> Path:
    """--project-dir, else the current directory when it holds accept.yml, else this checkout."""
    if given:
        return given
    return Path.cwd() if (Path.cwd() / "accept.yml").is_file() else CHECKOUT


def build_plan(inventory: Path | Inventory, profile_name: str | None = None, project: Path | None = None,
               overrides: dict[str, Any] | None = None, vllm_python: str | None = None) -> Plan:
    """The plan of `inventory` (a path read by ansible-inventory, or an Inventory already resolved: the gate's,
    gate.py); `overrides` outrank every host's variables, as `ansible-playbook -e` does.
    Every node's command is judged by vLLM itself (serve/vllm_check.py, with `vllm_python`, else the inventory's
    acceptance_vllm_check_python, else the lab venv): what vLLM refuses is a ConfigError quoting vLLM."""
    inv = inventory if isinstance(inventory, Inventory) else read_inventory(inventory)
    inventory = Path(inv.source)
    for host_vars in inv.hostvars.values():
        host_vars.update(overrides or {})
    site = inv.site_vars()
    name = profile_name or site.get("acceptance_profile")
    if not name:
        raise ConfigError(f"inventory {inventory}: acceptance_profile is not set (a profiles/<name>.yml name, "
                          "or pass --profile)")
    path = resolve_profile_path(str(name), project_dir(project))
    profile = load_profile(path)
    facts = serve_facts(profile, inv)
    gpu_nodes = inv.hosts("gpu_nodes")
    plan = Plan(inventory=str(inventory), profile=str(profile.model.name), profile_path=str(path),
                mode=str(facts["mode"]), runtime=str(facts["runtime"]),
                base_url=facts["base_url"] if facts["mode"] == "attach" else None,
                gpu_nodes=gpu_nodes, gpus_per_node=physical_gpus_per_node(profile, facts), gpus=0)
    plan.nodes = node_launches(profile, facts)
    # GPUs booked = the GPUs the launch holds on each node (`--gpus all`: every GPU of the node), not the layout's.
    plan.gpus_by_node = booked_gpus(profile, facts, gpu_nodes, plan.nodes)
    plan.gpus = sum(plan.gpus_by_node.values())
    fit = model_fit(profile, facts, plan.nodes)
    does_not_fit = fit_refusal(fit, profile, max(1, len({n.host for n in plan.nodes})))
    if does_not_fit:
        raise ConfigError(does_not_fit)
    plan.fit = fit.lines() if fit is not None else [_no_fit_reason(profile, facts)]
    judged_by = vllm_python if vllm_python is not None else site.get(vllm_check.VARIABLE)
    check = vllm_check.check_launch(profile, facts, judged_by, project_dir(project))
    why_not = vllm_check.judge_python(judged_by, project_dir(project))[1] if check is None else ""
    if facts["mode"] == "attach":
        why_not = "attach: nothing is launched"
    plan.vllm_check = check.to_dict() if check is not None else None
    plan.vllm_check_lines = vllm_check.summary(check, why_not)
    refused = vllm_check.refusal(check, f"profile {profile.name}") if check is not None and check.ran else None
    if refused:
        raise ConfigError(refused)
    plan.stages = stages(profile, facts, site)
    for stage in plan.stages:
        stage.gpu_hours = stage.wall_s * plan.gpus / 3600
    plan.notes = _notes(plan) + _capacity_notes(profile, facts)
    return plan


def _capacity_notes(profile: Profile, facts: dict[str, Any]) -> list[str]:
    """The per-engine arguments of the launch, multiplied by the engines that serve the contract (the data-parallel
    size; core/contract.py PER_ENGINE_ARGS), beside the contract."""
    if facts["mode"] == "attach":
        return []
    engines = launch_engines(profile.data, {"vllm_parallel": facts.get("parallel") or {}})
    args = [*profile.model.launch.args, *(facts.get("extra_args") or [])]
    return [f"per engine: {line}" for line in per_engine_capacity(profile.data, args, engines)]


def _notes(plan: Plan) -> list[str]:
    notes = ["preflight (read-only commands and the all-reduce on every GPU node) takes minutes; not estimated"]
    if plan.mode == "attach":
        notes.append(f"attach: nothing is launched, the server at {plan.base_url} is judged as it runs")
    if not plan.gpus:
        notes.append("no GPUs on this profile (hardware.accelerator none): GPU-hours are 0")
    return notes


# --- output ----------------------------------------------------------------------------------------


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def booked_text(plan: Plan) -> str:
    """The GPUs booked and where they come from: each GPU node's GPUs as the launch holds them."""
    counts = sorted(set(plan.gpus_by_node.values()))
    if len(counts) == 1:
        how = f"{len(plan.gpu_nodes)} gpu_nodes x {counts[0]}"
    else:
        how = " + ".join(f"{host} {n}" for host, n in plan.gpus_by_node.items()) or f"{len(plan.gpu_nodes)} gpu_nodes"
    held = " (the GPUs each node's container holds)" if plan.nodes and plan.runtime in ("docker", "podman") else ""
    return f"{how} = {plan.gpus}{held}"


def render_text(plan: Plan) -> str:
    lines = [f"plan: inventory {plan.inventory}, profile {plan.profile} ({plan.profile_path})",
             f"  {plan.mode} on {plan.runtime}; GPUs booked: {booked_text(plan)}",
             *(f"  {line}" for line in plan.fit), "", "launch per node:"]
    if not plan.nodes:
        lines.append(f"  (none: attached to {plan.base_url})")
    for node in plan.nodes:
        lines.append(f"  {node.host} ({node.role}, {node.address}):")
        lines.append(f"    argv: {shlex.join(node.argv)}")
        lines += [f"    env {k}={v}" for k, v in node.env.items()]
    lines += ["", *plan.vllm_check_lines]
    lines += ["", f"{'stage':<18}{'requests':>9}{'wall':>11}{'GPU-h':>10}  what / how estimated"]
    for s in plan.stages:
        req = "-" if s.requests is None else str(s.requests)
        mark = "" if s.in_total else " (not in total)"
        lines.append(f"{s.name:<18}{req:>9}{_hours(s.wall_s):>11}{s.gpu_hours:>10.2f}  {s.what}{mark}")
        lines.append(f"{'':<48}{s.basis}")
    lines.append(f"{'total':<18}{'':>9}{_hours(plan.total_s):>11}{plan.total_gpu_hours:>10.2f}")
    lines += ["", *(f"note: {n}" for n in plan.notes)]
    return redact_text("\n".join(lines))   # every line as `plan` and `run --check` print it (core/redact.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--inventory", required=True, type=Path, help="inventory file or directory")
    parser.add_argument("--profile", help="profile name or path (default: the inventory's acceptance_profile)")
    parser.add_argument("--project-dir", type=Path, help="checkout holding profiles/ (default: the current "
                                                         "directory when it holds accept.yml, else this checkout)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--vllm-python", metavar="PYTHON",
                        help="the Python whose vLLM judges every node's command (default: the inventory's "
                             "acceptance_vllm_check_python, else .venv-lab/bin/python where present; none: skip)")
    parser.add_argument("--recheck", action="store_true", help="the day-N re-check's cost instead: its duration and "
                                                                 "load on the deployment (docs/recheck.md)")
    parser.add_argument("--baseline", default="latest-signed", metavar="RUN",
                        help="--recheck: the signed run whose profile the re-check runs with (default latest-signed)")
    parser.add_argument("--vars", default="{}", metavar="JSON",
                        help="variables that outrank the inventory's, as -e does (playbooks/plan.yml passes the "
                             "head's as the run resolved them)")


def command(args: argparse.Namespace) -> int:
    """The CLI's `plan`: exit 0 with the plan, 2 with the reason on bad input."""
    if getattr(args, "recheck", False):
        print("cannot plan: --recheck is `vllm-acceptance plan -i INVENTORY --recheck` (recheck/run.py)",
              file=sys.stderr)
        return 2
    try:
        overrides = json.loads(args.vars)
        if not isinstance(overrides, dict):
            raise ConfigError(f"--vars {args.vars!r}: a JSON object of variables is expected")
        plan = build_plan(args.inventory, args.profile, args.project_dir, overrides, args.vllm_python)
    except json.JSONDecodeError as exc:
        print(redact_text(f"cannot plan: --vars is not JSON ({exc})"), file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(redact_text(f"cannot plan: {exc}"), file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=1) if args.json else render_text(plan))
    return 0


# --- the README's cost table, generated from the plan -----------------------------------------------------------

README = CHECKOUT / "README.md"
README_INVENTORY = "inventories/example-gb300"
README_BEGIN = "<!-- plan-table:begin (generated: python -m vllm_acceptance.plan readme) -->"
README_END = "<!-- plan-table:end -->"


def readme_table(plan: Plan) -> str:
    """The README's table of what the example inventory holds the cluster for: the plan's stages as `plan` prints
    them (tests/unit/test_plan.py keeps the README equal to it)."""
    lines = [f"For `{README_INVENTORY}` (`profiles/{plan.profile}.yml`, {booked_text(plan).split(' (')[0]} GPUs "
             "booked), each figure an upper bound:", "",
             "| stage | requests | wall | GPU-hours | bound |", "| --- | ---: | ---: | ---: | --- |"]
    for s in plan.stages:
        if not s.in_total:
            continue
        req = "-" if s.requests is None else f"{s.requests:,}"
        lines.append(f"| {s.name}: {s.what} | {req} | {_hours(s.wall_s)} | {s.gpu_hours:.2f} | {s.basis} |")
    lines.append(f"| **total** | | **{_hours(plan.total_s)}** | **{plan.total_gpu_hours:.2f}** | preflight (minutes) "
                 "is not in the total |")
    extra = [s for s in plan.stages if not s.in_total]
    lines += ["", *(f"Beside the total, only when the contract does not hold: `{s.name}`, up to {_hours(s.wall_s)} "
                    f"({s.gpu_hours:.2f} GPU-hours): {s.basis}." for s in extra)]
    return "\n".join(lines)


def render_readme(text: str, plan: Plan) -> str:
    """README.md with its plan table rewritten from `plan`."""
    head, _, rest = text.partition(README_BEGIN)
    _, found, tail = rest.partition(README_END)
    if not found:
        raise ValueError(f"{README}: no {README_BEGIN} ... {README_END} block")
    return f"{head}{README_BEGIN}\n{readme_table(plan)}\n{README_END}{tail}"


def readme_plan() -> Plan:
    """The plan the README shows: the example inventory, vLLM's own checks off (they change no figure)."""
    return build_plan(CHECKOUT / README_INVENTORY, project=CHECKOUT, vllm_python="none")


def readme_main(argv: list[str]) -> int:
    """`python -m vllm_acceptance.plan readme [--check]`: rewrite README.md's plan table, or exit 1 when stale."""
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.plan readme")
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md's table differs from the plan")
    args = parser.parse_args(argv)
    text = render_readme(README.read_text(), readme_plan())
    if README.read_text() == text:
        return 0
    if args.check:
        print(f"{README}: the plan table differs from `plan`; run python -m vllm_acceptance.plan readme",
              file=sys.stderr)
        return 1
    README.write_text(text)
    print(f"wrote {README}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["readme"]:
        return readme_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.plan", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
