"""The serving process as it runs (issue 28 item 3): the process listening on the server's port
(`ss -ltnpH`), its argv and environment from /proc/PID/{cmdline,environ}, secrets redacted before
anything is kept (core/redact.py), and what differs from the planned launch.

What runs decides: the interconnect's environment and the all2all backend are judged on the live
process where it was read (rules/interconnect.py), the planned launch only where it was not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.redact import redact_env, redact_obj

# `LISTEN 0 2048 0.0.0.0:8000 0.0.0.0:* users:(("python3",pid=1234,fd=22),("vllm",pid=99,fd=3))`
_SS_LINE = re.compile(r"^\s*LISTEN\s+\d+\s+\d+\s+(?P<local>\S+)\s+\S+\s*(?P<users>users:\(.*\))?\s*$")
_SS_USER = re.compile(r'\("(?P<name>[^"]*)",pid=(?P<pid>\d+),fd=\d+\)')


class LiveError(Exception):
    """The serving process could not be read (gone, or not readable by this user)."""


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    pid: int | None
    process: str | None


def parse_ss_listeners(text: str) -> list[Listener]:
    """Listening TCP sockets of `ss -ltnp` (header or not); a socket of another user's process has no pid."""
    out = []
    for line in text.splitlines():
        match = _SS_LINE.match(line)
        if not match:
            continue
        address, _, port = match.group("local").rpartition(":")
        if not port.isdigit():
            continue
        users = list(_SS_USER.finditer(match.group("users") or ""))
        if not users:
            out.append(Listener(address, int(port), None, None))
        for user in users:
            out.append(Listener(address, int(port), int(user.group("pid")), user.group("name")))
    return out


def listeners_on(text: str, port: int) -> list[Listener]:
    return [x for x in parse_ss_listeners(text) if x.port == port]


@dataclass
class LiveProcess:
    pid: int
    argv: list[str]
    env: dict[str, str]            # redacted
    source: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_cmdline(raw: bytes) -> list[str]:
    """/proc/PID/cmdline, the value of a secret flag (``--api-key sk-...``) and secrets in values redacted."""
    return redact_obj([part.decode(errors="replace") for part in raw.split(b"\0") if part])


def parse_environ(raw: bytes, read: Iterable[str] = ()) -> dict[str, str]:
    """/proc/PID/environ by allow-list (core/redact.py redact_env): values only of the variables a check reads (and
    of the names in `read`, the launch's own), redacted still; any other by name only."""
    env = {}
    for part in raw.split(b"\0"):
        name, sep, value = part.decode(errors="replace").partition("=")
        if sep and name:
            env[name] = value
    return redact_env(env, read)


def read_live_process(pid: int, proc: Path = Path("/proc")) -> LiveProcess:
    """argv and environment of a running process; LiveError when it is gone or not readable."""
    base = proc / str(pid)
    try:
        argv = parse_cmdline((base / "cmdline").read_bytes())
    except OSError as exc:
        raise LiveError(f"cannot read {base}/cmdline: {exc}") from exc
    notes = []
    try:
        env = parse_environ((base / "environ").read_bytes())
    except OSError as exc:
        env = {}
        notes.append(f"environment not readable ({exc.strerror or exc}): run as the server's user or with become")
    return LiveProcess(pid=pid, argv=argv, env=env, source=f"{base}/cmdline, {base}/environ", notes=notes)


def flag_values(argv: list[str]) -> dict[str, str | None]:
    """`--flag value` / `--flag=value` / `--switch` of an argv, by flag (the last one wins)."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith("--"):
            name, eq, value = item.partition("=")
            if eq:
                out[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[name] = argv[i + 1]
                i += 1
            else:
                out[name] = None
        i += 1
    return out


def compare_launch(live: LiveProcess, planned_args: list[str], planned_env: dict[str, str],
                   env_names: tuple[str, ...] = ("NCCL_", "UCX_", "NVSHMEM_", "VLLM_", "GLOO_")) -> dict[str, Any]:
    """What the running server does not run as planned: planned flags absent or with another value, flags it
    runs that the plan lacks, and planned communication variables absent or different (names by prefix)."""
    have, want = flag_values(live.argv), flag_values([str(a) for a in planned_args])
    differs = {f: {"planned": v, "live": have.get(f)} for f, v in want.items() if f not in have or have[f] != v}
    extra = {f: v for f, v in have.items() if f not in want}
    env = {k: {"planned": v, "live": live.env.get(k)} for k, v in planned_env.items()
           if k.startswith(env_names) and live.env.get(k) != str(v)}
    return {"args_differ": differs, "args_extra": extra, "env_differ": env,
            "matches": not differs and not env}


def hidden_server(text: str) -> str | None:
    """Why the server listening on this node could not be read, where a `live_process` record shows a listener on
    the port but no process (another user's: `ss` prints no `users:(...)` for it; or its /proc unreadable); None
    where it was read, or nothing listens (issue 42 item 3)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("pid") or not data.get("listeners"):
        return None
    return str(data.get("reason") or "a process listens on the port but this user sees no pid")


def environment_unread(text: str) -> str | None:
    """Why the running server's environment is not known, where its argv was read but /proc/PID/environ was not
    (another user's process: `environ` is readable by its owner and root only, proc(5)); None where it was read."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not data.get("pid") or not isinstance(data.get("argv"), list):
        return None
    notes = [str(n) for n in data.get("notes") or [] if "environment not readable" in str(n)]
    return notes[0] if notes and not data.get("env") else None


def local_netns(proc: Path = Path("/proc")) -> str | None:
    """`<boot id>:<inode of /proc/self/ns/net>` of this process, as the node script writes its own `netns`
    (roles/preflight/files/live_process.py): equal only inside one network namespace of one booted machine."""
    try:
        boot = (proc / "sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{(proc / 'self/ns/net').stat().st_ino}"
    except OSError:
        return None


def live_launch(text: str) -> tuple[list[str], dict[str, str], str] | None:
    """argv, environment and a description of a ``live_process`` evidence record (the JSON
    :meth:`LiveProcess.to_dict` wrote); None when it holds no readable process."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("argv"), list) or not data.get("pid"):
        return None
    env = data.get("env") if isinstance(data.get("env"), dict) else {}
    return ([str(a) for a in data["argv"]], {str(k): str(v) for k, v in env.items()},
            f"the running server (pid {data['pid']}, {data.get('source') or '/proc'})")


# --- the container the serving process runs in (issue 28 item 3) ---------------------------------------------
# /proc/PID/cgroup names the container by its full 64-hex id; the runtime by the path's shape (real captures:
# tests/fixtures/real/cgroup/, docs/sources.md#cgroup-container-id). roles/preflight/files/live_process.py keeps
# its own copy of these patterns (stock python3 on the node); tests/unit/test_live_container.py holds both equal.
_HEX64 = r"([0-9a-f]{64})"
CGROUP_PATTERNS: tuple[tuple[str, str | None], ...] = (
    (r"docker-" + _HEX64 + r"\.scope", "docker"),                  # systemd driver: docker-<id>.scope
    (r"/docker/" + _HEX64 + r"(?=/|$)", "docker"),                 # cgroupfs driver: /docker/<id>
    (r"cri-containerd[-:]" + _HEX64, "containerd"),                # cri-containerd-<id>.scope, ...:cri-containerd:<id>
    (r"crio-" + _HEX64, "crio"),                                   # crio-<id>.scope
    (r"libpod-(?:payload-)?" + _HEX64, "podman"),                  # libpod-<id>.scope[/container]
    (r"/" + _HEX64 + r"(?=/|$)", None),                            # a bare id (kubepods cgroupfs, --cgroup-parent)
)
_CGROUP_RES = tuple((re.compile(p), engine) for p, engine in CGROUP_PATTERNS)


def _cgroup_path_container(path: str) -> tuple[str | None, str] | None:
    """(engine, id) of the innermost container a cgroup path names (the match ending last; at one end, a pattern
    that names the runtime wins over a bare id); None when it names none (a host process)."""
    best: tuple[int, int, str | None, str] | None = None
    for regex, engine in _CGROUP_RES:
        for match in regex.finditer(path):
            key = (match.end(1), 1 if engine else 0, engine, match.group(1))
            if best is None or key[:2] > best[:2]:
                best = key
    return None if best is None else (best[2], best[3])


def container_from_cgroup(text: str) -> tuple[str | None, str | None, str | None]:
    """(engine, container id, the cgroup line it came from) of /proc/PID/cgroup text; the unified `0::` line is
    preferred, else the first line that names one. Engine is docker, podman, containerd, crio, or None where the
    path names no runtime (a bare id). (None, None, None) for a host process."""
    found = []
    for raw in text.splitlines():
        line = raw.strip()
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hit = _cgroup_path_container(parts[2])
        if hit is not None:
            found.append((0 if parts[0] == "0" and parts[1] == "" else 1, len(found), hit, line))
    if not found:
        return None, None, None
    _, _, (engine, cid), line = min(found)
    return engine, cid, line


def container_image(text: str) -> tuple[str, str | None]:
    """(image id, reference it was started from) of `docker|podman inspect --type container` JSON (the CLI's
    one-element array or the API's object): `Image` and `Config.Image` (podman: `ImageName` when Config has none).
    ValueError when the answer holds no container with an image id."""
    data = json.loads(text)
    if isinstance(data, list):
        if len(data) != 1:
            raise ValueError(f"expected one container in the inspect answer, found {len(data)}")
        data = data[0]
    if not isinstance(data, dict) or not isinstance(data.get("Image"), str) or not data["Image"]:
        raise ValueError("no `Image` (image id) in the container inspect answer")
    config = data.get("Config") if isinstance(data.get("Config"), dict) else {}
    ref = config.get("Image") or data.get("ImageName")
    return data["Image"], (str(ref) if ref else None)


def same_image_id(a: str, b: str) -> bool:
    """Image ids equal, with or without the `sha256:` prefix (docker before 1.10 and podman print the bare hex)."""
    return a.removeprefix("sha256:").lower() == b.removeprefix("sha256:").lower()


# `crictl inspect` (containerd and CRI-O, the Kubernetes node's CLI; docs/sources.md#crictl-inspect): the CRI
# ContainerStatus. `status.imageRef` is a repo digest (`repo@sha256:...`, containerd when the image has one, CRI-O
# before `imageId`) or the image ID (`sha256:<hex>`); `status.imageId` (CRI 1.30+) is the image ID;
# containerd's `info.config.image.image` is the ID the kubelet created the container from. The node script keeps
# its own copy (roles/preflight/files/live_process.py `crictl_image`); tests/unit/test_live_container.py holds
# both equal on the real captures in tests/fixtures/real/container-inspect/crictl-*.json.
_IMAGE_ID = re.compile(r"^(?:sha256:)?[0-9a-f]{64}$")


def crictl_image(text: str) -> tuple[str | None, str | None, str | None]:
    """(image ID, repo digest, reference) of `crictl inspect` JSON: the ID from `status.imageId`, else an ID-form
    `status.imageRef`, else an ID-form `info.config.image.image`; the repo digest from a `repo@sha256:` imageRef;
    the reference from `status.image.image` (else `info.config.image.image`) when it is not an ID. None where the
    answer does not say. ValueError when it names neither an image ID nor a repo digest."""
    data = json.loads(text)
    if isinstance(data, list):
        if len(data) != 1:
            raise ValueError(f"expected one container in the crictl inspect answer, found {len(data)}")
        data = data[0]
    status = data.get("status") if isinstance(data, dict) else None
    if not isinstance(status, dict):
        raise ValueError("no `status` in the crictl inspect answer")
    info = data.get("info") if isinstance(data.get("info"), dict) else {}
    config = info.get("config") if isinstance(info.get("config"), dict) else {}
    named = [_str_at(status, "imageId"), _str_at(status, "imageRef"), _str_at(config, "image", "image")]
    image_id = next((x for x in named if x and _IMAGE_ID.match(x)), None)
    ref = _str_at(status, "imageRef")
    digest = ref if ref and "@sha256:" in ref else None
    refs = [_str_at(status, "image", "image"), _str_at(config, "image", "image")]
    reference = next((x for x in refs if x and not _IMAGE_ID.match(x)), None)
    if image_id is None and digest is None:
        raise ValueError("neither an image ID nor a repo digest in the crictl inspect answer "
                         "(status.imageId, status.imageRef, info.config.image.image)")
    return image_id, digest, reference


def _str_at(data: dict[str, Any], *keys: str) -> str | None:
    for key in keys[:-1]:
        data = data.get(key) if isinstance(data.get(key), dict) else {}
    value = data.get(keys[-1])
    return value if isinstance(value, str) and value else None


def _digest_part(reference: str) -> str:
    return reference.rsplit("@", 1)[-1].lower()


def same_running_image(image_id: str | None, repo_digest: str | None, judged_id: str,
                       judged_repo_digests: list[str]) -> bool | None:
    """Whether the container runs the judged image: True when its image ID is the judged image's ID, or its repo
    digest is one the judged image was pulled by (RepoDigests; or its ID, which docker's containerd image store
    makes the index digest); False when its image ID differs, or (with no ID to compare) its repo digest is none of
    the judged image's RepoDigests (another manifest: another image); None when there is nothing to compare with
    (a repo digest only, and the judged image has no RepoDigests: built or loaded locally)."""
    if image_id and same_image_id(image_id, judged_id):
        return True
    judged = {_digest_part(d) for d in judged_repo_digests if "@" in d}
    if repo_digest and (_digest_part(repo_digest) in judged or same_image_id(_digest_part(repo_digest), judged_id)):
        return True
    if image_id:
        return False
    if repo_digest and judged:
        return False
    return None


@dataclass(frozen=True)
class RunningContainer:
    """The container of the serving process as the node read it (live_process evidence, key `container`)."""
    id: str | None
    engine: str | None
    image_id: str | None
    image_ref: str | None
    reason: str | None          # why the image is not known (no container, no CLI, inspect failed)
    image_digest: str | None = None     # repo digest (crictl's `repo@sha256:` imageRef) when no image ID is known

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def running_container(text: str) -> RunningContainer | None:
    """The `container` of a live_process evidence record; None when the record holds no process (then nothing is
    known about a container either) or predates the container read (the node script did not record one)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not data.get("pid") or "container" not in data:
        return None
    return _container_record(data)


def headless_container(text: str) -> RunningContainer | None:
    """The container of a multi-node worker's headless vLLM (live_process evidence, key `headless`: no process
    listens on the port there); None when the node named none."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    worker = data.get("headless") if isinstance(data, dict) else None
    if not isinstance(worker, dict) or not worker.get("pid") or "container" not in worker:
        return None
    return _container_record(worker)


def _container_record(data: dict[str, Any]) -> RunningContainer:
    """The RunningContainer of one process record (its `container` and `container_reason`)."""
    box = data.get("container")
    if not isinstance(box, dict) or not box.get("id"):
        return RunningContainer(None, None, None, None,
                                str(data.get("container_reason") or "no container id in /proc/PID/cgroup"))
    image_id = box.get("image_id") if isinstance(box.get("image_id"), str) and box.get("image_id") else None
    digest = box.get("image_digest") if isinstance(box.get("image_digest"), str) and box.get("image_digest") else None
    reason = None if image_id or digest else str(box.get("inspect_error") or "the container's image was not read")
    return RunningContainer(str(box["id"]), box.get("engine") or box.get("inspected_with"), image_id,
                            box.get("image_ref"), reason, digest)
