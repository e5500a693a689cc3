"""Multi-node launch commands from the profile and the inventory, with vLLM's own mechanism.

vLLM 0.32's `vllm serve` (the official image's entrypoint) spans nodes in two documented ways, and
nothing else is invented here:

- one replica across nodes (tensor x pipeline > GPUs of one node; multiprocessing backend): every
  node runs the same command with `--nnodes N --node-rank R --master-addr HEAD --master-port P`;
  the workers add `--headless` (no API server) and only the head serves HTTP;
- data parallel (DP, DEP with `--enable-expert-parallel`): `--data-parallel-size D
  --data-parallel-size-local L --data-parallel-address HEAD --data-parallel-rpc-port P` everywhere;
  each worker adds `--headless --data-parallel-start-rank R*L`.

The recipe's environment per interconnect comes from the profile (`launch.multinode`): over RDMA
its all-to-all backend and `UCX_TLS`; over NVLink its NVLink all-to-all backend; on an NVL fabric
(GB200/GB300 NVL, `interconnect: nvl`) also `nvl_env` (NCCL_MNNVL_ENABLE, NCCL_CUMEM_ENABLE,
NCCL_NVLS_ENABLE). On multi-node NVLink hardware every container asks for IMEX channel 0 (`imex_request`:
docker NVIDIA_IMEX_CHANNELS=0, podman the channel's device node), without which MNNVL memory sharing fails
inside the container. `NCCL_DMABUF_ENABLE=0` only when the inventory asks for it after the launch
triage saw `mlx5dv_reg_dmabuf_mr`. Every node runs the same image, pinned by digest (a tag could
resolve to different images on different nodes).

Environment values stay out of argv (`-e=KEY`, the value in the runtime's own environment), as the
single-node container launch does, so secrets never reach a command line or the evidence.

CLI for the role (prints JSON; exit 2 with the reason on bad input):

    python -m vllm_acceptance.serve.launch plan --profile profiles/kimi-k3.yml --facts '{"head": "a01", ...}'
    python -m vllm_acceptance.serve.launch evidence --run-dir RUN a01=/path/a01.log a02=/path/a02.log
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.argv import parse_flags
from ..core.evidence import EvidenceStore
from ..core.profile import ConfigError, Profile, load_profile
from ..rules.launched import mnnvl_hardware
from ..runtime.process import LaunchSpec

DEFAULT_CONTAINER_EXTRA = ["--gpus", "all", "--ipc", "host", "--network", "host"]
DEFAULT_MASTER_PORT = 29501          # vLLM's ParallelConfig.master_port default
DEFAULT_DP_RPC_PORT = 13345          # the port of vLLM's multi-node data-parallel documentation
# Flags this module owns: taken out of the profile's args and set from the layout.
_LAYOUT_FLAGS = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--data-parallel-size",
                 "-dp", "--data-parallel-size-local", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                 "--headless", "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-start-rank")


@dataclass(frozen=True)
class Layout:
    tensor: int
    pipeline: int
    data: int
    expert: bool
    nodes: int
    gpus_per_node: int

    @property
    def world(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def kind(self) -> str:
        """single (one node), replica (one replica across nodes), dp (data-parallel ranks per node)."""
        if self.nodes == 1:
            return "single"
        return "dp" if self.data > 1 else "replica"

    @property
    def dp_local(self) -> int:
        return self.data // self.nodes


@dataclass
class NodeCommand:
    host: str
    role: str                      # head | worker
    rank: int                      # node rank (0 = head)
    address: str
    argv: list[str]                # the container runtime's full argv
    env: dict[str, str]            # the runtime's environment (values passed with -e=KEY)
    serve_args: list[str] = field(default_factory=list)   # what `vllm serve` gets after the image

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: Any, name: str) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: {value!r} is not an integer") from exc
    if number < 1:
        raise ConfigError(f"{name}: {number} must be >= 1")
    return number


class LayoutRefusal(ConfigError):
    """The profile's parallel layout does not fit the nodes given (`nodes` of `gpus_per_node` GPUs): the plan offers
    the layouts the profile's recipe allows there (plan.py, recipe/layouts.py suggestions)."""

    def __init__(self, message: str, nodes: int, gpus_per_node: int) -> None:
        super().__init__(message)
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node


def layout(profile: Profile, facts: dict[str, Any]) -> Layout:
    """The parallel layout (profile `parallel`, overridable by the inventory's `parallel`), checked
    against the node count and the GPUs per node (the inventory's `gpus_per_node`, vllm_gpus_per_node,
    else the profile's hardware.gpus_per_node)."""
    merged = {**(profile.model.at("parallel") or {}), **(facts.get("parallel") or {})}
    nodes = 1 + len(facts.get("workers") or [])
    gpn = _int(facts.get("gpus_per_node") or profile.model.hardware.gpus_per_node or 1, "gpus_per_node")
    lay = Layout(tensor=_int(merged.get("tensor", 1), "parallel.tensor"),
                 pipeline=_int(merged.get("pipeline", 1), "parallel.pipeline"),
                 data=_int(merged.get("data", 1), "parallel.data"), expert=bool(merged.get("expert", False)),
                 nodes=nodes, gpus_per_node=gpn)
    min_nodes = int(profile.model.hardware.min_nodes)
    if nodes < min_nodes:
        raise LayoutRefusal(f"{nodes} node(s) in vllm_head + vllm_workers, profile hardware.min_nodes is {min_nodes}",
                            nodes, gpn)
    if lay.kind == "dp":
        if lay.data % nodes:
            raise LayoutRefusal(f"parallel.data {lay.data} does not divide over {nodes} nodes", nodes, gpn)
        per_node = lay.tensor * lay.pipeline * lay.dp_local
    else:
        if lay.world % nodes:
            raise LayoutRefusal(f"tensor x pipeline = {lay.world} does not divide over {nodes} nodes", nodes, gpn)
        per_node = lay.world // nodes
    if per_node > gpn:
        raise LayoutRefusal(f"layout tensor={lay.tensor} pipeline={lay.pipeline} data={lay.data} needs {per_node} GPUs "
                            f"per node on {nodes} node(s); the nodes have {gpn} (add nodes or change the layout)",
                            nodes, gpn)
    if lay.kind == "replica" and per_node != gpn:
        raise LayoutRefusal(f"a replica across nodes must fill each node: {per_node} of {gpn} GPUs per node used "
                            f"(use a layout over all {nodes * gpn} GPUs of the {nodes} nodes; a lower "
                            "vllm_gpus_per_node leaves the other GPUs idle, still booked)", nodes, gpn)
    return lay


def _strip_layout_flags(args: list[str]) -> list[str]:
    out: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in _LAYOUT_FLAGS:
            skip_value = "=" not in arg and name != "--headless"
            continue
        out.append(arg)
    return out


def interconnect_settings(profile: Profile, facts: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The recipe's args and env for the interconnect between nodes (profile launch.multinode)."""
    kind = str(facts.get("interconnect") or profile.model.hardware.interconnect or "none")
    multinode = profile.model.at("launch.multinode") or {}
    if kind == "rdma":
        block = multinode.get("rdma") or {}
        env = dict(block.get("env") or {})
    elif kind in ("nvl", "nvlink"):
        block = multinode.get("nvlink") or {}
        env = dict(block.get("env") or {})
        if kind == "nvl":                       # GB200/GB300 NVL: multi-node NVLink fabric
            env.update(multinode.get("nvl_env") or {})
    else:
        raise ConfigError(f"interconnect {kind!r}: a deployment across nodes needs rdma, nvlink or nvl "
                          "(set vllm_interconnect or the profile's hardware.interconnect)")
    if facts.get("dmabuf_workaround"):
        env.update(multinode.get("dmabuf_workaround_env") or {"NCCL_DMABUF_ENABLE": "0"})
    return list(block.get("args") or []), {k: str(v) for k, v in env.items()}


IMEX_CHANNEL_DEVICE = "/dev/nvidia-caps-imex-channels/channel0"


def imex_request(runtime: str, mnnvl: bool) -> tuple[list[str], dict[str, str]]:
    """How a container asks for IMEX channel 0 on multi-node NVLink hardware (docs/sources.md#imex-channel): the
    NVIDIA container toolkit injects channels only on request. docker (the NVIDIA runtime's hook or CDI mode)
    reads NVIDIA_IMEX_CHANNELS from the container's environment; podman's CDI devices pass no such hook, so the
    channel's device node is passed itself. Returns (runtime options, environment); nothing off MNNVL hardware.
    roles/vllm_serve (single node) and roles/preflight (the in-image probe and all-reduce) make the same request."""
    if not mnnvl:
        return [], {}
    if runtime == "docker":
        return [], {"NVIDIA_IMEX_CHANNELS": "0"}
    return ["--device", IMEX_CHANNEL_DEVICE], {}


def image_reference(profile: Profile, facts: dict[str, Any]) -> str:
    image = facts.get("image") or profile.model.image.reference
    digest = facts.get("image_digest") or profile.model.image.digest
    if not image:
        raise ConfigError("no image: the profile's image.reference or vllm_image")
    if not digest or not str(digest).startswith("sha256:"):
        raise ConfigError("a multi-node launch needs the image pinned by digest (vllm_image_digest: sha256:...): "
                          "every node must run the identical image")
    return f"{str(image).split('@', 1)[0]}@{digest}"


def node_commands(profile: Profile, inventory_facts: dict[str, Any]) -> dict[str, NodeCommand]:
    """Per host (head first, then workers in order): the container runtime's argv and environment."""
    facts = inventory_facts
    head = facts.get("head")
    if not head:
        raise ConfigError("no head node: put one host in the vllm_head group")
    workers = [str(w) for w in facts.get("workers") or []]
    if head in workers:
        raise ConfigError(f"{head} is both head and worker")
    lay = layout(profile, facts)
    runtime = str(facts.get("runtime") or profile.model.launch.runtime)
    if runtime not in ("docker", "podman"):
        raise ConfigError(f"runtime {runtime!r}: the multi-node launch runs the official image (docker or podman)")
    addresses = {str(k): str(v) for k, v in (facts.get("addresses") or {}).items() if v}
    head_addr = addresses.get(head, head)
    common = _strip_layout_flags([str(a) for a in profile.model.launch.args])
    env = {str(k): str(v) for k, v in profile.model.launch.env.items()}
    if lay.nodes > 1:
        ic_args, ic_env = interconnect_settings(profile, facts)
        common += [a for a in ic_args if a not in common]
        env.update(ic_env)
    imex_opts, imex_env = imex_request(runtime, mnnvl_hardware(profile))
    env.update(imex_env)
    env.update({str(k): str(v) for k, v in (facts.get("env") or {}).items()})
    common += [str(a) for a in facts.get("extra_args") or []]
    model = str(facts.get("model") or profile.model.model.name)
    port = str(facts.get("port") or profile.model.launch.port)
    listen = str(facts.get("listen_host") or profile.model.launch.host)
    refuse_per_node_balancing(common, lay)
    image = image_reference(profile, facts)
    out: dict[str, NodeCommand] = {}
    for rank, host in enumerate([str(head), *workers]):
        layout_args = _layout_args(lay, rank, head_addr, facts)
        # a flag the layout sets (--enable-expert-parallel of DEP) is not repeated from the profile's args
        serve = ([model] + (["--host", listen, "--port", port] if rank == 0 else []) + layout_args
                 + [a for a in common if a not in layout_args])
        out[host] = NodeCommand(host=host, role="head" if rank == 0 else "worker", rank=rank,
                                address=addresses.get(host, host), env=dict(env), serve_args=serve,
                                argv=_container_argv(runtime, facts, env, image, serve, imex_opts))
    return out


# vLLM's per-node load-balancing modes (vllm/entrypoints/cli/serve.py ServeSubcommand.cmd): with them each node's
# API server fronts only that node's engines. The launch across nodes uses vLLM's internal load balancing instead
# (the head's API server fronts every engine of every node; the workers run --headless), so the load and the
# probes, sent to the head, reach the whole deployment.
PER_NODE_BALANCING = ("--data-parallel-hybrid-lb",)


class LaunchRefused(ConfigError):
    """A launch the product refuses to run as written (not an input it cannot plan): validation refuses it too."""


def refuse_per_node_balancing(args: list[str], lay: Layout) -> None:
    """A per-node load-balancing flag in a launch across nodes: refused with why and the fix (LaunchRefused)."""
    if lay.nodes < 2 or lay.data < 2:
        return
    stated = [f"--{k.replace('_', '-')}" for k, v in parse_flags(args).items()
              if f"--{k.replace('_', '-')}" in PER_NODE_BALANCING and v is not False]
    if stated:
        raise LaunchRefused(
            f"launch.args: {', '.join(stated)} across {lay.nodes} nodes gives each node its own API server for its "
            f"{lay.dp_local} local engine(s) only, and vLLM refuses it beside --headless (\"data_parallel_hybrid_lb is "
            "not applicable in headless mode\", vllm/entrypoints/cli/serve.py run_headless): the launch sends the "
            f"load and the probes to the head, which would reach 1/{lay.nodes} of the deployment. Fix: remove "
            f"{', '.join(stated)} from the profile's launch.args (the launch then uses vLLM's internal load "
            "balancing: the head's API server fronts all "
            f"{lay.data} engines, the workers run --headless), or run the deployment yourself with your own balancer "
            "in front of every node's API server and attach to it (vllm_serve_mode: attach, vllm_base_url: the "
            "balancer)")


def _layout_args(lay: Layout, rank: int, head_addr: str, facts: dict[str, Any]) -> list[str]:
    args = [f"--tensor-parallel-size={lay.tensor}"]
    if lay.pipeline > 1:
        args.append(f"--pipeline-parallel-size={lay.pipeline}")
    if lay.kind == "replica":
        args += [f"--nnodes={lay.nodes}", f"--node-rank={rank}", f"--master-addr={head_addr}",
                 f"--master-port={facts.get('master_port') or DEFAULT_MASTER_PORT}"]
    elif lay.data > 1:
        args += [f"--data-parallel-size={lay.data}", f"--data-parallel-size-local={lay.dp_local}"]
        if lay.kind == "dp":
            args += [f"--data-parallel-address={head_addr}",
                     f"--data-parallel-rpc-port={facts.get('dp_rpc_port') or DEFAULT_DP_RPC_PORT}"]
            if rank > 0:
                args.append(f"--data-parallel-start-rank={rank * lay.dp_local}")
        if lay.expert:
            args.append("--enable-expert-parallel")     # DEP: experts spread over the data-parallel ranks
    if rank > 0:
        args.append("--headless")
    return args


def single_serve_args(profile: Profile, facts: dict[str, Any]) -> list[str]:
    """roles/vllm_serve/tasks/container.yml: what `vllm serve` gets in the one container of a single-node launch."""
    serve = [str(profile.model.model.name), "--host", str(facts.get("listen_host") or profile.model.launch.host),
             "--port", str(facts.get("port") or profile.model.launch.port)]
    return serve + [str(a) for a in profile.model.launch.args] + [str(a) for a in facts.get("extra_args") or []]


def process_spec(profile: Profile, facts: dict[str, Any]) -> LaunchSpec:
    """roles/vllm_serve/tasks/process.yml: the lab's vLLM process (runtime/process.py LaunchSpec)."""
    model = profile.model.model.name
    return LaunchSpec(python=str(facts.get("python") or ".venv-lab/bin/python"),
                      model_path=str(profile.model.model.path or model),
                      served_name=str(profile.model.model.served_name or model),
                      host=str(facts.get("listen_host") or profile.model.launch.host),
                      port=int(facts.get("port") or profile.model.launch.port),
                      args=[str(a) for a in [*profile.model.launch.args, *(facts.get("extra_args") or [])]],
                      env={str(k): str(v) for k, v in profile.model.launch.env.items()},
                      log_path=Path("vllm.log"), pid_path=Path("vllm.pid"))


def facts_from_hostvars(profile: Profile, head: str, workers: list[str],
                        hostvars: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The facts roles/vllm_serve/tasks/multinode.yml passes to this module, from the head's variables with the
    role's defaults (roles/vllm_serve/defaults/main.yml)."""
    hv = hostvars.get(head, {})
    return {
        "head": head, "workers": list(workers),
        "addresses": {h: hostvars.get(h, {}).get("ansible_host") for h in [head, *workers]},
        "runtime": hv.get("vllm_serve_runtime") or profile.model.launch.runtime,
        "image": hv.get("vllm_image") or profile.model.image.reference,
        "image_digest": hv.get("vllm_image_digest") or profile.model.image.digest or "",
        "port": hv.get("vllm_serve_port") or profile.model.launch.port,
        "listen_host": hv.get("vllm_serve_listen_host") or profile.model.launch.host,
        "container_name": hv.get("vllm_serve_container_name") or "vllm-acceptance",
        "container_extra": hv.get("vllm_serve_container_extra") or DEFAULT_CONTAINER_EXTRA,
        "hf_cache": hv.get("vllm_serve_hf_cache") or "/root/.cache/huggingface",
        "extra_args": list(hv.get("vllm_serve_extra_args") or []),
        "interconnect": hv.get("vllm_interconnect"), "parallel": hv.get("vllm_parallel") or {},
        "gpus_per_node": hv.get("vllm_gpus_per_node"),
        "dmabuf_workaround": bool(hv.get("vllm_nccl_dmabuf_workaround", False)),
        "env": hv.get("vllm_serve_multinode_env") or {},
        "ready_timeout_s": hv.get("vllm_serve_ready_timeout_s") or profile.model.launch.ready_timeout_s,
        "mode": hv.get("vllm_serve_mode", "launch"), "base_url": hv.get("vllm_base_url"),
        "python": hv.get("vllm_serve_python", ".venv-lab/bin/python"),
    }


def _container_argv(runtime: str, facts: dict[str, Any], env: dict[str, str], image: str,
                    serve: list[str], devices: list[str] | None = None) -> list[str]:
    name = str(facts.get("container_name") or "vllm-acceptance")
    extra = [str(a) for a in (facts.get("container_extra") or DEFAULT_CONTAINER_EXTRA)] + list(devices or [])
    hf_cache = str(facts.get("hf_cache") or "/root/.cache/huggingface")
    return ([runtime, "run", "-d", "--name", name] + extra + ["-v", f"{hf_cache}:/root/.cache/huggingface"]
            + [f"-e={key}" for key in sorted(env)] + [image] + serve)


def plan(profile: Profile, inventory_facts: dict[str, Any]) -> dict[str, Any]:
    """What the role needs: the commands in start order (head first) and the layout."""
    commands = node_commands(profile, inventory_facts)
    lay = layout(profile, inventory_facts)
    return {"layout": {**asdict(lay), "kind": lay.kind, "world": lay.world},
            "order": list(commands), "head": next(iter(commands)),
            "nodes": [c.to_dict() for c in commands.values()],
            "ready_timeout_s": math.ceil(float(inventory_facts.get("ready_timeout_s")
                                               or profile.model.launch.ready_timeout_s))}


def save_node_logs(run_dir: Path, logs: dict[str, Path], secrets: list[str] | None = None) -> list[str]:
    """Per-node startup logs as evidence (evidence/serve/nodes/<host>.log, secrets redacted)."""
    store = EvidenceStore(run_dir, "evidence/serve/nodes", secrets=secrets)
    written = []
    for host, path in logs.items():
        if "/" in host or host.startswith("."):
            raise ConfigError(f"bad host name {host!r}")
        text = path.read_text(errors="replace") if path.is_file() else f"(no log: {path} missing)\n"
        written.append(store.write_text(f"{host}.log", text))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.serve.launch")
    sub = parser.add_subparsers(dest="command", required=True)
    plan_cmd = sub.add_parser("plan", help="print the multi-node launch plan as JSON")
    plan_cmd.add_argument("--profile", required=True)
    plan_cmd.add_argument("--facts", required=True, help="JSON: head, workers, addresses, image_digest, ...")
    ev_cmd = sub.add_parser("evidence", help="save per-node startup logs as redacted evidence")
    ev_cmd.add_argument("--run-dir", required=True)
    ev_cmd.add_argument("logs", nargs="+", metavar="HOST=PATH")
    args = parser.parse_args(argv)
    try:
        if args.command == "evidence":
            pairs = dict(item.split("=", 1) for item in args.logs if "=" in item)
            secret = os.environ.get("VLLM_API_KEY")
            for path in save_node_logs(Path(args.run_dir), {h: Path(p) for h, p in pairs.items()},
                                       [secret] if secret else None):
                print(path)
            return 0
        facts = json.loads(args.facts)
        if not isinstance(facts, dict):
            raise ConfigError("--facts must be a JSON object")
        print(json.dumps(plan(load_profile(args.profile), facts), indent=1))
    except (ConfigError, json.JSONDecodeError, OSError) as exc:
        print(f"cannot {args.command} the multi-node launch: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
