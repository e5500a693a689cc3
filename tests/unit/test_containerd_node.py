"""A Kubernetes node with containerd or CRI-O and no docker/podman (issue 42 item 5): the preflight reads the
runtime, the image and the in-image probe with crictl, from the running server's container.

The node script runs a command's `fallback` where the command's own program is absent and the fallback's is there
(roles/preflight/templates/node_script.sh.j2, rendered by Ansible's own templar and run by /bin/sh); the commands
ask for crictl (commands.yml.j2); the probe is run in the container serving the port (live_process.py `exec`, on the
real `ss` and /proc/PID/cgroup captures of tests/fixtures/real/ss and cgroup); the parsers read crictl's answers
(real captures in tests/fixtures/real/image-inspect/crictl-inspecti-*.json and container-runtime/)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from test_imex_channel import _jinja
from test_preflight_judge import MARKER, _run_script

from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.parsers.container import parse_image_inspect, parse_runtime_info, parse_runtime_version
from vllm_acceptance.preflight.stage import judge, split_stream

from nodefixtures import _write, build_evidence

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
SCRIPT = ROOT / "roles" / "preflight" / "files" / "live_process.py"
PROBE = (ROOT / "roles" / "preflight" / "files" / "probe.py").read_text()


# --- the node script: the fallback runs where the program is absent ------------------------------------------

def test_a_command_whose_program_is_absent_runs_its_fallback_under_the_same_name() -> None:
    records, finished = split_stream(_run_script([
        {"name": "image_inspect", "argv": ["no-such-docker", "image", "inspect", "img"],
         "fallback": {"needs": "sh", "argv": ["sh", "-c", "echo from-crictl"]}},
        {"name": "runtime_info", "argv": ["echo", "from-docker"],
         "fallback": {"needs": "sh", "argv": ["sh", "-c", "echo from-crictl"]}},
        {"name": "runtime_version", "argv": ["no-such-docker", "version"],
         "fallback": {"needs": "no-such-crictl", "argv": ["no-such-crictl", "version"]}},
        {"name": "image_probe", "argv": ["no-such-docker", "run"],
         "fallback": {"needs": "sh", "shown": ["crictl", "exec", "<the container serving :8000>", "<probe.py>"],
                      "argv": ["sh", "-c", "echo probed"]}}]), MARKER)
    got = {r.name: r for r in records}
    assert finished and list(got) == ["image_inspect", "runtime_info", "runtime_version", "image_probe"]
    assert got["image_inspect"].stdout == "from-crictl\n" and got["image_inspect"].rc == 0
    assert got["image_inspect"].cmd == ["sh", "-c", "echo from-crictl"]          # the meta says what ran
    assert got["runtime_info"].stdout == "from-docker\n"                           # the program is there: itself
    assert got["runtime_version"].missing and "no-such-docker: command not found" in got["runtime_version"].stderr
    assert got["image_probe"].stdout == "probed\n"
    assert got["image_probe"].cmd == ["crictl", "exec", "<the container serving :8000>", "<probe.py>"]


# --- the commands ask for crictl -------------------------------------------------------------------------------

def render(runtime: str, live_port: int | None) -> dict[str, dict[str, Any]]:
    env = _jinja(jinja2.FileSystemLoader(str(ROOT / "roles/preflight/templates")))
    env.globals["lookup"] = lambda kind, name: (ROOT / "roles/preflight/files" / name).read_text()
    text = env.get_template("commands.yml.j2").render(
        preflight_container_runtime=runtime, preflight_pull_image=False, preflight_gpu_checks=True,
        preflight_nvswitch=False, preflight_mnnvl=False, preflight_multinode=False,
        preflight_image="vllm/vllm-openai:kimi-k3", preflight_json_format="{{json .}}",
        preflight_probe_timeout_s=900, preflight_driver_version_file="/v", preflight_nccl_test=False,
        preflight_inputs={}, preflight_secrets=[], ansible_check_mode=False, preflight_runtime_python="python3",
        preflight_live_port=live_port)
    return {c["name"]: c for c in yaml.safe_load(text.split("- name: inputs")[0])}


def test_attached_on_a_node_without_docker_the_probe_runs_in_the_servers_container() -> None:
    commands = render("docker", 8000)
    assert commands["runtime_version"]["fallback"] == {"needs": "crictl", "argv": ["crictl", "version"]}
    assert commands["runtime_info"]["fallback"]["argv"] == ["crictl", "info"]
    assert commands["image_inspect"]["fallback"]["argv"] == ["crictl", "inspecti", "-o", "json",
                                                             "vllm/vllm-openai:kimi-k3"]
    probe = commands["image_probe"]
    assert probe["argv"][:2] == ["docker", "run"]                # docker first, where there is one
    fallback = probe["fallback"]
    assert fallback["needs"] == "crictl"
    assert fallback["argv"][:2] == ["python3", "-c"] and fallback["argv"][2] == SCRIPT.read_text()
    assert fallback["argv"][3:] == ["exec", "8000", "--", "python3", "-c", PROBE]
    assert fallback["shown"] == ["crictl", "exec", "<the container serving :8000>", "python3", "-c", "<probe.py>"]


def test_without_a_running_server_there_is_no_container_to_probe() -> None:
    commands = render("podman", None)
    assert "fallback" not in commands["image_probe"]
    assert commands["image_inspect"]["fallback"]["argv"][:2] == ["crictl", "inspecti"]


# --- live_process.py exec: the container serving the port, entered with crictl ---------------------------------

def node_script() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "live_process"}
    exec(compile(SCRIPT.read_text(), "live_process.py", "exec"), namespace)  # noqa: S102
    return namespace


class Node:
    """A node's ss, /proc and CLIs: the real `ss -ltnpH` capture (pid 3285 serving :8001), a /proc/3285/cgroup
    from a real capture, and the CLIs on PATH; every command run is recorded."""

    def __init__(self, tmp_path: Path, cgroup: str, clis: tuple[str, ...] = ("crictl",)) -> None:
        self.proc = tmp_path / "proc"
        (self.proc / "3285").mkdir(parents=True)
        (self.proc / "3285" / "cgroup").write_text((REAL / "cgroup" / cgroup).read_text())
        self.clis, self.ran = clis, []

    def ss(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, (REAL / "ss" / "vllm-serve-8001.txt").read_text(), "")

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.clis else None

    def run(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.ran.append(argv)
        if argv[:2] == ["crictl", "exec"]:
            return subprocess.CompletedProcess(argv, 0, '{"cuda_available": true}\n', "")
        return subprocess.CompletedProcess(argv, 1, "", "FATA[0000] not found")

    def exec(self, port: int, argv: list[str]) -> tuple[int, str, str]:
        return node_script()["exec_in_server_container"](port, argv, ss_run=self.ss, proc=str(self.proc),
                                                         which=self.which, run=self.run)


@pytest.mark.parametrize(("cgroup", "cid"), [
    ("neuvector-containerd-1.4.4-colon.txt", "d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e"),
    ("neuvector-crio-1.19.txt", "d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607"),
])
def test_the_probe_runs_in_the_pod_container_serving_the_port(tmp_path: Path, cgroup: str, cid: str) -> None:
    node = Node(tmp_path, cgroup)
    rc, out, err = node.exec(8001, ["python3", "-c", "PROBE"])
    assert (rc, out, err) == (0, '{"cuda_available": true}\n', "")
    assert ["crictl", "exec", cid, "python3", "-c", "PROBE"] in node.ran


def test_a_docker_container_or_no_crictl_or_no_server_is_said_never_run_elsewhere(tmp_path: Path) -> None:
    docker = Node(tmp_path / "a", "neuvector-centos-systemd-docker.txt", clis=("crictl", "docker"))
    rc, _, err = docker.exec(8001, ["python3"])
    assert rc == 3 and "docker container" in err and not any(a[:2] == ["crictl", "exec"] for a in docker.ran)
    no_crictl = Node(tmp_path / "b", "neuvector-containerd-1.4.4-colon.txt", clis=())
    rc, _, err = no_crictl.exec(8001, ["python3"])
    assert rc == 3 and "crictl not on PATH" in err
    host = Node(tmp_path / "c", "neuvector-host-process.txt")
    rc, _, err = host.exec(8001, ["python3"])
    assert rc == 3 and "runs in no container" in err
    rc, _, err = Node(tmp_path / "d", "neuvector-containerd-1.4.4-colon.txt").exec(9999, ["python3"])
    assert rc == 3 and "no process listens on port 9999" in err


# --- crictl's answers read by the same parsers -----------------------------------------------------------------

def test_crictl_inspecti_is_read_as_the_image_inspect() -> None:
    image = parse_image_inspect((REAL / "image-inspect" / "crictl-inspecti-cri-containerd-2017-nginx.json")
                                .read_text())
    assert image.id == "sha256:f895b3fb9e3032cddf68d798ce00c46be433e15285c99b12d51c1b1ae7671334"
    assert image.repo_digests == [
        "docker.io/library/nginx@sha256:c319c3d05d7e00ace3c90d0829d9a4f35bf3adaf0f7134f31fd599edeefe9a08"]
    assert image.env["NGINX_VERSION"] == "1.13.7-1~stretch" and image.architecture == "amd64"
    assert not image.errors
    crio = parse_image_inspect((REAL / "image-inspect" / "crictl-inspecti-crio-2020-busybox.json").read_text())
    assert crio.id and crio.env == {} and "no info.imageSpec" in crio.errors[0]


def test_crictl_info_and_version_are_read_as_the_runtime() -> None:
    version = parse_runtime_version((REAL / "container-runtime" / "crictl-version-containerd-1.4.8.txt").read_text())
    assert (version.client_version, version.server_version) == ("0.1.0", "containerd 1.4.8")
    info = parse_runtime_info((REAL / "container-runtime" / "crictl-info-crio-minikube-2020.json").read_text())
    assert info.errors == []
    down = json.loads((REAL / "container-runtime" / "crictl-info-crio-minikube-2020.json").read_text())
    down["status"]["conditions"][0].update(status=False, reason="NotReady")
    assert parse_runtime_info(json.dumps(down)).errors == ["runtime not ready: NotReady"]


# --- the rehearsal's crictl stand-in answers what the preflight asks ---------------------------------------------

STANDIN = ROOT / "src" / "vllm_acceptance" / "lab" / "crictl_standin.py"
RECORDED_DOCKER = ROOT / "tests" / "fixtures" / "generated-nodes" / "good" / "bin" / "docker"
CID = "4f" * 32


@pytest.fixture
def pod(tmp_path: Path):
    """A running process as a pod container's (its own environment and working directory), and the CRI record
    the rehearsal writes for it (the real containerd capture with this id, image and pid put in)."""
    workdir = tmp_path / "app"
    workdir.mkdir()
    proc = subprocess.Popen(["sleep", "60"], cwd=workdir, env={"PATH": "/usr/bin:/bin", "POD_MARK": "in-the-pod"})
    record = json.loads((REAL / "container-inspect" / "crictl-inspect-containerd-1.7.json").read_text())
    record["status"].update(id=CID, image={"annotations": {}, "image": "vllm/vllm-openai:kimi-k3"})
    record["info"]["pid"] = proc.pid
    (tmp_path / "state" / "cri").mkdir(parents=True)
    (tmp_path / "state" / "cri" / f"{CID}.json").write_text(json.dumps(record))
    yield tmp_path / "state", workdir
    proc.kill()
    proc.wait()


def crictl(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/usr/bin/python3", str(STANDIN), "--state", str(state), "--recorded",
                           str(RECORDED_DOCKER), "--", *args], capture_output=True, text=True, timeout=60)


def test_the_standin_execs_in_the_containers_process_context(pod: tuple[Path, Path]) -> None:
    state, workdir = pod
    done = crictl(state, "exec", CID[:13], "sh", "-c", 'echo "$POD_MARK $(pwd)"')
    assert done.returncode == 0 and done.stdout == f"in-the-pod {workdir}\n"
    probe = crictl(state, "exec", CID, "python3", "-c", PROBE)       # the GPU image's recorded facts
    answer = json.loads(probe.stdout)
    assert probe.returncode == 0 and answer["cuda_available"] is True and answer["imex_channels"] is None
    missing = crictl(state, "exec", "0123456789ab", "true")
    assert missing.returncode == 1 and "NotFound" in missing.stderr
    calls = [json.loads(line)["argv"] for line in (state / "crictl-calls.jsonl").read_text().splitlines()]
    assert calls[0][:3] == ["crictl", "exec", CID[:13]]


def test_the_standin_answers_inspecti_version_and_info_as_crictl(pod: tuple[Path, Path]) -> None:
    state, _ = pod
    recorded = json.loads(subprocess.run([str(RECORDED_DOCKER), "image", "inspect", "vllm/vllm-openai:kimi-k3"],
                                         capture_output=True, text=True).stdout)[0]
    image = parse_image_inspect(crictl(state, "inspecti", "-o", "json", "vllm/vllm-openai:kimi-k3").stdout)
    assert image.id == recorded["Id"] and not image.errors
    assert image.repo_tags == ["docker.io/vllm/vllm-openai:kimi-k3"]
    assert [d.split("@")[1] for d in image.repo_digests] == [d.split("@")[1] for d in recorded["RepoDigests"]]
    assert image.cuda_version == parse_image_inspect(json.dumps([recorded])).cuda_version
    assert crictl(state, "inspecti", "ghcr.io/nobody/none:1").returncode == 1
    assert parse_runtime_version(crictl(state, "version").stdout).server_version == "containerd 1.4.8"
    assert parse_runtime_info(crictl(state, "info").stdout).errors == []


# --- judged: a containerd node without docker releases its compat checks on crictl's evidence -----------------

def containerd_node(tmp_path: Path, pod: tuple[Path, Path], *, with_crictl: bool) -> list[Any]:
    """The good node's evidence, attached to a server in a pod on a node without docker: the docker records say
    `command not found`; with crictl, runtime_version/runtime_info/image_inspect are crictl's answers (the rehearsal's
    stand-in over the node's recorded image) and the probe ran in the server's container."""
    state, _ = pod
    base = build_evidence("good", tmp_path, host="gpu-01")
    image = "vllm/vllm-openai:kimi-k3"
    if with_crictl:
        for name, argv in (("runtime_version", ["version"]), ("runtime_info", ["info"]),
                           ("image_inspect", ["inspecti", "-o", "json", image])):
            done = crictl(state, *argv)
            _write(base, name, done.stdout, done.returncode)
    else:
        for name in ("runtime_version", "runtime_info", "image_inspect", "image_probe"):
            _write(base, name, "", 127, "docker: command not found", missing=True)
    image_id = parse_image_inspect(crictl(state, "inspecti", image).stdout).id
    container = {"id": CID, "engine": "containerd", "cgroup_line": f"0::/kubepods.slice/cri-containerd-{CID}.scope",
                 "inspected_with": "crictl", "image_id": image_id, "image_digest": None, "image_ref": image}
    record = {"port": 8000, "pid": 4242, "argv": ["vllm", "serve"], "env": {}, "notes": [],
              "listeners": ['LISTEN 0 2048 0.0.0.0:8000 0.0.0.0:* users:(("vllm",pid=4242,fd=3))'],
              "container": container, "container_reason": None, "source": "ss -ltnpH; /proc/4242"}
    _write(base, "live_process", json.dumps(record), 0)
    kimi = load_profile(ROOT / "profiles" / "kimi-k3.yml")
    return judge(tmp_path, kimi, ["gpu-01"], today=dt.date(2026, 9, 1))


def test_a_containerd_node_without_docker_is_judged_on_crictls_evidence(tmp_path: Path,
                                                                        pod: tuple[Path, Path]) -> None:
    """Issue 42: on a node with containerd only, image identity, CUDA in the image and the snapshot stayed missing
    (docker/podman only). With crictl's answers and the probe run in the server's container they are judged."""
    def by_check(findings: list[Any]) -> dict[str, Any]:
        return {f.check: f for f in findings if f.host == "gpu-01"}

    without = by_check(containerd_node(tmp_path / "docker-only", pod, with_crictl=False))
    assert without["compat.image_identity"].status.value == "missing"
    assert without["compat.state_snapshot"].status.value == "missing"
    with_crictl = by_check(containerd_node(tmp_path / "crictl", pod, with_crictl=True))
    identity = with_crictl["compat.image_identity"]
    assert identity.status.value == "pass", identity.reason
    assert identity.observed["running_container"]["matches_judged_image"] is True
    assert with_crictl["compat.state_snapshot"].status.value == "pass", with_crictl["compat.state_snapshot"].reason
    judged_in_image = [f for c, f in with_crictl.items() if "image_probe" in " ".join(f.evidence or [])]
    assert judged_in_image and all(f.status.value != "missing" for f in judged_in_image)
