"""What an acceptance run will do and cost, before the cluster is booked (docs/plan.md).

`vllm-acceptance plan -i INVENTORY` (and the `--check` run of accept.yml, playbooks/plan.yml) reads the
inventory through Ansible's own `ansible-inventory` and the profile it names, and prints:

- the launch per node: the argv and environment the serve role would use (roles/vllm_serve), built by the
  same code (serve/launch.py for the container commands, runtime/process.py for the process runtime), the
  environment's secret-bearing values redacted;
- every stage the run goes through, its requests and its estimated wall time and GPU-hours, from the same
  probe settings the run uses (each probe's `config` in the probe registry, probes/registry.py) and the same ramp plan
  (probes/load/rules.py ramp_plan); with a total.

How the time is estimated (docs/plan.md): a server start (the launch, the cache probe's restart, each
relaunch at a proposed limit) counts its whole `launch.ready_timeout_s`, the bound the run waits; a request
counts the contract's end-to-end p95 (`contract.slo.e2e_p95_s`), so a wave of `concurrency` requests takes
that long on a deployment that meets its contract; the soak counts `load.soak_s` plus its last wave. The
GPU-hours of a stage are its seconds x the GPUs booked (the `gpu_nodes` hosts x GPUs per node) / 3600: the
whole cluster is held for the whole run. Relaunches at proposed limits happen only when the contract does not
hold: they are listed apart (worst case) and not in the total.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .core.contract import launch_engines, per_engine_capacity
from .core.probes import default_probe_names
from .core.profile import ConfigError, Profile, load_profile
from .core.redact import redact_obj, redact_text
from .core.rundir import resolve_profile_path
from .probes import registry as probe_registry
from .probes.agent import turn_target
from .probes.cache import KINDS as CACHE_KINDS
from .probes.load.rules import ramp_plan
from .probes.options import ProbeOptions, setting
from .scenarios import load_scenario
from .serve import launch, vllm_check
from .validate import ansible_inventory_command, group_hosts

CHECKOUT = Path(__file__).resolve().parents[2]
# The agent probe's single cases after its rate run (probes/agent/probe.py AgentProbe.run): streaming, multi_turn,
# failed_tool_fallback, structured_output, executor_safety, multimodal, client_library; one request each at least.
AGENT_CASES = 7
# The mixed stream (probes/load/stages.py stage_mixed): windows of 2 x concurrency requests, with a lone repeated
# request before the first window and after each one.
MIXED_WINDOWS = 3
# propose_limits (probes/load/rules.py) proposes at most two limits: fewer sessions, then a shorter context.
MAX_PROPOSED_LIMITS = 2


@dataclass
class Stage:
    name: str
    what: str
    requests: int | None
    wall_s: float
    gpu_hours: float = 0.0
    basis: str = ""
    in_total: bool = True


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
        commands = launch.node_commands(profile, facts)
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


def stages(profile: Profile, facts: dict[str, Any], site: dict[str, Any]) -> list[Stage]:
    """Every stage of the run in its order (accept.yml, playbooks/probes.yml), estimated (module docstring)."""
    load_cfg = probe_registry.get("load").config(_options(profile, "load", site), {})
    e2e = float(load_cfg.slo.get("e2e_p95_s") or 0) or float(load_cfg.request_timeout_s)
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
        out += cache_stages(_options(profile, "cache", site), e2e, ready, restart, engines)
    if "agent" in probes:
        out.append(agent_stage(_options(profile, "agent", site), e2e))
    if "load" in probes:
        # playbooks/vars/probes.yml probe_relaunch: a launched single-node server is relaunched at each limit;
        # otherwise the client is driven at the limit on the server as launched.
        relaunch = launched and bool(site.get("acceptance_limit_relaunch", True)) and not facts["workers"]
        out += load_stages(_options(profile, "load", site), e2e, ready, relaunch)
    # A probe without its own estimate here is still shown, never costed as free (docs/plan.md).
    out += [Stage(name, f"the {name} probe", None, 0.0, basis="no estimate for this probe", in_total=False)
            for name in probes if name not in ("cache", "agent", "load")]
    return out


def cache_stages(opts: ProbeOptions, e2e: float, ready: float, restart: bool, engines: int = 1) -> list[Stage]:
    """The protocol runs on every data-parallel engine, each session pinned to one (probes/cache/probe.py), after
    one warm-up request per engine where the engines' gauges are not exported yet."""
    cfg = probe_registry.get("cache").config(opts, load_scenario(str(setting(opts, "agent.scenario"))))
    per_engine = cfg.sessions * len(CACHE_KINDS) + cfg.rounds
    requests = engines * per_engine + (engines if engines > 1 else 0)
    each = (f"cache.sessions {cfg.sessions} x {len(CACHE_KINDS)} kinds + {cfg.rounds} rounds, each <= e2e p95 "
            f"{e2e:g} s")
    out = [Stage("cache", "prefix-cache protocol, one request at a time", requests, requests * e2e,
                 basis=each if engines == 1 else f"({each}) on each of {engines} data-parallel engines, + one "
                                                 "warm-up request each")]
    if restart:
        out.append(Stage("cache_restart", "restart the launched server, hot A again", 1, ready + e2e,
                         basis=f"launch.ready_timeout_s {ready:g} s + 1 request"))
    return out


def agent_stage(opts: ProbeOptions, e2e: float) -> Stage:
    scenario = str(setting(opts, "agent.scenario"))
    cfg = probe_registry.get("agent").config(opts, load_scenario(scenario))
    turns = turn_target(cfg)
    others = min(cfg.other_cases, max(5, turns // 5))
    repeats = cfg.consistency_cases * max(1, cfg.repeats)
    sent = turns + others + repeats
    waves = math.ceil(sent / max(1, cfg.concurrency)) + AGENT_CASES
    # agent.under_load: the case set (call and other cases) again with that many in flight.
    again = turns + others if cfg.under_load > 0 else 0
    waves += math.ceil(again / cfg.under_load) if again else 0
    loaded = f" + the {again} cases again at agent.under_load {cfg.under_load}" if again else ""
    return Stage("agent", f"tool calls ({scenario}): the case set{', again under load' if again else ''}, then "
                 f"{AGENT_CASES} cases", sent + again + AGENT_CASES, waves * e2e,
                 basis=f"{turns} distinct call cases + {others} other cases + {repeats} repeats at "
                       f"agent.concurrency {cfg.concurrency}{loaded} + {AGENT_CASES} cases, "
                       f"{waves} waves x e2e p95 {e2e:g} s")


def load_stages(opts: ProbeOptions, e2e: float, ready: float, relaunch: bool) -> list[Stage]:
    cfg = probe_registry.get("load").config(opts, {})
    c = cfg.contract_concurrency
    steps = ramp_steps(cfg.ramp, c, cfg.ramp_bound, cfg.requests_per_step, cfg.ramp_budget_s, e2e)
    ramp_s = sum(s for _, _, s in steps)
    step_c = math.ceil(max(cfg.requests_per_step, c) / c) * e2e
    # A launch serving more than the contract gets a third request, over the served max_model_len (probes/load/rules.py)
    wide = cfg.max_model_len > cfg.context_tokens + cfg.max_output_tokens
    contract_n = 3 if wide else 2
    out = [Stage("long_prompt", f"one prompt of {min(cfg.long_prompt_tokens, cfg.context_tokens)} tokens", 1, e2e,
                 basis=f"1 request <= e2e p95 {e2e:g} s"),
           Stage("context_contract", "at the contracted context, one token over" + (
                 f", one over the served max_model_len {cfg.max_model_len}" if wide else ""), contract_n,
                 contract_n * e2e, basis=f"{contract_n} requests"),
           Stage("ramp", "concurrency " + ", ".join(str(k) for k, _, _ in steps), sum(n for _, n, _ in steps),
                 ramp_s, basis=f"per step max(load.requests_per_step {cfg.requests_per_step}, c) requests in "
                               f"ceil(n / c) waves x e2e p95 {e2e:g} s; past the contract while under "
                               f"load.ramp_budget_s {cfg.ramp_budget_s:g} s")]
    out.append(verified_limits_stage(per_step=max(cfg.requests_per_step, c), step_s=step_c,
                                     ready=ready if relaunch else None))
    mixed_waves = 1 + MIXED_WINDOWS * 2 + MIXED_WINDOWS
    out.append(Stage("mixed", f"short, long, cold and repeated at concurrency {c}",
                     1 + MIXED_WINDOWS * (2 * c + 1), mixed_waves * e2e,
                     basis=f"{MIXED_WINDOWS} windows of 2 x {c} requests + {MIXED_WINDOWS + 1} lone repeated, "
                           f"{mixed_waves} waves x e2e p95 {e2e:g} s"))
    out.append(Stage("soak", f"steady load at concurrency {c} for load.soak_s", None, cfg.soak_s + e2e,
                     basis=f"load.soak_s {cfg.soak_s:g} s + its last wave {e2e:g} s"))
    return out


def verified_limits_stage(per_step: int, step_s: float, ready: float | None) -> Stage:
    """One step at each proposed limit, on the server relaunched with its flags (`ready`: its start bound) or
    with the client driven at the limit; only when the contract does not hold, so beside the total."""
    n = MAX_PROPOSED_LIMITS
    if ready is None:
        return Stage("verified_limits", f"one step at each proposed limit (at most {n}), the client driven at it; "
                     "only when the contract does not hold", n * per_step, n * step_s,
                     basis=f"{n} x one step at the contract {step_s:g} s; worst case, not in the total",
                     in_total=False)
    return Stage("verified_limits", f"relaunch at each proposed limit (at most {n}), one step each; only when "
                 "the contract does not hold", n * per_step, n * (ready + step_s),
                 basis=f"{n} x (launch.ready_timeout_s {ready:g} s + one step at the contract {step_s:g} s); "
                       "worst case, not in the total", in_total=False)


def ramp_steps(ramp: list[int], contract: int, bound: int, per_step: int, budget_s: float,
               e2e: float) -> list[tuple[int, int, float]]:
    """(concurrency, requests, seconds) of each ramp step that would run (probes/load/stages.py stage_ramp: a step
    past the contract starts only while the ramp has run no longer than its budget)."""
    out: list[tuple[int, int, float]] = []
    elapsed = 0.0
    for c in ramp_plan(ramp, contract, bound):
        if c > contract and elapsed > budget_s:
            break
        n = max(per_step, c)
        seconds = math.ceil(n / c) * e2e
        out.append((c, n, seconds))
        elapsed += seconds
    return out


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
    gpn = int(facts.get("gpus_per_node") or profile.model.hardware.gpus_per_node or 0)
    if profile.model.hardware.accelerator == "none":
        gpn = 0
    plan = Plan(inventory=str(inventory), profile=str(profile.model.name), profile_path=str(path),
                mode=str(facts["mode"]), runtime=str(facts["runtime"]),
                base_url=facts["base_url"] if facts["mode"] == "attach" else None,
                gpu_nodes=gpu_nodes, gpus_per_node=gpn, gpus=len(gpu_nodes) * gpn)
    plan.nodes = node_launches(profile, facts)
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


def render_text(plan: Plan) -> str:
    lines = [f"plan: inventory {plan.inventory}, profile {plan.profile} ({plan.profile_path})",
             f"  {plan.mode} on {plan.runtime}; GPUs booked: {len(plan.gpu_nodes)} gpu_nodes x {plan.gpus_per_node}"
             f" = {plan.gpus}", "", "launch per node:"]
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
    parser.add_argument("--vars", default="{}", metavar="JSON",
                        help="variables that outrank the inventory's, as -e does (playbooks/plan.yml passes the "
                             "head's as the run resolved them)")


def command(args: argparse.Namespace) -> int:
    """The CLI's `plan`: exit 0 with the plan, 2 with the reason on bad input."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.plan", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
