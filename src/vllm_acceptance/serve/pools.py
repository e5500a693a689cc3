"""The launch of a disaggregated prefill/decode deployment (issue 45 item 4; docs/profiles.md "Disaggregated
prefill/decode"): one vLLM server per pool host, each started as one engine is (runtime/process.py), and the router
in front of them, the entry point users call.

The profile's `pd` section holds each pool's launch and the router (recipe/pools.py writes it from the recipe); the
inventory names each pool's hosts (`pd.<pool>.inventory_group`, e.g. prefill_nodes / decode_nodes under gpu_nodes)
and the router's. The router's command is the recipe site's (command-synthesis.js pd_cluster routerLines):
`vllm-router --policy P --vllm-pd-disaggregation --prefill URL ... --decode URL ... --host H --port P
--intra-node-data-parallel-size N`.

What the serve stage records (`serve_record`, the hook the P/D path checks read as ProbeOptions.pools):
{"entry_point": router base URL, "pools": {"prefill": [{"base_url", "metrics_url", "stop_command",
"start_command"}], "decode": [...]}}; stop/start commands are shell commands run on the controller
(`python -m vllm_acceptance.serve.pools stop|start --state-dir D --instance prefill-0`).

The process runtime only (the lab, and a site running vLLM as processes on one host): a container launch of the
pools is not built yet (refused with that reason)."""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.profile import ConfigError, Profile
from ..runtime import process as server

POOLS = ("prefill", "decode")
PLAN_FILE = "pd-plan.json"
RECORD_FILE = "pd-serve.json"


@dataclass(frozen=True)
class Instance:
    """One server of a pool: its address and exactly what starts it."""

    name: str                 # prefill-0, decode-0, ...
    pool: str
    host: str
    port: int
    python: str
    model_path: str
    served_name: str
    args: list[str]
    env: dict[str, str]
    log_path: str
    pid_path: str
    listen: str = "0.0.0.0"  # noqa: S104 - the address the server listens on (pd.<pool>.launch.host)

    def spec(self) -> server.LaunchSpec:
        return server.LaunchSpec(python=self.python, model_path=self.model_path, served_name=self.served_name,
                                 host=self.listen, port=self.port, args=list(self.args), env=dict(self.env),
                                 log_path=Path(self.log_path), pid_path=Path(self.pid_path))

    @property
    def base_url(self) -> str:
        return f"http://{_reach(self.host)}:{self.port}/v1"

    @property
    def metrics_url(self) -> str:
        return f"http://{_reach(self.host)}:{self.port}/metrics"


@dataclass(frozen=True)
class Router:
    command: list[str]
    host: str
    port: int
    log_path: str
    pid_path: str
    metrics_url: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://{_reach(self.host)}:{self.port}/v1"


@dataclass(frozen=True)
class PdPlan:
    state_dir: str
    python: str
    ready_timeout_s: float
    router: Router
    instances: list[Instance] = field(default_factory=list)

    def instance(self, name: str) -> Instance:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise ConfigError(f"--instance {name!r}: not an instance of this P/D deployment "
                          f"({', '.join(i.name for i in self.instances)})")

    def save(self) -> Path:
        path = Path(self.state_dir) / PLAN_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def load(cls, state_dir: Path) -> PdPlan:
        path = state_dir / PLAN_FILE
        if not path.is_file():
            raise ConfigError(f"{path}: no P/D deployment was launched with this state directory")
        data = json.loads(path.read_text())
        return cls(state_dir=data["state_dir"], python=data["python"], ready_timeout_s=data["ready_timeout_s"],
                   router=Router(**data["router"]), instances=[Instance(**i) for i in data["instances"]])


def _reach(host: str) -> str:
    """The address a client on the controller uses for a server listening on `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "localhost") else host  # noqa: S104 - a listen address


def pool_profile(profile: Profile, pool: str) -> Profile:
    """One pool's servers seen as a one-engine profile (its launch, parallel layout and GPUs; no `pd`): what the
    serve role and vLLM's own argument check (serve/vllm_check.py) take for one engine."""
    pd = profile.model.pd
    if pd is None:
        raise ConfigError(f"profile {profile.name}: no `pd` section (not a P/D deployment)")
    if pool not in POOLS:
        raise ConfigError(f"pool {pool!r}: a P/D deployment has the pools {', '.join(POOLS)}")
    section = getattr(pd, pool)
    data = copy.deepcopy(profile.data)
    data.pop("pd", None)
    data["name"] = f"{profile.name}-{pool}"
    data["launch"] = section.launch.document()
    data["parallel"] = section.parallel.document()
    data["hardware"] = {**data["hardware"], "min_gpus": section.min_gpus, "min_nodes": section.nodes}
    data["recipe"] = {**data["recipe"], "pool": pool}
    return Profile(data=data, source=f"{profile.source} (pd.{pool})", extends=profile.extends)


def prometheus_port(profile: Profile) -> int:
    """Where the router exports its counters: pd.router.prometheus_port, else its port + 1."""
    pd = profile.model.pd
    assert pd is not None
    return pd.router.prometheus_port or pd.router.port + 1


def router_program(program: str, python: str) -> str:
    """The router's executable: beside the serving Python when installed there (the lab's .venv-lab), else as
    named (on PATH)."""
    if os.sep in program:
        return program
    beside = Path(python).parent / program
    return str(beside) if beside.is_file() else program


def router_command(profile: Profile, prefill: list[str], decode: list[str], host: str, python: str,
                   prometheus_port: int | None = None) -> list[str]:
    """The recipe site's router line with the pools' URLs (one --prefill / --decode per pool head)."""
    pd = profile.model.pd
    assert pd is not None
    command = [router_program(pd.router.program, python), "--policy", pd.router.policy, *pd.router.args]
    for url in prefill:
        command += ["--prefill", url]
    for url in decode:
        command += ["--decode", url]
    command += ["--host", host, "--port", str(pd.router.port)]
    if prometheus_port is not None:
        command += ["--prometheus-port", str(prometheus_port)]
    return command


def plan(profile: Profile, hosts: dict[str, list[str]], router_host: str, python: str, model_path: str,
         state_dir: Path, extra_env: dict[str, str] | None = None,
         router_prometheus_port: int | None = None) -> PdPlan:
    """Every server of the deployment on the inventory's hosts (pool -> hosts), and the router."""
    pd = profile.model.pd
    if pd is None:
        raise ConfigError(f"profile {profile.name}: no `pd` section (not a P/D deployment)")
    instances: list[Instance] = []
    seen: dict[tuple[str, int], str] = {}
    for pool in POOLS:
        section = getattr(pd, pool)
        if section.launch.runtime != "process":
            raise ConfigError(f"pd.{pool}.launch.runtime {section.launch.runtime!r}: the P/D launch runs the process "
                              "runtime only (serve/pools.py); attach to container pools instead")
        pool_hosts = hosts.get(pool) or []
        if not pool_hosts:
            raise ConfigError(f"inventory group {section.inventory_group!r}: no hosts for the {pool} pool; list its "
                              f"hosts under gpu_nodes (inventories/lab-pd/hosts.yml is an example)")
        for i, host in enumerate(pool_hosts):
            name = f"{pool}-{i}"
            key = (_reach(host), section.launch.port)
            if key in seen:
                raise ConfigError(f"{name} and {seen[key]} both listen on {key[0]}:{key[1]}: one server per pool "
                                  "host (pd.<pool>.launch.port)")
            seen[key] = name
            instances.append(Instance(
                name=name, pool=pool, host=host, port=section.launch.port, python=python, model_path=model_path,
                served_name=profile.model.model.served, args=list(section.launch.args),
                env={**dict(section.launch.env), **(extra_env or {})},
                log_path=str(state_dir / f"{name}.log"), pid_path=str(state_dir / f"{name}.pid"),
                listen=section.launch.host))
    urls = {pool: [i.base_url.removesuffix("/v1") for i in instances if i.pool == pool] for pool in POOLS}
    command = router_command(profile, urls["prefill"], urls["decode"], router_host, python, router_prometheus_port)
    router = Router(command=command, host=router_host, port=pd.router.port,
                    log_path=str(state_dir / "router.log"), pid_path=str(state_dir / "router.pid"),
                    metrics_url=(f"http://{_reach(router_host)}:{router_prometheus_port}/metrics"
                                 if router_prometheus_port else None))
    timeout = float(max(pd.prefill.launch.ready_timeout_s, pd.decode.launch.ready_timeout_s))
    return PdPlan(state_dir=str(state_dir), python=python, ready_timeout_s=timeout, router=router,
                  instances=instances)


def control_command(plan: PdPlan, action: str, instance: str) -> str:
    """The shell command (run on the controller) that stops or starts one instance of a launched deployment."""
    return " ".join(shlex.quote(w) for w in (sys.executable, "-m", "vllm_acceptance.serve.pools", action,
                                             "--state-dir", plan.state_dir, "--instance", instance))


def serve_record(plan: PdPlan) -> dict[str, Any]:
    """The serve stage's P/D record: the entry point (ProbeOptions.base_url) and `pools` (ProbeOptions.pools)."""
    pools: dict[str, list[dict[str, str]]] = {pool: [] for pool in POOLS}
    for inst in plan.instances:
        pools[inst.pool].append({"name": inst.name, "base_url": inst.base_url, "metrics_url": inst.metrics_url,
                                 "stop_command": control_command(plan, "stop", inst.name),
                                 "start_command": control_command(plan, "start", inst.name)})
    record: dict[str, Any] = {"entry_point": plan.router.base_url, "pools": pools,
                              "router": {"command": plan.router.command}}
    if plan.router.metrics_url:
        record["router"]["metrics_url"] = plan.router.metrics_url
    return record


def _start_router(router: Router) -> int:
    pid_path, log_path = Path(router.pid_path), Path(router.log_path)
    if server.read_pid(pid_path):
        raise server.LaunchError(f"a router already runs ({pid_path}): stop the deployment first")
    if server.port_in_use(router.host, router.port):
        raise server.LaunchError(f"{router.host}:{router.port} is already in use: stop it or choose another "
                                 "pd.router.port")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        log.write("# launch: " + " ".join(router.command) + "\n")
        log.flush()
        proc = subprocess.Popen(router.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    pid_path.write_text(str(proc.pid))
    return proc.pid


def start_instance(plan: PdPlan, name: str, wait: bool = True) -> float:
    inst = plan.instance(name)
    pid = server.start(inst.spec())
    return server.wait_ready(inst.base_url, pid, plan.ready_timeout_s, Path(inst.log_path)) if wait else 0.0


def stop_instance(plan: PdPlan, name: str) -> bool:
    return server.stop(Path(plan.instance(name).pid_path))


def up(plan: PdPlan) -> dict[str, Any]:
    """Start every instance (all at once: each loads on its own), wait for each /health, then the router;
    on any failure stop what was started. Returns the serve record (also written to the state directory)."""
    plan.save()
    try:
        pids = {inst.name: server.start(inst.spec()) for inst in plan.instances}
        ready = {inst.name: round(server.wait_ready(inst.base_url, pids[inst.name], plan.ready_timeout_s,
                                                    Path(inst.log_path)), 1) for inst in plan.instances}
        router_pid = _start_router(plan.router)
        ready["router"] = round(server.wait_ready(plan.router.base_url, router_pid, 60.0,
                                                  Path(plan.router.log_path)), 1)
    except server.LaunchError:
        down(plan)
        raise
    record = {**serve_record(plan), "ready_s": ready}
    (Path(plan.state_dir) / RECORD_FILE).write_text(json.dumps(record, indent=1))
    return record


def down(plan: PdPlan) -> list[str]:
    """Stop the router first (no request reaches a half-stopped deployment), then every instance."""
    stopped = []
    if server.stop(Path(plan.router.pid_path)):
        stopped.append("router")
    stopped += [inst.name for inst in plan.instances if server.stop(Path(inst.pid_path))]
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.serve.pools",
                                     description="stop / start one instance of a launched P/D deployment, or all")
    parser.add_argument("action", choices=("launch", "stop", "start", "down", "record"))
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--instance", help="prefill-0, decode-0, ... (stop / start)")
    parser.add_argument("--profile", type=Path, help="launch: the P/D deployment profile")
    parser.add_argument("--hosts", help="launch: JSON pool -> the inventory's hosts of that pool")
    parser.add_argument("--router-host", default="0.0.0.0", help="launch: the router's listen address")  # noqa: S104
    parser.add_argument("--python", help="launch: the Python with vLLM")
    parser.add_argument("--model", help="launch: the model path")
    args = parser.parse_args(argv)
    if args.action == "launch":
        from ..core.profile import load_profile

        if not (args.profile and args.hosts and args.python and args.model):
            parser.error("launch: --profile, --hosts, --python and --model are required")
        profile = load_profile(args.profile)
        assert profile.model.pd is not None, "not a P/D profile"
        launched = plan(profile, json.loads(args.hosts), args.router_host, args.python, args.model, args.state_dir,
                        router_prometheus_port=prometheus_port(profile))
        print(json.dumps(up(launched)))
        return 0
    launched = PdPlan.load(args.state_dir)
    if args.action == "down":
        print(json.dumps({"stopped": down(launched)}))
    elif args.action == "record":
        print(json.dumps(serve_record(launched)))
    elif args.instance is None:
        parser.error(f"{args.action}: --instance is required")
    elif args.action == "stop":
        print(json.dumps({"instance": args.instance, "stopped": stop_instance(launched, args.instance)}))
    else:
        print(json.dumps({"instance": args.instance, "ready_s": round(start_instance(launched, args.instance), 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
