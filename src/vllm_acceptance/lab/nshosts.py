"""Real SSH test hosts made of network namespaces (stdlib only, root required).

Each host is a network namespace joined by a veth pair to one bridge on the controller side,
with its own address in a private /24 of 10.213.0.0/16 (on the bridge only; the namespaces get
no default route, so nothing inside can reach beyond the controller) and its own ``sshd``.
Each ``sshd`` runs under ``unshare --mount --uts`` with a per-host bin dir bind-mounted over
``/usr/local/bin``: ``/usr/local/bin`` comes first in the session PATH, so every host answers
``nvidia-smi``/``docker``/... with its own (recorded, fake) binaries. Each host also gets its
own hostname, and root's shell start-up files (~/.bashrc, ~/.profile) read as empty; the rest
of the file system, including the controller's ``/usr/bin/python3``, stays shared.

Why namespaces and not containers: there is no Docker engine here, and a namespace host with
a real sshd is exercised by Ansible exactly like a remote node (ssh, pipelining, become-less
root) at 3 hosts in ~0.2 s (docs/lab.md).

Usage::

    from vllm_acceptance.lab.nshosts import HostSpec, up
    cluster = up([HostSpec("node0", Path("fixtures/good/bin")), HostSpec("node1", None)], workdir)
    cluster.write_inventory(workdir / "inventory.yml", group="gpu_nodes")
    ...
    cluster.down()

CLI::

    python -m vllm_acceptance.lab.nshosts up --workdir DIR --count 3 [--bin-dir DIR]
    python -m vllm_acceptance.lab.nshosts down --workdir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NETWORK_PREFIX = "10.213"  # private test range; each cluster takes one /24 of it
FIRST_HOST_OCTET = 10
MAX_HOSTS = 240  # .10 .. .249 in the cluster's /24
STATE_FILE = "cluster.json"
LOCK_FILE = Path("/run/vllm-acceptance-nshosts.lock")
SSHD = "/usr/sbin/sshd"
SSH_READY_TIMEOUT_S = 15.0
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

# tool -> Debian package that provides it (named in the error so the fix is one apt-get away)
REQUIRED_TOOLS: dict[str, str] = {
    "ip": "iproute2",
    SSHD: "openssh-server",
    "ssh-keygen": "openssh-client",
    "unshare": "util-linux",
    "mount": "mount",
}


class NsHostsError(RuntimeError):
    """Set-up or tear-down of namespace hosts failed; the message says what to do."""


@dataclass(frozen=True)
class HostSpec:
    """One host to create.

    bin_dir: bind-mounted over /usr/local/bin for this host's sshd and its sessions;
        None leaves the controller's /usr/local/bin visible.
    reachable: False creates the namespace and address but starts no sshd, so SSH is refused
        (the 'node down' case for tests).
    env: variables set in every SSH session on this host (sshd ``SetEnv``).
    """

    name: str
    bin_dir: Path | None = None
    reachable: bool = True
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    netns: str
    veth: str
    bin_dir: str | None
    reachable: bool
    pid: int | None


@dataclass
class Cluster:
    workdir: Path
    octet: int
    bridge: str
    hosts: list[Host]
    ssh_key: Path
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @property
    def controller_address(self) -> str:
        return f"{NETWORK_PREFIX}.{self.octet}.1"

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def ssh_command(self, name: str, *remote: str) -> list[str]:
        """argv of a plain ``ssh`` into host ``name`` (for tests and debugging)."""
        host = self.host(name)
        return [
            "ssh",
            "-i",
            str(self.ssh_key),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "ConnectTimeout=5",
            f"root@{host.address}",
            *remote,
        ]

    def inventory_data(
        self,
        group: str = "gpu_nodes",
        extra_vars: Mapping[str, Any] | None = None,
        host_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        # Connection vars live on the group, not on `all`, so a localhost added beside this
        # group keeps its own (venv) interpreter and local connection.
        group_vars: dict[str, Any] = {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.ssh_key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": system_python(),
        }
        group_vars.update(extra_vars or {})
        hosts: dict[str, Any] = {}
        for host in self.hosts:
            hosts[host.name] = {"ansible_host": host.address, **dict((host_vars or {}).get(host.name, {}))}
        return {"all": {"children": {group: {"hosts": hosts, "vars": group_vars}}}}

    def write_inventory(
        self,
        path: Path,
        group: str = "gpu_nodes",
        extra_vars: Mapping[str, Any] | None = None,
        host_vars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> Path:
        """Write an Ansible YAML inventory for these hosts; returns ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_to_yaml(self.inventory_data(group, extra_vars, host_vars)))
        return path

    def down(self) -> None:
        """Stop every sshd and session, delete veths, namespaces and the bridge. Idempotent.

        The state file in ``workdir`` is the cluster's claim on its names: once a first ``down`` (this object's, or
        ``down --workdir`` from another process) removed it, the /24, the bridge and the namespace names are free and
        the next ``up`` anywhere on the machine takes them, so a later call does nothing rather than tear down that
        new owner's hosts.
        """
        if not self._owns_names():
            _reap(self._procs)  # our own listeners' pids stay ours until reaped: still safe to signal
            self._procs.clear()
            return
        _teardown(self.bridge, [(h.netns, h.veth, h.pid) for h in self.hosts], self._procs)
        self._procs.clear()
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / STATE_FILE).unlink()

    def _owns_names(self) -> bool:
        try:
            recorded = json.loads((self.workdir / STATE_FILE).read_text())
        except FileNotFoundError:
            return False
        except json.JSONDecodeError:
            return True  # a torn write of our own record: tear down by what this object knows
        return recorded.get("octet") == self.octet and recorded.get("bridge") == self.bridge

    def to_json(self) -> dict[str, Any]:
        return {
            "workdir": str(self.workdir),
            "octet": self.octet,
            "bridge": self.bridge,
            "ssh_key": str(self.ssh_key),
            "hosts": [asdict(h) for h in self.hosts],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Cluster:
        return cls(
            workdir=Path(data["workdir"]),
            octet=int(data["octet"]),
            bridge=str(data["bridge"]),
            hosts=[Host(**h) for h in data["hosts"]],
            ssh_key=Path(data["ssh_key"]),
        )


def system_python() -> str:
    """The controller's system python3: visible inside every host because the fs is shared.

    Not sys.executable: a venv interpreter would hide what a real node's python can do.
    """
    # Not /usr/local/bin: that path is replaced by each host's bin dir.
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    found = shutil.which("python3", path="/usr/bin:/bin")
    if found is None:
        raise NsHostsError("no system python3 in /usr/bin: install Debian package python3")
    return found


def check_environment() -> None:
    """Raise NsHostsError naming what is missing (root, tools and their Debian packages)."""
    if os.geteuid() != 0:
        raise NsHostsError("namespace hosts need root (network namespaces, veths, bind mounts): run as root")
    missing = [
        f"{tool} (apt-get install -y {package})"
        for tool, package in REQUIRED_TOOLS.items()
        if not (os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool))
    ]
    if missing:
        raise NsHostsError("missing tools for namespace hosts: " + ", ".join(missing))


def up(specs: Sequence[HostSpec], workdir: Path) -> Cluster:
    """Create one host per spec and return when every reachable host accepts SSH.

    A cluster already recorded in ``workdir`` is torn down first, so re-running is safe.
    On any failure everything created so far is removed before the error propagates.
    """
    check_environment()
    _validate(specs)
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    down(workdir)
    ssh_key = _client_key(workdir)
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation dir
    with _allocation_lock():
        octet = _free_octet()
        bridge = f"vac{octet}br"
        hosts = [
            Host(
                name=spec.name,
                address=f"{NETWORK_PREFIX}.{octet}.{FIRST_HOST_OCTET + index}",
                netns=f"vac{octet}-{index}",
                veth=f"vac{octet}h{index}",
                bin_dir=str(Path(spec.bin_dir).resolve()) if spec.bin_dir is not None else None,
                reachable=spec.reachable,
                pid=None,
            )
            for index, spec in enumerate(specs)
        ]
        cluster = Cluster(workdir, octet, bridge, hosts, ssh_key)
        # Record before creating anything, so `down --workdir` can clean up a half-built cluster.
        _save(cluster)
        try:
            _create_network(cluster)
        except BaseException:
            cluster.down()
            raise
    try:
        _start_sshds(cluster, specs)
        _wait_ready(cluster)
    except BaseException:
        cluster.down()
        raise
    _save(cluster)
    return cluster


def down(workdir: Path) -> None:
    """Tear down the cluster recorded in ``workdir`` (no-op when there is none)."""
    state = Path(workdir) / STATE_FILE
    try:
        data = json.loads(state.read_text())
    except FileNotFoundError:
        return
    except json.JSONDecodeError as exc:
        raise NsHostsError(f"{state} is not valid JSON ({exc}); remove vac* namespaces by hand") from exc
    Cluster.from_json(data).down()


def load(workdir: Path) -> Cluster:
    """The cluster recorded in ``workdir`` by ``up`` (possibly from another process)."""
    return Cluster.from_json(json.loads((Path(workdir) / STATE_FILE).read_text()))


# --- internals -------------------------------------------------------------------------------


def _validate(specs: Sequence[HostSpec]) -> None:
    if not specs:
        raise NsHostsError("no hosts requested: pass at least one HostSpec")
    if len(specs) > MAX_HOSTS:
        raise NsHostsError(f"{len(specs)} hosts requested; at most {MAX_HOSTS} fit in one /24")
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise NsHostsError(f"host names must be unique: {names}")
    for spec in specs:
        if not NAME_RE.match(spec.name):
            raise NsHostsError(f"host name {spec.name!r} must match {NAME_RE.pattern}")
        if spec.bin_dir is not None and not Path(spec.bin_dir).is_dir():
            raise NsHostsError(f"bin dir {spec.bin_dir} of host {spec.name} is not a directory")
        for key, value in spec.env.items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) or any(c in value for c in '\n"\\'):
                raise NsHostsError(f"env {key}={value!r} of host {spec.name} cannot be passed via SetEnv")


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    proc = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NsHostsError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@contextlib.contextmanager
def _allocation_lock() -> Any:
    # Concurrent `up`s (tests, benchmarks, molecule) must not pick the same /24 or bridge name.
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_octet() -> int:
    used: set[int] = set()
    addresses = _run(["ip", "-o", "-4", "addr", "show"])
    used.update(int(m) for m in re.findall(rf"{re.escape(NETWORK_PREFIX)}\.(\d+)\.", addresses))
    used.update(int(m) for m in re.findall(r"\bvac(\d+)br\b", _run(["ip", "-o", "link", "show"])))
    used.update(int(m) for m in re.findall(r"^vac(\d+)-", _run(["ip", "netns", "list"]), re.M))
    for octet in range(256):
        if octet not in used:
            return octet
    raise NsHostsError("no free /24 in 10.213.0.0/16: tear down stale clusters (ip netns list | grep vac)")


def _create_network(cluster: Cluster) -> None:
    # One `ip -batch` for the controller side and one per namespace: ~2 processes per host
    # instead of ~6 keeps 64 hosts well under a second.
    controller = [
        f"link add {cluster.bridge} type bridge",
        f"addr add {cluster.controller_address}/24 dev {cluster.bridge}",
        f"link set {cluster.bridge} up",
    ]
    for host in cluster.hosts:
        controller += [
            f"netns add {host.netns}",
            f"link add {host.veth} type veth peer name eth0 netns {host.netns}",
            f"link set {host.veth} master {cluster.bridge} up",
        ]
    _run(["ip", "-batch", "-"], "\n".join(controller) + "\n")
    inside = ["link set lo up", "link set eth0 up"]
    procs = [
        (
            host,
            subprocess.Popen(
                ["ip", "-n", host.netns, "-batch", "-"],
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for host in cluster.hosts
    ]
    errors = []
    for host, proc in procs:
        _, err = proc.communicate("\n".join([f"addr add {host.address}/24 dev eth0", *inside]) + "\n")
        if proc.returncode != 0:
            errors.append(f"{host.name}: {err.strip()}")
    if errors:
        raise NsHostsError("configuring namespace interfaces failed: " + "; ".join(errors))


def _client_key(workdir: Path) -> Path:
    key = workdir / "id_ed25519"
    if not key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vllm-acceptance-nshosts", "-f", str(key)])
    return key


def _host_dir(cluster: Cluster, host: Host) -> Path:
    return cluster.workdir / "hosts" / host.name


def _sshd_config(cluster: Cluster, host: Host, env: Mapping[str, str]) -> str:
    hdir = _host_dir(cluster, host)
    lines = [
        f"ListenAddress {host.address}",
        "Port 22",
        f"HostKey {hdir / 'ssh_host_ed25519_key'}",
        f"PidFile {hdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {cluster.ssh_key}.pub",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # No PAM (no login stack in a namespace) and no StrictModes (the workdir may be a
        # world-readable tmp dir); both are test-host-only relaxations.
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        # Ansible with forks=64 opens many connections at once; the defaults (10:30:100) drop them.
        "MaxStartups 512",
        "MaxSessions 64",
        "LogLevel INFO",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
    ]
    if env:
        lines.append("SetEnv " + " ".join(f'{k}="{v}"' for k, v in env.items()))
    return "\n".join(lines) + "\n"


def _start_sshds(cluster: Cluster, specs: Sequence[HostSpec]) -> None:
    keygens = []
    for host, spec in zip(cluster.hosts, specs, strict=True):
        hdir = _host_dir(cluster, host)
        hdir.mkdir(parents=True, exist_ok=True)
        (hdir / "sshd_config").write_text(_sshd_config(cluster, host, spec.env))
        key = hdir / "ssh_host_ed25519_key"
        for stale in (key, key.with_suffix(".pub")):
            stale.unlink(missing_ok=True)
        if host.reachable:
            keygens.append(
                subprocess.Popen(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(key)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
    for proc in keygens:
        if proc.wait() != 0:
            raise NsHostsError(f"ssh-keygen failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    known_hosts = []
    started: list[Host] = []
    for host in cluster.hosts:
        if not host.reachable:
            started.append(host)
            continue
        hdir = _host_dir(cluster, host)
        pub = (hdir / "ssh_host_ed25519_key.pub").read_text().split()
        known_hosts.append(f"{host.address} {pub[0]} {pub[1]}")
        # Each sshd gets private mount and UTS namespaces: its own /usr/local/bin (the node's
        # tools), its own hostname, and the controller's shell start-up files masked with
        # /dev/null (here ~/.bashrc runs a slow `pyenv init` in every ssh session; a node's
        # sessions must not inherit the controller user's shell set-up anyway). /root itself
        # stays visible: work dirs (molecule's) may live under it.
        # `ip netns exec` mounts a fresh sysfs on /sys (the namespace's network devices), which hides the
        # controller's cgroup mounts under it; the cgroup v2 hierarchy is mounted again at /sys/fs/cgroup, as on a
        # GPU node, so that a node's container runtime stand-in places its servers in cgroups the node reads
        # (/proc/PID/cgroup: lab/container_standin.py). Where the kernel refuses, the node simply has none.
        # `exec` chain: ip netns exec -> unshare -> sh -> sshd keep one pid, so Popen.pid is sshd.
        script = (
            'hostname "$1" || exit 97; '
            'mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || true; '
            'if [ -n "$2" ]; then mount --bind "$2" /usr/local/bin || exit 97; fi; '
            'sshd="$3" config="$4" log="$5"; shift 5; '
            'for rc in "$@"; do mount --bind /dev/null "$rc" || exit 97; done; '
            'exec "$sshd" -D -f "$config" -E "$log"'
        )
        argv = ["ip", "netns", "exec", host.netns, "unshare", "--mount", "--uts", "--propagation", "private"]
        argv += ["sh", "-c", script, "sh", host.name, host.bin_dir or "", SSHD]
        argv += [str(hdir / "sshd_config"), str(hdir / "sshd.log"), *_shell_rc_files()]
        # stderr goes to a file, not a pipe: sshd outlives the CLI process that starts it.
        with (hdir / "sshd.stderr").open("wb") as stderr:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        cluster._procs[host.name] = proc
        started.append(Host(**{**asdict(host), "pid": proc.pid}))
    cluster.hosts = started
    (cluster.workdir / "known_hosts").write_text("\n".join(known_hosts) + "\n")


def _shell_rc_files() -> list[str]:
    home = Path(os.path.expanduser("~root"))
    names = (".bashrc", ".profile", ".bash_profile", ".bash_login")
    return [str(home / name) for name in names if (home / name).is_file()]


def _wait_ready(cluster: Cluster) -> None:
    pending = {h.name: h for h in cluster.hosts if h.reachable}
    deadline = time.monotonic() + SSH_READY_TIMEOUT_S
    while pending:
        for name, host in list(pending.items()):
            proc = cluster._procs[name]
            if proc.poll() is not None:
                hdir = _host_dir(cluster, host)
                err = (hdir / "sshd.stderr").read_text() if (hdir / "sshd.stderr").exists() else ""
                detail = (hdir / "sshd.log").read_text() if (hdir / "sshd.log").exists() else ""
                raise NsHostsError(f"sshd of {name} exited {proc.returncode}: {err.strip()} {detail.strip()}")
            with socket.socket() as sock:
                sock.settimeout(0.5)
                try:
                    sock.connect((host.address, 22))
                    banner = sock.recv(64)
                except OSError:
                    continue
            if banner.startswith(b"SSH-"):
                del pending[name]
        if pending:
            if time.monotonic() > deadline:
                raise NsHostsError(f"sshd not answering after {SSH_READY_TIMEOUT_S}s on: {sorted(pending)}")
            time.sleep(0.01)


def _netns_pids(netns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _teardown(
    bridge: str, members: Iterable[tuple[str, str, int | None]], procs: Mapping[str, subprocess.Popen[bytes]]
) -> None:
    members = list(members)
    existing = set(re.findall(r"^(\S+)", _run(["ip", "netns", "list"]), re.M))
    # Kill every process inside each namespace: a namespace with live processes outlives
    # `ip netns del`, and a stray session would keep a test host alive. Sessions go first and
    # the listening sshd a moment later, so the listener can still reap its session children.
    listeners = {pid for _, _, pid in members if pid}
    pids = [pid for netns, _, _ in members if netns in existing for pid in _netns_pids(netns)]
    sessions = [pid for pid in pids if pid not in listeners]
    _kill(sessions)
    deadline = time.monotonic() + 0.5
    while sessions and time.monotonic() < deadline and any(_alive(pid) for pid in sessions):
        time.sleep(0.01)
    _kill([pid for pid in pids if pid in listeners])
    _reap(procs)
    links = set(re.findall(r"^\d+:\s+([^:@\s]+)", _run(["ip", "-o", "link", "show"]), re.M))
    # Host-side veth first (docs/lab.md): deleting it removes the peer; then the namespace.
    commands = [f"link del {veth}" for _, veth, _ in members if veth in links]
    commands += [f"netns del {netns}" for netns, _, _ in members if netns in existing]
    if bridge in links:
        commands.append(f"link del {bridge}")
    if commands:
        # -force: keep going past an entry that vanished meanwhile, so cleanup always completes.
        subprocess.run(
            ["ip", "-force", "-batch", "-"],
            input="\n".join(commands) + "\n",
            capture_output=True,
            text=True,
            check=False,
        )


def _reap(procs: Mapping[str, subprocess.Popen[bytes]]) -> None:
    """Kill and reap our own children (the listeners started in this process)."""
    for proc in procs.values():
        with contextlib.suppress(Exception):
            proc.kill()
            proc.wait(timeout=5)


def _save(cluster: Cluster) -> None:
    state = cluster.workdir / STATE_FILE
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps(cluster.to_json(), indent=2) + "\n")
    tmp.replace(state)


def _to_yaml(data: Any, indent: int = 0) -> str:
    """Minimal YAML emitter for the inventory (stdlib only): JSON scalars are valid YAML."""
    pad = "  " * indent
    if not isinstance(data, Mapping):
        raise TypeError("inventory root must be a mapping")
    out = []
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.append(f"{pad}{key}:\n{_to_yaml(value, indent + 1)}")
        elif isinstance(value, Mapping):
            out.append(f"{pad}{key}: {{}}\n")
        else:
            out.append(f"{pad}{key}: {json.dumps(value)}\n")
    return "".join(out)


# --- CLI -------------------------------------------------------------------------------------


def _specs_from_args(args: argparse.Namespace) -> list[HostSpec]:
    specs = [HostSpec(f"{args.name_prefix}{i}", args.bin_dir) for i in range(args.count)]
    for item in args.host:
        name, sep, bin_dir = item.partition("=")
        specs.append(HostSpec(name, Path(bin_dir) if sep and bin_dir else None))
    specs += [HostSpec(name, None, reachable=False) for name in args.unreachable]
    return specs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_acceptance.lab.nshosts", description=(__doc__ or "").split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="create hosts, print them as JSON and write an inventory")
    p_up.add_argument("--workdir", type=Path, required=True)
    p_up.add_argument("--count", type=int, default=0, help="hosts named PREFIX0..PREFIX<N-1>")
    p_up.add_argument("--bin-dir", type=Path, default=None, help="over /usr/local/bin on the --count hosts")
    p_up.add_argument("--name-prefix", default="node")
    p_up.add_argument(
        "--host", action="append", default=[], metavar="NAME[=BIN_DIR]", help="one more host (repeatable)"
    )
    p_up.add_argument(
        "--unreachable", action="append", default=[], metavar="NAME", help="a host without sshd (repeatable)"
    )
    p_up.add_argument("--group", default="gpu_nodes")
    p_up.add_argument("--inventory", type=Path, default=None, help="default: WORKDIR/inventory.yml")
    p_down = sub.add_parser("down", help="tear down the hosts recorded in WORKDIR")
    p_down.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "down":
            down(args.workdir)
            print(json.dumps({"down": str(args.workdir)}))
            return 0
        started = time.monotonic()
        cluster = up(_specs_from_args(args), args.workdir)
        inventory = cluster.write_inventory(args.inventory or cluster.workdir / "inventory.yml", group=args.group)
        summary = {"inventory": str(inventory), "seconds": round(time.monotonic() - started, 3)}
        print(json.dumps({**summary, **cluster.to_json()}, indent=2))
        return 0
    except NsHostsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
