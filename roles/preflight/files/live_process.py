"""On a GPU node (stock python3, nothing installed): the process listening on the server's TCP port, its argv
and environment from /proc/PID/{cmdline,environ}, as one JSON object on stdout. No listener here, or one of
another user's processes (`ss` shows no pid then), is stated with pid null, never guessed. Values of
secret-looking variables are dropped here already; the controller redacts again before saving
(preflight/stage.py, core/redact.py). The container it runs in: the id from /proc/PID/cgroup and the image
that container runs, read with the docker or podman CLI (`inspect --type container`: Image, Config.Image) or,
for containerd and CRI-O (Kubernetes pods), with crictl (`crictl inspect`: status.imageId/imageRef, the image
ID or a repo digest; status.image.image, the reference), or why not (issue 28 item 3; rules/image.py compares
it with the judged image; docs/sources.md#crictl-inspect).
A multi-node worker serves no port (`--headless`): where nothing listens, the vLLM process started with
`--headless` is named under `headless` (its pid, argv and container), `pid` staying null, so that
compat.image_uniform compares the images the workers run with the head's.
On a Kubernetes node with containerd or CRI-O and no docker/podman (issue 42 item 5), the preflight runs the image
probe inside the running server's container with the same script:
`python3 -c "$(cat live_process.py)" exec PORT -- ARGV...` finds the process serving PORT (or the headless vLLM
worker), its container from /proc/PID/cgroup, and runs `crictl exec CONTAINER ARGV...` (docs/sources.md#crictl-node),
its output and exit status passed through; a process in no CRI container, or no crictl, exits 3 saying why.
A listener whose pid `ss` hides (another user's process: a docker-group user attached to a root container) is
read through the pid or the container the operator named (vllm_serve_pid, vllm_serve_attach_container), never
guessed; `pid_from` says which. The node's own addresses (`addresses`: /proc/net/fib_trie, /proc/net/if_inet6)
and its network namespace (`netns`: boot id and /proc/self/ns/net inode) let the controller bind the URL's host
to this node (rules/live_server.py; issue 42 item 3).
Usage: python3 -c "$(cat live_process.py)" PORT [PID] [CONTAINER]
       python3 -c "$(cat live_process.py)" exec PORT -- ARGV..."""

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys

SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|(^|_)KEY$|API_?KEY|AUTH", re.IGNORECASE)


def listening(ss, port):
    """The LISTEN lines of `ss -ltnp` output (header or not) on `port`, and their pids (none for another
    user's process)."""
    lines = [line.strip() for line in ss.splitlines()
             if len(line.split()) > 3 and line.split()[0] == "LISTEN" and line.split()[3].rsplit(":", 1)[-1] == str(port)]
    return lines, sorted({int(p) for line in lines for p in re.findall(r"pid=(\d+)", line)})


# A copy of parsers/live.py CGROUP_PATTERNS (this script runs on stock python3 without the package);
# tests/unit/test_live_container.py feeds both the same real captures (docs/sources.md#cgroup-container-id).
HEX64 = r"([0-9a-f]{64})"
CGROUP_PATTERNS = (
    (r"docker-" + HEX64 + r"\.scope", "docker"),
    (r"/docker/" + HEX64 + r"(?=/|$)", "docker"),
    (r"cri-containerd[-:]" + HEX64, "containerd"),
    (r"crio-" + HEX64, "crio"),
    (r"libpod-(?:payload-)?" + HEX64, "podman"),
    (r"/" + HEX64 + r"(?=/|$)", None),
)


def cgroup_container(text):
    """(engine, id, line) of the innermost container /proc/PID/cgroup names; the `0::` line first, else the
    first line naming one; (None, None, None) for a host process."""
    found = []
    for raw in text.splitlines():
        line = raw.strip()
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        best = None
        for pattern, engine in CGROUP_PATTERNS:
            for match in re.finditer(pattern, parts[2]):
                key = (match.end(1), 1 if engine else 0, engine, match.group(1))
                if best is None or key[:2] > best[:2]:
                    best = key
        if best is not None:
            found.append((0 if parts[0] == "0" and parts[1] == "" else 1, len(found), best[2], best[3], line))
    if not found:
        return None, None, None
    first = min(found)
    return first[2], first[3], first[4]


def container_image(text):
    """(image id, reference) of `docker|podman inspect --type container` JSON; ValueError when unreadable."""
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


# A copy of parsers/live.py crictl_image (docs/sources.md#crictl-inspect); the same real captures feed both.
IMAGE_ID = re.compile(r"^(?:sha256:)?[0-9a-f]{64}$")


def str_at(data, *keys):
    for key in keys[:-1]:
        data = data.get(key) if isinstance(data.get(key), dict) else {}
    value = data.get(keys[-1])
    return value if isinstance(value, str) and value else None


def crictl_image(text):
    """(image ID, repo digest, reference) of `crictl inspect` JSON; ValueError when it names neither an ID nor a
    repo digest."""
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
    named = [str_at(status, "imageId"), str_at(status, "imageRef"), str_at(config, "image", "image")]
    image_id = next((x for x in named if x and IMAGE_ID.match(x)), None)
    ref = str_at(status, "imageRef")
    digest = ref if ref and "@sha256:" in ref else None
    refs = [str_at(status, "image", "image"), str_at(config, "image", "image")]
    reference = next((x for x in refs if x and not IMAGE_ID.match(x)), None)
    if image_id is None and digest is None:
        raise ValueError("neither an image ID nor a repo digest in the crictl inspect answer "
                         "(status.imageId, status.imageRef, info.config.image.image)")
    return image_id, digest, reference


CLIS = {"docker": ["docker"], "podman": ["podman"], "containerd": ["crictl"], "crio": ["crictl"],
        None: ["docker", "podman", "crictl"]}


def inspect_with(cli, cid, run):
    """(answer, None) or (None, why) of one CLI's inspect of the container."""
    argv = ["crictl", "inspect", "-o", "json", cid] if cli == "crictl" else [cli, "inspect", "--type", "container", cid]
    try:
        done = run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{' '.join(argv[:2])} failed: {exc}"
    if done.returncode != 0:
        return None, f"{' '.join(argv[:-1])} rc {done.returncode}: {done.stderr.strip()[:300]}"
    try:
        if cli == "crictl":
            image_id, digest, image_ref = crictl_image(done.stdout)
            return {"inspected_with": cli, "image_id": image_id, "image_digest": digest, "image_ref": image_ref}, None
        image_id, image_ref = container_image(done.stdout)
    except ValueError as exc:
        return None, f"{cli} inspect answer unreadable: {exc}"
    return {"inspected_with": cli, "image_id": image_id, "image_ref": image_ref}, None


def inspect_container(engine, cid, which=shutil.which, run=subprocess.run):
    """What the container runs, read with its runtime's CLI (docker, podman; crictl for containerd and CRI-O;
    for a bare id whichever of them is here answers), or the reasons it could not be read. Never guessed."""
    clis = CLIS.get(engine)
    if not clis:
        return {"inspect_error": f"{engine} has no CLI this script uses (docker, podman or crictl) to read "
                                 "the container's image"}
    tried = []
    for cli in clis:
        if not which(cli):
            tried.append(f"{cli} not on PATH")
            continue
        answer, why = inspect_with(cli, cid, run)
        if answer is not None:
            return answer
        tried.append(why)
    return {"inspect_error": "; ".join(tried)}


def container_of(pid, proc="/proc", which=shutil.which, run=subprocess.run):
    """(container, reason): the container record of the process, or None and why (a host process)."""
    try:
        with open(f"{proc}/{pid}/cgroup") as handle:
            text = handle.read()
    except OSError as exc:
        return None, f"cannot read {proc}/{pid}/cgroup: {exc}"
    engine, cid, line = cgroup_container(text)
    if cid is None:
        first = text.strip().splitlines()[0] if text.strip() else "(empty)"
        return None, f"no container id in {proc}/{pid}/cgroup ({first.strip()}): a host process"
    box = {"id": cid, "engine": engine, "cgroup_line": line}
    box.update(inspect_container(engine, cid, which, run))
    return box, None


def headless_worker(proc="/proc", which=shutil.which, run=subprocess.run):
    """The vLLM process of a multi-node worker (`--headless`: no API server, no port) on this node, with its
    container, or None. The lowest pid: the process the runtime started, not one of its engine children."""
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        return None
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as handle:
                argv = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
        except OSError:
            continue
        if "--headless" in argv and any("vllm" in part for part in argv):
            container, why = container_of(pid, proc, which, run)
            return {"pid": pid, "argv": argv, "container": container, "container_reason": why,
                    "source": f"/proc/{pid}/cmdline, /proc/{pid}/cgroup"}
    return None


def from_ss(stdout, returncode, stderr, port):
    """(answer, listener lines) as far as `ss` tells it; with a pid, main reads its /proc and completes it."""
    lines, pids = listening(stdout, port)
    if returncode != 0 and not lines:   # no answer is not "nobody listens"
        return {"port": port, "pid": None, "reason": f"ss -ltnpH failed (rc {returncode}): {stderr.strip()[:300]}"}, []
    if not lines:
        return {"port": port, "pid": None, "reason": f"no process listens on port {port} on this node"}, []
    if not pids:
        return {"port": port, "pid": None, "listeners": lines,
                "reason": f"a process listens on port {port} but ss shows no pid (another user's): read it as "
                          "that user or with become"}, lines
    return {"port": port, "pid": pids[0], "listeners": lines}, lines


def local_addresses(proc="/proc"):
    """The addresses of this node's own network namespace: IPv4 from /proc/net/fib_trie (each `/32 host LOCAL`
    leaf, the address on the `|--` line above it), IPv6 from /proc/net/if_inet6 (32 hex digits a line)."""
    found = set()
    try:
        with open(f"{proc}/net/fib_trie") as handle:
            leaf = None
            for line in handle:
                text = line.strip()
                if text.startswith("|--"):
                    leaf = text[3:].strip()
                elif text.startswith("/32 host LOCAL") and leaf:
                    found.add(leaf)
    except OSError:
        pass
    try:
        with open(f"{proc}/net/if_inet6") as handle:
            for line in handle:
                if line.split() and len(line.split()[0]) == 32:
                    found.add(str(ipaddress.IPv6Address(int(line.split()[0], 16))))
    except (OSError, ValueError):
        pass
    return sorted(found)


def netns_identity(proc="/proc"):
    """`<boot id>:<inode of /proc/self/ns/net>`: equal on two readers only inside one network namespace of one
    booted machine (where 127.0.0.1 is the same listener); None when unreadable."""
    try:
        with open(f"{proc}/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
        return f"{boot}:{os.stat(f'{proc}/self/ns/net').st_ino}"
    except OSError:
        return None


def container_pid(name, which=shutil.which, run=subprocess.run):
    """(pid, None) of the named container's main process (`docker|podman inspect --type container`: State.Pid),
    or (None, why)."""
    tried = []
    for cli in ("docker", "podman"):
        if not which(cli):
            tried.append(f"{cli} not on PATH")
            continue
        try:
            done = run([cli, "inspect", "--type", "container", name], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as exc:
            tried.append(f"{cli} inspect failed: {exc}")
            continue
        if done.returncode != 0:
            tried.append(f"{cli} inspect --type container rc {done.returncode}: {done.stderr.strip()[:300]}")
            continue
        try:
            data = json.loads(done.stdout)
            data = data[0] if isinstance(data, list) and len(data) == 1 else data
            pid = data["State"]["Pid"]
        except (ValueError, KeyError, TypeError, IndexError):
            tried.append(f"{cli} inspect answer names no State.Pid")
            continue
        if isinstance(pid, int) and pid > 0:
            return pid, None
        tried.append(f"{cli} says container {name} runs no process (State.Pid {pid})")
    return None, "; ".join(tried)


def named_pid(told, pid_hint, container_hint, which=shutil.which, run=subprocess.run):
    """A listener ss shows without its pid: the pid the operator named, else the named container's, with
    `pid_from` saying so; `told` unchanged (with why) when neither is given or the container is not found."""
    if pid_hint:
        return {**told, "pid": int(pid_hint), "pid_from": f"vllm_serve_pid {int(pid_hint)}"}
    if container_hint:
        pid, why = container_pid(container_hint, which, run)
        if pid is not None:
            return {**told, "pid": pid, "pid_from": f"vllm_serve_attach_container {container_hint} (State.Pid)"}
        return {**told, "reason": f"{told['reason']}; the named container {container_hint}: {why}"}
    return told


def main(port, pid_hint=None, container_hint=None):
    here = {"addresses": local_addresses(), "netns": netns_identity()}
    return {**read_server(port, pid_hint, container_hint), **here}


def read_server(port, pid_hint=None, container_hint=None):
    try:
        ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"port": port, "pid": None, "reason": f"ss -ltnpH failed: {exc}"}
    told, lines = from_ss(ss.stdout, ss.returncode, ss.stderr, port)
    if told["pid"] is None and lines:
        told = named_pid(told, pid_hint, container_hint)
    if told["pid"] is None:
        if not lines:      # nobody listens: a multi-node worker's headless vLLM, if one runs here
            worker = headless_worker()
            if worker is not None:
                told["headless"] = worker
        return told
    pid = told["pid"]
    named = {"pid_from": told["pid_from"]} if told.get("pid_from") else {}
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError as exc:
        return {"port": port, "pid": None, "listeners": lines, "reason": f"cannot read /proc/{pid}/cmdline: {exc}"}
    env, notes = {}, []
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            for part in handle.read().split(b"\0"):
                name, sep, value = part.decode(errors="replace").partition("=")
                if sep and name:
                    env[name] = "<redacted>" if SECRET.search(name) else value
    except OSError as exc:
        notes.append(f"environment not readable: {exc}")
    container, why = container_of(pid)
    return {**named, "port": port, "pid": pid, "argv": argv, "env": env, "listeners": lines, "notes": notes,
            "container": container, "container_reason": why,
            "source": f"ss -ltnpH; /proc/{pid}/cmdline, /proc/{pid}/environ, /proc/{pid}/cgroup"}


CRI_ENGINES = ("containerd", "crio")


def served_by(port, ss_run=subprocess.run, proc="/proc", which=shutil.which, run=subprocess.run):
    """(pid, container, why): the process serving `port` on this node (else the headless vLLM worker) and the
    container /proc/PID/cgroup names; pid None and why when there is none to be seen."""
    try:
        ss = ss_run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, None, f"ss -ltnpH failed: {exc}"
    told, lines = from_ss(ss.stdout, ss.returncode, ss.stderr, port)
    if told["pid"] is None:
        worker = headless_worker(proc, which, run) if not lines else None
        if worker is None:
            return None, None, told["reason"]
        return worker["pid"], worker["container"], worker["container_reason"]
    container, why = container_of(told["pid"], proc, which, run)
    return told["pid"], container, why


def cri_exec_argv(container, argv, which=shutil.which):
    """(`crictl exec ID ARGV...`, None), or (None, why not): only a containerd or CRI-O container (or a bare id on a
    node with crictl) is entered, with crictl; anything else is said, never run elsewhere."""
    if container is None:
        return None, "the server runs in no container"
    engine = container.get("engine")
    if engine not in CRI_ENGINES + (None,):
        return None, (f"the server's container is a {engine} container: its own CLI runs the probe, not crictl")
    if not which("crictl"):
        return None, "crictl not on PATH"
    return ["crictl", "exec", container["id"], *argv], None


def exec_in_server_container(port, argv, ss_run=subprocess.run, proc="/proc", which=shutil.which,
                             run=subprocess.run):
    """Run `argv` in the container of the server on `port` with crictl: (rc, stdout, stderr)."""
    pid, container, why = served_by(port, ss_run, proc, which, run)
    if pid is None:
        return 3, "", f"no server process to enter on port {port}: {why}\n"
    command, why_not = cri_exec_argv(container, argv, which)
    if command is None:
        return 3, "", f"cannot enter the container of pid {pid}: {why_not or why}\n"
    try:
        done = run(command, capture_output=True, text=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return 3, "", f"{' '.join(command[:3])} failed: {exc}\n"
    return done.returncode, done.stdout, done.stderr


if __name__ == "__main__":
    if sys.argv[1:2] == ["exec"]:
        rest = sys.argv[3:]
        rc, out, err = exec_in_server_container(int(sys.argv[2]), rest[1:] if rest[:1] == ["--"] else rest)
        sys.stdout.write(out)
        sys.stderr.write(err)
        sys.exit(rc)
    hints = [(sys.argv[i] if len(sys.argv) > i and sys.argv[i] else None) for i in (2, 3)]   # pid, container
    print(json.dumps(main(int(sys.argv[1]), *hints), indent=1, sort_keys=True))
