"""Multi-node launch through the real vllm_serve role, on namespace hosts over real SSH.

Each host answers `docker` with a stand-in that records the exact argv and the -e variables' values
it was given (there are no GPUs or Docker engine here), and plays one behaviour per host: `ok` (the
container runs; on the head a real HTTP server answers /health), `exit` (the container exits after
`docker run` succeeded: the rank died), `refuse` (`docker run` itself fails, as the NVIDIA runtime
refuses a cu130 image on an old driver) or `hang` (runs, the head never becomes healthy). The plays
are the project's validate and serve playbooks with the kimi-k3 profile.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from support.hosts import REPO, HostSpec, ansible_bin, ansible_env, cluster_factory

pytestmark = pytest.mark.hosts

DIGEST = "sha256:" + "0123456789abcdef" * 4
# the 8-GPU node model the node fixtures are shaped after (see its header); a path, as acceptance_profile takes one
K3_8GPU = "tests/fixtures/profiles/kimi-k3-8gpu-node.yml"
GOLDEN = REPO / "tests" / "fixtures" / "launch_golden"

FAKE_DOCKER = r'''#!/usr/bin/python3
"""Stand-in docker: records argv and env, plays the host's mode (STATE/<hostname>/mode)."""
import json, os, socket, subprocess, sys
STATE = os.path.join(@STATE@, socket.gethostname())
os.makedirs(STATE, exist_ok=True)
argv = sys.argv[1:]
def read(name, default=""):
    try:
        return open(os.path.join(STATE, name)).read()
    except OSError:
        return default
def write(name, text):
    open(os.path.join(STATE, name), "w").write(text)
mode = read("mode", "ok").strip()
env = {a[3:]: os.environ.get(a[3:]) for a in argv if a.startswith("-e=")}
with open(os.path.join(STATE, "calls.jsonl"), "a") as calls:
    calls.write(json.dumps({"argv": ["docker"] + argv, "env": env}) + "\n")
cmd = argv[0] if argv else ""
if cmd == "run":
    if mode == "refuse":
        sys.stderr.write("docker: Error response from daemon: failed to create task for container: "
                         "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=13.0, please "
                         "update your driver to a newer version, or use an earlier cuda container: unknown.\n")
        sys.exit(125)
    image_at = next(i for i, a in enumerate(argv) if "@sha256:" in a)
    write("args.json", json.dumps(argv[image_at + 1:]))
    head = "--port" in argv
    if mode == "exit":
        write("state", "exited")
        write("logs", "(Worker_TP8 pid=120) ERROR 08-28 20:10:05 [multiproc_executor.py:751] "
                      "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms "
                      "while trying to connect to (10.40.1.11, 29501).\n")
    else:
        write("state", "running")
        write("logs", "(APIServer pid=1) INFO 08-28 10:00:01 [api_utils.py:286] vLLM server version 0.32.0, "
                      "serving model moonshotai/Kimi-K3\n")
        if head and mode == "ok":
            port = argv[argv.index("--port") + 1]
            www = os.path.join(STATE, "www")
            os.makedirs(www, exist_ok=True)
            open(os.path.join(www, "health"), "w").write("")
            proc = subprocess.Popen([sys.executable, "-m", "http.server", port, "--bind", "0.0.0.0",
                                     "--directory", www], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            write("http.pid", str(proc.pid))
    print("4f1c2a" * 10 + "abcd")
elif cmd == "inspect":
    state = read("state")
    if not state:
        sys.stderr.write("Error: No such object: vllm-acceptance\n")
        sys.exit(1)
    fmt = argv[argv.index("--format") + 1]
    print(read("args.json", "[]") if "json .Args" in fmt else state)
elif cmd == "logs":
    sys.stdout.write(read("logs"))
elif cmd == "stop":
    if not read("state"):
        sys.stderr.write("Error response from daemon: No such container: vllm-acceptance\n")
        sys.exit(1)
    pid = read("http.pid")
    if pid:
        try:
            os.kill(int(pid), 15)
        except OSError:
            pass
        os.remove(os.path.join(STATE, "http.pid"))
    write("state", "exited")
    print("vllm-acceptance")
elif cmd == "rm":
    pid = read("http.pid")
    if pid:
        try:
            os.kill(int(pid), 15)
        except OSError:
            pass
    for name in ("state", "http.pid", "args.json"):
        try:
            os.remove(os.path.join(STATE, name))
        except OSError:
            pass
else:
    sys.stderr.write("fake docker: unsupported " + " ".join(argv) + "\n")
    sys.exit(2)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    factory = cluster_factory(tmp_path_factory)
    make = next(factory)
    base = tmp_path_factory.mktemp("mn")
    state = base / "state"
    bin_dir = base / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.replace("@STATE@", repr(str(state))))
    docker.chmod(0o755)
    try:
        hosts = make([HostSpec("gb300-a01", bin_dir), HostSpec("gb300-a02", bin_dir),
                      HostSpec("gb300-a03", bin_dir)], name="mn")
        yield hosts, state, base
    finally:
        with contextlib.suppress(StopIteration):
            next(factory)                     # tears the hosts down


def _inventory(cluster_obj, path: Path, workers: list[str], extra: dict | None = None) -> Path:
    data = cluster_obj.inventory_data(group="gpu_nodes")
    children = data["all"]["children"]
    children["vllm_head"] = {"hosts": {"gb300-a01": None}}
    children["vllm_workers"] = {"hosts": dict.fromkeys(workers)}
    data["all"]["hosts"] = {"localhost": {"ansible_connection": "local",
                                          "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}
    data["all"]["vars"] = {"acceptance_profile": K3_8GPU, "acceptance_owner": "test-owner",
                           "acceptance_reviewer": "sre", "vllm_image_digest": DIGEST, "vllm_serve_mode": "launch",
                           **(extra or {})}
    path.write_text(json.dumps(data))
    return path


def _run(cluster_obj, tmp: Path, modes: dict[str, str], workers: list[str], extra: dict | None = None,
         extravars: dict | None = None, check: bool = False,
         playbooks: tuple[str, ...] = ("validate.yml", "serve.yml")) -> tuple[subprocess.CompletedProcess[str], Path]:
    _, state, _ = cluster_obj
    hosts = cluster_obj[0]
    for host in hosts.hosts:
        (state / host.name).mkdir(parents=True, exist_ok=True)
        (state / host.name / "mode").write_text(modes.get(host.name, "ok"))
        (state / host.name / "calls.jsonl").unlink(missing_ok=True)
    inventory = _inventory(hosts, tmp / "inventory.json", workers, extra)
    reports = tmp / "reports"
    variables = {"acceptance_reports_dir": str(reports), "acceptance_inventory_name": "mn",
                 "vllm_serve_port": 8058, "vllm_serve_ready_timeout_s": 20, "vllm_serve_multinode_poll_s": 5,
                 **(extravars or {})}
    argv = [ansible_bin(), "-i", str(inventory), "-e", json.dumps(variables), *(["--check"] if check else []),
            *(str(REPO / "playbooks" / name) for name in playbooks)]
    proc = subprocess.run(argv, cwd=REPO, env=ansible_env(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), VLLM_API_KEY=""),
                          capture_output=True, text=True, timeout=600)
    found = (reports / "mn").iterdir() if (reports / "mn").is_dir() else []
    runs = [p for p in found if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]
    return proc, runs[0] if runs else reports


def _calls(state: Path, host: str) -> list[dict]:
    path = state / host / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _runs(state: Path, host: str) -> list[dict]:
    return [c for c in _calls(state, host) if c["argv"][1] == "run"]


def _removed_last(state: Path, host: str) -> bool:
    """The node's last calls are the stop: stop, rm -f, then an inspect that finds no container."""
    tail = [c["argv"][1:3] for c in _calls(state, host)[-3:]]
    return tail == [["stop", "-t"], ["rm", "-f"], ["inspect", "--format"]] and not (state / host / "state").exists()


def _stage(run_dir: Path) -> dict:
    return json.loads((run_dir / "stages" / "serve.json").read_text())


def test_commands_per_node_match_the_golden_and_all_ranks_ready(cluster, tmp_path: Path) -> None:
    started = time.monotonic()
    proc, run_dir = _run(cluster, tmp_path, {}, ["gb300-a02"], extravars={"vllm_parallel": {"pipeline": 2}})
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-5000:]
    golden = json.loads((GOLDEN / "kimi-k3-tp8-pp2-nvl.json").read_text())
    state = cluster[1]
    for host in ("gb300-a01", "gb300-a02"):
        (call,) = _runs(state, host)
        expected = golden[host]
        expected_argv = [a.replace("10.40.1.11", cluster[0].host("gb300-a01").address) for a in expected["argv"]]
        expected_argv = [a.replace("8000", "8058") if a == "8000" else a for a in expected_argv]
        assert call["argv"] == expected_argv, host
        assert call["env"] == expected["env"], host       # values reached docker through its environment
    assert _runs(state, "gb300-a03") == []               # not in vllm_workers: untouched
    stage = _stage(run_dir)
    assert stage["launch_error"] is None and stage["ready_s"] is not None, proc.stdout[-6000:]
    assert "--headless" not in stage["launch_command"] and "--node-rank=0" in stage["launch_command"]
    logs = run_dir.parent / ".lab-server" / "multinode"
    assert {p.name for p in logs.iterdir()} == {"gb300-a01.log", "gb300-a02.log", "all-nodes.log"}
    evidence = run_dir / "evidence" / "serve" / "nodes"
    assert {p.name for p in evidence.iterdir()} == {"gb300-a01.log", "gb300-a02.log"}
    assert "vLLM server version 0.32.0" in (evidence / "gb300-a02.log").read_text()
    print(f"multi-node launch, 2 nodes, ready: {elapsed:.1f} s of ansible-playbook wall time")


@pytest.mark.full
def test_worker_that_exits_stops_the_launch_and_is_named(cluster, tmp_path: Path) -> None:
    proc, run_dir = _run(cluster, tmp_path, {"gb300-a03": "exit"}, ["gb300-a02", "gb300-a03"],
                         extravars={"vllm_parallel": {"tensor": 1, "data": 24, "expert": True},
                                    "vllm_interconnect": "rdma", "vllm_serve_ready_timeout_s": 600,
                                    "vllm_serve_multinode_poll_s": 30})
    assert proc.returncode == 0, proc.stdout[-5000:]
    stage = _stage(run_dir)
    assert "gb300-a03" in stage["launch_error"] and "gb300-a02" not in stage["launch_error"]
    state = cluster[1]
    # the dead rank is seen in the first round: one state read per node, not 20 rounds (+ the stop's check)
    for host in ("gb300-a01", "gb300-a02", "gb300-a03"):
        assert sum(c["argv"][1] == "inspect" for c in _calls(state, host)) == 1 + 1, host
    for host in ("gb300-a01", "gb300-a02", "gb300-a03"):
        assert _removed_last(state, host), host                              # no half-started deployment
        assert len(_runs(state, host)) == 1                                  # no retry
    findings = {f["check"]: f for f in json.loads((run_dir / "findings" / "serve.json").read_text())}
    triage = findings["compat.launch_triage"]
    assert triage["observed"]["class"] == "interconnect"           # the dead worker's log, read from its section
    assert triage["observed"]["rule"] == "interconnect.rendezvous"
    log = (run_dir / triage["evidence"][0]).read_text()
    assert "# node gb300-a03 (node rank 2, worker) - FAILED" in log


@pytest.mark.full
def test_head_refused_by_runtime_starts_no_worker(cluster, tmp_path: Path) -> None:
    proc, run_dir = _run(cluster, tmp_path, {"gb300-a01": "refuse"}, ["gb300-a02"],
                         extravars={"vllm_parallel": {"pipeline": 2}})
    assert proc.returncode == 0, proc.stdout[-5000:]
    stage = _stage(run_dir)
    assert stage["launch_error"].startswith("node(s) gb300-a01 did not start")
    assert "unsatisfied condition: cuda>=13.0" in stage["launch_error"]
    assert _runs(cluster[1], "gb300-a02") == []
    findings = {f["check"]: f for f in json.loads((run_dir / "findings" / "serve.json").read_text())}
    assert findings["compat.launch_triage"]["observed"]["class"] == "environment"


@pytest.mark.full
def test_readiness_wait_is_bounded(cluster, tmp_path: Path) -> None:
    started = time.monotonic()
    proc, run_dir = _run(cluster, tmp_path, {"gb300-a01": "hang"}, ["gb300-a02"],
                         extravars={"vllm_parallel": {"pipeline": 2}, "vllm_serve_ready_timeout_s": 10})
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert _stage(run_dir)["launch_error"].startswith("not ready within 10 s")
    # ceil(10 / 5) = 2 rounds, each one state read per node, then the launch is given up (no retry)
    for host in ("gb300-a01", "gb300-a02"):
        assert sum(c["argv"][1] == "inspect" for c in _calls(cluster[1], host)) == 2 + 1, host   # + the stop's check
        assert _removed_last(cluster[1], host), host
    print(f"bounded wait: 10 s timeout, {elapsed:.1f} s of ansible-playbook wall time on this machine")


def test_impossible_layout_is_refused_before_any_node_is_touched(cluster, tmp_path: Path) -> None:
    proc, _ = _run(cluster, tmp_path, {}, ["gb300-a02"])           # TP 8 alone cannot fill 2 nodes
    assert proc.returncode != 0
    assert "must fill each node" in proc.stdout
    for host in ("gb300-a01", "gb300-a02"):
        assert _runs(cluster[1], host) == []


def test_check_mode_shows_the_plan_and_starts_nothing(cluster, tmp_path: Path) -> None:
    proc, _ = _run(cluster, tmp_path, {}, ["gb300-a02"], extravars={"vllm_parallel": {"pipeline": 2}}, check=True)
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "replica layout over 2 nodes: gb300-a01=head, gb300-a02=worker" in proc.stdout
    for host in ("gb300-a01", "gb300-a02"):
        assert _runs(cluster[1], host) == []


def test_every_node_is_stopped_at_the_end_of_the_run(cluster, tmp_path: Path) -> None:
    """The report stage stops what the run launched on every node (head and workers), confirms nothing is left
    (no container, the head's port closed) and the report says so."""
    proc, run_dir = _run(cluster, tmp_path, {}, ["gb300-a02"], extravars={"vllm_parallel": {"pipeline": 2}},
                         playbooks=("validate.yml", "serve.yml", "report.yml"))
    assert proc.returncode == 0, proc.stdout[-5000:]
    state = cluster[1]
    assert _stage(run_dir)["launch_error"] is None
    for host in ("gb300-a01", "gb300-a02"):
        assert _removed_last(state, host), (host, _calls(state, host)[-3:])
        assert not (state / host / "http.pid").exists()
    assert _calls(state, "gb300-a03") == []                                   # not part of the deployment
    record = json.loads((run_dir / "stages" / "teardown.json").read_text())
    assert record["action"] == "stopped" and record["nodes"] == ["gb300-a01", "gb300-a02"]
    assert record["gone"] is True and record["port_closed"] is True and record["left_on"] == []
    server = json.loads((run_dir / "report.json").read_text())["server"]
    assert server["state"] == "stopped" and "on gb300-a01, gb300-a02 is gone" in server["text"]
