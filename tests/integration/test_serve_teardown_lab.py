"""The server a run launches is gone after the run, in the container runtimes too (docker, podman), and
after a failure; kept only when the inventory says so, and the report says which.

The actual configuration is judged from what the running server reports, not from what it was asked.

There is no container engine here: a PATH stand-in `docker`/`podman` records every call (argv) and runs, as
its "container", a TCP forwarder to a real lab vLLM, so /health, /v1/models, /metrics and the startup log
(`logs`) the role judges are the real server's; `stop`/`rm -f` end the forwarder, `inspect` answers from
the container's state. The real playbooks run (validate, serve, and report where the end of the run is
tested); preflight and the probes are not part of these tests. The process runtime's stop is tested on a
real launched vLLM in test_pipeline_lab.py, the multi-node one in test_launch_multinode.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.serve.stage import ServeFacts, judge_serve

from support.hosts import REPO, ansible_bin, ansible_env

pytestmark = pytest.mark.lab
OFFSET = int(os.environ.get("LAB_PORT_OFFSET", "0"))
LAB_PROFILE = REPO / "profiles" / "cpu-lab.yml"

STANDIN = r'''#!/usr/bin/python3
"""Stand-in container runtime: records argv; a container is a TCP forwarder to the real lab vLLM."""
import json, os, signal, subprocess, sys, time
STATE = @STATE@
RUNTIME = os.path.basename(sys.argv[0])
argv = sys.argv[1:]
os.makedirs(STATE, exist_ok=True)
with open(os.path.join(STATE, "calls.jsonl"), "a") as calls:
    calls.write(json.dumps([RUNTIME] + argv) + "\n")
def path(name):
    return os.path.join(STATE, name)
def read(name, default=""):
    try:
        return open(path(name)).read()
    except OSError:
        return default
def alive(pid):
    try:
        os.kill(pid, 0)
        return open("/proc/%d/stat" % pid).read().split()[2] != "Z"   # a zombie is gone
    except OSError:
        return False
def kill():
    # Like `docker stop`/`rm -f`: return only once the container is gone. The forwarder is not this
    # process's child (an earlier `run` started it), so wait on /proc, bounded, then SIGKILL.
    pid = read("forwarder.pid").strip()
    if pid:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(int(pid), sig)
            except OSError:
                break
            deadline = time.monotonic() + 15
            while alive(int(pid)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not alive(int(pid)):
                break
        os.remove(path("forwarder.pid"))
cmd = argv[0] if argv else ""
name = argv[-1] if argv else ""
if cmd == "run":
    host_at = argv.index("--host")
    open(path("args.json"), "w").write(json.dumps(argv[host_at - 1:]))
    port = argv[argv.index("--port") + 1]
    upstream = read("upstream").strip() if read("mode", "ok").strip() == "ok" else "127.0.0.1:1"
    proc = subprocess.Popen([sys.executable, path("forward.py"), "127.0.0.1", port, upstream],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    open(path("forwarder.pid"), "w").write(str(proc.pid))
    open(path("state"), "w").write("running")
    print("5e1f0c" * 10 + "abcd")
elif cmd == "inspect":
    state = read("state")
    if not state:
        sys.stderr.write("Error: No such object: " + name + "\n")
        sys.exit(1)
    fmt = argv[argv.index("--format") + 1]
    print(read("args.json", "[]") if "json .Args" in fmt else state)
elif cmd == "logs":
    if not read("state"):
        sys.stderr.write("Error: No such container: " + name + "\n")
        sys.exit(1)
    sys.stdout.write(open(read("log_path").strip()).read())
elif cmd == "stop":
    if not read("state"):
        sys.stderr.write("Error: No such container: " + name + "\n")
        sys.exit(1)
    kill()
    open(path("state"), "w").write("exited")
    print(name)
elif cmd == "rm":
    kill()
    for leftover in ("state", "args.json"):
        if os.path.exists(path(leftover)):
            os.remove(path(leftover))
    print(name)
else:
    sys.stderr.write(RUNTIME + " stand-in: unsupported " + " ".join(argv) + "\n")
    sys.exit(2)
'''

FORWARDER = r'''import asyncio, sys
LISTEN_HOST, LISTEN_PORT, UPSTREAM = sys.argv[1], int(sys.argv[2]), sys.argv[3]
UP_HOST, UP_PORT = UPSTREAM.rsplit(":", 1)
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
async def handle(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_connection(UP_HOST, int(UP_PORT))
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
async def main():
    server = await asyncio.start_server(handle, LISTEN_HOST, LISTEN_PORT, reuse_address=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
'''


def _standin(tmp: Path, lab_server, mode: str = "ok") -> tuple[Path, Path]:
    state, bin_dir = tmp / "runtime-state", tmp / "bin"
    state.mkdir()
    bin_dir.mkdir()
    (state / "forward.py").write_text(FORWARDER)
    (state / "upstream").write_text(lab_server.base_url.split("//", 1)[1].split("/", 1)[0])
    (state / "log_path").write_text(str(lab_server.log_path))
    (state / "mode").write_text(mode)
    for runtime in ("docker", "podman"):
        script = bin_dir / runtime
        script.write_text(STANDIN.replace("@STATE@", repr(str(state))))
        script.chmod(0o755)
    return state, bin_dir


# Recipe flags that the CPU build of vLLM 0.32 accepts and reports: cache_config_info cache_dtype / block_size,
# and vLLM's AttentionConfig(...) repr in the startup log's non-default args.
FP8_ARGS = ["--kv-cache-dtype=fp8", "--block-size=64",
            '--attention-config={"use_prefill_query_quantization":true,"mla_prefill_backend":"flashinfer"}']


def _cpu_kv_dtype() -> str:
    """The KV cache dtype the lab's CPU vLLM can start with: fp8 needs AVX-512 or AMX (vLLM 0.32's
    v1/attention/backends/cpu_attn.py: "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"); a CPU
    without them (an AVX2-only machine) starts the recipe's other flags with `auto`."""
    flags = set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").is_file() else set()
    return "fp8" if flags & {"avx512f", "amx_tile"} else "auto"


CPU_KV_DTYPE = _cpu_kv_dtype()
# FP8_ARGS as this machine's CPU vLLM starts them (the docker launch test)
LAUNCHABLE_ARGS = [f"--kv-cache-dtype={CPU_KV_DTYPE}", *FP8_ARGS[1:]]


def _profile(tmp: Path, runtime: str, extra_args: list[str] | None = None) -> Path:
    """cpu-lab, served by a container runtime (the stand-in): the lab's flags, image and port."""
    data = yaml.safe_load(LAB_PROFILE.read_text())
    data["name"] = f"cpu-lab-{runtime}"
    if runtime != "process":
        data["image"] = {"reference": "vllm/vllm-openai:lab-standin", "digest": None, "cuda_major": None}
    data["launch"]["runtime"] = runtime
    data["launch"]["args"] += extra_args or []
    data["launch"]["ready_timeout_s"] = 20
    path = tmp / f"cpu-lab-{runtime}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(tmp: Path, bin_dir: Path, profile: Path, port: int, report: bool = True,
         **extra) -> tuple[subprocess.CompletedProcess[str], Path]:
    reports = tmp / "reports"
    # vLLM's own argument checks at validate are not what these tests judge (tests/unit/test_vllm_check.py, the lab
    # launch runs): turned off as an operator can, ~10 s of importing vLLM per run
    variables = {"acceptance_reports_dir": str(reports), "acceptance_profile": str(profile),
                 "vllm_serve_port": port + OFFSET, "vllm_serve_state_dir": str(tmp / "server"),
                 "vllm_serve_stop_timeout_s": 10, "acceptance_vllm_check_python": "none", **extra}
    env = ansible_env(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), VLLM_API_KEY="")
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"
    argv = [ansible_bin(), "-i", str(REPO / "inventories" / "lab"), "-e", json.dumps(variables),
            str(REPO / "playbooks" / "validate.yml"), str(REPO / "playbooks" / "serve.yml"),
            *([str(REPO / "playbooks" / "report.yml")] if report else [])]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    runs = [p for p in (reports / "lab").iterdir() if p.is_dir() and not p.is_symlink()] \
        if (reports / "lab").is_dir() else []
    assert len(runs) == 1, proc.stdout[-4000:]
    return proc, runs[0]


def _calls(state: Path) -> list[list[str]]:
    return [json.loads(line) for line in (state / "calls.jsonl").read_text().splitlines()]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port + OFFSET), timeout=2):
            return True
    except OSError:
        return False


def _gone(state: Path, port: int) -> None:
    assert not (state / "forwarder.pid").exists() and not (state / "state").exists()
    assert not _answers(port), "something still answers on the container's port"


def _record(run_dir: Path) -> dict:
    return json.loads((run_dir / "stages" / "teardown.json").read_text())


def _findings(run_dir: Path) -> dict[str, dict]:
    return {f["check"]: f for f in json.loads((run_dir / "findings" / "serve.json").read_text())}


def test_docker_launch_judged_on_the_servers_reports_then_stopped(lab_server_factory, tmp_path: Path) -> None:
    """The recipe asks for fp8 KV cache (auto on a CPU without AVX-512 or AMX: _cpu_kv_dtype), block size 64 and
    an attention config; the real vLLM behind the container reports them (cache_config_info, AttentionConfig
    repr): every actual-config check passes. At the end of the run the container is stopped, removed and confirmed
    gone, and the report says so."""
    server = lab_server_factory(" ".join(LAUNCHABLE_ARGS), port=8085)
    state, bin_dir = _standin(tmp_path, server)
    proc, run_dir = _run(tmp_path, bin_dir, _profile(tmp_path, "docker", LAUNCHABLE_ARGS), 8081)
    assert proc.returncode == 0, proc.stdout[-4000:]
    serve = _findings(run_dir)
    for check in ("compat.startup_log", "compat.actual_config.prefix_caching", "compat.actual_config.cache",
                  "compat.actual_config.flags", "compat.actual_config.max_model_len"):
        assert serve[check]["status"] == "pass", (check, serve[check]["reason"])
    cache = {r["flag"]: r for r in serve["compat.actual_config.cache"]["observed"]["flags"]}
    assert cache["--kv-cache-dtype"]["source"] == f'vllm:cache_config_info cache_dtype="{CPU_KV_DTYPE}"'
    assert cache["--block-size"]["source"] == 'vllm:cache_config_info block_size="64"'
    flags = {r["flag"]: r for r in serve["compat.actual_config.flags"]["observed"]["flags"]}
    assert flags["--attention-config"]["shown"]["__repr__"] == "AttentionConfig"
    assert flags["--attention-config"]["shown"]["mla_prefill_backend"] == "MLAPrefillBackendEnum.FLASHINFER"
    calls = _calls(state)
    assert calls[-3:] == [["docker", "stop", "-t", "10", "vllm-acceptance"], ["docker", "rm", "-f", "vllm-acceptance"],
                          ["docker", "inspect", "--format", "{{.State.Status}}", "vllm-acceptance"]]
    _gone(state, 8081)
    record = _record(run_dir)
    assert record["action"] == "stopped" and record["gone"] is True and record["when"] == "end of the run"
    reported = json.loads((run_dir / "report.json").read_text())["server"]
    assert reported["state"] == "stopped" and "docker vllm-acceptance on localhost is gone" in reported["text"]
    assert f"- Server: {reported['text']}" in (run_dir / "report.md").read_text()


def test_server_started_without_the_requested_flags_fails_on_its_own_evidence(lab_server, tmp_path: Path) -> None:
    """The session's lab vLLM runs without fp8, block size 64 and the attention config that this recipe asks
    for (its argv is read too, as attach mode does): the running server's /metrics and startup log say so."""
    profile_path = _profile(tmp_path, "process", FP8_ARGS)
    argv = [a for a in Path(f"/proc/{lab_server.pid}/cmdline").read_text().split("\0") if a]
    findings = {f.check: f for f in judge_serve(tmp_path / "run", load_profile(profile_path), ServeFacts(
        base_url=lab_server.base_url, host="localhost", mode="attach", startup_log=lab_server.log_path.read_text(),
        process_args=argv))}
    cache = findings["compat.actual_config.cache"]
    assert cache.status.value == "fail"
    assert '--kv-cache-dtype=fp8: the server shows auto (vllm:cache_config_info cache_dtype="auto")' in cache.reason
    assert '--block-size=64: the server shows 128 (vllm:cache_config_info block_size="128")' in cache.reason
    evidence = (tmp_path / "run" / cache.evidence[0]).read_text()
    assert 'cache_dtype="auto"' in evidence and 'block_size="128"' in evidence     # the server's own words, kept
    flags = findings["compat.actual_config.flags"]
    # absent from its non-default args and from its engine config line: unverifiable, not a false rebuild
    # (issue 31, item 7); the cache flags above fail on the server's own /metrics
    assert flags.status.value == "inconclusive" and "--attention-config=" in flags.reason
    assert "unverifiable" in flags.reason
    assert findings["compat.actual_config.prefix_caching"].status.value == "pass"
    # the operator's log is this server's: its version and max_model_len are the live /version and /v1/models ones
    identity = findings["compat.startup_log_identity"]
    assert identity.status.value == "pass" and identity.evidence == ["evidence/serve/startup.log"], identity.reason
    assert identity.observed["server"]["version"] == identity.observed["log"]["version"]
    # another server's real log (a 0.10.2 GPU build) named for it: not this server's, not used, the run incomplete
    other = Path(__file__).resolve().parents[2] / "tests/fixtures/real/vllm/v1-0.10.2-dev-engine-config-tp2.log"
    wrong = {f.check: f for f in judge_serve(tmp_path / "wrong", load_profile(profile_path), ServeFacts(
        base_url=lab_server.base_url, host="localhost", mode="attach", startup_log=other.read_text(),
        process_args=argv, startup_log_source=f"the file {other}"))}
    assert wrong["compat.startup_log_identity"].status.value == "inconclusive"
    assert "is not this server's" in wrong["compat.startup_log_identity"].reason
    assert wrong["compat.startup_log"].status.value == "missing"
    assert not (tmp_path / "wrong/evidence/serve/startup.log").exists()
    assert (tmp_path / "wrong/evidence/serve/startup-log-rejected.log").is_file()


def test_podman_container_is_removed_when_the_serve_stage_fails(lab_server, tmp_path: Path) -> None:
    """The container came up, then the judge failed (a ready time that is not a number is forced on it as an
    extra var, so the module refuses its arguments): the role's rescue stops the container, the report is still
    written and says so, and the run fails at its end naming the stage."""
    state, bin_dir = _standin(tmp_path, lab_server)
    proc, run_dir = _run(tmp_path, bin_dir, _profile(tmp_path, "podman"), 8082,
                         vllm_serve_ready_s="not-a-number", acceptance_unchecked_vars=["vllm_serve_ready_s"])
    assert proc.returncode != 0
    assert "the serve stage failed on localhost: Judge the serve stage on the controller" in proc.stdout
    assert ["podman", "rm", "-f", "vllm-acceptance"] in _calls(state)[2:]   # after the run, not the stale clean-up
    _gone(state, 8082)
    record = _record(run_dir)
    assert record["action"] == "stopped" and record["when"] == "serve stage error" and record["gone"] is True
    assert json.loads((run_dir / "report.json").read_text())["server"]["state"] == "stopped"


def test_kept_when_the_inventory_says_so_and_the_report_says_it(lab_server, tmp_path: Path) -> None:
    state, bin_dir = _standin(tmp_path, lab_server)
    proc, run_dir = _run(tmp_path, bin_dir, _profile(tmp_path, "docker"), 8083, vllm_serve_stop_at_end=False)
    try:
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert not any(call[1] in ("stop", "rm") for call in _calls(state)[1:]), _calls(state)
        assert (state / "state").read_text() == "running" and _answers(8083)
        record = _record(run_dir)
        assert record["action"] == "kept" and record["kept_by"] == "vllm_serve_stop_at_end: false"
        reported = json.loads((run_dir / "report.json").read_text())["server"]
        assert reported["state"] == "kept" and "vllm_serve_stop_at_end: false" in reported["text"]
    finally:
        subprocess.run([str(bin_dir / "docker"), "rm", "-f", "vllm-acceptance"], capture_output=True, timeout=60)
    _gone(state, 8083)


def test_failed_launch_is_removed_even_when_kept(lab_server, tmp_path: Path) -> None:
    """A container that never answers /health (bounded wait): removed, whatever vllm_serve_stop_at_end says."""
    state, bin_dir = _standin(tmp_path, lab_server, mode="never_ready")
    started = time.monotonic()
    proc, run_dir = _run(tmp_path, bin_dir, _profile(tmp_path, "podman"), 8084, report=False,
                         vllm_serve_stop_at_end=False, vllm_serve_ready_timeout_s=10)
    assert proc.returncode == 0, proc.stdout[-4000:]
    serve = json.loads((run_dir / "stages" / "serve.json").read_text())
    assert serve["launch_error"]
    assert ["podman", "rm", "-f", "vllm-acceptance"] in _calls(state)[2:]      # after the run, not the stale clean-up
    _gone(state, 8084)
    record = _record(run_dir)
    assert record["action"] == "stopped" and record["when"] == "failed launch"
    print(f"failed container launch, removed: {time.monotonic() - started:.1f} s of ansible-playbook wall time")
