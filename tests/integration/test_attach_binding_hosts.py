"""Attach binding on real SSH hosts (issue 42 item 3): playbooks/preflight.yml on a namespace host where a process
listens on the attached server's port. The role hands the node script its hints, the node names its own addresses
(its network namespace's /proc/net), the controller resolves the URL's host at unpack time: a URL on the node's own
address binds the listener; the same port behind another address (a load balancer) cannot be bound. No vLLM: the
listener is a plain socket; the node's other tools are the recorded fixture binaries of the `good` case."""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance.lab.nshosts import Cluster, HostSpec, up

from support.hosts import REPO, ansible_bin, ansible_env, hosts_skip_reason

pytestmark = pytest.mark.hosts

NODES = REPO / "tests" / "fixtures" / "generated-nodes"
HOST = "node-attach"
PORT = 18543
LOAD_BALANCER = "192.0.2.10"      # RFC 5737 TEST-NET-1: an address no node has
LISTEN = ("import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          f"s.bind(('0.0.0.0', {PORT})); s.listen(); print('up', flush=True); time.sleep(600)\n")


@pytest.fixture(scope="module")
def node() -> Iterator[Cluster]:
    """One namespace host with a process listening on PORT inside its network namespace. Its work directory is
    one another user may traverse (not pytest's 0700 tmp root): the hosts' sshd reads the cluster's public key as
    the connecting user, the non-root one included."""
    reason = hosts_skip_reason()
    if reason is not None:
        pytest.skip(f"namespace hosts unavailable: {reason}")
    workdir = Path(tempfile.mkdtemp(prefix="vac-attach-"))
    workdir.chmod(0o711)
    cluster = up([HostSpec(HOST, NODES / "good" / "bin")], workdir)
    try:
        cluster.ssh_key.with_suffix(".pub").chmod(0o644)
        proc = subprocess.Popen(["ip", "netns", "exec", cluster.host(HOST).netns, sys.executable, "-c", LISTEN],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
            yield cluster
        finally:
            proc.kill()
            proc.wait()
    finally:
        cluster.down()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def non_root_user(node: Cluster) -> Iterator[str]:
    """A non-root login for the namespace hosts, as the README's `ansible_user` (docker group, no become): a
    temporary account made for this test (password `*`: not locked, no password login), removed afterwards. The
    hosts' sshd takes the cluster key for every user."""
    if not (shutil.which("useradd") and shutil.which("userdel")):
        pytest.skip("useradd/userdel not available to make a non-root login")
    name = f"vacattach{node.octet}"
    home = node.workdir / "home"
    made = subprocess.run(["useradd", "--no-user-group", "--home-dir", str(home), "--create-home", "--shell",
                           "/bin/sh", "--password", "*", name], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a non-root login: {made.stderr.strip()}")
    try:
        pwd.getpwnam(name)
        yield name
    finally:
        # --force: the sessions Ansible left (its ssh ControlPersist) end with the hosts' sshd, torn down next
        subprocess.run(["userdel", "--force", name], capture_output=True, check=False)


def preflight(cluster: Cluster, work: Path, url: str, connection: dict[str, Any] | None = None,
              head: dict[str, Any] | None = None) -> dict[str, Any]:
    """The findings of preflight.yml on the host, attached to `url` (`connection`: group vars such as another
    ansible_user; `head`: the host also in vllm_head with these host vars)."""
    variables = {"vllm_serve_mode": "attach", "vllm_base_url": url}
    data = cluster.inventory_data(group="gpu_nodes", extra_vars={**variables, **(connection or {})})
    if head is not None:
        data["all"]["children"]["vllm_head"] = {"hosts": {HOST: head}}
    inventory = work / "inventory.yml"
    inventory.parent.mkdir(parents=True, exist_ok=True)
    inventory.write_text(yaml.safe_dump(data))
    run_dir = work / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"hosts": [HOST], "inventory_vars": variables}))
    proc = subprocess.run(
        [ansible_bin(), "-i", str(inventory), "playbooks/preflight.yml", "-e", f"acceptance_run_dir={run_dir}",
         "-e", f"acceptance_profile_path={REPO / 'tests/fixtures/profiles/kimi-k3-8gpu-node.yml'}"],
        cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=900, check=False)
    findings_path = run_dir / "findings" / "preflight.json"
    assert findings_path.exists(), f"rc={proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    data = json.loads(findings_path.read_text())
    findings = {(f["check"], f.get("host")): f for f in (data["findings"] if isinstance(data, dict) else data)}
    answer = run_dir / "evidence" / "preflight" / HOST / "live_process.txt"
    assert answer.is_file(), f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    live = json.loads(answer.read_text())
    resolved = json.loads((run_dir / "evidence" / "preflight-url.json").read_text())
    return {"finding": findings[("compat.server_location", None)], "findings": findings, "live": live,
            "resolved": resolved}


def test_the_url_on_the_nodes_own_address_binds_and_a_load_balancer_cannot(node: Cluster, tmp_path: Path) -> None:
    address = node.host(HOST).address
    own = preflight(node, tmp_path / "own", f"http://{address}:{PORT}/v1")
    assert address in own["live"]["addresses"] and own["live"]["pid"]      # root sees the pid
    assert own["resolved"]["addresses"] == [address]
    assert own["finding"]["status"] == "pass", own["finding"]["reason"]
    balanced = preflight(node, tmp_path / "lb", f"http://{LOAD_BALANCER}:{PORT}/v1")
    assert balanced["finding"]["status"] == "inconclusive"
    assert "no judged node's address" in balanced["finding"]["reason"]
    assert "load balancer" in balanced["finding"]["action"]


def test_a_non_root_ssh_user_sees_the_listener_not_the_process(node: Cluster, non_root_user: str,
                                                               tmp_path: Path) -> None:
    """The README's non-root setup for real: Ansible connects as a non-root user, the server's process is root's.
    `ss` there shows the listener without its pid: the binding is inconclusive (before issue 42: a pass, "pid not
    visible"), and the image judged is not taken for the one that serves. Named on vllm_head by its pid, the
    process is read (/proc/PID/cmdline is world-readable) and bound."""
    user = non_root_user
    address = node.host(HOST).address
    url = f"http://{address}:{PORT}/v1"
    hidden = preflight(node, tmp_path / "hidden", url, {"ansible_user": user})
    assert hidden["live"]["pid"] is None and hidden["live"]["listeners"]
    assert hidden["finding"]["status"] == "inconclusive", hidden["finding"]["reason"]
    assert "not visible to this user" in hidden["finding"]["reason"]
    assert "vllm_serve_attach_container" in hidden["finding"]["action"]
    image = hidden["findings"][("compat.image_identity", HOST)]
    assert image["status"] == "inconclusive" and "not visible to this user" in image["reason"]
    listener = subprocess.run(["ip", "netns", "exec", node.host(HOST).netns, "ss", "-ltnpH"], capture_output=True,
                              text=True, check=True).stdout
    pid = int(next(line for line in listener.splitlines() if f":{PORT} " in line).split("pid=")[1].split(",")[0])
    named = preflight(node, tmp_path / "named", url, {"ansible_user": user}, head={"vllm_serve_pid": pid})
    assert named["live"]["pid"] == pid and named["live"]["pid_from"] == f"vllm_serve_pid {pid}"
    assert named["finding"]["status"] == "pass", named["finding"]["reason"]
