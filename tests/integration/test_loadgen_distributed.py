"""playbooks/loadgen.yml: two namespace loadgen hosts load the real lab vLLM at once, the controller merges.

The hosts live in their own network namespaces, so they cannot reach the root namespace's
127.0.0.1: this test starts its own lab server bound to 0.0.0.0 and points the hosts at the
cluster bridge's address. The server's access log then proves the requests really came from
both host addresses; the merge must count exactly what the hosts recorded, and keeps each host's
client self-check. A second run with one host down must name it `missing`.

The self-check's limits here are ones no healthy client reaches (a profile copy with lenient
`loadgen` limits): this machine is shared, and whether its other work saturates a client is not
what these tests decide; tests/unit/test_loadmerge.py covers a saturated host.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.lab.nshosts import HostSpec
from vllm_acceptance.load.engine import read_records
from vllm_acceptance.runtime import process as lab

from support.hosts import REPO, ClusterFactory, ansible_bin, ansible_env, cluster_factory

pytestmark = [pytest.mark.lab, pytest.mark.hosts]

LAB_PYTHON = REPO / ".venv-lab" / "bin" / "python"
LAB_MODEL = REPO / ".lab" / "models" / "tiny-agent"
PORTS = range(8061, 8070)
HOSTS = ["lg0", "lg1"]
PER_HOST_REQUESTS = 4


def free_port() -> int:
    for port in PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    pytest.skip(f"no free port in {PORTS.start}-{PORTS.stop - 1} for the 0.0.0.0 lab server")


@pytest.fixture(scope="module")
def open_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A real lab vLLM on 0.0.0.0 (reachable from the namespaces through the bridge)."""
    if not LAB_PYTHON.exists() or not (LAB_MODEL / "config.json").exists():
        pytest.skip("no lab vLLM or lab model: run `make lab-venv lab-model` (make test does)")
    state = tmp_path_factory.mktemp("open-lab")
    profile = load_profile(str(REPO / "profiles" / "cpu-lab.yml"))
    port = free_port()
    spec = lab.LaunchSpec(python=str(LAB_PYTHON), model_path=str(LAB_MODEL), served_name="tiny-agent",
                          host="0.0.0.0", port=port, args=[str(a) for a in profile.get("launch.args", [])],
                          env={str(k): str(v) for k, v in profile.get("launch.env", {}).items()},
                          log_path=state / "vllm.log", pid_path=state / "vllm.pid")
    pid = lab.start(spec)
    try:
        lab.wait_ready(f"http://127.0.0.1:{port}/v1", pid, 600, spec.log_path)
        yield port, spec.log_path
    finally:
        lab.stop(spec.pid_path)


@pytest.fixture(scope="module")
def loadgen_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    yield from cluster_factory(tmp_path_factory)


def lenient_profile(work: Path) -> Path:
    profile = yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text())
    profile["loadgen"].update({"max_cpu_pct": 100, "max_loop_lag_p99_s": 10, "max_send_lag_p99_s": 10,
                               "send_lag_ttft_fraction": 1})
    # The hosts send the profile's shape (short, for the shared machine): a step below the profile's prompt or
    # output length is inconclusive by design (probes/loadmerge.py below_contract_shape; tests/unit/test_loadmerge.py).
    profile["load"].update({"prompt_tokens": 64, "output_tokens": 8})
    path = work / "cpu-lab-lenient-loadgen.yml"
    path.write_text(yaml.safe_dump(profile))
    return path


def run_loadgen(port: int, cluster: Any, work: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    data = cluster.inventory_data(group="loadgen")
    # The controller itself, for the plan and merge plays (its own venv, local connection).
    data["all"]["hosts"] = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    run_dir = work / "run"
    run_dir.mkdir()
    extra = {
        "acceptance_run_dir": str(run_dir),
        "acceptance_profile_path": str(lenient_profile(work)),
        "loadgen_base_url": f"http://{cluster.controller_address}:{port}/v1",
        "vllm_metrics_url": f"http://127.0.0.1:{port}/metrics",
        "loadgen_model": "tiny-agent",
        "loadgen_concurrency": 2,
        "loadgen_requests": PER_HOST_REQUESTS,
        "loadgen_prompt_tokens": 64,
        "loadgen_output_tokens": 8,
        "loadgen_start_delay_s": 10,  # covers the hosts' interpreter start on a busy 2-core machine
    }
    proc = subprocess.run([ansible_bin(), "-i", str(inventory), "playbooks/loadgen.yml", "-e", json.dumps(extra)],
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    return proc, run_dir


@pytest.fixture(scope="module")
def distributed_run(open_lab: tuple[int, Path], loadgen_hosts: ClusterFactory,
                    tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    port, log = open_lab
    cluster = loadgen_hosts([HostSpec(h) for h in HOSTS], name="loadgen-hosts")
    work = tmp_path_factory.mktemp("loadgen-run")
    proc, run_dir = run_loadgen(port, cluster, work)
    return {"proc": proc, "run_dir": run_dir, "cluster": cluster, "log": log}


@pytest.fixture(scope="module")
def one_host_down(open_lab: tuple[int, Path], loadgen_hosts: ClusterFactory,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    port, _ = open_lab
    cluster = loadgen_hosts([HostSpec("lg2"), HostSpec("lg3", reachable=False)], name="loadgen-down")
    proc, run_dir = run_loadgen(port, cluster, tmp_path_factory.mktemp("loadgen-down"))
    return {"proc": proc, "run_dir": run_dir}


def test_both_hosts_records_arrive_and_merge(distributed_run: dict[str, Any]) -> None:
    proc, run_dir = distributed_run["proc"], distributed_run["run_dir"]
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-3000:]}"
    records_dir = run_dir / "probes" / "load-distributed"
    per_host = {h: read_records(records_dir / f"{h}.jsonl") for h in HOSTS}
    assert {h: len(r) for h, r in per_host.items()} == dict.fromkeys(HOSTS, PER_HOST_REQUESTS)
    assert all(r.status == "ok" and r.completion_tokens == 8 for recs in per_host.values() for r in recs)
    merged = json.loads((records_dir / "merged.json").read_text())
    assert merged["summary"]["overall"]["count"] == sum(len(r) for r in per_host.values())
    assert merged["row"]["concurrency"] == 4 and merged["clock"]["ok"] is True
    assert merged["preemptions"] == 0
    # Each host's client self-check is kept beside the merge: its worker process, its figures.
    for host in HOSTS:
        client = merged["clients"][host]
        assert client["saturated"] is False and client["send_lag_s"]["count"] == PER_HOST_REQUESTS
        (worker,) = client["processes"]
        assert worker["host"] == host and worker["requests"] == PER_HOST_REQUESTS and worker["cpu_s"] > 0


def test_requests_came_from_both_namespace_hosts(distributed_run: dict[str, Any]) -> None:
    """vLLM's access log names the client address: each host's own, through the bridge."""
    cluster, log = distributed_run["cluster"], distributed_run["log"]
    text = log.read_text(errors="replace")
    for name in HOSTS:
        address = cluster.host(name).address
        hits = [line for line in text.splitlines() if f"{address}:" in line and "/v1/chat/completions" in line]
        assert len(hits) >= PER_HOST_REQUESTS, f"{name} ({address}) sent {len(hits)} requests per the server log"


def test_finding_is_filed_for_the_report(distributed_run: dict[str, Any]) -> None:
    run_dir = distributed_run["run_dir"]
    findings = json.loads((run_dir / "findings" / "load-distributed.json").read_text())
    assert [f["check"] for f in findings] == ["capacity.distributed"]
    finding = findings[0]
    assert finding["status"] == "pass", finding
    assert finding["observed"]["hosts"] == dict.fromkeys(HOSTS, PER_HOST_REQUESTS)
    assert all((run_dir / p).is_file() for p in finding["evidence"])
    assert {f"probes/load-distributed/{h}.jsonl" for h in HOSTS} <= set(finding["evidence"])
    stage = json.loads((run_dir / "stages" / "load-distributed.json").read_text())
    assert stage["hosts"] == HOSTS
    # The hosts started together: every first request within the tolerance of the shared start.
    assert stage["clock"]["start_spread_s"] < stage["clock"]["tolerance_s"]


def test_a_loadgen_host_down_is_named_missing_never_a_smaller_load(one_host_down: dict[str, Any]) -> None:
    run_dir = one_host_down["run_dir"]
    assert "lg3" in one_host_down["proc"].stdout and "UNREACHABLE" in one_host_down["proc"].stdout
    (finding,) = json.loads((run_dir / "findings" / "load-distributed.json").read_text())
    assert finding["check"] == "capacity.distributed" and finding["status"] == "missing", finding
    assert finding["reason"] == "no records from: lg3"
    assert finding["observed"]["hosts"] == {"lg2": PER_HOST_REQUESTS}  # what came is kept, not judged alone


AGENT_HOSTS = ["lg4", "lg5"]


@pytest.fixture(scope="module")
def probes_with_agents(open_lab: tuple[int, Path], loadgen_hosts: ClusterFactory,
                       tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """validate, serve (attach to the open lab) and probes (load only) with two loadgen hosts: their agents
    send the ramp, mixed and soak steps; the long prompt and the context contract stay on the controller."""
    cluster = loadgen_hosts([HostSpec(h) for h in AGENT_HOSTS], name="loadgen-agents")
    return run_probes(open_lab, cluster, tmp_path_factory.mktemp("loadgen-agents"))


@pytest.fixture(scope="module")
def probes_with_an_agent_missing(open_lab: tuple[int, Path], loadgen_hosts: ClusterFactory,
                                 tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same with lg7's loadgen_python pointing nowhere: its agent never starts."""
    cluster = loadgen_hosts([HostSpec("lg6"), HostSpec("lg7")], name="loadgen-agent-missing")
    return run_probes(open_lab, cluster, tmp_path_factory.mktemp("loadgen-agent-missing"),
                      host_vars={"lg7": {"loadgen_python": "/nonexistent/python3"}})


def run_probes(open_lab: tuple[int, Path], cluster: Any, work: Path,
               host_vars: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    port, log = open_lab
    inventory = work / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    lab_vars = REPO / "inventories" / "lab" / "group_vars" / "all.yml"
    (inventory / "group_vars" / "all.yml").write_text(lab_vars.read_text())
    data = cluster.inventory_data(group="loadgen", host_vars=host_vars)
    data["all"]["hosts"] = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    data["all"]["children"].update({"gpu_nodes": {"hosts": {"localhost": None}},
                                    "vllm_head": {"hosts": {"localhost": None}}})
    (inventory / "hosts.yml").write_text(yaml.safe_dump(data))
    pid = int((log.parent / "vllm.pid").read_text().strip())
    extra = {"acceptance_reports_dir": str(work / "reports"), "acceptance_profile": str(lenient_profile(work)),
             "acceptance_probes": ["load"], "vllm_serve_mode": "attach",
             "vllm_base_url": f"http://{cluster.controller_address}:{port}/v1", "vllm_serve_pid": pid,
             "vllm_serve_startup_log": str(log),
             "acceptance_probe_overrides": {"load": {"load.ramp": [2], "load.max_step": 4, "load.requests_per_step": 4,
                                                     "load.soak_s": 3}}}
    before = log.stat().st_size
    proc = subprocess.run([ansible_bin(), "-i", str(inventory), "playbooks/validate.yml", "playbooks/serve.yml",
                           "playbooks/probes.yml", "-e", json.dumps(extra)], cwd=REPO,
                          env=ansible_env(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), VLLM_API_KEY=""),
                          capture_output=True, text=True, timeout=900, check=False)
    runs = [p for p in (work / "reports").glob("*/*") if p.is_dir() and not p.is_symlink()]  # <inventory>/<run>
    return {"proc": proc, "run_dir": runs[0] if len(runs) == 1 else None, "cluster": cluster,
            "log": log.read_text(errors="replace")[before:]}


@pytest.mark.full
def test_ramp_mixed_and_soak_are_sent_from_every_loadgen_host(probes_with_agents: dict[str, Any]) -> None:
    proc, run_dir, cluster = probes_with_agents["proc"], probes_with_agents["run_dir"], probes_with_agents["cluster"]
    assert proc.returncode == 0 and run_dir is not None, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    found = {f["check"]: f for f in json.loads((run_dir / "findings" / "load.json").read_text())}
    assert "capacity.probe" not in found, found.get("capacity.probe")
    records = run_dir / "probes" / "load" / "records"
    for stage in ("ramp_c2", "ramp_c4", "mixed", "soak"):
        hosts = {r.worker.split("/", 1)[0] for r in read_records(records / f"{stage}.jsonl")}
        assert hosts == set(AGENT_HOSTS), (stage, hosts)
    assert all("/" not in r.worker for r in read_records(records / "long_prompt.jsonl"))  # alone, from the controller
    # vLLM's access log names the client: both namespace hosts' own addresses, through the bridge
    for name in AGENT_HOSTS:
        address = cluster.host(name).address
        assert any(f"{address}:" in line and "/v1/chat/completions" in line
                   for line in probes_with_agents["log"].splitlines()), name
    # each host's client self-check per step, judged into capacity.loadgen; the clocks were measured
    stage = json.loads((run_dir / "stages" / "load.json").read_text())
    assert {f"ramp_c4@{h}" for h in AGENT_HOSTS} <= set(stage["client"]) and f"soak@{AGENT_HOSTS[1]}" in stage["client"]
    (connected,) = [json.loads(line) for line in (run_dir / "probes" / "load" / "loadgen_agents.jsonl").read_text()
                    .splitlines()]
    assert [a["host"] for a in connected["agents"]] == AGENT_HOSTS
    assert all(abs(a["clock_offset_s"]) < 1.0 for a in connected["agents"])
    assert found["capacity.ramp"]["status"] in ("pass", "fail") and found["capacity.soak"]["status"] != "missing"
    # the agents are gone after the probes
    for name in AGENT_HOSTS:
        with pytest.raises(OSError), socket.create_connection((cluster.host(name).address, 29600), timeout=2):
            pass


@pytest.mark.full
def test_a_loadgen_host_without_its_agent_stops_the_load_probe_naming_it(
        probes_with_an_agent_missing: dict[str, Any]) -> None:
    proc, run_dir = probes_with_an_agent_missing["proc"], probes_with_an_agent_missing["run_dir"]
    assert run_dir is not None, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    assert "no load agent on lg7" in proc.stdout
    (finding,) = json.loads((run_dir / "findings" / "load.json").read_text())
    assert finding["check"] == "capacity.probe" and finding["status"] == "missing", finding
    assert "no load agent on loadgen host(s) lg7" in finding["reason"], finding["reason"]
    assert not (run_dir / "probes" / "load" / "records").exists()   # nothing sent: never a smaller load
