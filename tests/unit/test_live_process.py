"""The serving process as it runs (parsers/live.py): a real process listening on a port, found with the real
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
from vllm_acceptance.core.redact import NOT_RECORDED, REDACTED
from vllm_acceptance.parsers.live import (
    LiveError,
    LiveProcess,
    compare_launch,
    listeners_on,
    live_launch,
    parse_ss_listeners,
    read_live_process,
)
from vllm_acceptance.parsers.node_evidence import EVIDENCE_SUBDIR
from vllm_acceptance.rules.interconnect import expected_comm_settings

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
    # by allow-list (core/redact.py redact_env): HF_TOKEN is read by no check, VLLM_API_KEY is but is a secret
    assert live.env["HF_TOKEN"] == NOT_RECORDED and live.env["VLLM_API_KEY"] == REDACTED
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


# --- compat.server_location: the attached server runs on a judged GPU node (rules/live_server.py) -----------

SS_CAPTURES = ROOT / "tests/fixtures/real/ss"


def save_answer(run_dir: Path, host: str, answer: str) -> None:
    base = run_dir / EVIDENCE_SUBDIR / host
    base.mkdir(parents=True, exist_ok=True)
    (base / "live_process.txt").write_text(answer)
    (base / "live_process.json").write_text(json.dumps({"cmd": ["python3"], "rc": 0, "stderr": "", "missing": False}))


def located(run_dir: Path, answers: dict[str, str | None], url: str, mode: str = "attach",
            resolved: dict[str, object] | None = None) -> Finding:
    """compat.server_location of a run on two trays, each answering `answers[host]` (None: unreachable). The URL's
    host as this controller resolves it (preflight's unpack), or as `resolved` says."""
    from vllm_acceptance.preflight.stage import URL_EVIDENCE, judge, save_url_resolution

    from nodefixtures import build_evidence

    hosts = list(answers)
    for host, answer in answers.items():
        if answer is not None:
            build_evidence("good", run_dir, host=host)
            save_answer(run_dir, host, answer)
    (run_dir / "run.json").write_text(json.dumps({"hosts": hosts, "inventory_vars": {
        **EXAMPLE_GB300, "vllm_serve_mode": mode, "vllm_base_url": url}}))
    if resolved is None:
        save_url_resolution(run_dir)
    else:
        (run_dir / URL_EVIDENCE).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / URL_EVIDENCE).write_text(json.dumps(resolved))
    found = [f for f in judge(run_dir, load_profile(KIMI), hosts, today=dt.date(2026, 8, 30))
             if f.check == "compat.server_location"]
    assert len(found) == 1
    return found[0]


def captured_answer(capture: Path, port: int) -> str:
    """What the node script answers when `ss -ltnpH` prints this real capture, as far as ss tells it (its own
    code; the /proc of a pid from another machine is not read here)."""
    node: dict[str, object] = {}
    exec(compile(NODE_SCRIPT, "live_process.py", "exec"), node)  # noqa: S102 - the real node script's code
    told, _ = node["from_ss"](capture.read_text(), 0, "", port)  # type: ignore[operator]
    # as main() completes it: this machine's own addresses and network namespace (the trays are this machine)
    return json.dumps({**told, "addresses": node["local_addresses"](), "netns": node["netns_identity"]()})  # type: ignore[operator]


def own_address() -> str:
    """A non-loopback address of this machine (what a tray's name resolves to in these tests)."""
    node: dict[str, object] = {}
    exec(compile(NODE_SCRIPT, "live_process.py", "exec"), node)  # noqa: S102 - the real node script's code
    return next(a for a in node["local_addresses"]() if not a.startswith(("127.", "::1", "fe80")))  # type: ignore[operator]


def test_the_real_listener_on_a_judged_node_locates_the_server(serving, tmp_path: Path) -> None:
    proc, port = serving
    # one machine plays both trays: a01 answers as the script does where nobody listens on the port
    here = located(tmp_path, {"gb300-a01": node_answer_nobody(port), "gb300-a02": node_answer(port)},
                   f"http://127.0.0.1:{port}/v1")
    assert here.status == Status.PASS and f"gb300-a02 (pid {proc.pid})" in here.reason
    assert here.observed["nodes"] == {"gb300-a01": "absent", "gb300-a02": "here"}
    assert here.observed["serving"][0]["host"] == "gb300-a02" and here.observed["serving"][0]["pid"] == proc.pid
    assert any(p.endswith("gb300-a02/live_process.txt") for p in here.evidence)
    # the process binds 127.0.0.1: a URL on the node's name cannot reach it, so it is not where that URL is served
    named = located(tmp_path / "named", {"gb300-a01": node_answer_nobody(port), "gb300-a02": node_answer(port)},
                    f"http://gb300-a02:{port}/v1")
    assert named.status == Status.INCONCLUSIVE and "bound to loopback only here (127.0.0.1)" in named.reason


def test_a_server_on_no_judged_node_is_never_a_pass(serving, tmp_path: Path) -> None:
    from vllm_acceptance.verdict import decide

    _, port = serving
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    # the server listens on `port`, but the URL names `free`: on neither tray does anything listen there
    elsewhere = located(tmp_path, {"gb300-a01": node_answer(free), "gb300-a02": node_answer(free)},
                        f"http://10.0.0.99:{free}/v1")
    assert elsewhere.status == Status.INCONCLUSIVE and "no GPU node judged" in elsewhere.reason
    assert "gb300-a01" in elsewhere.reason and "gpu_nodes" in elsewhere.action
    assert decide([elsewhere]).verdict == "incomplete"
    # one tray did not answer: the server may run there, so evidence is missing, never a pass
    gone = located(tmp_path / "gone", {"gb300-a01": node_answer(free), "gb300-a02": None}, f"http://h:{free}/v1")
    assert gone.status == Status.MISSING and "gb300-a02" in gone.reason
    # ss failed on the node: not "nobody listens"
    failed = located(tmp_path / "failed", {"gb300-a01": json.dumps(
        {"port": free, "pid": None, "reason": "ss -ltnpH failed: [Errno 2] No such file or directory: 'ss'"}),
        "gb300-a02": node_answer(free)}, f"http://h:{free}/v1")
    assert failed.status == Status.MISSING and "ss -ltnpH failed" in failed.reason


@pytest.mark.parametrize(("capture", "pid", "process", "address"), [
    ("vllm-serve-8001.txt", 3285, "vllm", "127.0.0.1"),
    ("python3-holder-8001.txt", 421841, "python3", "0.0.0.0"),
    ("no-pid-netlink-denied-8001.txt", None, None, "127.0.0.1"),   # another user's process: the listener, no pid
])
def test_recorded_ss_captures_locate_the_server_by_port(tmp_path: Path, capture: str, pid: int | None,
                                                        process: str | None, address: str) -> None:
    answer = captured_answer(SS_CAPTURES / capture, 8001)
    # the URL the controller uses on that node itself (as the lab's localhost node): any listener on the port counts
    here = located(tmp_path, {"gb300-a01": node_answer_nobody(8001), "gb300-a02": answer}, "http://127.0.0.1:8001/v1")
    serving = here.observed["serving"][0]
    assert (serving["host"], serving["pid"], serving["process"]) == ("gb300-a02", pid, process)
    if pid is None:   # another user's process: bound to no process the run sees, never a pass (issue 42 item 3)
        assert here.status == Status.INCONCLUSIVE and "not visible to this user" in here.reason
        assert "vllm_serve_attach_container" in here.action and "become" in here.action
    else:
        assert here.status == Status.PASS, here.reason
    # a URL on the node's name: a socket bound to loopback there cannot be what answers it
    remote = located(tmp_path / "remote", {"gb300-a01": node_answer_nobody(8001), "gb300-a02": answer},
                     "http://gb300-a02:8001/v1", resolved={"host": "gb300-a02", "addresses": [own_address()]})
    if address == "127.0.0.1":
        assert remote.status == Status.INCONCLUSIVE and "bound to loopback only" in remote.reason
    else:
        assert remote.status == Status.PASS and "gb300-a02 (pid 421841)" in remote.reason
    # the same capture, the URL on another port: nothing on the trays serves it
    other = located(tmp_path / "other", {"gb300-a01": node_answer_nobody(8000),
                                         "gb300-a02": captured_answer(SS_CAPTURES / capture, 8000)},
                    "http://gb300-a02:8000/v1")
    assert other.status == Status.INCONCLUSIVE and "port 8000" in other.reason


def node_answer_nobody(port: int) -> str:
    return json.dumps({"port": port, "pid": None, "reason": f"no process listens on port {port} on this node"})


def test_launch_mode_and_a_url_without_port(tmp_path: Path) -> None:
    from vllm_acceptance.rules.live_server import attached_port

    launch = located(tmp_path, {"gb300-a01": node_answer_nobody(8000)}, "http://h:8000/v1", mode="launch")
    assert launch.status == Status.NOT_APPLICABLE
    assert attached_port({"vllm_serve_mode": "attach", "vllm_base_url": "https://vllm.example/v1"}) == 443
    assert attached_port({"vllm_serve_mode": "attach", "vllm_base_url": "http://h:8000/v1",
                          "preflight_live_port": "9000"}) == 9000
    assert attached_port({"vllm_serve_mode": "launch", "vllm_base_url": "http://h:8000/v1"}) is None
