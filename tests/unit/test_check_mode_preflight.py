"""Issue 43 item 3: `--check` starts nothing on a node. roles/preflight's commands (commands.yml.j2) in check mode:
no container run, no image pull, no all-reduce, no vLLM argument check inside the image; each such command is
replaced by one that says it was not run in check mode (exit 3), so its checks are reported as not run. The same
commands outside check mode do start them (the test can fail)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from test_imex_channel import _jinja

ROOT = Path(__file__).resolve().parents[2]


def render(runtime: str, check_mode: bool) -> dict[str, dict[str, Any]]:
    env = _jinja(jinja2.FileSystemLoader(str(ROOT / "roles/preflight/templates")))
    env.globals["lookup"] = lambda kind, name: (ROOT / "roles/preflight/files" / name).read_text()
    text = env.get_template("commands.yml.j2").render(
        preflight_container_runtime=runtime, preflight_pull_image=True, preflight_pull_timeout_s=60,
        preflight_gpu_checks=True, preflight_nvswitch=False, preflight_mnnvl=True, preflight_multinode=True,
        preflight_image="vllm/vllm-openai:kimi-k3", preflight_json_format="{{json .}}",
        preflight_probe_timeout_s=900, preflight_driver_version_file="/v", preflight_nccl_test=True,
        preflight_nccl_test_method="auto", preflight_nccl_test_argv=["all_reduce_perf", "-b", "8M"],
        preflight_nccl_timeout_s=900, preflight_allreduce_master_addr="10.0.0.1", preflight_allreduce_master_port=1,
        preflight_allreduce_args=[], preflight_allreduce_env={}, preflight_profile={"hardware": {"gpus_per_node": 4}},
        ansible_play_hosts_all=["a", "b"], inventory_hostname="a", ansible_forks=8,
        preflight_launch_check={"host": "a", "payload": "{}", "script": "print(1)"},
        preflight_inputs={}, preflight_secrets=[], ansible_check_mode=check_mode, preflight_runtime_python="python3",
        preflight_live_port=8000)
    return {c["name"]: c for c in yaml.safe_load(text.split("- name: inputs")[0])}


STARTS = ("image_pull", "image_probe", "launch_args_check", "nccl_allreduce", "nccl_allreduce_image")


def _starts_something(argv: list[str]) -> bool:
    words = [str(a) for a in argv]
    return (len(words) > 1 and words[0] in ("docker", "podman") and words[1] in ("run", "pull")) \
        or words[0] == "all_reduce_perf" or (words[0] == "crictl" and "exec" in words) \
        or (len(words) > 3 and words[3] == "exec")            # live_process.py exec: a probe in a running container


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_check_mode_starts_nothing_on_the_node_and_says_what_was_not_run(runtime: str) -> None:
    commands = render(runtime, check_mode=True)
    assert "image_pull" not in commands
    for name, command in commands.items():
        assert not _starts_something(command["argv"]), (name, command["argv"])
        assert "fallback" not in command or name != "image_probe"
    for name in STARTS[1:]:
        argv = commands[name]["argv"]
        assert argv[:2] == ["sh", "-c"] and "not run in check mode" in argv[2] and argv[2].endswith("exit 3")
        assert commands[name]["shown"] == ["not run in check mode"]
    # the read-only queries still run: the driver, the runtime, the image's metadata
    assert commands["nvidia_smi"]["argv"] == ["nvidia-smi"]
    assert commands["image_inspect"]["argv"][:3] == [runtime, "image", "inspect"]


@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_outside_check_mode_the_same_commands_start_them(runtime: str) -> None:
    commands = render(runtime, check_mode=False)
    for name in STARTS:
        assert name in commands, name
    assert commands["image_pull"]["argv"][:2] == [runtime, "pull"]
    assert commands["image_probe"]["argv"][:2] == [runtime, "run"]
    assert commands["launch_args_check"]["argv"][:2] == [runtime, "run"]
    assert commands["nccl_allreduce"]["argv"][0] == "all_reduce_perf"
    assert commands["nccl_allreduce_image"]["argv"][:2] == [runtime, "run"]
