"""The cluster rehearsal: accept.yml on simulated GB300 nodes, each verdict for the right reason.

Nodes are network-namespace sshd hosts (nshosts.py) answering the recorded GPU tool outputs of
tests/fixtures/generated-nodes/<case>; their `docker` is the container-runtime stand-in (container_standin.py)
whose `run -d` starts the REAL lab vLLM (CPU, the tiny hermes-format model) bound to the node's namespace
address, and their `nvidia-smi -lms` is a per-GPU memory stream a scenario makes flat or rising
(gpu_memory_standin.py). The product runs unchanged: `ansible-playbook -i INVENTORY accept.yml` with
profiles/rehearsal-gb300.yml; nothing in it knows it is rehearsed.

    python -m vllm_acceptance.lab.rehearsal --out reports/rehearsal [--only NAME ...]

writes reports/rehearsal/summary.json ({scenario: {verdict, expected, reasons, ok, wall_s}}) and exits
1 when a scenario's verdict differs from the expected one.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .nshosts import Cluster, HostSpec, system_python, up

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "generated-nodes"
PROFILE = REPO / "profiles" / "rehearsal-gb300.yml"
MODELS = REPO / ".lab" / "models"
DIGEST = "sha256:181ec868e19acf210c3bf194732b2f2d50459a1c59df63a1d2653a6c9450c5b6"  # the recorded RepoDigest
PORT = 8000
CONTAINER = "vllm-acceptance"
# Two healthy nodes (the head and a second one for the multi-node scenarios) beside the driver-575 one.
NODES = {"gb300-a01": "good", "gb300-a02": "driver-575", "gb300-a03": "good"}


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def node_tree(case: str, node_dir: Path) -> Path:
    """bin/ (the case's recorded tools; docker and nvidia-smi wrapped by the stand-ins), recorded/, state/."""
    bin_dir, recorded, state = node_dir / "bin", node_dir / "recorded", node_dir / "state"
    for d in (bin_dir, recorded, state):
        d.mkdir(parents=True, exist_ok=True)
    for tool in (FIXTURES / case / "bin").iterdir():
        target = (recorded if tool.name in ("docker", "nvidia-smi") else bin_dir) / tool.name
        shutil.copy2(tool, target)
    lab = Path(__file__).resolve().parent
    lab_python = REPO / ".venv-lab" / "bin" / "python"
    common = f"--state {state} --recorded"
    _executable(bin_dir / "docker", f"#!/bin/sh\nexec /usr/bin/python3 {lab / 'container_standin.py'} {common} "
                                    f"{recorded / 'docker'} --lab-python {lab_python} -- \"$@\"\n")
    _executable(bin_dir / "nvidia-smi", f"#!/bin/sh\nexec /usr/bin/python3 {lab / 'gpu_memory_standin.py'} {common} "
                                        f"{recorded / 'nvidia-smi'} -- \"$@\"\n")
    return bin_dir


@dataclass
class Rehearsal:
    """One stand-in cluster shared by every scenario (a running server is reused where a scenario allows)."""

    workdir: Path
    cluster: Cluster | None = None
    dirs: dict[str, Path] = field(default_factory=dict)

    def up(self) -> None:
        specs = []
        for host, case in NODES.items():
            self.dirs[host] = self.workdir / "nodes" / host
            specs.append(HostSpec(host, node_tree(case, self.dirs[host])))
        self.cluster = up(specs, self.workdir / "cluster")

    def down(self) -> None:
        for host in self.dirs:
            self.ssh(host, "docker", "rm", "-f", CONTAINER)
        if self.cluster is not None:
            self.cluster.down()

    def address(self, host: str) -> str:
        assert self.cluster is not None
        return self.cluster.host(host).address

    def ssh(self, host: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        assert self.cluster is not None
        # ssh hands the remote shell one string: quote each argument
        return subprocess.run(self.cluster.ssh_command(host, shlex.join(cmd)), capture_output=True, text=True,
                              timeout=timeout)

    def state(self, host: str) -> Path:
        return self.dirs[host] / "state"

    def set_node(self, host: str, memory: str = "flat", fault: str | None = None) -> None:
        (self.state(host) / "memory_mode").write_text(memory + "\n")
        path = self.state(host) / "fault"
        if fault:
            path.write_text(fault + "\n")
        elif path.exists():
            path.unlink()

    def set_tool(self, host: str, tool: str, present: bool) -> None:
        """Take a node tool away (or give it back): e.g. a node without nccl-tests' all_reduce_perf."""
        source, target = FIXTURES / NODES[host] / "bin" / tool, self.dirs[host] / "bin" / tool
        if present:
            shutil.copy2(source, target)
        else:
            target.unlink(missing_ok=True)

    def throttle(self, host: str, rate: str | None) -> None:
        """Shape the node's link on the bridge side (tc tbf), a slow inter-node path; None lifts it."""
        veth = self.cluster.host(host).veth if self.cluster else ""
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], capture_output=True)
        if rate:
            subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", rate, "burst", "64kbit",
                            "latency", "400ms"], check=True, capture_output=True)

    def container_status(self, host: str) -> str:
        out = self.ssh(host, "docker", "inspect", "--format", "{{.State.Status}}", CONTAINER)
        return out.stdout.strip() if out.returncode == 0 else "absent"

    def calls(self, host: str) -> list[dict[str, Any]]:
        path = self.state(host) / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def start_server(self, host: str, timeout_s: float = 900) -> str:
        """A deployment already running on the cluster (for attach): the same container launch the role
        makes, through the node's runtime; returns its base URL once /v1/models answers."""
        if self.container_status(host) != "running":
            self.ssh(host, "docker", "rm", "-f", CONTAINER)
            argv = ["docker", "run", "-d", "--name", CONTAINER, "--gpus", "all", "--ipc", "host", "--network", "host",
                    "-v", f"{MODELS}:/root/.cache/huggingface", "-e=VLLM_CPU_KVCACHE_SPACE",
                    f"vllm/vllm-openai:kimi-k3@{DIGEST}", profile_model(), "--host", "0.0.0.0", "--port", str(PORT),
                    *profile_args()]
            started = self.ssh(host, "env", "VLLM_CPU_KVCACHE_SPACE=1", *argv)
            if started.returncode != 0:
                raise RuntimeError(f"docker run on {host} failed: {started.stderr}")
        url = f"http://{self.address(host)}:{PORT}/v1"
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            probe = self.ssh(host, "/usr/bin/python3", "-c", "import urllib.request,sys;"
                             f"urllib.request.urlopen('http://127.0.0.1:{PORT}/v1/models', timeout=3)", timeout=30)
            if probe.returncode == 0:
                return url
            if self.container_status(host) != "running":
                log = self.ssh(host, "docker", "logs", "--tail", "20", CONTAINER).stdout
                raise RuntimeError(f"the server on {host} exited: {log}")
            time.sleep(3)
        raise RuntimeError(f"the server on {host} did not answer within {timeout_s} s")

    # --- inventories ------------------------------------------------------------------------------

    def inventory(self, name: str, *, gpu_nodes: list[str], head: str, variables: dict[str, Any],
                  gpu_group: str = "gpu_nodes", workers: list[str] | None = None) -> Path:
        assert self.cluster is not None
        inv = self.workdir / "inventories" / name
        (inv / "group_vars").mkdir(parents=True, exist_ok=True)
        node_vars = {"ansible_user": "root", "ansible_ssh_private_key_file": str(self.cluster.ssh_key),
                     "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                     "ansible_python_interpreter": system_python()}
        # `cat` is not faked: each node's driver version file is its recorded one
        # (tests/fixtures/generated-nodes/README.md).
        hosts = {h: {"ansible_host": self.address(h), **node_vars,
                     "preflight_driver_version_file": str(FIXTURES / case / "proc-driver-nvidia-version")}
                 for h, case in NODES.items()}
        data = {"all": {"children": {
            gpu_group: {"hosts": {h: hosts[h] for h in gpu_nodes}},
            "vllm_head": {"hosts": {head: hosts[head]}},
            **({"vllm_workers": {"hosts": {w: hosts[w] for w in workers}}} if workers else {}),
            "loadgen": {"hosts": {"localhost": None}}},
            "hosts": {"localhost": {"ansible_connection": "local",
                                    "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                      **{h: hosts[h] for h in self.dirs}}}}
        (inv / "hosts.yml").write_text(json.dumps(data, indent=2))
        base = {"acceptance_profile": str(PROFILE), "acceptance_owner": "rehearsal-operator",
                "acceptance_reviewer": "sre-lead", "vllm_image_digest": DIGEST,
                "vllm_serve_hf_cache": str(MODELS)}
        (inv / "group_vars" / "all.yml").write_text(json.dumps({**base, **variables}, indent=2))
        return inv


def _profile() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(PROFILE.read_text())


def profile_args() -> list[str]:
    return [str(a) for a in _profile()["launch"]["args"]]


def profile_model() -> str:
    return str(_profile()["model"]["name"])


def run_preflight(inventory: Path, run_dir: Path, timeout_s: float = 600) -> tuple[subprocess.CompletedProcess[str],
                                                                                    list[dict[str, Any]]]:
    """`playbooks/preflight.yml` alone (the compatibility chain, no server), as an operator runs it on an
    opened run directory; returns the run and findings/preflight.json."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([_ansible_playbook(), "-i", str(inventory), str(REPO / "playbooks" / "preflight.yml"),
                           "-e", f"acceptance_run_dir={run_dir}", "-e", f"acceptance_profile_path={PROFILE}"],
                          capture_output=True, text=True, timeout=timeout_s, env=_ansible_env(), cwd=REPO)
    path = run_dir / "findings" / "preflight.json"
    data = json.loads(path.read_text()) if path.is_file() else {"findings": []}
    return proc, data["findings"] if isinstance(data, dict) else data


def _ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_PIPELINING": "1", "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_HOST_KEY_CHECKING": "False",
                "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"})
    return env


def _ansible_playbook() -> str:
    return shutil.which("ansible-playbook", path=_ansible_env()["PATH"]) or "ansible-playbook"


@dataclass
class Outcome:
    rc: int
    output: str
    wall_s: float
    report: dict[str, Any] | None

    @property
    def verdict(self) -> str | None:
        return (self.report or {}).get("verdict")

    @property
    def reasons(self) -> list[str]:
        return list((self.report or {}).get("verdict_reasons") or [])

    def finding(self, check: str, host: str | None = None) -> dict[str, Any]:
        for f in (self.report or {}).get("findings", []):
            if f["check"] == check and (host is None or f.get("host") == host):
                return f
        raise KeyError(f"{check}@{host}")


def run_accept(inventory: Path, reports: Path, timeout_s: float = 900) -> Outcome:
    """`ansible-playbook -i INVENTORY accept.yml`, as a user runs it, from the checkout."""
    env = _ansible_env()
    start = time.time()
    proc = subprocess.run([_ansible_playbook(), "-i", str(inventory), str(REPO / "accept.yml"),
                           "-e", f"acceptance_reports_dir={reports}"], capture_output=True, text=True,
                          timeout=timeout_s, env=env, cwd=REPO)
    wall = time.time() - start
    latest = reports / inventory.name / "latest" / "report.json"
    report = json.loads(latest.read_text()) if latest.is_file() else None
    return Outcome(proc.returncode, proc.stdout + proc.stderr, round(wall, 1), report)


# --- scenarios -------------------------------------------------------------------------------------

def single_node_container(r: Rehearsal, reports: Path) -> Outcome:
    r.set_node("gb300-a01", "flat")
    r.ssh("gb300-a01", "docker", "rm", "-f", CONTAINER)
    inv = r.inventory("single-node-container", gpu_nodes=["gb300-a01"], head="gb300-a01",
                      variables={"vllm_serve_mode": "launch"})
    return run_accept(inv, reports)


def container_at_its_limit(r: Rehearsal, reports: Path) -> Outcome:
    """A container launched with a KV cache too small for the contract (31 blocks of 128 tokens: one session of
    2,048 where the contract wants two): the load stage proposes --max-num-seqs 1, the container is relaunched
    with it (the stand-in records the new argv and starts the real lab vLLM with it), and the limit is measured
    on a server that enforces it."""
    r.set_node("gb300-a01", "flat")
    r.ssh("gb300-a01", "docker", "rm", "-f", CONTAINER)
    inv = r.inventory("container-at-its-limit", gpu_nodes=["gb300-a01"], head="gb300-a01",
                      variables={"vllm_serve_mode": "launch",
                                 "vllm_serve_extra_args": ["--max-num-seqs", "2", "--num-gpu-blocks-override", "31"]})
    return run_accept(inv, reports)


def attach(r: Rehearsal, reports: Path, name: str, *, gpu_nodes: list[str], memory: str = "flat",
           extra: dict[str, Any] | None = None, gpu_group: str = "gpu_nodes") -> Outcome:
    r.set_node("gb300-a01", memory)
    url = r.start_server("gb300-a01")
    # What an operator attaching to a running deployment hands over: the server's pid on the head node
    # (its real argv is read from /proc), its startup log as saved with `docker logs`, and its container's
    # name (its live log is read after the probes).
    log = r.workdir / "inventories" / f"{name}-startup.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(r.ssh("gb300-a01", "docker", "logs", CONTAINER).stdout)
    pid = (r.state("gb300-a01") / "containers" / CONTAINER / "pid").read_text().strip()
    inv = r.inventory(name, gpu_nodes=gpu_nodes, head="gb300-a01", gpu_group=gpu_group,
                      variables={"vllm_serve_mode": "attach", "vllm_base_url": url, "vllm_serve_pid": int(pid),
                                 "vllm_serve_startup_log": str(log), "vllm_serve_attach_container": CONTAINER,
                                 **(extra or {})})
    return run_accept(inv, reports)


def attach_dead_url(r: Rehearsal, reports: Path) -> Outcome:
    inv = r.inventory("attach-dead-url", gpu_nodes=["gb300-a01"], head="gb300-a01",
                      variables={"vllm_serve_mode": "attach",
                                 "vllm_base_url": f"http://{r.address('gb300-a01')}:8999/v1"})
    return run_accept(inv, reports)


def driver_575(r: Rehearsal, reports: Path) -> Outcome:
    """One node on R575: the chain is broken whatever the server does, so no server is needed (the
    deployment URL does not answer); the healthy node is still judged node by node."""
    inv = r.inventory("driver-575-one-node", gpu_nodes=["gb300-a01", "gb300-a02"], head="gb300-a01",
                      variables={"vllm_serve_mode": "attach",
                                 "vllm_base_url": f"http://{r.address('gb300-a01')}:8999/v1"})
    return run_accept(inv, reports)


def oom_mid_ramp(r: Rehearsal, reports: Path, fault: str, name: str) -> Outcome:
    r.set_node("gb300-a01", "flat", fault=fault)
    r.ssh("gb300-a01", "docker", "rm", "-f", CONTAINER)
    try:
        inv = r.inventory(name, gpu_nodes=["gb300-a01"], head="gb300-a01", variables={"vllm_serve_mode": "launch"})
        return run_accept(inv, reports)
    finally:
        r.set_node("gb300-a01", "flat")
        r.ssh("gb300-a01", "docker", "rm", "-f", CONTAINER)


# The layout the CPU build serves across two namespace nodes (docs/lab.md, measured with vllm-cpu 0.32.0):
# tensor parallel 2 with vLLM's own multi-node flags, one rank per node. Pipeline parallel 2 across nodes
# starts but its first request fails under the profile's --enforce-eager (the CPU model runner then never
# runs the warm-up that allocates the later stage's intermediate tensors), and tensor parallel 2 inside one
# node needs a manual OpenMP binding (VLLM_CPU_OMP_THREADS_BIND) on this single-NUMA machine.
TWO_NODE_LAYOUT = {"tensor": 2}


# The in-image all-reduce between the namespace nodes (interconnect.nccl_bandwidth without nccl-tests): gloo
# names the nodes' interface as a site names NCCL's; small messages keep it short on 2 busy cores.
ALLREDUCE = {"preflight_nccl_test_method": "auto", "preflight_allreduce_env": {"GLOO_SOCKET_IFNAME": "eth0"},
             "preflight_allreduce_args": ["--min-bytes", "1M", "--max-bytes", "4M", "--iters", "3", "--warmup", "1",
                                          "--timeout", "120"]}


def two_node_layout(r: Rehearsal, reports: Path) -> Outcome:
    """The example-gb300 case on healthy nodes: the inventory's vllm_parallel differs from the profile's
    (tensor 1), launched with vLLM's --nnodes/--node-rank/--master-addr (the worker --headless); every
    layout check must judge the launched plan. One rank per node is what the lab fills
    (vllm_gpus_per_node: 1); GLOO_SOCKET_IFNAME names the nodes' interface for torch.distributed (gloo is
    the CPU build's backend), as a site names its NCCL/GLOO interface."""
    nodes = ["gb300-a01", "gb300-a03"]
    for host in nodes:
        r.set_node(host, "flat")
        r.ssh(host, "docker", "rm", "-f", CONTAINER)
        r.set_tool(host, "all_reduce_perf", present=False)   # no nccl-tests: the image's own all-reduce
    try:
        inv = r.inventory("two-node-layout", gpu_nodes=nodes, head="gb300-a01", workers=nodes[1:],
                          variables={"vllm_serve_mode": "launch", "vllm_parallel": TWO_NODE_LAYOUT,
                                     "vllm_gpus_per_node": 1, "vllm_serve_multinode_poll_s": 10,
                                     "vllm_serve_multinode_env": {"GLOO_SOCKET_IFNAME": "eth0"},
                                     **ALLREDUCE})
        return run_accept(inv, reports)
    finally:
        for host in nodes:
            r.ssh(host, "docker", "rm", "-f", CONTAINER)
            r.set_tool(host, "all_reduce_perf", present=True)


def weakened_contract(r: Rehearsal, reports: Path) -> Outcome:
    inv = r.inventory("weakened-contract", gpu_nodes=["gb300-a01"], head="gb300-a01",
                      variables={"vllm_serve_mode": "attach", "vllm_base_url": f"http://{r.address('gb300-a01')}:8000/v1",
                                 "acceptance_probe_overrides": {"load": {"contract.concurrency": 1}}})
    return run_accept(inv, reports)


@dataclass(frozen=True)
class Play:
    expected: str                          # a verdict, or "refused": the run stopped naming the cause, no report
    run: Callable[[Rehearsal, Path], Outcome]
    reasons: tuple[str, ...] = ()          # each must appear in the verdict reasons (or, refused, in the output)
    suite: bool = True                     # part of the test suite's short set (the rest: make rehearsal)
    in_output: bool = False                # the reasons are the run's own words (what the user reads), not the report's


PLAYS: dict[str, Play] = {
    "attach-running": Play("release", lambda r, p: attach(r, p, "attach-running", gpu_nodes=["gb300-a01"]),
                           ("every required check passed with evidence",), suite=False),
    "attach-dead-url": Play("incomplete", attach_dead_url, (":8999/v1 does not answer within 30 s",), in_output=True),
    "weakened-contract": Play("refused", weakened_contract,
                              ("acceptance_probe_overrides.load.contract.concurrency", "write profiles/<site>.yml")),
    "driver-575-one-node": Play("rebuild_environment", driver_575, ("compat.driver_branch@gb300-a02",)),
    "gpu-nodes-misspelled": Play("incomplete", lambda r, p: attach(
        r, p, "gpu-nodes-misspelled", gpu_nodes=["gb300-a01"], gpu_group="gpu_node"),
        ("compat.gpu_nodes",), suite=False),
    "soak-memory-rising": Play("expand_capacity", lambda r, p: attach(
        r, p, "soak-memory-rising", gpu_nodes=["gb300-a01"], memory="rising"), ("capacity.soak",), suite=False),
    "single-node-container": Play("release", single_node_container,
                                  ("every required check passed with evidence",)),
    "oom-mid-ramp": Play("expand_capacity", lambda r, p: oom_mid_ramp(r, p, "oom_at_running=2", "oom-mid-ramp"),
                         ("capacity.crash", "torch.OutOfMemoryError: CUDA out of memory"), suite=False),
    "two-node-layout": Play("release", two_node_layout, ("every required check passed with evidence",),
                            suite=False),
    "container-at-its-limit": Play("limited_observation", container_at_its_limit,
                                   ("stable only under limits: capacity.kv_capacity",), suite=False),
    "crash-mid-ramp": Play("incomplete", lambda r, p: oom_mid_ramp(r, p, "crash_at_running=2", "crash-mid-ramp"),
                           ("without an OOM signature", "died unexpectedly"), suite=False),
}


def verdict_of(outcome: Outcome) -> str:
    if outcome.report is None and outcome.rc != 0:
        return "refused"
    return outcome.verdict or "no report"


def judge(name: str, outcome: Outcome) -> dict[str, Any]:
    """One line of summary.json: the verdict, the expected one, the deciding reasons, whether both hold."""
    play = PLAYS[name]
    verdict = verdict_of(outcome)
    if verdict == "refused" or play.in_output:
        reasons = [line.strip() for line in outcome.output.splitlines()
                   if '"msg"' in line or "fatal:" in line or "FAILED!" in line][-4:]
        text = outcome.output
    else:
        reasons = outcome.reasons
        text = "\n".join(reasons)
    lacking = [r for r in play.reasons if r not in text]
    return {"verdict": verdict, "expected": play.expected, "ok": verdict == play.expected and not lacking,
            "reasons": reasons, "lacking_reasons": lacking, "wall_s": outcome.wall_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.lab.rehearsal", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "reports" / "rehearsal")
    parser.add_argument("--only", nargs="*", choices=sorted(PLAYS))
    args = parser.parse_args(argv)
    out = args.out.resolve()
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rehearsal = Rehearsal(work)
    summary: dict[str, Any] = {}
    start = time.time()
    try:
        rehearsal.up()
        for name in args.only or list(PLAYS):
            outcome = PLAYS[name].run(rehearsal, out / "runs")
            summary[name] = judge(name, outcome)
            print(f"{name}: {summary[name]['verdict']} (expected {PLAYS[name].expected}) in {outcome.wall_s} s"
                  + ("" if summary[name]["ok"] else f"  DIFFERS {summary[name]['lacking_reasons']}"), flush=True)
    finally:
        rehearsal.down()
    summary_all = {"scenarios": summary, "wall_s": round(time.time() - start, 1)}
    (out / "summary.json").write_text(json.dumps(summary_all, indent=2) + "\n")
    print(f"summary: {out / 'summary.json'}")
    return 0 if summary and all(s["ok"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
