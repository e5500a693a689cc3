"""Attach binding that never passes on what it cannot see (issue 42 item 3): a server whose process this user
cannot see, and a URL whose host is no judged node, leave compat.server_location, compat.image_identity,
interconnect.nccl_env and compat.image_uniform inconclusive, naming how to make it visible or bind it.

The non-root view is real: `ss -ltnpH` run as user nobody beside a root listener (the capture
tests/fixtures/real/ss/no-pid-other-user-18431.txt, and, where the tests run as root, the node script itself run
as nobody with setpriv against a root process)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.parsers.live import environment_unread, hidden_server, local_netns
from vllm_acceptance.parsers.node_evidence import EVIDENCE_SUBDIR
from vllm_acceptance.rules.interconnect import expected_comm_settings

ROOT = Path(__file__).resolve().parents[2]
KIMI = ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml"
NODE_SCRIPT = (ROOT / "roles/preflight/files/live_process.py").read_text()
NON_ROOT_SS = ROOT / "tests/fixtures/real/ss/no-pid-other-user-18431.txt"
DOCKER_INSPECT = ROOT / "tests/fixtures/real/container-inspect/docker4s-jupyterhub-singleuser.json"
MULTINODE = {"vllm_parallel": {"tensor": 8, "pipeline": 2}, "vllm_interconnect": "nvl"}
HOSTS = ["gb300-a01", "gb300-a02"]
PORT = 18431


def script() -> dict[str, object]:
    node: dict[str, object] = {}
    exec(compile(NODE_SCRIPT, "live_process.py", "exec"), node)  # noqa: S102 - the real node script's code
    return node


def non_root_answer(port: int = PORT) -> str:
    """The node script's answer where `ss` printed the real non-root capture (no users:(...)), completed as main()
    completes it with this machine's addresses and namespace."""
    node = script()
    told, _ = node["from_ss"](NON_ROOT_SS.read_text(), 0, "", port)  # type: ignore[operator]
    return json.dumps({**told, "addresses": node["local_addresses"](),  # type: ignore[operator]
                       "netns": node["netns_identity"]()})  # type: ignore[operator]


def nobody_answer(port: int) -> str:
    return json.dumps({"port": port, "pid": None, "reason": f"no process listens on port {port} on this node",
                       "addresses": ["10.99.0.2"], "netns": "another-boot:1"})


def judged(run_dir: Path, answers: dict[str, str], url: str, resolved: dict[str, object] | None = None,
           extra: dict[str, object] | None = None) -> dict[tuple[str, str | None], Finding]:
    """Preflight's findings of an attached run on two trays answering `answers` (the URL's host as this controller
    resolves it, or as `resolved` says)."""
    from vllm_acceptance.preflight.stage import URL_EVIDENCE, judge, save_url_resolution

    from nodefixtures import build_evidence

    for host in HOSTS:
        build_evidence("good", run_dir, host=host)
    for host, answer in answers.items():
        base = run_dir / EVIDENCE_SUBDIR / host
        (base / "live_process.txt").write_text(answer)
        (base / "live_process.json").write_text(json.dumps({"cmd": ["python3"], "rc": 0, "stderr": "",
                                                            "missing": False}))
    (run_dir / "run.json").write_text(json.dumps({"hosts": HOSTS, "inventory_vars": {
        **MULTINODE, "vllm_serve_mode": "attach", "vllm_base_url": url, **(extra or {})}}))
    if resolved is None:
        save_url_resolution(run_dir)
    else:
        (run_dir / URL_EVIDENCE).write_text(json.dumps(resolved))
    return {(f.check, f.host): f for f in judge(run_dir, load_profile(KIMI), HOSTS, today=dt.date(2026, 8, 30))}


def test_the_real_non_root_view_leaves_every_binding_inconclusive(tmp_path: Path) -> None:
    """The README's non-root attach (a docker-group user, no become, the server's container runs as root): ss
    shows the listener without a pid. Before issue 42 this passed server_location ("pid not visible"), passed
    image_identity on the configured image, judged nccl_env on the plan and passed image_uniform."""
    answer = non_root_answer()
    assert json.loads(answer)["pid"] is None and json.loads(answer)["listeners"]
    assert hidden_server(answer) and "no pid" in str(hidden_server(answer))
    found = judged(tmp_path, {"gb300-a01": answer, "gb300-a02": nobody_answer(PORT)},
                   f"http://127.0.0.1:{PORT}/v1")
    location = found[("compat.server_location", None)]
    assert location.status == Status.INCONCLUSIVE and "not visible to this user" in location.reason
    image = found[("compat.image_identity", "gb300-a01")]
    assert image.status == Status.INCONCLUSIVE and "not visible to this user" in image.reason
    nccl = found[("interconnect.nccl_env", "gb300-a01")]
    assert nccl.status == Status.INCONCLUSIVE and "planned launch is not what runs" in nccl.reason
    uniform = found[("compat.image_uniform", None)]
    assert uniform.status == Status.INCONCLUSIVE and "gb300-a01" in uniform.reason
    for finding in (location, image, nccl):      # each names the fix
        assert all(word in finding.action for word in ("become", "vllm_serve_attach_container", "vllm_serve_pid"))
    # the worker, where nothing listens, keeps its judgement (its plan, its configured image)
    assert found[("compat.image_identity", "gb300-a02")].status == Status.PASS


def test_a_visible_server_still_binds(tmp_path: Path) -> None:
    """The same run where ss showed the pid (become): the binding passes, so the inconclusive above is the pid's."""
    node = script()
    seen = NON_ROOT_SS.read_text().rstrip() + ' users:(("vllm",pid=4242,fd=25))\n'
    told, _ = node["from_ss"](seen, 0, "", PORT)  # type: ignore[operator]
    answer = json.dumps({**told, "addresses": node["local_addresses"](), "netns": node["netns_identity"]()})  # type: ignore[operator]
    found = judged(tmp_path, {"gb300-a01": answer, "gb300-a02": nobody_answer(PORT)}, f"http://127.0.0.1:{PORT}/v1")
    assert found[("compat.server_location", None)].status == Status.PASS
    assert "gb300-a01 (pid 4242)" in found[("compat.server_location", None)].reason


# --- the URL's host is resolved and matched to the node judged ------------------------------------------------

def bound_answer(address: str, netns: str = "other:1") -> str:
    return json.dumps({"port": 8000, "pid": 4242, "argv": ["vllm", "serve"], "env": {}, "notes": [],
                       "listeners": ['LISTEN 0 4096 0.0.0.0:8000 0.0.0.0:* users:(("vllm",pid=4242,fd=25))'],
                       "container": None, "container_reason": "a host process", "addresses": [address, "127.0.0.1"],
                       "netns": netns})


def location(tmp_path: Path, url: str, resolved: dict[str, object] | None, netns: str = "other:1") -> Finding:
    found = judged(tmp_path, {"gb300-a01": bound_answer("10.20.0.11", netns), "gb300-a02": json.dumps(
        {"port": 8000, "pid": None, "reason": "no process listens on port 8000 on this node",
         "addresses": ["10.20.0.12"], "netns": "other:2"})}, url, resolved)
    return found[("compat.server_location", None)]


def test_a_load_balancer_in_front_cannot_bind(tmp_path: Path) -> None:
    """Before: any judged node listening on the URL's port passed, whatever machine the URL names."""
    lb = location(tmp_path, "http://vllm-lb.example:8000/v1", {"host": "vllm-lb.example", "addresses": ["10.20.0.5"]})
    assert lb.status == Status.INCONCLUSIVE and "10.20.0.5" in lb.reason and "no judged node's address" in lb.reason
    assert "load balancer" in lb.action and "backends" in lb.action
    head = location(tmp_path / "head", "http://gb300-a01:8000/v1", {"host": "gb300-a01", "addresses": ["10.20.0.11"]})
    assert head.status == Status.PASS and "gb300-a01 (pid 4242)" in head.reason
    # the URL names the other tray, where nothing listens: not bound to a01's listener
    other = location(tmp_path / "other", "http://gb300-a02:8000/v1", {"host": "gb300-a02", "addresses": ["10.20.0.12"]})
    assert other.status == Status.INCONCLUSIVE and "is gb300-a02, where nothing listens on port 8000" in other.reason
    # a name that did not resolve on the controller, or a run that recorded no resolution: never a pass
    unresolved = location(tmp_path / "unresolved", "http://gb300-a01:8000/v1",
                          {"host": "gb300-a01", "addresses": [], "error": "gb300-a01 does not resolve here"})
    assert unresolved.status == Status.INCONCLUSIVE and "does not resolve" in unresolved.reason


def test_loopback_binds_only_the_node_the_controller_is(tmp_path: Path) -> None:
    """127.0.0.1 answers from the controller's own network namespace: the node listening on it is the server only
    where the controller is that node (same boot id and namespace inode)."""
    mine = local_netns()
    assert mine is not None
    resolved = {"host": "localhost", "addresses": ["127.0.0.1"], "controller_netns": mine}
    same = location(tmp_path, "http://localhost:8000/v1", resolved, netns=mine)
    assert same.status == Status.PASS
    elsewhere = location(tmp_path / "elsewhere", "http://localhost:8000/v1", resolved, netns="another-boot:4026531840")
    assert elsewhere.status == Status.INCONCLUSIVE and "no judged node's address" in elsewhere.reason


def test_the_controller_resolves_the_url_host() -> None:
    from vllm_acceptance.preflight.stage import resolve_url_host

    assert resolve_url_host("http://127.0.0.1:8000/v1")["addresses"] == ["127.0.0.1"]
    assert resolve_url_host("http://[::1]:8000/v1")["addresses"] == ["::1"]
    assert resolve_url_host("http://127.0.0.1:8000/v1")["controller_netns"] == local_netns()
    gone = resolve_url_host("http://no-such-host.invalid:8000/v1")    # RFC 2606: .invalid never resolves
    assert gone["addresses"] == [] and "does not resolve" in gone["error"]


def test_the_node_names_its_own_addresses_and_namespace() -> None:
    node = script()
    addresses = node["local_addresses"]()  # type: ignore[operator]
    assert "127.0.0.1" in addresses
    assert node["netns_identity"]() == local_netns()  # type: ignore[operator]


# --- the operator names the pid or the container: what ss hides is read through it ---------------------------

def test_a_named_container_gives_the_pid_ss_hides() -> None:
    """docker inspect of the named container (a real answer: State.Pid 3931) gives the pid; a container the node
    does not know leaves the listener unread, with why."""
    node = script()
    told, _ = node["from_ss"](NON_ROOT_SS.read_text(), 0, "", PORT)  # type: ignore[operator]
    answer = DOCKER_INSPECT.read_text()

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        assert argv[:4] == ["docker", "inspect", "--type", "container"]
        if argv[4] == "vllm":
            return subprocess.CompletedProcess(argv, 0, answer, "")
        return subprocess.CompletedProcess(argv, 1, "", f"Error: No such container: {argv[4]}")

    named = node["named_pid"](told, None, "vllm", lambda cli: cli == "docker", run)  # type: ignore[operator]
    assert named["pid"] == 3931 and "vllm_serve_attach_container vllm" in named["pid_from"]
    unknown = node["named_pid"](told, None, "other", lambda cli: cli == "docker", run)  # type: ignore[operator]
    assert unknown["pid"] is None and "No such container: other" in unknown["reason"]
    given = node["named_pid"](told, "77", None, lambda cli: False, run)  # type: ignore[operator]
    assert given["pid"] == 77 and given["pid_from"] == "vllm_serve_pid 77"


@pytest.fixture
def root_listener() -> Iterator[tuple[subprocess.Popen[str], int]]:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not SYSTEM_PYTHON.is_file():
        pytest.skip("needs root to run a listener another user cannot see, and setpriv to be that user")
    env = {**os.environ, "NCCL_IB_HCA": "mlx5_0"}
    proc = subprocess.Popen([sys.executable, "-c", "import socket, time\ns = socket.socket(); "
                             "s.bind(('0.0.0.0', 0)); s.listen(); print(s.getsockname()[1], flush=True); "
                             "time.sleep(120)", "--all2all-backend", "deepep_low_latency"],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


SYSTEM_PYTHON = Path("/usr/bin/python3")     # the node's stock python3 (a user's pyenv is not nobody's)


def as_nobody(*args: str) -> str:
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(SYSTEM_PYTHON), "-c",
                           NODE_SCRIPT, *args], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_node_script_run_as_another_user(root_listener, tmp_path: Path) -> None:
    """The real thing: the node script as user nobody beside a root server. Without a hint it sees the listener
    and no pid; with the server's pid named it reads the argv (/proc/PID/cmdline is world-readable) but not the
    environment (its owner's only): the location binds, the NCCL settings stay inconclusive."""
    proc, port = root_listener
    hidden = as_nobody(str(port))
    assert json.loads(hidden)["pid"] is None and hidden_server(hidden)
    # only a container named, one this node cannot inspect: no pid, never the container's name taken for one
    boxed = json.loads(as_nobody(str(port), "", "no-such-container"))
    assert boxed["pid"] is None and "the named container no-such-container" in boxed["reason"]
    named = as_nobody(str(port), str(proc.pid))
    data = json.loads(named)
    assert data["pid"] == proc.pid and data["pid_from"] == f"vllm_serve_pid {proc.pid}"
    assert "--all2all-backend" in data["argv"] and data["env"] == {} and environment_unread(named)
    found = judged(tmp_path, {"gb300-a01": named, "gb300-a02": nobody_answer(port)}, f"http://127.0.0.1:{port}/v1")
    assert found[("compat.server_location", None)].status == Status.PASS
    nccl = found[("interconnect.nccl_env", "gb300-a01")]
    assert nccl.status == Status.INCONCLUSIVE and "environment is not readable" in nccl.reason
    recipe_args, _ = expected_comm_settings(load_profile(KIMI), "nvl")
    assert nccl.expected["args"] == recipe_args


def live_command(**variables: object) -> list[str]:
    """The live_process command of roles/preflight/templates/commands.yml.j2 as the role renders it."""
    import jinja2
    import yaml
    from test_imex_channel import _jinja

    env = _jinja(jinja2.FileSystemLoader(str(ROOT / "roles/preflight/templates")))
    env.filters["int"] = int
    env.globals["lookup"] = lambda kind, name: (ROOT / "roles/preflight/files" / name).read_text()
    text = env.get_template("commands.yml.j2").render(
        preflight_container_runtime="docker", preflight_pull_image=False, preflight_gpu_checks=False,
        preflight_nvswitch=False, preflight_mnnvl=False, preflight_multinode=False, preflight_image="img@sha256:x",
        preflight_json_format="{{json .}}", preflight_probe_timeout_s=900, preflight_driver_version_file="/v",
        preflight_nccl_test=False, ansible_play_hosts_all=["t01"], inventory_hostname="t01",
        preflight_profile={"hardware": {"gpus_per_node": 4}}, preflight_inputs={}, preflight_secrets=[],
        ansible_check_mode=False, preflight_runtime_python="python3", **variables)
    found = [c for c in yaml.safe_load(text.split("- name: inputs")[0]) if c["name"] == "live_process"]
    assert len(found) == 1
    return [str(a) for a in found[0]["argv"]]


def test_the_role_hands_the_named_pid_and_container_to_the_node_script() -> None:
    named = live_command(preflight_live_port="8000", preflight_live_pid=4242, preflight_live_container="vllm")
    assert named[:2] == ["python3", "-c"] and named[3:] == ["8000", "4242", "vllm"]
    plain = live_command(preflight_live_port="8000", preflight_live_pid="", preflight_live_container="")
    assert plain[3:] == ["8000", "", ""]
