"""compat.launch_args (rules/launch_args.py): at preflight the image's own vLLM judges every node's command on the
head node. The answers judged here are real: the rehearsal's container stand-in (lab/container_standin.py) runs
`docker run --rm --gpus all --entrypoint python3 IMAGE -c <vllm_argcheck.py> JSON` as the role sends it, with the
lab venv's vLLM 0.32 in place of the image's, once for this module (one vLLM import); each deployment's answer is
saved as the `launch_args_check` evidence of its own run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import LAB_PYTHON, REPO, _skip_or_fail

from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.lab import container_standin
from vllm_acceptance.parsers import vllm_argcheck as answer_parser
from vllm_acceptance.parsers.node_evidence import load_node_evidence
from vllm_acceptance.rules.context import NodeContext
from vllm_acceptance.rules.launch_args import check_launch_args
from vllm_acceptance.serve import vllm_argcheck, vllm_check

DEP16 = load_profile(REPO / "profiles" / "kimi-k3-gb300-dep16.yml")
RECORDED_DOCKER = REPO / "tests" / "fixtures" / "generated-nodes" / "good" / "bin" / "docker"
HOSTS = ["t01", "t02", "t03", "t04"]
DIGEST = "sha256:" + "a" * 64


def request(extra_worker_args: list[str] | None = None, *, lab_build: bool = False) -> dict[str, Any]:
    """What playbooks/preflight.yml plans for DEP16 on four trays. `lab_build`: without VLLM_USE_RUST_FRONTEND,
    which the lab's CPU wheel (no vllm-rs binary) refuses for itself (tests/unit/test_vllm_check.py)."""
    hostvars = {"t01": {"vllm_image_digest": DIGEST, "vllm_interconnect": "nvl"}}
    req = vllm_check.preflight_request(DEP16, {"head": "t01", "workers": HOSTS[1:], "hostvars": hostvars})
    payload = json.loads(req["payload"])
    for node in payload["deployments"]["launch"]:
        if node["role"] == "worker":
            node["serve_args"] += extra_worker_args or []
        if lab_build:
            node["env"].pop("VLLM_USE_RUST_FRONTEND")
    req["payload"] = json.dumps(payload)
    return req


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The stand-in's stdout for the planned DEP16 and for its workers with --data-parallel-hybrid-lb, from one run
    (the two deployments in one payload), split into one answer per deployment."""
    if not LAB_PYTHON.exists():
        _skip_or_fail(f"no lab vLLM environment at {LAB_PYTHON}: run `make lab-venv`")
    good, bad = request(lab_build=True), request(["--data-parallel-hybrid-lb"], lab_build=True)
    payload = json.loads(good["payload"])
    payload["deployments"]["hybrid"] = json.loads(bad["payload"])["deployments"]["launch"]
    state = tmp_path_factory.mktemp("standin")
    argv = ["--state", str(state), "--recorded", str(RECORDED_DOCKER), "--lab-python", str(LAB_PYTHON), "--",
            "run", "--rm", "--gpus", "all", "--entrypoint", "python3", f"vllm/vllm-openai:kimi-k3@{DIGEST}",
            "-c", good["script"], json.dumps(payload)]
    done = subprocess.run([sys.executable, "-m", "vllm_acceptance.lab.container_standin", *argv],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    answer, why = answer_parser.parse_answer(done.stdout)
    assert answer is not None, why
    split = {}
    for key in ("launch", "hybrid"):
        one = {**answer, "deployments": {"launch": answer["deployments"][key]}}
        split[key] = done.stdout.replace(done.stdout.splitlines()[-1], answer_parser.MARK + " " + json.dumps(one))
    return split


def contexts(tmp_path: Path, stdout: str | None, *, state: str = "planned", rc: int = 0, stderr: str = "",
             why: str = "") -> list[NodeContext]:
    """A run whose GPU nodes answered; the head's `launch_args_check` evidence is `stdout` (None: not run)."""
    for host in HOSTS:
        base = tmp_path / "evidence" / "preflight" / host
        base.mkdir(parents=True)
        inputs = {"launch_check": {"state": state, "host": "t01" if state == "planned" else "", "why": why}}
        (base / "inputs.txt").write_text(json.dumps(inputs))
        (base / "inputs.json").write_text(json.dumps({"cmd": "printf", "rc": 0}))
        if host == "t01" and stdout is not None:
            (base / "launch_args_check.txt").write_text(stdout)
            (base / "launch_args_check.json").write_text(json.dumps({"cmd": ["docker", "run"], "rc": rc,
                                                                     "stderr": stderr}))
    return [NodeContext(evidence=load_node_evidence(tmp_path, h), profile=DEP16, n_hosts=4) for h in HOSTS]


def test_the_image_vllm_accepts_the_planned_dep16_and_it_passes(tmp_path: Path, answers: dict[str, str]) -> None:
    finding = check_launch_args(contexts(tmp_path, answers["launch"]))
    assert finding.status == Status.PASS and finding.host == "t01", finding.reason
    nodes = finding.observed["nodes"]
    assert [(n["host"], n["mode"]) for n in nodes] == [("t01", "multi_api_server")] + [
        (h, "headless") for h in HOSTS[1:]]
    assert finding.evidence == ["evidence/preflight/t01/launch_args_check.txt",
                                "evidence/preflight/t01/launch_args_check.json"]


def test_what_the_image_vllm_refuses_fails_as_a_configuration_error(tmp_path: Path, answers: dict[str, str]) -> None:
    finding = check_launch_args(contexts(tmp_path, answers["hybrid"]))
    assert finding.status == Status.FAIL and finding.consequence == Consequence.REBUILD
    assert finding.reason.count("ValueError: data_parallel_hybrid_lb is not applicable in headless mode") == 3
    assert "vllm/entrypoints/cli/serve.py" in finding.reason and "configuration error" in finding.action


def test_no_answer_is_missing_or_inconclusive_never_a_pass(tmp_path: Path) -> None:
    assert check_launch_args(contexts(tmp_path / "a", None)).status == Status.MISSING
    no_vllm = check_launch_args(contexts(tmp_path / "b", "", rc=1,
                                         stderr="ModuleNotFoundError: No module named 'vllm'"))
    assert no_vllm.status == Status.INCONCLUSIVE and "No module named 'vllm'" in no_vllm.reason
    error = answer_parser.MARK + " " + json.dumps({"error": "ImportError: libcudart.so.13", "deployments": {}})
    assert check_launch_args(contexts(tmp_path / "c", error)).status == Status.INCONCLUSIVE
    unjudged = answer_parser.MARK + " " + json.dumps({"vllm_version": "0.32.0", "deployments": {"launch": [
        {"host": "t01", "role": "head", "accepted": None, "not_judged": ["--config: a file on the node"]}]}})
    assert check_launch_args(contexts(tmp_path / "d", unjudged)).status == Status.INCONCLUSIVE
    unplanned = check_launch_args(contexts(tmp_path / "e", None, state="unplannable", why="the launch cannot be "
                                           "planned: parallel.data 16 does not divide over 3 nodes"))
    assert unplanned.status == Status.INCONCLUSIVE and "does not divide" in unplanned.reason
    attach = check_launch_args(contexts(tmp_path / "f", None, state="nothing", why="attach: the server runs"))
    assert attach.status == Status.NOT_APPLICABLE
    nobody = [NodeContext(evidence=load_node_evidence(tmp_path / "g", h), profile=DEP16) for h in HOSTS]
    assert check_launch_args(nobody).status == Status.MISSING
    older = contexts(tmp_path / "h", None)
    for host in HOSTS:      # evidence of a role that did not plan the check: inputs without launch_check
        (tmp_path / "h" / "evidence" / "preflight" / host / "inputs.txt").write_text(json.dumps({"image": "x"}))
    older = [NodeContext(evidence=load_node_evidence(tmp_path / "h", h), profile=DEP16) for h in HOSTS]
    assert check_launch_args(older).status == Status.NOT_APPLICABLE


def test_the_standalone_script_writes_the_line_the_parser_reads() -> None:
    assert vllm_argcheck.MARK == answer_parser.MARK
    assert container_standin.foreground_program(["run", "--rm", "--entrypoint", "python3", "IMG", "-c", "x", "{}"]) \
        == ("x", ["{}"])


def test_preflight_plans_the_launch_on_the_head_and_nothing_when_attached() -> None:
    planned = request()
    assert planned["state"] == "planned" and planned["host"] == "t01"
    payload = json.loads(planned["payload"])
    assert payload["target"] == {"device": "cuda", "same_build": True, "on_node": True}
    assert [n["host"] for n in payload["deployments"]["launch"]] == HOSTS
    attach = vllm_check.preflight_request(DEP16, {"head": "t01", "workers": [], "hostvars": {
        "t01": {"vllm_serve_mode": "attach"}}})
    assert attach["state"] == "nothing" and attach["payload"] == ""
    none = vllm_check.preflight_request(DEP16, {"head": None})
    assert none["state"] == "nothing" and "no vllm_head" in none["why"]
    bad = vllm_check.preflight_request(DEP16, {"head": "t01", "workers": ["t02", "t03"], "hostvars": {
        "t01": {"vllm_image_digest": DIGEST}}})
    assert bad["state"] == "unplannable" and "hardware.min_nodes is 4" in bad["why"]
