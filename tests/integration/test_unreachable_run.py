"""Issue 30 (1, 2): `vllm-acceptance run` on nodes that are down, and on inputs refused before any node.

Real ansible-playbook runs through the CLI (ansible-runner), no lab server. Nodes that are down are addresses of
127.0.0.0/8 with no sshd on their port (127.0.0.77:2, 127.0.0.78:2: ssh gets "Connection refused" at once). Where a
run must touch no node, the nodes' address is a TCP listener on 127.0.0.79 that counts the connections it accepts:
it must count none (and counts a plain connect afterwards, so the count is real).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.examples import fill_placeholders

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "vllm-acceptance"
DOWN = {"gb300-a01": ("127.0.0.77", 2), "gb300-a02": ("127.0.0.78", 2)}


def _inventory(root: Path, hosts: dict[str, tuple[str, int]], *, gpu_nodes: bool = True) -> Path:
    """The example GB300 inventory (two nodes, head and worker) with these addresses."""
    shutil.copytree(REPO / "inventories" / "example-gb300" / "group_vars", root / "group_vars")
    fill_placeholders(root / "group_vars" / "all.yml")
    address = {name: {"ansible_host": host, "ansible_port": port} for name, (host, port) in hosts.items()}
    head, worker = sorted(hosts)
    children: dict[str, Any] = {"vllm_head": {"hosts": {head: address[head]}},
                                "vllm_workers": {"hosts": {worker: address[worker]}},
                                "loadgen": {"hosts": {"localhost": None}}}
    if gpu_nodes:
        children["gpu_nodes"] = {"hosts": address}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "children": children, "vars": {"ansible_user": "acceptance"},
        "hosts": {"localhost": {"ansible_connection": "local",
                                "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}}}))
    return root


def _run(inventory: Path, reports: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([str(CLI), "run", "-i", str(inventory), "--reports-dir", str(reports)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "VLLM_API_KEY": ""})
    return proc, time.monotonic() - started


class CountingListener:
    """A TCP port that accepts and counts connections (an SSH client would open one before anything else)."""

    def __init__(self, host: str = "127.0.0.79") -> None:
        self.sock = socket.create_server((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def connect_once(self) -> int:
        """A plain connection, then the count once the listener has taken it."""
        before = self.accepted
        socket.create_connection((self.host, self.port), timeout=5).close()
        for _ in range(500):
            if self.accepted > before:
                break
            time.sleep(0.01)
        return self.accepted

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    counting = CountingListener()
    yield counting
    counting.close()


def test_every_node_down_is_an_incomplete_verdict_naming_each_node_and_its_ssh_error(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path / "site", DOWN)
    # Issue 30 asks for under a minute: 18 s measured on a quiet machine. Not asserted (no timing-sensitive tests;
    # 72 s were seen at load 13 on 2 cores): what keeps it short is asserted instead, that nothing waited on a
    # node (each error is an immediate refusal, no timeout) and nothing was launched or probed.
    proc, _ = _run(inventory, tmp_path / "reports")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 40, out[-4000:]
    assert "verdict: incomplete" in proc.stdout and "exit: 40" in proc.stdout
    assert "timed out" not in out.lower() and "waiting for" not in out, out[-4000:]
    run_dir = tmp_path / "reports" / "site" / "latest"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "incomplete" and report["unreachable_hosts"] == sorted(DOWN)
    recorded = json.loads((run_dir / "evidence" / "preflight-unreachable.json").read_text())
    markdown = (run_dir / "report.md").read_text()
    for host, (address, port) in DOWN.items():
        error = report["unreachable_errors"][host]
        assert f"connect to host {address} port {port}: Connection refused" in error, error
        assert recorded[host] == error and "censored" not in error
        assert f"- {host} unreachable ({error}): none of its preflight checks ran" in markdown
        assert not (run_dir / "evidence" / "preflight" / host).exists()
    # Nothing was launched on half a cluster: the serve stage is named missing, never judged from nothing.
    statuses = {f["check"]: f["status"] for f in report["findings"] if f["host"] is None}
    assert statuses["compat.serve"] == "missing"


def test_a_gpu_profile_without_gpu_nodes_is_refused_before_any_connection(tmp_path: Path,
                                                                          listener: CountingListener) -> None:
    nodes = {name: (listener.host, listener.port) for name in DOWN}
    inventory = _inventory(tmp_path / "site", nodes, gpu_nodes=False)
    proc, _ = _run(inventory, tmp_path / "reports")
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-4000:]
    assert "group `gpu_nodes` is missing or empty, but profile" in proc.stdout
    assert "runs on nvidia GPUs (hardware.accelerator)" in proc.stdout
    assert not (tmp_path / "reports" / "site").exists()                # no run was opened
    assert listener.accepted == 0
    assert listener.connect_once() == 1                                # the count is real


def test_a_yaml_error_is_refused_with_file_line_and_column_before_any_connection(tmp_path: Path,
                                                                                listener: CountingListener) -> None:
    inventory = _inventory(tmp_path / "site", {name: (listener.host, listener.port) for name in DOWN})
    group_vars = inventory / "group_vars" / "all.yml"
    group_vars.write_text("acceptance_profile: kimi-k3\nacceptance_owner: [ml-platform-oncall\n"
                          "acceptance_reviewer: sre-lead\n")          # the list is never closed: the : of line 3
    proc, _ = _run(inventory, tmp_path / "reports")
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-4000:]
    where = f"inventory {group_vars}, line 3, column 20: YAML error: while parsing a flow sequence: expected ','"
    assert where in proc.stderr, proc.stderr
    assert listener.accepted == 0
    assert listener.connect_once() == 1


def test_a_launch_is_not_started_when_a_worker_of_it_could_not_be_reached(tmp_path: Path) -> None:
    """playbooks/serve.yml alone: the head answers (the controller itself), its worker was unreachable at preflight
    (as the preflight judge shares it): the head is left out of the serve play, so nothing is launched on half a
    cluster (the serve stage is then missing, and the unreachable worker makes the verdict incomplete)."""
    inventory = _inventory(tmp_path / "site", {"gb300-a01": ("127.0.0.1", 22), "gb300-a02": DOWN["gb300-a02"]})
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["vllm_head"]["hosts"]["gb300-a01"] = {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    del hosts["all"]["children"]["gpu_nodes"]                          # the sampler play is not under test
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    extra = json.dumps({"acceptance_unreachable_hosts": ["gb300-a02"], "acceptance_run_dir": str(tmp_path / "run")})
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                           "playbooks/serve.yml", "-e", extra], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                               "ANSIBLE_STDOUT_CALLBACK": "default"})
    out = " ".join((proc.stdout + proc.stderr).split())               # the yaml callback wraps long messages
    assert proc.returncode == 0, out[-4000:]
    assert "gb300-a01 is left out of this play: node(s) gb300-a02 could not be reached at preflight" in out, out[-3000:]
    assert "vllm_serve :" not in out, out[-3000:]                      # no task of the serve role ran
    assert "gb300-a02" not in out.split("PLAY RECAP")[-1]              # and nothing was tried on the worker


def test_ansible_playbook_stops_on_a_host_file_that_does_not_parse_before_any_connection(
        tmp_path: Path, listener: CountingListener) -> None:
    """Straight ansible-playbook (no CLI pre-check): Ansible only warns about the broken host file (naming its line
    and column) and would go on with no host; the validate play's gate stops there, exit 2."""
    inventory = _inventory(tmp_path / "site", {name: (listener.host, listener.port) for name in DOWN})
    hosts = inventory / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("children:", "children: [", 1))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "accept.yml",
                           "-e", f"acceptance_reports_dir={tmp_path / 'reports'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")})
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out[-4000:]
    # the gate (gate.py) names the file, line and column, as `vllm-acceptance validate` does (issue 43)
    assert f"inventory {hosts}, line " in out and "YAML error" in out, out[-4000:]
    assert not (tmp_path / "reports").exists() and listener.accepted == 0
    assert listener.connect_once() == 1


# --- issue 41 item 9: a vllm_head outside gpu_nodes ------------------------------------------------------------

def _head_outside(root: Path, head: tuple[str, int], gpu: tuple[str, int], mode: str) -> Path:
    """The example GB300 inventory with its head `gb300-head` outside gpu_nodes (one GPU node, `gb300-a02`)."""
    shutil.copytree(REPO / "inventories" / "example-gb300" / "group_vars", root / "group_vars")
    group_vars = fill_placeholders(root / "group_vars" / "all.yml")
    text = group_vars.read_text().replace("vllm_serve_mode: launch", f"vllm_serve_mode: {mode}")
    if mode == "attach":
        text += "vllm_base_url: http://127.0.0.1:9/v1\nvllm_serve_attach_timeout_s: 5\n"
    group_vars.write_text(text)
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "children": {"gpu_nodes": {"hosts": {"gb300-a02": {"ansible_host": gpu[0], "ansible_port": gpu[1]}}},
                     "vllm_head": {"hosts": {"gb300-head": {"ansible_host": head[0], "ansible_port": head[1]}}},
                     "loadgen": {"hosts": {"localhost": None}}},
        "vars": {"ansible_user": "acceptance"},
        "hosts": {"localhost": {"ansible_connection": "local",
                                "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}}}))
    return root


def test_a_launch_on_a_head_outside_gpu_nodes_is_refused_before_any_connection(tmp_path: Path,
                                                                              listener: CountingListener) -> None:
    """Before: validation passed it, the launch went to a node preflight never judged, and a head that was down
    ended the run with no verdict (exit 1). Now: exit 2, the host, the groups and the fix named, nothing touched."""
    node = (listener.host, listener.port)
    inventory = _head_outside(tmp_path / "site", node, node, "launch")
    proc, _ = _run(inventory, tmp_path / "reports")
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-4000:]
    assert "host `gb300-head` is in group `vllm_head` but not in `gpu_nodes` (gpu_nodes: gb300-a02)" in out, out[-3000:]
    assert "add `gb300-head` under all.children.gpu_nodes.hosts" in out
    assert not (tmp_path / "reports" / "site").exists()                # no run was opened
    assert listener.accepted == 0
    assert listener.connect_once() == 1


def test_an_attached_run_whose_head_outside_gpu_nodes_is_down_still_ends_with_a_verdict(tmp_path: Path) -> None:
    """Attach launches nothing, so the head may be a host that is no GPU node; when it is down the run used to stop at
    the serve play (no verdict, exit 1). Its reachability is now recorded at preflight like a GPU node's: the run is
    incomplete, naming the head and its connection error."""
    inventory = _head_outside(tmp_path / "site", DOWN["gb300-a01"], DOWN["gb300-a02"], "attach")
    proc, _ = _run(inventory, tmp_path / "reports")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 40, out[-4000:]
    assert "verdict: incomplete" in proc.stdout
    run_dir = tmp_path / "reports" / "site" / "latest"
    report = json.loads((run_dir / "report.json").read_text())
    assert report["verdict"] == "incomplete" and report["unreachable_hosts"] == ["gb300-a02", "gb300-head"]
    error = report["unreachable_errors"]["gb300-head"]
    assert "connect to host 127.0.0.77 port 2: Connection refused" in error, error
    assert f"- gb300-head unreachable ({error})" in (run_dir / "report.md").read_text()
    statuses = {f["check"]: f["status"] for f in report["findings"] if f["host"] is None}
    assert statuses["compat.serve"] == "missing"                       # nothing judged from nothing
