"""roles/gpu_memory_sampler on namespace hosts: start in one ansible-playbook run, stop in a later one.

Each GPU host answers ``nvidia-smi`` with the fake in tests/fixtures/sampler/bin (the real -lms
stream format, FAKE_GPUS GPUs); one host has no nvidia-smi at all. Starting and stopping in two
separate playbook runs proves what playbooks/probes.yml needs: the sampler outlives the SSH
session and the play that started it, and the stop finds it again by its pid file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance.lab.container_standin import docker_cgroup, join_cgroup, make_cgroup, remove_cgroup
from vllm_acceptance.lab.nshosts import HostSpec
from vllm_acceptance.parsers.gpu_memory import parse_memory_file

from support.hosts import REPO, ClusterFactory, ansible_bin, ansible_env, cluster_factory

pytestmark = pytest.mark.hosts

FAKE_BIN = REPO / "tests" / "fixtures" / "sampler" / "bin"
GPUS = {"gpu-a": 2, "gpu-b": 4}
NO_SMI = "no-smi"
INTERVAL_MS = 200
SERVER_PORT = 18766          # a server in a container's cgroup listens here on gpu-a only
CONTAINER_ID = "5e" * 32

START = """
- name: Start
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Start the sampler
      ansible.builtin.include_role:
        name: gpu_memory_sampler
        tasks_from: start
    - name: Keep what start said
      ansible.builtin.copy:
        content: "{{ {'running': gpu_memory_sampler_running, 'error': gpu_memory_sampler_error,
          'changed': gpu_memory_sampler_start_result.changed | default(false)} | to_json }}"
        dest: "{{ acceptance_run_dir }}/start-{{ inventory_hostname }}-{{ attempt }}.json"
        mode: "0644"
      delegate_to: localhost
"""

STOP = """
- name: Stop
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Stop the sampler
      ansible.builtin.include_role:
        name: gpu_memory_sampler
        tasks_from: stop
    - name: Keep what stop said
      ansible.builtin.copy:
        content: "{{ {'state': gpu_memory_sampler_state, 'csv': gpu_memory_sampler_csv} | to_json }}"
        dest: "{{ acceptance_run_dir }}/stop-{{ inventory_hostname }}.json"
        mode: "0644"
      delegate_to: localhost
"""


@pytest.fixture(scope="module")
def sampler_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    yield from cluster_factory(tmp_path_factory)


def _play(work: Path, inventory: Path, text: str, run_dir: Path, **extra: Any) -> subprocess.CompletedProcess[str]:
    book = work / f"play-{len(list(work.glob('play-*')))}.yml"
    book.write_text(text)
    extra_vars = {"acceptance_run_dir": str(run_dir), "gpu_memory_sampler_interval_ms": INTERVAL_MS, **extra}
    proc = subprocess.run([ansible_bin(), "-i", str(inventory), str(book), "-e", json.dumps(extra_vars)],
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    return proc


@pytest.fixture(scope="module")
def sampled(sampler_hosts: ClusterFactory, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    empty_bin = tmp_path_factory.mktemp("empty-bin")
    specs = [HostSpec(name, FAKE_BIN, env={"FAKE_GPUS": str(n)}) for name, n in GPUS.items()]
    specs.append(HostSpec(NO_SMI, empty_bin))
    cluster = sampler_hosts(specs, name="sampler-hosts")
    work = tmp_path_factory.mktemp("sampler-run")
    data = cluster.inventory_data(group="gpu_nodes")
    data["all"]["hosts"] = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    inventory = work / "inventory.yml"
    inventory.write_text(yaml.safe_dump(data))
    run_dir = work / "run-20261130T000000Z"
    run_dir.mkdir()
    server = _server_in_a_container(cluster.host("gpu-a").netns)
    try:
        t_start = time.time()
        _play(work, inventory, START, run_dir, attempt=1, gpu_memory_sampler_server_port=SERVER_PORT)
        _play(work, inventory, START, run_dir, attempt=2, gpu_memory_sampler_server_port=SERVER_PORT)  # idempotent
        time.sleep(2.0)
        _play(work, inventory, STOP, run_dir, gpu_memory_sampler_server_port=SERVER_PORT)
        t_stop = time.time()
        rss_kib = _rss_anon_kib(server[0].pid) if server else None
    finally:
        if server:
            server[0].kill()
            server[0].wait()
            remove_cgroup(docker_cgroup(CONTAINER_ID))
    return {"cluster": cluster, "run_dir": run_dir, "t_start": t_start, "t_stop": t_stop, "server": bool(server),
            "rss_kib": rss_kib}


def _server_in_a_container(netns: str) -> tuple[subprocess.Popen[bytes], Path] | None:
    """A process listening on SERVER_PORT inside gpu-a's network namespace, placed in a cgroup named as docker's
    systemd driver names a container's (as lab/container_standin.py places the lab server); None where this
    machine has no writable cgroup v2 hierarchy."""
    path, _why = make_cgroup(docker_cgroup(CONTAINER_ID))
    if path is None:
        return None
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-m", "http.server", str(SERVER_PORT),
                             "--bind", "0.0.0.0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: join_cgroup(path))
    for _ in range(50):
        if subprocess.run(["ip", "netns", "exec", netns, "ss", "-ltnH", f"sport = :{SERVER_PORT}"],
                          capture_output=True, text=True, check=False).stdout.strip():
            return proc, path
        time.sleep(0.1)
    proc.kill()
    return None


def _rss_anon_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("RssAnon:")))


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_csv_comes_back_and_parses_to_rows_per_gpu(sampled: dict[str, Any]) -> None:
    run_dir = sampled["run_dir"]
    for host, gpus in GPUS.items():
        csv = run_dir / "evidence" / "memory" / f"{host}.csv"
        assert csv.is_file(), f"{host}: no CSV fetched"
        rows = parse_memory_file(csv)
        per_gpu = {f"gpu{i}@{host}": [r for r in rows if r["series"] == f"gpu{i}@{host}"] for i in range(gpus)}
        assert set(per_gpu) == {r["series"] for r in rows}
        # ~2 s at 200 ms, and the two plays around it: at least 5 samples of every GPU.
        assert all(len(samples) >= 5 for samples in per_gpu.values()), {k: len(v) for k, v in per_gpu.items()}
        # UTC timestamps on the node's clock land inside the controller's window (TZ=UTC works).
        assert all(sampled["t_start"] - 1 <= r["t"] <= sampled["t_stop"] + 1 for r in rows)
        assert rows[-1]["bytes"] > rows[0]["bytes"]  # the fake's memory rises: rows keep the order
        assert _json(run_dir / f"stop-{host}.json") == {"state": "stopped", "csv": str(csv)}


def test_started_once_and_stopped_processes_and_files_gone(sampled: dict[str, Any]) -> None:
    run_dir, cluster = sampled["run_dir"], sampled["cluster"]
    for host in GPUS:
        first, second = _json(run_dir / f"start-{host}-1.json"), _json(run_dir / f"start-{host}-2.json")
        assert first == {"running": True, "error": "", "changed": True}
        assert second["running"] is True and second["changed"] is False
        pids = subprocess.run(["ip", "netns", "pids", cluster.host(host).netns], capture_output=True,
                              text=True, check=False).stdout.split()
        cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in pids if Path(f"/proc/{p}/cmdline").exists()]
        assert not [c for c in cmdlines if b"nvidia-smi" in c], "sampler still running after stop"
    assert not list(Path("/tmp").glob(f"vllm-acceptance-gpu-memory-{run_dir.name}-*"))


def test_node_without_nvidia_smi_reports_missing_without_failing(sampled: dict[str, Any]) -> None:
    run_dir = sampled["run_dir"]
    started = _json(run_dir / f"start-{NO_SMI}-1.json")
    assert started["running"] is False and "exited at once" in started["error"]
    assert _json(run_dir / f"stop-{NO_SMI}.json") == {"state": "exited-early", "csv": ""}
    assert not (run_dir / "evidence" / "memory" / f"{NO_SMI}.csv").exists()


def test_the_servers_container_memory_is_sampled_on_its_node_only(sampled: dict[str, Any]) -> None:
    """Issue 42 item 4: the process on the server's port in a container's cgroup is sampled (memory.stat anon, or
    on a hierarchy without the memory controller the RssAnon of its cgroup's processes); a node where nothing
    listens on the port writes no container series."""
    if not sampled["server"]:
        pytest.skip("no writable cgroup v2 hierarchy on this machine: no container to sample")
    run_dir = sampled["run_dir"]
    csv = run_dir / "evidence" / "memory" / "cgroup" / "gpu-a.csv"
    assert csv.is_file(), "gpu-a: no container memory CSV fetched"
    values = [int(line.split(",")[1]) for line in csv.read_text().splitlines() if line.strip()]
    assert len(values) >= 5, values
    # the http.server's own anonymous memory: within a factor of the RssAnon read at the end (anon counts the
    # cgroup's pages, RssAnon the process's; both are the one process here)
    assert all(sampled["rss_kib"] * 1024 / 4 <= v <= sampled["rss_kib"] * 1024 * 4 for v in values), values
    assert not (run_dir / "evidence" / "memory" / "cgroup" / "gpu-b.csv").exists()
