"""The container the attached server runs in, and the image it runs (issue 28 item 3): the node script
(roles/preflight/files/live_process.py) reads the container id from /proc/PID/cgroup and the container's image
with the docker or podman CLI, or crictl for a Kubernetes pod (containerd, CRI-O); parsers/live.py holds the same
parsing; compat.image_identity fails when the server's container runs another image than the judged one
(rules/image.py, docs/checks.md).

Inputs are real captures (tests/fixtures/real/cgroup/, tests/fixtures/real/container-inspect/, sources beside
them and in docs/sources.md#cgroup-container-id and #crictl-inspect). The docker, podman and crictl CLIs are
stand-ins that serve a recorded answer (or fail as a CLI without access does), like the fake nvidia-smi binaries
elsewhere."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.core.redact import redact_obj
from vllm_acceptance.parsers.live import (
    container_from_cgroup,
    container_image,
    crictl_image,
    running_container,
    same_running_image,
)
from vllm_acceptance.preflight.stage import judge

from nodefixtures import build_evidence

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
CGROUPS = sorted((REAL / "cgroup").glob("*.txt"))
INSPECTS = sorted(p for p in (REAL / "container-inspect").glob("*.json") if not p.name.startswith("crictl-"))
CRICTLS = sorted((REAL / "container-inspect").glob("crictl-*.json"))
SCRIPT = ROOT / "roles" / "preflight" / "files" / "live_process.py"
KIMI = load_profile(ROOT / "profiles" / "kimi-k3.yml")
JUPYTER = REAL / "container-inspect" / "docker4s-jupyterhub-singleuser.json"
DOCKER_V2 = REAL / "cgroup" / "kepler-v2-docker-prometheus.txt"       # docker-b176….scope
PODMAN_V2 = REAL / "cgroup" / "kepler-v2-podman-rootless.txt"         # libpod-f992….scope/container
CONTAINERD = REAL / "cgroup" / "neuvector-bottlerocket-cri-containerd-hybrid.txt"
HOST = REAL / "cgroup" / "kepler-v2-host-tmux.txt"
CRIO = REAL / "cgroup" / "neuvector-crio-1.19.txt"
BARE = REAL / "cgroup" / "neuvector-kubepods-cgroupfs-bare-id.txt"
CRICTL_CONTAINERD = REAL / "container-inspect" / "crictl-inspect-containerd-1.7.json"    # imageRef: the image ID
CRICTL_CRIO = REAL / "container-inspect" / "crictl-inspect-crio-2020-flannel.json"      # imageRef: a repo digest
CAT = shutil.which("cat")     # the stand-ins run on a PATH that holds only them


def node_script() -> dict[str, Any]:
    node: dict[str, Any] = {}
    exec(compile(SCRIPT.read_text(), "live_process.py", "exec"), node)  # noqa: S102
    return node


def expect(capture: Path) -> dict[str, Any]:
    return yaml.safe_load(capture.with_suffix(".yml").read_text())["expect"]


# --- the parsing, package and node script alike ----------------------------------------------------------------

@pytest.mark.parametrize("capture", CGROUPS, ids=[p.stem for p in CGROUPS])
def test_each_real_cgroup_names_its_container_alike_in_the_package_and_on_the_node(capture: Path) -> None:
    text = capture.read_text()
    engine, cid, line = container_from_cgroup(text)
    assert (engine, cid) == (expect(capture)["engine"], expect(capture)["id"])
    assert node_script()["cgroup_container"](text) == (engine, cid, line)
    if cid is not None:
        assert cid in line and line in [x.strip() for x in text.splitlines()]


def test_the_captures_cover_every_runtime_cgroup_v1_and_v2_and_host_processes() -> None:
    read = [container_from_cgroup(p.read_text()) for p in CGROUPS]
    assert {engine for engine, cid, _ in read if cid} == {"docker", "podman", "containerd", "crio", None}
    assert sum(cid is None for _, cid, _ in read) == 3
    assert any(line and line.startswith("0::") for _, _, line in read)          # a cgroup v2 line decides
    # BottleRocket has v1 lines and the v2 line: the unified line is the one recorded
    assert container_from_cgroup(CONTAINERD.read_text())[2].startswith("0::/kubepods.slice/")


@pytest.mark.parametrize("capture", INSPECTS, ids=[p.stem for p in INSPECTS])
def test_a_real_container_inspect_gives_the_image_id_and_its_reference_alike(capture: Path) -> None:
    text = capture.read_text()
    got = container_image(text)
    assert got == (expect(capture)["image_id"], expect(capture)["image_ref"])
    assert node_script()["container_image"](text) == got


def test_an_inspect_without_one_container_image_is_an_error_never_a_reading() -> None:
    for text in ("[]", "{}", '[{"Id": "x"}]', json.dumps([json.loads(JUPYTER.read_text())] * 2)):
        for parse in (container_image, node_script()["container_image"]):
            with pytest.raises(ValueError):
                parse(text)


@pytest.mark.parametrize("capture", CRICTLS, ids=[p.stem for p in CRICTLS])
def test_a_real_crictl_inspect_gives_the_image_id_or_repo_digest_and_reference_alike(capture: Path) -> None:
    text = capture.read_text()
    got = crictl_image(text)
    want = expect(capture)
    assert got == (want["image_id"], want["image_digest"], want["image_ref"])
    assert node_script()["crictl_image"](text) == got


def test_the_crictl_captures_cover_an_image_id_and_repo_digests_of_containerd_and_cri_o() -> None:
    read = {p.stem: crictl_image(p.read_text()) for p in CRICTLS}
    assert read["crictl-inspect-containerd-1.7"][0] == expect(CRICTL_CONTAINERD)["image_id"]
    assert {stem for stem, (iid, digest, _) in read.items() if iid is None and digest} == {
        "crictl-inspect-crio-2020-flannel", "crictl-inspect-cri-containerd-2017-nginx"}


def test_a_crictl_answer_without_an_image_id_or_digest_is_an_error_never_a_reading() -> None:
    status = json.loads(CRICTL_CRIO.read_text())["status"]
    tag_only = {"status": {**status, "imageRef": "quay.io/coreos/flannel:v0.11.0-amd64"}}      # a tag: no identity
    for text in ("{}", "[]", '{"status": "x"}', json.dumps(tag_only), json.dumps([tag_only, tag_only])):
        for parse in (crictl_image, node_script()["crictl_image"]):
            with pytest.raises(ValueError):
                parse(text)


def test_a_newer_cri_image_id_field_wins_over_a_repo_digest() -> None:
    """CRI 1.30 added `imageId` (the platform image's config digest) beside a repo-digest `imageRef`
    (docs/sources.md#crictl-inspect); generated from the real CRI-O capture with that field added."""
    data = json.loads(CRICTL_CRIO.read_text())
    data["status"]["imageId"] = "sha256:" + "ab" * 32
    got = crictl_image(json.dumps(data))
    assert got == ("sha256:" + "ab" * 32, expect(CRICTL_CRIO)["image_digest"], expect(CRICTL_CRIO)["image_ref"])
    assert node_script()["crictl_image"](json.dumps(data)) == got


DIGEST = "sha256:181ec868e19acf210c3bf194732b2f2d50459a1c59df63a1d2653a6c9450c5b6"
OTHER = "sha256:" + "0" * 64


@pytest.mark.parametrize(("image_id", "repo_digest", "judged_digests", "same"), [
    ("sha256:" + "1" * 64, None, [], True),                                      # the image ID itself
    ("1" * 64, None, [], True),                                                  # bare hex (podman, CRI-O)
    (OTHER, None, [f"vllm/vllm-openai@{DIGEST}"], False),                       # another image ID
    (None, f"docker.io/vllm/vllm-openai@{DIGEST}", [f"vllm/vllm-openai@{DIGEST}"], True),   # pulled by this digest
    (None, f"mirror.example/vllm-openai@{DIGEST}", [f"vllm/vllm-openai@{DIGEST}"], True),   # same manifest elsewhere
    (None, f"docker.io/vllm/vllm-openai@{OTHER}", [f"vllm/vllm-openai@{DIGEST}"], False),   # another manifest
    (None, f"docker.io/vllm/vllm-openai@{DIGEST}", [], None),                    # nothing to compare it with
    (None, "docker.io/vllm/vllm-openai@sha256:" + "1" * 64, [], True),           # docker's containerd store: Id
    (None, None, [f"vllm/vllm-openai@{DIGEST}"], None),
])
def test_the_running_image_is_compared_by_id_or_by_repo_digest_never_guessed(
        image_id: str | None, repo_digest: str | None, judged_digests: list[str], same: bool | None) -> None:
    assert same_running_image(image_id, repo_digest, "sha256:" + "1" * 64, judged_digests) is same


# --- the node script with a container CLI (stand-in serving the real capture) ----------------------------------

def fake_cli(tmp_path: Path, name: str, answer: str | None, rc: int = 0, stderr: str = "") -> Path:
    """`name` on a PATH of its own: records its argv, prints `answer` (a recorded capture) or fails with `stderr`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (tmp_path / f"{name}.answer").write_text(answer or "")
    (tmp_path / f"{name}.stderr").write_text(stderr)
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/{name}.argv"\n{CAT} "{tmp_path}/{name}.answer"\n'
                    f'{CAT} "{tmp_path}/{name}.stderr" >&2\nexit {rc}\n')
    tool.chmod(0o755)
    return bin_dir


def fake_proc(tmp_path: Path, pid: int, cgroup: Path) -> Path:
    (tmp_path / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
    shutil.copy(cgroup, tmp_path / "proc" / str(pid) / "cgroup")
    return tmp_path / "proc"


def read_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cgroup: Path,
                   bin_dir: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    monkeypatch.setenv("PATH", str(bin_dir) if bin_dir else str(tmp_path / "empty"))
    return node_script()["container_of"](4242, proc=str(fake_proc(tmp_path, 4242, cgroup)))


def test_the_node_reads_the_docker_container_and_the_image_it_runs(tmp_path: Path, monkeypatch) -> None:
    cid = expect(DOCKER_V2)["id"]
    box, why = read_container(tmp_path, monkeypatch, DOCKER_V2, fake_cli(tmp_path, "docker", JUPYTER.read_text()))
    assert why is None and box is not None
    assert (box["id"], box["engine"], box["inspected_with"]) == (cid, "docker", "docker")
    assert (box["image_id"], box["image_ref"]) == container_image(JUPYTER.read_text())
    assert (tmp_path / "docker.argv").read_text().split() == ["inspect", "--type", "container", cid]
    assert redact_obj(box) == box          # ids and references survive the controller's redaction


def test_a_podman_container_is_read_with_podman(tmp_path: Path, monkeypatch) -> None:
    bin_dir = fake_cli(tmp_path, "podman", JUPYTER.read_text())
    fake_cli(tmp_path, "docker", None, 1, "must not be asked")
    box, _ = read_container(tmp_path, monkeypatch, PODMAN_V2, bin_dir)
    assert box is not None and box["engine"] == "podman" and box["inspected_with"] == "podman"
    assert not (tmp_path / "docker.argv").exists()


def test_a_cli_without_access_is_recorded_as_its_error_never_a_guess(tmp_path: Path, monkeypatch) -> None:
    denied = ("permission denied while trying to connect to the Docker daemon socket at "
              "unix:///var/run/docker.sock: Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.24/containers/json\"")
    box, _ = read_container(tmp_path, monkeypatch, DOCKER_V2, fake_cli(tmp_path, "docker", None, 1, denied))
    assert box is not None and "image_id" not in box and "permission denied" in box["inspect_error"]
    assert "rc 1" in box["inspect_error"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
def test_the_real_docker_cli_answering_an_error_leaves_the_image_unknown(tmp_path: Path, monkeypatch) -> None:
    """The real CLI (no daemon here, or a daemon that does not know this container id): its error is recorded."""
    real = Path(str(shutil.which("docker"))).parent
    box, _ = read_container(tmp_path, monkeypatch, DOCKER_V2, real)
    assert box is not None and "image_id" not in box and box["id"] == expect(DOCKER_V2)["id"]
    assert "docker inspect --type container rc" in box["inspect_error"]


def test_no_cli_and_containerd_leave_the_image_unknown_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    box, _ = read_container(tmp_path, monkeypatch, DOCKER_V2, None)
    assert box is not None and box["inspect_error"] == "docker not on PATH" and "image_id" not in box
    box, _ = read_container(tmp_path / "k8s", monkeypatch, CONTAINERD, fake_cli(tmp_path, "docker", "[]"))
    assert box is not None and box["engine"] == "containerd" and box["inspect_error"] == "crictl not on PATH"
    assert not (tmp_path / "docker.argv").exists()         # a containerd container is not docker's to read


def test_a_containerd_pod_is_read_with_crictl(tmp_path: Path, monkeypatch) -> None:
    cid = expect(CONTAINERD)["id"]
    bin_dir = fake_cli(tmp_path, "crictl", CRICTL_CONTAINERD.read_text())
    fake_cli(tmp_path, "docker", None, 1, "must not be asked")
    box, why = read_container(tmp_path, monkeypatch, CONTAINERD, bin_dir)
    assert why is None and box is not None
    assert (box["id"], box["engine"], box["inspected_with"]) == (cid, "containerd", "crictl")
    assert (box["image_id"], box["image_digest"], box["image_ref"]) == crictl_image(CRICTL_CONTAINERD.read_text())
    assert (tmp_path / "crictl.argv").read_text().split() == ["inspect", "-o", "json", cid]
    assert not (tmp_path / "docker.argv").exists()
    assert redact_obj(box) == box


def test_a_cri_o_pod_is_read_with_crictl_and_keeps_its_repo_digest(tmp_path: Path, monkeypatch) -> None:
    box, _ = read_container(tmp_path, monkeypatch, CRIO, fake_cli(tmp_path, "crictl", CRICTL_CRIO.read_text()))
    assert box is not None and (box["engine"], box["inspected_with"]) == ("crio", "crictl")
    assert box["image_id"] is None and box["image_digest"] == expect(CRICTL_CRIO)["image_digest"]
    got = running_container(json.dumps({"pid": 7, "container": box, "container_reason": None}))
    assert got is not None and got.reason is None and got.image_digest == box["image_digest"]


def test_a_bare_id_is_tried_with_crictl_after_docker_and_podman(tmp_path: Path, monkeypatch) -> None:
    bin_dir = fake_cli(tmp_path, "crictl", CRICTL_CONTAINERD.read_text())
    box, _ = read_container(tmp_path, monkeypatch, BARE, bin_dir)
    assert box is not None and box["engine"] is None and box["inspected_with"] == "crictl"
    assert box["image_id"] == expect(CRICTL_CONTAINERD)["image_id"]


def test_a_crictl_failure_is_recorded_with_its_rc_never_a_guess(tmp_path: Path, monkeypatch) -> None:
    denied = ('validate service connection: validate CRI v1 runtime API for endpoint '
              '"unix:///run/containerd/containerd.sock": rpc error: code = Unavailable desc = connection error: '
              'desc = "transport: Error while dialing: dial unix /run/containerd/containerd.sock: connect: '
              'permission denied"')
    box, _ = read_container(tmp_path, monkeypatch, CONTAINERD, fake_cli(tmp_path, "crictl", None, 1, denied))
    assert box is not None and "image_id" not in box and "image_digest" not in box
    assert box["inspect_error"].startswith("crictl inspect -o json rc 1: validate service connection")
    box, _ = read_container(tmp_path / "b", monkeypatch, CONTAINERD, fake_cli(tmp_path / "b", "crictl", "{}"))
    assert box is not None and box["inspect_error"].startswith("crictl inspect answer unreadable: no `status`")


def test_a_host_process_has_no_container_and_says_why(tmp_path: Path, monkeypatch) -> None:
    box, why = read_container(tmp_path, monkeypatch, HOST, None)
    assert box is None and why is not None and "a host process" in why and "0::/user.slice" in why
    box, why = node_script()["container_of"](4242, proc=str(tmp_path / "nowhere"))
    assert box is None and why is not None and "cannot read" in why


def test_the_whole_script_on_a_real_listener_states_its_container_or_why_not() -> None:
    """The script as the role runs it, against a real process listening on a port: the answer carries a
    `container` (this machine's own cgroup decides which) and, without one, the reason."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", SCRIPT.read_text(), str(port)], capture_output=True,
                             text=True, check=True, timeout=60, env={**os.environ, "PATH": os.defpath})
    answer = json.loads(out.stdout)
    assert answer["pid"] == os.getpid() and "container" in answer
    own = container_from_cgroup(Path("/proc/self/cgroup").read_text())
    if own[1] is None:
        assert answer["container"] is None and "a host process" in answer["container_reason"]
    else:
        assert answer["container"]["id"] == own[1]


# --- compat.image_identity on what runs --------------------------------------------------------------------------

GOOD_INSPECT = ROOT / "tests" / "fixtures" / "generated-nodes" / "good" / "docker-image-inspect.json"


def judged_id() -> str:
    data = json.loads(GOOD_INSPECT.read_text())
    return (data[0] if isinstance(data, list) else data)["Id"]


def with_live(tmp_path: Path, container: dict[str, Any] | None, reason: str | None = None,
              pid: int | None = 4242) -> Any:
    """The good node case, attached: a live_process record as the node script writes it."""
    base = build_evidence("good", tmp_path, host="gpu-01")
    record = ({"port": 8000, "pid": None, "reason": "no process listens on port 8000 on this node"} if pid is None
              else {"port": 8000, "pid": pid, "argv": ["vllm", "serve"], "env": {}, "notes": [],
                    "listeners": ["LISTEN 0 2048 0.0.0.0:8000 0.0.0.0:* users:((\"vllm\",pid=4242,fd=3))"],
                    "container": container, "container_reason": reason, "source": "ss -ltnpH; /proc/4242"})
    (base / "live_process.txt").write_text(json.dumps(record))
    (base / "live_process.json").write_text(json.dumps({"cmd": "live_process", "rc": 0, "stderr": "",
                                                        "missing": False}))
    findings = judge(tmp_path, KIMI, ["gpu-01"], today=dt.date(2026, 9, 1))
    return next(f for f in findings if f.check == "compat.image_identity" and f.host == "gpu-01")


def baseline(tmp_path: Path) -> Any:
    build_evidence("good", tmp_path, host="gpu-01")
    findings = judge(tmp_path, KIMI, ["gpu-01"], today=dt.date(2026, 9, 1))
    return next(f for f in findings if f.check == "compat.image_identity" and f.host == "gpu-01")


def docker_box(tmp_path: Path, monkeypatch, answer: str) -> dict[str, Any]:
    box, _ = read_container(tmp_path, monkeypatch, DOCKER_V2, fake_cli(tmp_path, "docker", answer))
    assert box is not None
    return box


def test_a_server_whose_container_runs_another_image_fails_identity(tmp_path: Path, monkeypatch) -> None:
    assert baseline(tmp_path / "before").status == Status.PASS          # the configured image alone: green
    box = docker_box(tmp_path / "node", monkeypatch, JUPYTER.read_text())
    found = with_live(tmp_path / "run", box)
    assert found.status == Status.FAIL
    assert found.reason == ("the running server's container b176419186d7 runs jupyterhub/singleuser:latest "
                            "(sha256:c277215e785e96520dd2e7717b692c128e782f187edcb1c32feaf209b533a530), not the "
                            f"judged image vllm/vllm-openai:kimi-k3 ({judged_id()})")
    assert "set vllm_image to jupyterhub/singleuser:latest" in found.action
    assert "attach to the server started from the judged image" in found.action
    running = found.observed["running_container"]
    assert running["matches_judged_image"] is False and running["engine"] == "docker"
    assert running["id"] == expect(DOCKER_V2)["id"] and running["image_ref"] == "jupyterhub/singleuser:latest"
    assert any(p.endswith("live_process.txt") for p in found.evidence)


def test_a_server_whose_container_runs_the_judged_image_passes_and_says_so(tmp_path: Path, monkeypatch) -> None:
    # the real capture with its Image set to the judged image's Id (generated: the same image both ways)
    same = json.loads(JUPYTER.read_text()) | {"Image": judged_id()}
    found = with_live(tmp_path / "run", docker_box(tmp_path / "node", monkeypatch, json.dumps(same)))
    assert found.status == Status.PASS
    assert found.observed["running_container"]["matches_judged_image"] is True


def test_no_server_on_this_node_leaves_the_status_unchanged_and_observed_says_why(tmp_path: Path) -> None:
    """A node where nothing listens on the port (a worker tray, a dead URL): nothing runs here to bind the image
    to; compat.server_location judges where the server is."""
    before = baseline(tmp_path / "before")
    found = with_live(tmp_path / "run", None, pid=None)
    assert found.status == before.status == Status.PASS
    running = found.observed["running_container"]
    assert running["matches_judged_image"] is None and "no process listens on port 8000" in running["reason"]


def test_a_server_that_is_a_host_process_is_not_the_judged_image(tmp_path: Path, monkeypatch) -> None:
    """The real host-process cgroup: the server serving the port runs in no container, so the image judged is
    not what serves (a pip install beside it, a server started by hand): fail, never the configured image's pass."""
    assert baseline(tmp_path / "before").status == Status.PASS
    box, why = read_container(tmp_path / "node", monkeypatch, HOST, None)
    found = with_live(tmp_path / "run", box, why)
    assert found.status == Status.FAIL
    assert "runs in no container" in found.reason and "a host process" in found.reason
    assert "the judged image vllm/vllm-openai:kimi-k3 is not what serves (launch.runtime docker)" in found.reason
    assert "launch.runtime is process" in found.action
    assert found.observed["running_container"]["host_process"] is True


@pytest.mark.parametrize("case", ["containerd", "denied"])
def test_a_container_whose_image_cannot_be_read_is_inconclusive_never_pass(tmp_path: Path, monkeypatch,
                                                                           case: str) -> None:
    """The server runs in a container the node cannot inspect (no crictl for a pod, docker refusing the user):
    the configured image alone does not pass for it."""
    if case == "containerd":
        box, _ = read_container(tmp_path / "node", monkeypatch, CONTAINERD, None)
        says = "crictl not on PATH"
    else:
        box, _ = read_container(tmp_path / "node", monkeypatch, DOCKER_V2,
                                fake_cli(tmp_path / "node", "docker", None, 1, "permission denied"))
        says = "permission denied"
    found = with_live(tmp_path / "run", box)
    assert found.status == Status.INCONCLUSIVE
    assert says in found.reason and f"container {box['id'][:12]} was found" in found.reason
    assert "crictl for a Kubernetes pod" in found.action
    running = found.observed["running_container"]
    assert running["matches_judged_image"] is None and says in running["reason"]


def test_a_launch_without_a_live_process_record_is_not_told_about_a_container(tmp_path: Path) -> None:
    assert "running_container" not in (baseline(tmp_path).observed or {})


def test_the_evidence_record_reads_back_as_the_node_wrote_it(tmp_path: Path, monkeypatch) -> None:
    box = docker_box(tmp_path, monkeypatch, JUPYTER.read_text())
    got = running_container(json.dumps({"pid": 7, "container": box, "container_reason": None}))
    assert got is not None and (got.id, got.engine, got.reason) == (box["id"], "docker", None)
    assert running_container(json.dumps({"pid": 7, "argv": []})) is None       # an older script: no claim


def test_a_failed_live_process_command_is_stated_not_passed_over(tmp_path: Path) -> None:
    base = build_evidence("good", tmp_path, host="gpu-01")
    (base / "live_process.txt").write_text("")
    (base / "live_process.json").write_text(json.dumps({"cmd": "live_process", "rc": 127, "missing": True,
                                                        "stderr": "[Errno 2] No such file or directory: b'python3'"}))
    findings = judge(tmp_path, KIMI, ["gpu-01"], today=dt.date(2026, 9, 1))
    found = next(f for f in findings if f.check == "compat.image_identity" and f.host == "gpu-01")
    running = found.observed["running_container"]
    assert found.status == Status.PASS and running["matches_judged_image"] is None
    assert "command not found on the node" in running["reason"]


# --- compat.image_identity on a Kubernetes pod (crictl) ----------------------------------------------------------

def judged_repo_digest() -> str:
    data = json.loads(GOOD_INSPECT.read_text())
    return (data[0] if isinstance(data, list) else data)["RepoDigests"][0]


def crictl_box(tmp_path: Path, monkeypatch, cgroup: Path, answer: str) -> dict[str, Any]:
    box, _ = read_container(tmp_path, monkeypatch, cgroup, fake_cli(tmp_path, "crictl", answer))
    assert box is not None and box["inspected_with"] == "crictl"
    return box


def test_a_pod_whose_container_runs_another_image_fails_identity(tmp_path: Path, monkeypatch) -> None:
    box = crictl_box(tmp_path / "node", monkeypatch, CONTAINERD, CRICTL_CONTAINERD.read_text())
    found = with_live(tmp_path / "run", box)
    assert found.status == Status.FAIL
    assert found.reason.startswith(f"the running server's container {box['id'][:12]} runs "
                                   "registry.k8s.io/coredns/coredns:v1.10.1 (sha256:ead0a4a53df8")
    running = found.observed["running_container"]
    assert running["matches_judged_image"] is False and running["engine"] == "containerd"


def test_a_pod_whose_container_runs_the_judged_image_passes(tmp_path: Path, monkeypatch) -> None:
    # the real containerd capture with its imageRef and config image set to the judged image's Id (generated)
    data = json.loads(CRICTL_CONTAINERD.read_text())
    data["status"]["imageRef"] = data["info"]["config"]["image"]["image"] = judged_id()
    found = with_live(tmp_path / "run", crictl_box(tmp_path / "node", monkeypatch, CONTAINERD, json.dumps(data)))
    assert found.status == Status.PASS and found.observed["running_container"]["matches_judged_image"] is True


def test_a_cri_o_pod_is_judged_by_its_repo_digest_both_ways(tmp_path: Path, monkeypatch) -> None:
    """CRI-O (and containerd for a pulled image) give a repo digest, not an image ID: compared with the judged
    image's RepoDigests. The real capture's flannel digest is none of them: fail; the same capture with the
    judged image's repo digest as its imageRef (generated): pass."""
    box = crictl_box(tmp_path / "a", monkeypatch, CRIO, CRICTL_CRIO.read_text())
    found = with_live(tmp_path / "run-a", box)
    assert found.status == Status.FAIL and found.observed["running_container"]["matches_judged_image"] is False
    assert "(registry digest quay.io/coreos/flannel@sha256:7806805c" in found.reason
    data = json.loads(CRICTL_CRIO.read_text())
    data["status"]["imageRef"] = "docker.io/" + judged_repo_digest()
    found = with_live(tmp_path / "run-b", crictl_box(tmp_path / "b", monkeypatch, CRIO, json.dumps(data)))
    assert found.status == Status.PASS and found.observed["running_container"]["matches_judged_image"] is True
    assert found.observed["running_container"]["image_digest"] == "docker.io/" + judged_repo_digest()


def test_a_repo_digest_with_nothing_to_compare_is_stated_not_comparable(tmp_path: Path, monkeypatch) -> None:
    box = crictl_box(tmp_path / "node", monkeypatch, CRIO, CRICTL_CRIO.read_text())
    base = tmp_path / "run"
    with_live(base, box)
    inspect_path = base / "evidence" / "preflight" / "gpu-01" / "image_inspect.txt"     # the node's docker answer
    data = json.loads(inspect_path.read_text())
    (data[0] if isinstance(data, list) else data)["RepoDigests"] = []         # built or loaded locally
    inspect_path.write_text(json.dumps(data))
    findings = judge(base, KIMI, ["gpu-01"], today=dt.date(2026, 9, 1))
    found = next(f for f in findings if f.check == "compat.image_identity" and f.host == "gpu-01")
    running = found.observed["running_container"]
    assert running["matches_judged_image"] is None and "not comparable" in running["reason"]
    # unproven for its own reason (issue 41 item 8): no RepoDigest is never a rebuild and never a pass
    assert found.status == Status.INCONCLUSIVE and "no RepoDigest" in found.reason, found.reason
    assert found.action.startswith("prove it: pull the profile's image on this node by digest")


# --- compat.image_uniform on the images the nodes run (issue 28: a multi-node worker serves no port) -----------

HEADLESS_ARGV = ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size",
                 "8", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.11", "--headless"]


def test_the_node_names_a_headless_worker_where_nothing_listens(tmp_path: Path, monkeypatch) -> None:
    """A worker tray: no listener, one vLLM started with --headless in a docker container, and a bystander
    process: the worker is named with its container and image, pid stays null (nothing serves here)."""
    proc = fake_proc(tmp_path, 4242, DOCKER_V2)
    (proc / "4242" / "cmdline").write_bytes(b"\0".join(a.encode() for a in HEADLESS_ARGV) + b"\0")
    fake_proc(tmp_path, 77, HOST)
    (proc / "77" / "cmdline").write_bytes(b"sshd: root@pts/0\0")
    monkeypatch.setenv("PATH", str(fake_cli(tmp_path, "docker", JUPYTER.read_text())))
    script = node_script()
    worker = script["headless_worker"](proc=str(proc))
    assert worker is not None and worker["pid"] == 4242 and worker["argv"] == HEADLESS_ARGV
    assert worker["container"]["id"] == expect(DOCKER_V2)["id"]
    assert worker["container"]["image_id"] == container_image(JUPYTER.read_text())[0]
    (proc / "4242" / "cmdline").write_bytes(b"\0".join(a.encode() for a in HEADLESS_ARGV[:-1]) + b"\0")
    assert script["headless_worker"](proc=str(proc)) is None      # a vLLM that serves a port is not a worker


def two_nodes(tmp_path: Path, records: dict[str, dict[str, Any] | None]) -> Any:
    """Two good GPU nodes with the same configured image; each node's live_process record as given (None: none)."""
    for host, record in records.items():
        base = build_evidence("good", tmp_path, host=host)
        if record is not None:
            (base / "live_process.txt").write_text(json.dumps(record))
            (base / "live_process.json").write_text(json.dumps({"cmd": "live_process", "rc": 0, "stderr": "",
                                                                "missing": False}))
    findings = judge(tmp_path, KIMI, list(records), today=dt.date(2026, 9, 1))
    return next(f for f in findings if f.check == "compat.image_uniform")


def served(box: dict[str, Any]) -> dict[str, Any]:
    return {"port": 8000, "pid": 4242, "argv": ["vllm", "serve"], "env": {}, "notes": [], "listeners": [],
            "container": box, "container_reason": None}


def worker(box: dict[str, Any]) -> dict[str, Any]:
    return {"port": 8000, "pid": None, "reason": "no process listens on port 8000 on this node",
            "headless": {"pid": 5151, "argv": HEADLESS_ARGV, "container": box, "container_reason": None}}


def test_image_uniform_compares_the_images_the_head_and_its_headless_worker_run(tmp_path: Path, monkeypatch) -> None:
    """Both nodes hold the judged image (configured: pass); attached, the head's container runs it while the
    worker's headless vLLM runs another image: fail naming the worker and where its image was read. Before,
    only the configured images were compared and this passed."""
    assert two_nodes(tmp_path / "configured", {"gpu-01": None, "gpu-02": None}).status == Status.PASS
    judged = docker_box(tmp_path / "n1", monkeypatch, json.dumps(json.loads(JUPYTER.read_text())
                                                                 | {"Image": judged_id()}))
    other = docker_box(tmp_path / "n2", monkeypatch, JUPYTER.read_text())
    same = two_nodes(tmp_path / "same", {"gpu-01": served(judged), "gpu-02": worker(judged)})
    assert same.status == Status.PASS
    assert same.observed["read_from"]["gpu-02"].startswith("the headless worker's container")
    odd = two_nodes(tmp_path / "odd", {"gpu-01": served(judged), "gpu-02": worker(other)})
    assert odd.status == Status.FAIL and odd.reason.endswith("the odd nodes: gpu-02")
    assert "gpu-02: the headless worker's container" in odd.reason
    assert set(odd.observed["images"]) == {judged_id(), container_image(JUPYTER.read_text())[0]}
    assert any(p.endswith("gpu-02/live_process.txt") for p in odd.evidence)


def test_image_uniform_with_a_running_image_unread_is_inconclusive_never_pass(tmp_path: Path) -> None:
    """A worker whose vLLM container was found but whose image could not be read (docker refused): which image runs
    there is unknown, so the check is inconclusive naming the node; the configured image never stands in for it."""
    unread = {"id": expect(DOCKER_V2)["id"], "engine": "docker", "inspect_error": "docker: permission denied"}
    found = two_nodes(tmp_path, {"gpu-01": None, "gpu-02": worker(unread)})
    assert found.status == Status.INCONCLUSIVE
    assert "gpu-02 (the headless worker's container" in found.reason and "permission denied" in found.reason
    assert found.observed["read_from"]["gpu-01"].startswith("the configured image")
