"""Namespace SSH hosts (lab/nshosts.py) driven by the real ansible-playbook.

The point of these hosts is that each one answers node tools with its own binaries; these
tests prove it end to end (ssh, pipelining, per-host mount namespace), plus clean teardown.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_acceptance.lab import nshosts
from vllm_acceptance.lab.nshosts import HostSpec, NsHostsError

from support.hosts import ansible_bin, ansible_env, hosts_skip_reason

pytestmark = pytest.mark.hosts

PLAYBOOK = """\
- name: Ask every node for nvidia-smi
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Run nvidia-smi
      ansible.builtin.command: nvidia-smi
      register: smi
      changed_when: false
    - name: Read the session variable
      ansible.builtin.command: printenv NODE_CASE
      register: case
      changed_when: false
      failed_when: false
    - name: Bring both answers back to the controller
      ansible.builtin.copy:
        content: "{{ {'smi': smi.stdout, 'case': case.stdout} | to_json }}"
        dest: "{{ out_dir }}/{{ inventory_hostname }}.json"
        mode: "0644"
      delegate_to: localhost
"""


def _fake_bin(root: Path, host: str) -> Path:
    bin_dir = root / host / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho 'NVIDIA-SMI fake for {host}'\n")
    tool.chmod(0o755)
    return bin_dir


def _run_playbook(inventory: Path, playbook: Path, out_dir: Path) -> tuple[dict[str, dict[str, int]], dict]:
    """Run the real ansible-playbook; return (PLAY RECAP per host, answers per host)."""
    out_dir.mkdir(exist_ok=True)
    proc = subprocess.run(
        [ansible_bin(), "-i", str(inventory), str(playbook), "-e", f"out_dir={out_dir}"],
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    recap = {
        m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", proc.stdout, re.M)
    }
    assert recap, proc.stdout + proc.stderr
    answers = {p.stem: json.loads(p.read_text()) for p in out_dir.glob("*.json")}
    return recap, answers


def test_each_host_answers_with_its_own_binary(ns_hosts, tmp_path: Path) -> None:
    names = ["node0", "node1", "node2"]
    cluster = ns_hosts([HostSpec(name, _fake_bin(tmp_path, name), env={"NODE_CASE": f"case-{name}"}) for name in names])
    inventory = cluster.write_inventory(tmp_path / "inventory.yml")
    playbook = tmp_path / "smi.yml"
    playbook.write_text(PLAYBOOK)

    recap, answers = _run_playbook(inventory, playbook, tmp_path / "out")

    assert answers == {name: {"smi": f"NVIDIA-SMI fake for {name}", "case": f"case-{name}"} for name in names}
    assert all(stats["failed"] == 0 and stats["unreachable"] == 0 for stats in recap.values())


def test_unreachable_and_toolless_hosts_are_reported_not_hidden(ns_hosts, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    cluster = ns_hosts(
        [
            HostSpec("good", _fake_bin(tmp_path, "good")),
            HostSpec("empty", empty),
            HostSpec("down", None, reachable=False),
        ]
    )
    inventory = cluster.write_inventory(tmp_path / "inventory.yml")
    playbook = tmp_path / "smi.yml"
    playbook.write_text(PLAYBOOK)

    recap, answers = _run_playbook(inventory, playbook, tmp_path / "out")

    assert recap["good"]["failed"] == 0 and recap["good"]["unreachable"] == 0
    assert answers["good"]["smi"] == "NVIDIA-SMI fake for good"
    # The bind mount hides the controller's /usr/local/bin: no nvidia-smi on 'empty'.
    assert recap["empty"]["failed"] == 1
    assert recap["down"]["unreachable"] == 1
    assert set(answers) == {"good"}


def test_namespaces_have_no_default_route_and_own_addresses(ns_hosts) -> None:
    cluster = ns_hosts([HostSpec("a"), HostSpec("b")])
    addresses = [h.address for h in cluster.hosts]
    assert len(set(addresses)) == 2
    assert all(a.startswith("10.213.") for a in addresses)
    for host in cluster.hosts:
        routes = subprocess.run(
            ["ip", "-n", host.netns, "route", "show"], capture_output=True, text=True, check=True
        ).stdout
        assert "default" not in routes
        assert host.address in routes
    # Plain ssh works too, and the session really runs inside the namespace.
    out = subprocess.run(
        cluster.ssh_command("b", "ip -o -4 addr show dev eth0"), capture_output=True, text=True, check=True
    ).stdout
    assert cluster.host("b").address in out
    # Own hostname per host; the controller user's shell set-up stays out of node sessions.
    out = subprocess.run(
        cluster.ssh_command("a", "hostname; cat ~/.bashrc ~/.profile 2>/dev/null | wc -c"),
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert out == ["a", "0"]


def _leftovers(cluster: nshosts.Cluster) -> list[str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    namespaces = {line.split()[0] for line in netns.splitlines() if line.strip()}
    link_names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    found = [h.netns for h in cluster.hosts if h.netns in namespaces]
    return found + [n for n in [cluster.bridge, *(h.veth for h in cluster.hosts)] if n in link_names]


def test_down_removes_everything_and_is_idempotent(ns_hosts) -> None:
    cluster = ns_hosts([HostSpec("a"), HostSpec("b", reachable=False)])
    pid = cluster.host("a").pid
    assert pid is not None and Path(f"/proc/{pid}").exists()
    assert _leftovers(cluster)
    cluster.down()
    assert _leftovers(cluster) == []
    assert not nshosts._alive(pid)
    cluster.down()  # second call: nothing left, no error
    # The names it freed go to the next cluster (the lowest free /24); a third call of the first cluster's down (the
    # fixture's own at the end of its scope) must not take down the new owner's bridge, namespace and sshd.
    again = ns_hosts([HostSpec("c")])
    assert again.octet == cluster.octet, "the freed /24 was not reused: this test shows nothing"
    cluster.down()
    assert _leftovers(again) and nshosts._alive(again.host("c").pid)


def test_cli_up_then_down_from_another_process(tmp_path: Path) -> None:
    if (reason := hosts_skip_reason()) is not None:
        pytest.skip(reason)
    bin_dir = _fake_bin(tmp_path, "cli")
    workdir = tmp_path / "wd"
    module = [sys.executable, "-m", "vllm_acceptance.lab.nshosts"]
    try:
        up = subprocess.run(
            [
                *module,
                "up",
                "--workdir",
                str(workdir),
                "--count",
                "2",
                "--bin-dir",
                str(bin_dir),
                "--name-prefix",
                "gpu",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        summary = json.loads(up.stdout)
        assert [h["name"] for h in summary["hosts"]] == ["gpu0", "gpu1"]
        assert Path(summary["inventory"]).is_file()
        cluster = nshosts.load(workdir)
        out = subprocess.run(
            cluster.ssh_command("gpu1", "nvidia-smi"), capture_output=True, text=True, check=True, timeout=30
        ).stdout
        assert out.strip() == "NVIDIA-SMI fake for cli"
    finally:
        subprocess.run([*module, "down", "--workdir", str(workdir)], check=True, timeout=60)
    assert _leftovers(cluster) == []
    assert not (workdir / nshosts.STATE_FILE).exists()


def test_inventory_is_valid_ansible_yaml(ns_hosts, tmp_path: Path) -> None:
    cluster = ns_hosts([HostSpec("n0"), HostSpec("n1")])
    inventory = cluster.write_inventory(
        tmp_path / "inv.yml",
        group="nodes",
        extra_vars={"acceptance_profile_path": "profiles/kimi-k3.yml"},
        host_vars={"n1": {"node_rank": 1}},
    )
    proc = subprocess.run(
        [ansible_bin("ansible-inventory"), "-i", str(inventory), "--list"],
        capture_output=True,
        text=True,
        check=True,
        env=ansible_env(),
    )
    data = json.loads(proc.stdout)
    assert sorted(data["nodes"]["hosts"]) == ["n0", "n1"]
    n1 = data["_meta"]["hostvars"]["n1"]
    assert n1["ansible_host"] == cluster.host("n1").address
    assert n1["ansible_user"] == "root"
    assert n1["node_rank"] == 1
    assert n1["acceptance_profile_path"] == "profiles/kimi-k3.yml"
    assert n1["ansible_python_interpreter"] == "/usr/bin/python3"
    assert "StrictHostKeyChecking=no" in n1["ansible_ssh_common_args"]


def test_environment_errors_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nshosts.os, "geteuid", lambda: 1000)
    with pytest.raises(NsHostsError, match="root"):
        nshosts.check_environment()
    monkeypatch.setattr(nshosts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(nshosts.shutil, "which", lambda tool, **_: None)
    monkeypatch.setattr(nshosts.os, "access", lambda path, mode: False)
    with pytest.raises(NsHostsError, match=r"apt-get install -y iproute2.*apt-get install -y openssh-server"):
        nshosts.check_environment()


def test_specs_are_validated_before_anything_is_created(tmp_path: Path) -> None:
    with pytest.raises(NsHostsError, match="unique"):
        nshosts._validate([HostSpec("a"), HostSpec("a")])
    with pytest.raises(NsHostsError, match="not a directory"):
        nshosts._validate([HostSpec("a", tmp_path / "nope")])
    with pytest.raises(NsHostsError, match="must match"):
        nshosts._validate([HostSpec("a b")])
