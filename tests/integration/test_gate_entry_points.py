"""Issue 43 item 1 and 3: one gate for every entry point, before any SSH connection.

Every bad input of issue 43's "Why" that belongs to the gate is given to the real entry points, `vllm-acceptance
validate -i`, `plan`, `run`, `run --check`, `ansible-playbook accept.yml` and `ansible-playbook --check accept.yml`:
each refuses it (the CLI with exit 2, ansible-playbook non-zero) with the same message (src/vllm_acceptance/gate.py),
and no SSH connection is opened: every node's `ansible_ssh_executable` is a small wrapper that counts its calls (and
fails, as a node that cannot be reached). The healthy copies of the example inventories pass the gate; a
`--check` run of one then reaches the nodes (the wrapper counts them: the count is real). No vLLM, no lab server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DIGEST = "sha256:" + "5" * 64
IFACE = "vllm_serve_multinode_env: {GLOO_SOCKET_IFNAME: enP5p9s0, NCCL_SOCKET_IFNAME: enP5p9s0}\n"


def _counter(root: Path) -> tuple[Path, Path]:
    """An ssh stand-in that records each call and fails as an unreachable node does (exit 255)."""
    count = root / "ssh-calls.txt"
    wrapper = root / "ssh-count"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {count}\necho 'ssh: counted, refused' >&2\nexit 255\n")
    wrapper.chmod(0o755)
    return wrapper, count


def healthy(root: Path, example: str = "example-gb300", nodes: int | None = None) -> Path:
    """A copy of an example inventory with its placeholders filled in (the digest, the trays' interface), the
    nodes' ssh the counting wrapper, vLLM's own checks left to preflight (no vLLM here)."""
    inv = root / "site"
    shutil.copytree(REPO / "inventories" / example, inv)
    wrapper, _ = _counter(root)
    group_vars = inv / "group_vars" / "all.yml"
    text = group_vars.read_text().replace("sha256:" + "0" * 64, DIGEST)
    text += "acceptance_vllm_check_python: none\n" + (IFACE if example == "example-gb300" else "")
    group_vars.write_text(text)
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    hosts["all"]["vars"]["ansible_ssh_executable"] = str(wrapper)
    children = hosts["all"]["children"]
    if nodes:
        prefix = next(iter(children["gpu_nodes"]["hosts"])).rstrip("0123456789")
        names = [f"{prefix}{i:02d}" for i in range(1, nodes + 1)]
        children["gpu_nodes"]["hosts"] = {n: {"ansible_host": f"10.40.9.{i}"} for i, n in enumerate(names, 1)}
        children["vllm_head"]["hosts"] = {names[0]: None}
        children["vllm_workers"] = {"hosts": dict.fromkeys(names[1:])}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def _append(inv: Path, text: str) -> None:
    path = inv / "group_vars" / "all.yml"
    path.write_text(path.read_text() + text)


def _replace(inv: Path, old: str, new: str, name: str = "group_vars/all.yml") -> None:
    path = inv / name
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new, 1))


def _no_gpu_nodes(inv: Path) -> None:
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    nodes = hosts["all"]["children"].pop("gpu_nodes")["hosts"]
    hosts["all"]["children"]["vllm_head"]["hosts"] = {h: v for h, v in nodes.items()
                                                      if h in hosts["all"]["children"]["vllm_head"]["hosts"]}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))


# (id, how the healthy GB300 copy is broken, a line of the refusal, the number of trays)
BAD: list[tuple[str, Callable[[Path], None], str, int | None]] = [
    ("no_gpu_nodes", _no_gpu_nodes, "group `gpu_nodes` is missing or empty", None),
    ("hosts_yaml", lambda inv: _replace(inv, "children:", "children: [", "hosts.yml"), "YAML error", None),
    ("misspelt_prefix", lambda inv: _append(inv, "acceptence_owner: me\n"),
     "unknown variable `acceptence_owner`: did you mean `acceptance_owner`?", None),
    ("typo", lambda inv: _append(inv, "vllm_serve_prot: 8001\n"), "unknown variable `vllm_serve_prot`: did you mean",
     None),
    ("port_eighty", lambda inv: _append(inv, "vllm_serve_port: eighty\n"), "field `vllm_serve_port`", None),
    ("attach_without_url", lambda inv: _replace(inv, "vllm_serve_mode: launch", "vllm_serve_mode: attach"),
     "vllm_base_url is required because vllm_serve_mode is attach", None),
    ("multinode_env_string", lambda inv: _replace(inv, IFACE, "vllm_serve_multinode_env: enP5p9s0\n"),
     "vllm_serve_multinode_env", None),
    ("placeholder_digest", lambda inv: _replace(inv, DIGEST, "sha256:" + "0" * 64),
     "is the example's placeholder sha256:00000000...0", None),
    ("interface_unset", lambda inv: _replace(inv, IFACE, ""),
     "needs GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME", None),
    ("four_trays_half_filled", lambda inv: None, "a replica across nodes must fill each node: 2 of 4 GPUs", 4),
]


def _env() -> dict[str, str]:
    return {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "default",
            "VLLM_API_KEY": ""}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "vllm-acceptance"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=_env())


def _playbook(inv: Path, reports: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "accept.yml", *extra,
                           "-e", f"acceptance_reports_dir={reports}"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=_env())


def _entry_point(run: str, inv: Path, reports: Path) -> subprocess.CompletedProcess[str]:
    """`vllm-acceptance validate|plan|run [--check]` or `ansible-playbook [--check] accept.yml` on `inv`."""
    command, *check = run.split()
    if command == "playbook":
        return _playbook(inv, reports, *check)
    where = ["--reports-dir", str(reports)] if command == "run" else []
    return _cli(command, *check, "-i", str(inv), *where)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _refusal(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    err = proc.stderr.strip().splitlines()
    start = next(i for i, line in enumerate(err) if line.startswith("vllm-acceptance: "))
    return "\n".join(err[start:]).removeprefix("vllm-acceptance: ")


@pytest.mark.parametrize(("name", "breaks", "expected", "trays"), BAD, ids=[b[0] for b in BAD])
def test_every_entry_point_refuses_the_same_input_with_the_same_message_before_any_ssh(
        tmp_path: Path, name: str, breaks: Callable[[Path], None], expected: str, trays: int | None) -> None:
    inv = healthy(tmp_path, nodes=trays)
    breaks(inv)
    count = tmp_path / "ssh-calls.txt"
    reports = tmp_path / "reports"
    # the six entry points are independent processes on the same input: asked at once, judged below
    runs = ["validate", "plan", "run", "run --check", "playbook", "playbook --check"]
    with ThreadPoolExecutor(3) as pool:
        asked = dict(zip(runs, pool.map(lambda run: _entry_point(run, inv, reports), runs), strict=True))
    message = _refusal(asked["validate"])
    assert expected in _flat(message), message
    assert str(inv) in message                                  # the inventory (or its file) is named
    assert _refusal(asked["plan"]) == message
    # `run` gates in accept.yml's validate play (its progress lines say why; a YAML error before Ansible starts)
    for args in ("run", "run --check"):
        proc = asked[args]
        assert proc.returncode == 2, (args, (proc.stdout + proc.stderr)[-3000:])
        assert _flat(message) in _flat(proc.stdout + proc.stderr), (args, (proc.stdout + proc.stderr)[-3000:])
    for extra in ("playbook", "playbook --check"):
        proc = asked[extra]
        out = _flat(proc.stdout + proc.stderr)
        assert proc.returncode != 0, out[-3000:]
        assert _flat(message) in out, (extra, out[-3000:])
        assert "PLAY [Preflight" not in out
    assert not count.exists(), count.read_text()                 # no SSH connection was opened
    assert not reports.exists()                                  # no run was opened


def test_a_group_vars_yaml_error_is_refused_with_its_file_and_line_before_any_ssh(tmp_path: Path) -> None:
    """The CLI names the file, line and column. ansible-playbook stops itself at such a file before any play
    (exit 4, "YAML parsing failed"): the gate cannot run there, but no node is touched either."""
    inv = healthy(tmp_path)
    _append(inv, "acceptance_reviewer: [sre-lead\n")
    message = _refusal(_cli("validate", "-i", str(inv)))
    assert f"inventory {inv / 'group_vars' / 'all.yml'}, line " in message and "YAML error" in message, message
    for args in (["plan", "-i", str(inv)], ["run", "--check", "-i", str(inv)]):
        assert _refusal(_cli(*args)) == message, args
    proc = _playbook(inv, tmp_path / "reports")
    assert proc.returncode != 0 and "YAML" in proc.stdout + proc.stderr
    assert not (tmp_path / "ssh-calls.txt").exists()


@pytest.mark.parametrize(("example", "nodes", "layout"), [
    ("example-gb300", None, ""), ("example-b300", None, ""),
    ("example-gb300", 4, "vllm_parallel: {tensor: 16}\n"),                  # 4 trays, one TP16 replica
    ("example-b300", 2, "vllm_parallel: {tensor: 16}\nvllm_interconnect: rdma\n"),   # 2 x B300, TP16 over RDMA
], ids=["gb300-2-trays", "b300", "gb300-4-trays-tp16", "b300-x2-tp16"])
def test_the_healthy_example_copies_pass_the_gate(tmp_path: Path, example: str, nodes: int | None,
                                                  layout: str) -> None:
    inv = healthy(tmp_path, example, nodes)
    _append(inv, layout)
    proc = _cli("validate", "-i", str(inv))
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = _cli("plan", "-i", str(inv))
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert plan.stdout.startswith(f"plan: inventory {inv}"), plan.stdout[:500]
    assert not (tmp_path / "ssh-calls.txt").exists()


def test_a_check_run_of_a_healthy_copy_passes_the_gate_then_reaches_the_nodes_read_only(tmp_path: Path) -> None:
    """The positive control of the counter: past the gate, preflight reaches every node (the wrapper counts the
    calls, then fails them as unreachable); check mode opens no run directory under reports/."""
    inv = healthy(tmp_path)
    proc = _playbook(inv, tmp_path / "reports", "--check")
    out = proc.stdout + proc.stderr
    assert "Gate the inputs, then open the run directory" in out and "PLAY [Preflight" in out, out[-3000:]
    calls = (tmp_path / "ssh-calls.txt").read_text().splitlines()
    assert {h for h in ("10.40.1.11", "10.40.1.12") if any(h in c for c in calls)} == {"10.40.1.11", "10.40.1.12"}
    assert not (tmp_path / "reports").exists()
