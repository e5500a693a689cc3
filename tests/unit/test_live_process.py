"""The serving process as it runs (serve/live.py): a real process listening on a port, found with the real
`ss -ltnp`, its argv and environment read from the real /proc, secrets redacted, compared with a plan."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.core.redact import REDACTED
from vllm_acceptance.parsers.node_evidence import EVIDENCE_SUBDIR
from vllm_acceptance.rules.interconnect import expected_comm_settings
from vllm_acceptance.serve.live import (
    LiveError,
    LiveProcess,
    compare_launch,
    listeners_on,
    live_launch,
    parse_ss_listeners,
    read_live_process,
)

SERVE = ("import socket, sys, time\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
         "print(s.getsockname()[1], flush=True)\n"
         "time.sleep(120)\n")


@pytest.fixture
def serving() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A real process listening on a port, started as a server is: argv with flags, an environment with a
    communication variable and two secrets."""
    env = {**os.environ, "NCCL_IB_HCA": "mlx5_0,mlx5_1", "HF_TOKEN": "hf_livesecret123456", "VLLM_API_KEY": "sk-x9"}
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "--all2all-backend", "deepep_low_latency",
                             "--api-key", "sk-livekey-987", "--max-num-seqs", "8"],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


def test_the_process_listening_on_the_port_is_read_as_it_runs_secrets_redacted(serving) -> None:
    proc, port = serving
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = listeners_on(ss, port)
    assert [x.pid for x in found] == [proc.pid] and found[0].process and found[0].address == "127.0.0.1"
    live = read_live_process(proc.pid)
    assert "--all2all-backend" in live.argv and "sk-livekey-987" not in live.argv and REDACTED in live.argv
    assert live.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert live.env["HF_TOKEN"] == REDACTED and live.env["VLLM_API_KEY"] == REDACTED
    assert "hf_livesecret123456" not in repr(live.to_dict())

    same = compare_launch(live, ["--all2all-backend", "deepep_low_latency"], {"NCCL_IB_HCA": "mlx5_0,mlx5_1"})
    assert same["matches"] and same["args_extra"]["--max-num-seqs"] == "8"
    other = compare_launch(live, ["--all2all-backend", "pplx"], {"NCCL_IB_HCA": "mlx5_2", "NCCL_DEBUG": "INFO"})
    assert not other["matches"]
    assert other["args_differ"] == {"--all2all-backend": {"planned": "pplx", "live": "deepep_low_latency"}}
    assert set(other["env_differ"]) == {"NCCL_IB_HCA", "NCCL_DEBUG"}


def test_a_port_nobody_listens_on_and_a_gone_process_are_no_evidence(serving) -> None:
    proc, _ = serving
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    assert listeners_on(ss, free) == []
    assert parse_ss_listeners("State Recv-Q Send-Q Local Address:Port Peer Address:Port Process\n") == []
    proc.kill()
    proc.wait()
    with pytest.raises(LiveError):
        read_live_process(proc.pid)


# --- interconnect.nccl_env judged on the running server ---------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
KIMI = ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml"
EXAMPLE_GB300 = {"vllm_parallel": {"tensor": 8, "pipeline": 2}, "vllm_interconnect": "nvl"}


def start_with_env(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", SERVE, *args], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, **env})
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def judged_with_live(tmp_path: Path, live: dict[str, LiveProcess]) -> dict[tuple[str, str | None], Finding]:
    from vllm_acceptance.preflight.stage import judge

    from nodefixtures import build_evidence

    hosts = ["gb300-a01", "gb300-a02"]
    for host in hosts:
        build_evidence("good", tmp_path, host=host)
    for host, process in live.items():
        (tmp_path / EVIDENCE_SUBDIR / host / "live_process.txt").write_text(json.dumps(process.to_dict()))
    (tmp_path / "run.json").write_text(json.dumps({"hosts": hosts, "inventory_vars": EXAMPLE_GB300}))
    return {(f.check, f.host): f for f in judge(tmp_path, load_profile(KIMI), hosts, today=dt.date(2026, 8, 30))}


def test_nccl_env_is_judged_on_the_running_process_not_the_plan(tmp_path: Path) -> None:
    recipe_args, recipe_env = expected_comm_settings(load_profile(KIMI), "nvl")
    assert recipe_env and recipe_args, "the profile's nvl launch sets communication variables and all2all"
    dropped = sorted(recipe_env)[0]
    right = start_with_env(recipe_args, {k: str(v) for k, v in recipe_env.items()})
    wrong = start_with_env(recipe_args, {k: str(v) for k, v in recipe_env.items() if k != dropped})
    no_a2a = start_with_env([], {k: str(v) for k, v in recipe_env.items()})
    try:
        live = {"gb300-a01": read_live_process(right.pid), "gb300-a02": read_live_process(wrong.pid)}
        other = read_live_process(no_a2a.pid)
    finally:
        for proc in (right, wrong, no_a2a):
            proc.kill()
            proc.wait()
    found = judged_with_live(tmp_path, live)
    ok, bad = found[("interconnect.nccl_env", "gb300-a01")], found[("interconnect.nccl_env", "gb300-a02")]
    assert ok.status == Status.PASS and ok.observed["source"].startswith("the running server (pid")
    assert any(p.endswith("live_process.txt") for p in ok.evidence)
    assert bad.status == Status.FAIL and dropped in bad.reason   # the plan sets it; the process runs without it
    a2a = judged_with_live(tmp_path / "a2a", {"gb300-a02": other})[("interconnect.nccl_env", "gb300-a02")]
    assert a2a.status == Status.FAIL and "--all2all-backend" in a2a.reason   # the running backend is not the recipe's
    planned = judged_with_live(tmp_path / "planned", {})[("interconnect.nccl_env", "gb300-a02")]
    assert planned.status == Status.PASS and planned.observed["source"].startswith("the planned launch")


# --- collected on the node (roles/preflight/files/live_process.py), saved redacted ---------------------------

NODE_SCRIPT = (ROOT / "roles/preflight/files/live_process.py").read_text()


def node_answer(port: int) -> str:
    """What the preflight's node command prints: the real script, stock python3, on this machine."""
    return subprocess.run(["python3", "-c", NODE_SCRIPT, str(port)], capture_output=True, text=True, check=True,
                          timeout=60).stdout


def test_the_node_script_reports_the_listener_and_the_controller_saves_it_redacted(serving, tmp_path: Path) -> None:
    from vllm_acceptance.preflight.stage import StreamRecord, _evidence_stdout

    proc, port = serving
    raw = json.loads(node_answer(port))
    assert raw["pid"] == proc.pid and "--all2all-backend" in raw["argv"]
    assert raw["env"]["HF_TOKEN"] == "<redacted>" and raw["env"]["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    saved = _evidence_stdout(StreamRecord(name="live_process", cmd=["python3"], stdout=json.dumps(raw)), [])
    assert "sk-livekey-987" not in saved and "hf_livesecret123456" not in saved and "sk-x9" not in saved
    args, env, source = live_launch(saved) or ([], {}, "")
    assert "deepep_low_latency" in args and env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert source.startswith(f"the running server (pid {proc.pid}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    nobody = json.loads(node_answer(free))
    assert nobody["pid"] is None and "no process listens" in nobody["reason"]
    assert live_launch(json.dumps(nobody)) is None   # no running server here: the plan is judged, never a pass by it
