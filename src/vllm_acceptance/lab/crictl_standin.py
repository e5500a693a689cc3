"""A `crictl` stand-in for rehearsal nodes: the containers of the Kubernetes pods a scenario placed on the node.

There is no kubelet or containerd here. A scenario that attaches to a server in a pod (rehearsal.py, attach-pod)
starts the real lab vLLM in a real cgroup named as containerd's CRI plugin names a pod container
(`kubepods.slice/.../cri-containerd-<id>.scope`) and writes that container's `crictl inspect -o json` answer to
STATE/cri/<id>.json, built from a real capture (tests/fixtures/real/container-inspect/
crictl-inspect-containerd-1.7.json: the id, image, image ref and pid replaced). This script answers:

- `inspect [-o json] ID` from that record, NotFound in crictl's words for any other id;
- `exec [-i] [-t] ID CMD...` (issue 42 item 5): CMD run in the container's process context, as the runtime enters
  a container: the environment of the container's process (/proc/PID/environ, its PATH resolving CMD), its working
  directory, its cgroup (joined where this node may). The container's image is the lab's: its `python3` is the lab
  venv's with the real vLLM (CPU). Preflight's in-image probe alone (`python3 -c <probe.py>`) is answered with the
  GPU image's recorded facts (the node's recorded docker's answer: CUDA 13, the GPUs), as container_standin.py
  answers `docker run` of the probe: there is no GPU here;
- `inspecti [-o json] IMAGE`: the image the node's recorded docker knows by that reference, in crictl's shape (the
  real containerd capture tests/fixtures/real/image-inspect/crictl-inspecti-containerd-2018-ubuntu.json with its id,
  names, digests, created, architecture and config from the recorded `docker image inspect`), crictl's "no such
  image" otherwise;
- `version`, `info`: the real captures tests/fixtures/real/container-runtime/crictl-version-containerd-1.4.8.txt and
  crictl-info-cri-containerd-2017.json, as they are.

Every call is recorded in STATE/crictl-calls.jsonl. Stdlib only (run by the node's /usr/bin/python3).

    crictl_standin.py --state DIR [--recorded DOCKER] [--] CRICTL-ARGS...
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
REAL = REPO / "tests" / "fixtures" / "real"
PROBE = REPO / "roles" / "preflight" / "files" / "probe.py"
INSPECTI = REAL / "image-inspect" / "crictl-inspecti-containerd-2018-ubuntu.json"
VERSION = REAL / "container-runtime" / "crictl-version-containerd-1.4.8.txt"
INFO = REAL / "container-runtime" / "crictl-info-cri-containerd-2017.json"
OUTPUT_FLAGS = ("-o", "--output")


def options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0] in ("--state", "--recorded"):
        opts[rest[0][2:]] = rest[1]
        rest = rest[2:]
    return opts, rest[1:] if rest[:1] == ["--"] else rest


def operands(args: list[str]) -> list[str]:
    """The non-flag arguments of `inspect`/`inspecti` (an `-o FORMAT` value is a flag's)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in OUTPUT_FLAGS:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def record_of(state: Path, target: str) -> Path | None:
    found = [p for p in sorted((state / "cri").glob("*.json")) if p.stem.startswith(target)] \
        if (state / "cri").is_dir() and target else []
    return found[0] if len(found) == 1 else None


def not_found(target: str) -> int:
    sys.stderr.write(f'FATA[0000] getting the status of the container "{target}": rpc error: code = NotFound '
                     f'desc = an error occurred when try to find container "{target}": not found\n')
    return 1


def inspect(state: Path, args: list[str]) -> int:
    ids = operands(args)
    if len(ids) != 1:
        sys.stderr.write("FATA[0000] ID cannot be empty\n")
        return 1
    found = record_of(state, ids[0])
    if found is None:
        return not_found(ids[0])
    sys.stdout.write(found.read_text())
    return 0


def qualified(name: str) -> str:
    """A reference as containerd's CRI plugin names it: docker.io/ and library/ made explicit."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name if '/' in name else 'library/' + name}"


def names_image(reference: str, image: dict[str, object]) -> bool:
    """The node has the image by this reference: one of its tags or digests (names qualified) or its ID."""
    listed = [image.get("RepoTags"), image.get("RepoDigests")]
    names = {qualified(str(n)) for names in listed if isinstance(names, list) for n in names}
    return qualified(reference) in names or str(image.get("Id", "")).removeprefix("sha256:") == \
        reference.removeprefix("sha256:")


def inspecti(recorded: str | None, args: list[str]) -> int:
    refs = operands(args)
    if len(refs) != 1:
        sys.stderr.write("FATA[0000] image name cannot be empty\n")
        return 1
    done = subprocess.run([recorded, "image", "inspect", refs[0]], capture_output=True, text=True) \
        if recorded else None
    try:
        image = json.loads(done.stdout)[0] if done is not None and done.returncode == 0 else None
    except (ValueError, IndexError, KeyError):
        image = None
    if not isinstance(image, dict) or not names_image(refs[0], image):
        sys.stderr.write(f'FATA[0000] no such image "{refs[0]}" present\n')
        return 1
    answer = json.loads(INSPECTI.read_text())
    config = image.get("Config") if isinstance(image.get("Config"), dict) else {}
    answer["status"].update(id=image.get("Id"), repoTags=[qualified(t) for t in image.get("RepoTags") or []],
                            repoDigests=[qualified(d) for d in image.get("RepoDigests") or []])
    spec = answer["info"]["imageSpec"]
    spec.update(created=image.get("Created"), architecture=image.get("Architecture"), os=image.get("Os", "linux"))
    spec["config"] = {k: config[k] for k in ("Env", "Entrypoint", "Cmd", "Labels") if config.get(k) is not None}
    print(json.dumps(answer, indent=2))
    return 0


def container_process(state: Path, target: str) -> tuple[dict[str, object] | None, int | None]:
    found = record_of(state, target)
    if found is None:
        return None, None
    record = json.loads(found.read_text())
    pid = record.get("info", {}).get("pid")
    return record, pid if isinstance(pid, int) else None


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(part.decode(errors="replace").split("=", 1) for part in raw.split(b"\0") if b"=" in part)


def join_cgroup_of(pid: int) -> None:
    """Join the container's cgroup (cgroup v2: the `0::` line of /proc/PID/cgroup), where this node may."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x.startswith("0::"))
        root = next(x.split()[1] for x in Path("/proc/mounts").read_text().splitlines() if x.split()[2] == "cgroup2")
        (Path(root) / line[3:].lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
    except (OSError, StopIteration, IndexError):
        pass


def exec_in(state: Path, recorded: str | None, args: list[str]) -> int:
    rest = [a for a in args if a not in ("-i", "-t", "-it", "-ti", "--interactive", "--tty")]
    if len(rest) < 2:
        sys.stderr.write("FATA[0000] ID and command cannot be empty\n")
        return 1
    target, command = rest[0], rest[1:]
    record, pid = container_process(state, target)
    if record is None:
        return not_found(target)
    if pid is None or not Path(f"/proc/{pid}").exists():
        sys.stderr.write(f'FATA[0000] execing command in container: container "{target}" is not running\n')
        return 1
    if command[:2] == ["python3", "-c"] and len(command) > 2 and command[2].rstrip() == PROBE.read_text().rstrip():
        return probe_answer(recorded, record)
    env = environ(pid)
    program = shutil.which(command[0], path=env.get("PATH", "")) or command[0]
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "/"
    done = subprocess.run([program, *command[1:]], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                          preexec_fn=lambda: join_cgroup_of(pid))
    return done.returncode


def probe_answer(recorded: str | None, record: dict[str, object]) -> int:
    """The in-image probe: the GPU image's recorded facts (the node's recorded docker), no IMEX channel asked."""
    status = record.get("status") if isinstance(record.get("status"), dict) else {}
    image = (status.get("image") or {}).get("image") if isinstance(status, dict) else None
    if not recorded or not image:
        sys.stderr.write("crictl stand-in: no recorded image facts for the probe\n")
        return 1
    done = subprocess.run([recorded, "run", "--rm", "--gpus", "all", "--entrypoint", "python3", str(image), "-c",
                           PROBE.read_text()], capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        sys.stdout.write(done.stdout)
        return done.returncode or 1
    answer["imex_channels"] = None
    print(json.dumps(answer, sort_keys=True))
    return 0


def main(argv: list[str]) -> int:
    opts, args = options(argv)
    if "state" not in opts:
        sys.stderr.write("usage: crictl_standin.py --state DIR [--recorded DOCKER] [--] CRICTL-ARGS...\n")
        return 2
    state = Path(opts["state"])
    state.mkdir(parents=True, exist_ok=True)
    with (state / "crictl-calls.jsonl").open("a") as calls:
        calls.write(json.dumps({"t": time.time(), "argv": ["crictl", *args]}) + "\n")
    cmd, rest = (args[0], args[1:]) if args else ("", [])
    if cmd == "inspect":
        return inspect(state, rest)
    if cmd == "exec":
        return exec_in(state, opts.get("recorded"), rest)
    if cmd == "inspecti":
        return inspecti(opts.get("recorded"), rest)
    if cmd == "version":
        sys.stdout.write(VERSION.read_text())
        return 0
    if cmd == "info":
        sys.stdout.write(INFO.read_text())
        return 0
    sys.stderr.write(f"crictl stand-in: {cmd or '(nothing)'} is not answered here (inspect, exec, inspecti, version, "
                     "info are)\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
