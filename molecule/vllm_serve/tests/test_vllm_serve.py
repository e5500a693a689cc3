"""Testinfra verifier of the vllm_serve scenario: one real lab vLLM launched, attached to, then stopped.

The first pass (after converge) runs while the server the role launched is up; the second (after side_effect.yml,
which writes MOLECULE_EPHEMERAL_DIRECTORY/phase) after the role stopped it. Each test belongs to one pass and is
skipped in the other, so each runs once per `molecule test`. `host` is a live ssh connection to the node.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
RUN_DIR = EPHEMERAL / "reports" / "molecule" / "vllm-serve"
LAUNCH = EPHEMERAL / "launch"
CONTAINER = "vllm-acceptance"
PORT = 8000
MODEL = "tiny-agent"
STOPPED = (EPHEMERAL / "phase").is_file()
running = pytest.mark.skipif(STOPPED, reason="first pass only: the server is stopped now")
stopped = pytest.mark.skipif(not STOPPED, reason="second pass only: the server still runs")


def _address(host) -> str:
    return host.check_output("ip -o -4 addr show dev eth0").split()[3].split("/")[0]


def _container(host) -> dict:
    return json.loads(host.check_output(f"docker inspect {CONTAINER}"))[0]


@running
def test_the_launched_server_answers_v1_models_on_the_node(host) -> None:
    out = host.check_output(f"/usr/bin/python3 -c \"import urllib.request; print(urllib.request.urlopen("
                            f"'http://{_address(host)}:{PORT}/v1/models', timeout=10).read().decode())\"")
    assert [m["id"] for m in json.loads(out)["data"]] == [MODEL]


@running
def test_the_launch_record_is_the_running_container(host) -> None:
    launch = json.loads((LAUNCH / "serve.json").read_text())
    container = _container(host)
    assert launch["mode"] == "launch" and launch["launch_error"] is None
    assert launch["base_url"] == f"http://{_address(host)}:{PORT}/v1"
    assert launch["launch_command"].startswith(f"docker run -d --name {CONTAINER} ")
    assert launch["launch_command"].split()[-len(container["Args"]):] == container["Args"]
    assert container["State"]["Status"] == "running" and container["State"]["Pid"] > 0
    # the arguments the role read back from the runtime are the container's own
    assert json.loads((LAUNCH / "evidence" / "process-args.json").read_text()) == container["Args"]
    assert launch["model"] == MODEL and launch["ready_s"] > 0


@running
def test_the_attach_records_the_running_servers_facts(host) -> None:
    attach = json.loads((RUN_DIR / "stages" / "serve.json").read_text())
    facts = json.loads((EPHEMERAL / "attach-facts.json").read_text())
    pid = _container(host)["State"]["Pid"]
    argv = [a for a in host.file(f"/proc/{pid}/cmdline").content.decode().split("\0") if a]
    assert attach["mode"] == "attach" and attach["launch_command"] is None and attach["launch_error"] is None
    assert attach["base_url"] == f"http://{_address(host)}:{PORT}/v1" and attach["model"] == MODEL
    assert facts["vllm_serve_ok"] is True and int(facts["vllm_serve_pid"]) == pid
    assert facts["vllm_serve_launched_container"] == {"runtime": "docker", "name": CONTAINER}
    # the argv the role read from /proc/PID/cmdline on the node is the running server's
    assert json.loads((RUN_DIR / "evidence" / "serve" / "process-args.json").read_text()) == argv
    assert "vllm.entrypoints.openai.api_server" in argv


@stopped
def test_the_stopped_server_is_gone_from_the_node(host) -> None:
    facts = json.loads((EPHEMERAL / "attach-facts.json").read_text())
    assert host.run(f"docker inspect {CONTAINER}").rc != 0
    assert not host.file(f"/proc/{facts['vllm_serve_pid']}").exists
    assert host.check_output(f"ss -ltnH 'sport = :{PORT}'") == ""


@stopped
def test_the_teardown_record_says_it_is_gone(host) -> None:
    teardown = json.loads((RUN_DIR / "stages" / "teardown.json").read_text())
    assert teardown["action"] == "stopped" and teardown["gone"] is True and teardown["port_closed"] is True
    assert teardown["container"] == CONTAINER and teardown["runtime"] == "docker"
    assert teardown["nodes"] == [host.backend.get_hostname()] and teardown["left_on"] == []
