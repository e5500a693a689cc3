"""Testinfra verifier of the gpu_memory_sampler scenario: the sampler runs on the node, then its samples are back.

The first pass (after converge and idempotence) runs while the sampler runs; the second (after side_effect.yml, which
writes MOLECULE_EPHEMERAL_DIRECTORY/phase) after the role stopped it. Each test belongs to one pass and is skipped in
the other. `host` is a live ssh connection to the node.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vllm_acceptance.parsers.gpu_memory import parse_memory_file

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
RUN_DIR = EPHEMERAL / "reports" / "run-molecule-sampler"
STOPPED = (EPHEMERAL / "phase").is_file()
running = pytest.mark.skipif(STOPPED, reason="first pass only: the sampler is stopped now")
stopped = pytest.mark.skipif(not STOPPED, reason="second pass only: the sampler still runs")
QUERY = "--query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits"


def _name(host) -> str:
    return host.backend.get_hostname()


def _base(host) -> str:
    """The role's per-run files on the node (roles/gpu_memory_sampler/vars/main.yml)."""
    return f"/tmp/vllm-acceptance-gpu-memory-{RUN_DIR.name}-{_name(host)}"


def _gpus_now(host) -> dict[str, int]:
    """What the node's nvidia-smi streams now, by GPU index (one second of the same query)."""
    out = host.run(f"timeout 1 nvidia-smi {QUERY} -lms 200").stdout
    return {cells[1]: int(cells[2]) for cells in (line.split(", ") for line in out.splitlines()) if len(cells) == 3}


@running
def test_the_sampler_runs_on_the_node(host) -> None:
    started = json.loads((EPHEMERAL / f"start-{_name(host)}.json").read_text())
    assert started["running"] is True and started["error"] == ""
    pid = host.file(f"{_base(host)}.pid").content_string.strip()
    assert started["started"].strip() == f"started pid {pid}"
    cmdline = host.file(f"/proc/{pid}/cmdline").content.decode().split("\0")
    assert "nvidia-smi" in Path(cmdline[0]).name or any("gpu_memory_standin" in a for a in cmdline), cmdline
    assert "-lms" in cmdline and "--query-gpu=timestamp,index,memory.used" in cmdline


@running
def test_the_nodes_csv_grows_with_every_gpus_memory(host) -> None:
    lines = host.file(f"{_base(host)}.csv").content_string.splitlines()
    sampled = {cells[1]: int(cells[2]) for cells in (line.split(", ") for line in lines)}
    assert sampled and sampled == _gpus_now(host)
    assert len(lines) >= 2 * len(sampled)   # more than one round already


@running
def test_no_container_series_where_no_server_listens(host) -> None:
    started = json.loads((EPHEMERAL / f"start-{_name(host)}.json").read_text())
    assert started["cgroup"].startswith("not sampled: no process with a visible pid listens on port 8000")
    assert not host.file(f"{_base(host)}-cgroup.pid").exists


@stopped
def test_the_samples_came_back_parsed_per_gpu(host) -> None:
    stop = json.loads((EPHEMERAL / f"stop-{_name(host)}.json").read_text())
    csv = RUN_DIR / "evidence" / "memory" / f"{_name(host)}.csv"
    assert stop == {"state": "stopped", "csv": str(csv)}
    rows = parse_memory_file(csv)
    series = {r["series"] for r in rows}
    now = _gpus_now(host)
    assert series == {f"gpu{i}@{_name(host)}" for i in now}
    assert all(r["bytes"] == now[r["series"][3:].split("@")[0]] * 2**20 for r in rows)
    assert all(sum(r["series"] == s for r in rows) >= 2 for s in series)
    assert not (RUN_DIR / "evidence" / "memory" / "cgroup" / f"{_name(host)}.csv").exists()


@stopped
def test_nothing_is_left_on_the_node(host) -> None:
    assert not [f for f in (".csv", ".err", ".pid", "-cgroup.csv", "-cgroup.pid") if host.file(_base(host) + f).exists]
    # the process the start left running (its "started pid N") is gone, or is another program now
    started = json.loads((EPHEMERAL / f"start-{_name(host)}.json").read_text())
    pid = started["started"].split("started pid ")[1].split()[0]
    cmdline = host.file(f"/proc/{pid}/cmdline")
    assert not cmdline.exists or "-lms" not in cmdline.content.decode().split("\0")
