"""Preflight fan-out: how long does the preflight playbook take on N namespace hosts?

Starts N real sshd hosts (lab/nshosts.py, root needed) that all serve the `good` node fixture
(tests/fixtures/nodes/good/bin), runs playbooks/preflight.yml once per `forks` setting with
pipelining on, and prints wall time and per-host overhead. Goal: <= 60 s for 64 hosts on the
2-core lab machine.

When the repo has no playbooks/preflight.yml (or no good fixture) yet, a stand-in playbook
running the same kind of stock commands (nvidia-smi queries, docker inspect, lsmod, systemctl,
raw output brought back to the controller) is used, and the output says so.

    sudo .venv/bin/python benchmarks/preflight_fanout.py --hosts 64 --forks 16 32 64
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from vllm_acceptance.lab.nshosts import HostSpec, up  # noqa: E402

STANDIN_PLAYBOOK = """\
- name: Stand-in preflight (stock commands, raw output to the controller)
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: Collect node tool outputs
      ansible.builtin.command: "{{ item }}"
      loop:
        - nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
        - nvidia-smi -q
        - nvidia-smi topo -m
        - docker inspect vllm
        - lsmod
        - systemctl is-active nvidia-fabricmanager
      register: outputs
      changed_when: false
      failed_when: false
    - name: Save raw outputs on the controller
      ansible.builtin.copy:
        content: "{{ outputs.results | map(attribute='stdout') | list | to_json }}"
        dest: "{{ acceptance_run_dir }}/evidence/{{ inventory_hostname }}.json"
        mode: "0644"
      delegate_to: localhost
"""

STANDIN_TOOLS = {
    "nvidia-smi": 'case "$1" in --query-gpu*) for i in 0 1 2 3 4 5 6 7; do '
    'echo "$i, NVIDIA GB300, 580.95.05, 284208 MiB"; done;; *) echo "Driver Version: 580.95.05";; esac',
    "docker": 'echo \'[{"Config": {"Env": ["CUDA_VERSION=13.0.1"]}}]\'',
    "lsmod": 'echo "nvidia_peermem 16384 0"',
    "systemctl": "echo active",
}


def _good_bin(tmp: Path) -> tuple[Path, bool]:
    fixture = REPO / "tests" / "fixtures" / "nodes" / "good" / "bin"
    if fixture.is_dir():
        return fixture, True
    bin_dir = tmp / "good-bin"
    bin_dir.mkdir()
    for tool, body in STANDIN_TOOLS.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    return bin_dir, False


def _env(forks: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(
        {
            "ANSIBLE_PIPELINING": "1",
            "ANSIBLE_FORKS": str(forks),
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_LIBRARY": str(REPO / "plugins" / "modules"),
            "ANSIBLE_FILTER_PLUGINS": str(REPO / "plugins" / "filter"),
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_NOCOLOR": "1",
        }
    )
    return env


def _run(playbook: Path, inventory: Path, run_dir: Path, forks: int, extra: list[str]) -> tuple[float, str]:
    (run_dir / "evidence").mkdir(parents=True, exist_ok=True)
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i", str(inventory), str(playbook),
        "-e", f"acceptance_run_dir={run_dir}",
        *extra,
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(argv, env=_env(forks), cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    recap = re.findall(r"^\S+\s+:\s+ok=(\d+).*unreachable=(\d+)\s+failed=(\d+)", proc.stdout, re.M)
    bad = sum(1 for _, unreachable, failed in recap if int(unreachable) or int(failed))
    return wall, f"rc={proc.returncode} hosts_in_recap={len(recap)} hosts_unreachable_or_failed={bad}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--forks", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--playbook", type=Path, default=REPO / "playbooks" / "preflight.yml")
    parser.add_argument("--profile", default="profiles/kimi-k3.yml")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (evidence) for inspection")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="preflight-fanout-"))
    bin_dir, real_fixture = _good_bin(tmp)
    playbook, extra = args.playbook, ["-e", f"acceptance_profile_path={args.profile}"]
    if not playbook.exists():
        playbook = tmp / "standin-preflight.yml"
        playbook.write_text(STANDIN_PLAYBOOK)
    started = time.monotonic()
    cluster = up([HostSpec(f"node{i:02d}", bin_dir) for i in range(args.hosts)], tmp / "hosts")
    up_s = time.monotonic() - started
    try:
        inventory = cluster.write_inventory(tmp / "inventory.yml")
        which = playbook.relative_to(REPO) if playbook.is_relative_to(REPO) else "stand-in"
        node_bin = "tests/fixtures/nodes/good/bin" if real_fixture else "stand-in fakes"
        print(f"playbook: {which}; node bin: {node_bin}")
        print(f"hosts up: {args.hosts} in {up_s:.2f} s; cpus: {os.cpu_count()}")
        results = []
        for forks in args.forks:
            wall, summary = _run(playbook, inventory, tmp / f"run-forks{forks}", forks, extra)
            results.append(
                {"forks": forks, "wall_s": round(wall, 2), "per_host_ms": round(wall / args.hosts * 1000)}
            )
            print(
                f"forks={forks:3d}  wall={wall:6.2f} s  "
                f"per host={wall / args.hosts * 1000:6.0f} ms  {summary}"
            )
        print(json.dumps({"hosts": args.hosts, "up_s": round(up_s, 2), "results": results}))
    finally:
        started = time.monotonic()
        cluster.down()
        print(f"hosts down in {time.monotonic() - started:.2f} s")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
