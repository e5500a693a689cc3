"""Issue 41 item 5: multi-node NVLink inside the container.

The launch and preflight's in-image checks ask for IMEX channel 0 the NVIDIA container toolkit's way on MNNVL
hardware; `interconnect.imex_channel` judges the channel the probe lists INSIDE the container (never the env);
the rehearsal's container stand-in hands channels out as the toolkit does (none unless requested, a site may make
it ignore requests). docs/sources.md#imex-channel.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import jinja2
import yaml
from test_fabric import TRAYS, nvl72_profile, run, tray

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.preflight.stage import judge
from vllm_acceptance.rules.node import node_commands
from vllm_acceptance.serve.launch import IMEX_CHANNEL_DEVICE, imex_request
from vllm_acceptance.serve.launch import node_commands as launch_commands
from vllm_acceptance.verdict import decide

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "src" / "vllm_acceptance" / "lab" / "container_standin.py"
RECORDED = ROOT / "tests" / "fixtures" / "generated-nodes" / "good" / "bin" / "docker"
PROBE = (ROOT / "roles" / "preflight" / "files" / "probe.py").read_text()
GB300 = load_profile(ROOT / "profiles" / "kimi-k3-gb300.yml")
B300 = load_profile(ROOT / "profiles" / "kimi-k3-b300.yml")
TODAY_FACTS = {"head": "t01", "workers": ["t02"], "image_digest": "sha256:" + "a" * 64}


# --- the launch asks for the channel -----------------------------------------------------------------

def test_the_multi_node_launch_on_mnnvl_trays_asks_for_imex_channel_0() -> None:
    docker = launch_commands(GB300, {**TODAY_FACTS, "runtime": "docker"})
    for node in docker.values():
        assert node.env["NVIDIA_IMEX_CHANNELS"] == "0" and "-e=NVIDIA_IMEX_CHANNELS" in node.argv
        assert "NVIDIA_IMEX_CHANNELS=0" not in " ".join(node.argv)          # the value stays out of argv
    podman = launch_commands(GB300, {**TODAY_FACTS, "runtime": "podman"})
    for node in podman.values():
        at = node.argv.index("--device")
        assert node.argv[at + 1] == IMEX_CHANNEL_DEVICE and "NVIDIA_IMEX_CHANNELS" not in node.env
        assert at < node.argv.index(node.serve_args[0]) - 1                  # a runtime option, before the image


def test_no_channel_is_asked_for_off_mnnvl_hardware() -> None:
    assert imex_request("docker", False) == ([], {})
    two_b300 = launch_commands(B300, {**TODAY_FACTS, "runtime": "docker", "interconnect": "rdma",
                                      "parallel": {"tensor": 16}})
    assert all("NVIDIA_IMEX_CHANNELS" not in n.env and "--device" not in n.argv for n in two_b300.values())


def _jinja(loader: jinja2.BaseLoader | None = None) -> jinja2.Environment:
    """Jinja with the Ansible filters the role templates use (enough of each for these templates)."""
    env = jinja2.Environment(loader=loader, trim_blocks=True)
    env.filters.update({"to_json": json.dumps, "string": str, "combine": lambda a, b: {**a, **b},
                        "bool": lambda v: v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1"),
                        "dict2items": lambda d: [{"key": k, "value": v} for k, v in d.items()],
                        "regex_replace": lambda s, pat, rep: rep + s if pat == "^" else s,
                        "vllm.acceptance.acceptance_node_commands": node_commands,
                        "vllm.acceptance.acceptance_redact_obj": lambda obj, secrets: obj})
    return env


def test_the_single_node_container_role_makes_the_same_request() -> None:
    defaults = yaml.safe_load((ROOT / "roles/vllm_serve/defaults/main.yml").read_text())
    task = (ROOT / "roles/vllm_serve/tasks/container.yml").read_text()
    env = _jinja().from_string(defaults["vllm_serve_imex_env"])
    opts = _jinja().from_string(defaults["vllm_serve_imex_opts"])
    mnnvl = _jinja().from_string(defaults["vllm_serve_mnnvl"])
    assert mnnvl.render(vllm_serve_profile={"hardware": {"class": "gb300"}}) == "True"
    assert mnnvl.render(vllm_serve_profile={"hardware": {"class": "b300", "nvlink_domain": "nvswitch"}}) == "False"
    literal = ast.literal_eval
    assert literal(env.render(vllm_serve_mnnvl=True, vllm_serve_runtime="docker")) == {"NVIDIA_IMEX_CHANNELS": "0"}
    assert literal(opts.render(vllm_serve_mnnvl=True, vllm_serve_runtime="podman")) == ["--device",
                                                                                        IMEX_CHANNEL_DEVICE]
    assert literal(env.render(vllm_serve_mnnvl=False, vllm_serve_runtime="docker")) == {}
    assert "vllm_serve_imex_opts" in task and "combine(vllm_serve_imex_env)" in task


# --- preflight's commands ask for it too, and the host's channels are read --------------------------------

def _render_commands(runtime: str, mnnvl: bool) -> list[dict]:
    """roles/preflight/templates/commands.yml.j2 rendered as the role renders it (the filters it uses)."""
    env = _jinja(jinja2.FileSystemLoader(str(ROOT / "roles/preflight/templates")))
    env.globals["lookup"] = lambda kind, name: (ROOT / "roles/preflight/files" / name).read_text()
    text = env.get_template("commands.yml.j2").render(
        preflight_container_runtime=runtime, preflight_pull_image=False, preflight_gpu_checks=True,
        preflight_nvswitch=False, preflight_mnnvl=mnnvl, preflight_multinode=True, preflight_image="img@sha256:x",
        preflight_json_format="{{json .}}", preflight_probe_timeout_s=900, preflight_driver_version_file="/v",
        preflight_nccl_test=True, preflight_nccl_test_method="image", preflight_nccl_timeout_s=900,
        ansible_play_hosts_all=["t01", "t02"], inventory_hostname="t01", preflight_allreduce_master_addr="t01",
        preflight_allreduce_master_port=29512, preflight_profile={"hardware": {"gpus_per_node": 4}},
        preflight_allreduce_args=[], preflight_allreduce_env={}, preflight_inputs={}, preflight_secrets=[],
        ansible_check_mode=False, preflight_runtime_python="python3")
    text = text.split("- name: inputs")[0]
    return {c["name"]: c for c in yaml.safe_load(text)}


def test_the_in_image_probe_and_all_reduce_ask_for_the_channel_on_mnnvl() -> None:
    docker = _render_commands("docker", True)
    probe = docker["image_probe"]
    assert probe["env"] == {"NVIDIA_IMEX_CHANNELS": "0"} and "-e=NVIDIA_IMEX_CHANNELS" in probe["argv"]
    assert probe["argv"][-1] == PROBE and "imex_channels" in PROBE
    allreduce = docker["nccl_allreduce_image"]
    assert allreduce["env"]["NVIDIA_IMEX_CHANNELS"] == "0" and "-e=NVIDIA_IMEX_CHANNELS" in allreduce["argv"]
    assert docker["imex_channels_host"]["argv"] == ["ls", "-1", "/dev/nvidia-caps-imex-channels"]
    podman = _render_commands("podman", True)
    for name in ("image_probe", "nccl_allreduce_image"):
        argv = podman[name]["argv"]
        assert argv[argv.index(IMEX_CHANNEL_DEVICE) - 1] == "--device", name
    plain = _render_commands("docker", False)
    assert "env" not in plain["image_probe"] and "imex_channels_host" not in plain


# --- interconnect.imex_channel: the channel seen inside -------------------------------------------------

def test_two_trays_that_see_the_channel_inside_pass(tmp_path: Path) -> None:
    findings, by = run(tmp_path)
    for host in TRAYS:
        assert by[f"interconnect.imex_channel@{host}"].status == Status.PASS
        assert "channel0 visible inside the container" in by[f"interconnect.imex_channel@{host}"].reason
    assert decide(findings).verdict == "release"


def test_no_channel_inside_fails_naming_the_request_when_the_host_has_one(tmp_path: Path) -> None:
    findings, by = run(tmp_path, gb300_n02={"imex_inside": None})
    channel = by["interconnect.imex_channel@gb300-n02"]
    assert channel.status == Status.FAIL and "tray gb300-n02" in channel.reason
    assert "host has channel0" in channel.reason
    assert "NVIDIA_IMEX_CHANNELS=0" in channel.action and "ignore-imex-channel-requests" in channel.action
    assert by["interconnect.imex_channel@gb300-n01"].status == Status.PASS
    assert decide(findings).verdict == "rebuild_environment"


def test_no_channel_on_the_host_names_the_host_fix(tmp_path: Path) -> None:
    for host in TRAYS:
        base = tray(tmp_path, host, imex_inside=None)
        (base / "imex_channels_host.txt").write_text("")
        (base / "imex_channels_host.json").write_text(json.dumps({
            "cmd": ["ls"], "rc": 2, "missing": False,
            "stderr": "ls: cannot access '/dev/nvidia-caps-imex-channels': No such file or directory"}))
    findings = judge(tmp_path, nvl72_profile(), list(TRAYS))
    channel = next(f for f in findings if f.check == "interconnect.imex_channel")
    assert channel.status == Status.FAIL and "none on the host" in channel.reason and "mknod" in channel.action


def test_an_env_request_is_no_proof_and_an_older_probe_is_inconclusive(tmp_path: Path) -> None:
    base = tray(tmp_path, "gb300-n01")
    probe = json.loads((base / "image_probe.txt").read_text())
    del probe["imex_channels"]
    (base / "image_probe.txt").write_text(json.dumps(probe))
    tray(tmp_path, "gb300-n02")
    findings = judge(tmp_path, nvl72_profile(), list(TRAYS))
    channel = next(f for f in findings if f.check == "interconnect.imex_channel" and f.host == "gb300-n01")
    assert channel.status == Status.INCONCLUSIVE and "did not list the IMEX channels" in channel.reason


def test_one_tray_or_hgx_nodes_need_no_channel(tmp_path: Path) -> None:
    tray(tmp_path, "gb300-n01", imex_inside=None)
    profile = nvl72_profile()
    profile.data["hardware"]["min_nodes"] = 1
    one = next(f for f in judge(tmp_path, profile, ["gb300-n01"]) if f.check == "interconnect.imex_channel")
    assert one.status == Status.NOT_APPLICABLE
    hgx_profile = nvl72_profile()
    hgx_profile.data["hardware"].update({"class": "b300", "nvlink_domain": "nvswitch", "min_nodes": 2})
    hgx = next(f for f in judge(tmp_path, hgx_profile, ["gb300-n01"]) if f.check == "interconnect.imex_channel")
    assert hgx.status == Status.NOT_APPLICABLE and "nvswitch" in hgx.reason


# --- the rehearsal's container stand-in behaves like the toolkit ------------------------------------------

def _standin(state: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(STANDIN), "--state", str(state), "--recorded", str(RECORDED),
                           "--lab-python", sys.executable, "--", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=60)


def _probe(state: Path, *opts: str, env: dict | None = None) -> tuple[int, object]:
    done = _standin(state, "run", "--rm", "--gpus", "all", *opts, "--entrypoint", "python3",
                    "vllm/vllm-openai:kimi-k3", "-c", PROBE, env=env)
    if done.returncode:
        return done.returncode, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["devices"] and answer["nccl_version"]          # the recorded image facts are kept
    return 0, answer["imex_channels"]


def test_the_standin_shows_a_channel_only_when_asked_and_the_host_has_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    assert _probe(state, "-e=NVIDIA_IMEX_CHANNELS", env={"NVIDIA_IMEX_CHANNELS": "0"}) == (0, None)   # host: none
    (state / "imex-channels").write_text("channel0\n")
    assert _probe(state) == (0, None)                                                             # not asked
    assert _probe(state, "-e=NVIDIA_IMEX_CHANNELS", env={"NVIDIA_IMEX_CHANNELS": "0"}) == (0, ["channel0"])
    assert _probe(state, "-e=NVIDIA_IMEX_CHANNELS", env={"NVIDIA_IMEX_CHANNELS": "all"}) == (0, None)
    assert _probe(state, "--device", IMEX_CHANNEL_DEVICE) == (0, ["channel0"])
    rc, err = _probe(state, "--device", "/dev/nvidia-caps-imex-channels/channel3")
    assert rc == 125 and "no such file or directory" in str(err)


def test_a_site_that_ignores_requests_drops_the_env_request_not_the_device(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "imex-channels").write_text("channel0\n")
    (state / "nvidia-container-toolkit.toml").write_text("[features]\nignore-imex-channel-requests = true\n")
    assert _probe(state, "-e=NVIDIA_IMEX_CHANNELS", env={"NVIDIA_IMEX_CHANNELS": "0"}) == (0, None)
    assert _probe(state, "--device", IMEX_CHANNEL_DEVICE) == (0, ["channel0"])


def test_the_rehearsal_trays_have_channel0_and_answer_ls(tmp_path: Path) -> None:
    from vllm_acceptance.lab.rehearsal import node_tree

    bin_dir = node_tree("gb300-tray", tmp_path / "t01")
    assert (tmp_path / "t01" / "state" / "imex-channels").read_text().split() == ["channel0"]
    listed = subprocess.run([str(bin_dir / "ls"), "-1", "/dev/nvidia-caps-imex-channels"], capture_output=True,
                            text=True, timeout=30)
    assert listed.returncode == 0 and listed.stdout.split() == ["channel0"]
    good = node_tree("good", tmp_path / "a01")
    assert not (tmp_path / "a01" / "state" / "imex-channels").exists() and not (good / "ls").exists()
