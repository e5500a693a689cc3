"""vllm-acceptance plan (src/vllm_acceptance/plan.py): the launch per node and the cost table, each figure
derived here again from the files (profile YAML, inventory YAML), never from a shape written in the test."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance import plan as planmod

REPO = Path(__file__).resolve().parents[2]
FLAGSHIP = REPO / "inventories" / "example-gb300"
# The example's placeholders filled in, as a site does (the gate refuses them as shipped: gate.py, issue 43)
FILLED = {"vllm_image_digest": "sha256:" + "5" * 64,
          "vllm_serve_multinode_env": {"GLOO_SOCKET_IFNAME": "enP5p9s0", "NCCL_SOCKET_IFNAME": "enP5p9s0"}}


def _flagship_files() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(hosts.yml, group_vars/all.yml, the profile it names) as plain YAML."""
    hosts = yaml.safe_load((FLAGSHIP / "hosts.yml").read_text())
    site = yaml.safe_load((FLAGSHIP / "group_vars" / "all.yml").read_text())
    profile = yaml.safe_load((REPO / "profiles" / f"{site['acceptance_profile']}.yml").read_text())
    return hosts, site, profile


def _group(hosts: dict[str, Any], name: str) -> list[str]:
    return list(hosts["all"]["children"][name].get("hosts") or {})


@pytest.fixture(scope="module")
def flagship() -> planmod.Plan:
    return planmod.build_plan(FLAGSHIP)


def test_flagship_cost_table_derives_from_the_profile(flagship: planmod.Plan) -> None:
    hosts, site, profile = _flagship_files()
    # GPUs booked: every GPU of each GPU node, as `--gpus all` hands them to the container (a GB300 tray: 4).
    gpus = len(_group(hosts, "gpu_nodes")) * 4
    slo = profile["contract"]["slo"]
    # A request that meets the contract ends within TTFT + its output tokens x ITL (docs/plan.md), at most the
    # request timeout.
    timeout = profile["load"]["request_timeout_s"]

    def request(tokens: int) -> float:
        return min(slo["ttft_p95_s"] + tokens * slo["itl_p95_s"], timeout)

    long_s, short_s = request(profile["contract"]["max_output_tokens"]), request(profile["load"]["output_tokens"])
    ready = profile["launch"]["ready_timeout_s"]
    stage = {s.name: s for s in flagship.stages}
    assert flagship.gpus == gpus
    # The soak: its seconds and its last batch of short requests, x the GPUs booked / 3600.
    assert stage["soak"].wall_s == pytest.approx(profile["load"]["soak_s"] + short_s)
    assert stage["soak"].gpu_hours == pytest.approx((profile["load"]["soak_s"] + short_s) * gpus / 3600)
    # A server start counts its whole ready timeout: the launch, and the cache probe's restart.
    assert stage["model_load"].wall_s == ready
    assert stage["cache_restart"].wall_s > ready
    cache = profile["cache"]
    assert stage["cache"].requests == cache["sessions"] * 4 + cache.get("rounds", 3)
    # The ramp: every profile step up to the contract runs, max(requests_per_step, c) requests each, in
    # ceil(n / c) waves of the contract's longest request, at most load.stage_timeout_s a step.
    contract = profile["contract"]["concurrency"]
    per_step = profile["load"]["requests_per_step"]
    below = sorted({c for c in profile["load"]["ramp"] if c <= contract} | {contract})
    ran = [s["concurrency"] for s in stage["ramp"].steps]
    assert ran[:len(below)] == below
    assert stage["ramp"].requests >= sum(max(per_step, c) for c in below)
    first = sum(min(math.ceil(max(per_step, c) / c) * long_s, profile["load"]["stage_timeout_s"]) for c in below)
    assert stage["ramp"].wall_s >= first
    # The agent rate run: zero errors in n turns resolve 1 % at 95 % when n >= ln(0.05) / ln(0.99).
    agent = profile["agent"]
    turns = min(agent["turn_budget"], max(agent["repeats"], agent.get("cases", 300), math.ceil(
        math.log(0.05) / math.log(1 - profile["thresholds"]["tool_format_error_rate"]))))
    others = min(agent.get("other_cases", 60), max(5, turns // 5))
    sent = turns + others + 10 * agent["repeats"]
    # agent.stream_tool_calls: the call cases (agent.stream_cases, default every one) streamed too, in every pass.
    twins = turns if agent.get("stream_cases") is None else min(agent["stream_cases"], turns)
    loaded = agent.get("under_load", 0)
    again = turns + others + twins if loaded else 0
    assert loaded == contract and stage["agent"].requests > sent + twins + again
    # each agent wave: TTFT + agent.max_tokens x ITL
    assert stage["agent"].wall_s >= (math.ceil(sent / agent["concurrency"]) + math.ceil(twins / agent["concurrency"])
                                     + math.ceil(again / loaded)) * request(agent["max_tokens"])
    # Relaunches at proposed limits are a worst case beside the total, never in it; across nodes the client is
    # driven at the limit on the server as launched (playbooks/vars/probes.yml probe_relaunch).
    assert stage["verified_limits"].in_total is False
    assert "relaunch" not in stage["verified_limits"].what
    assert flagship.total_s == pytest.approx(sum(s.wall_s for s in flagship.stages if s.in_total))
    assert flagship.total_gpu_hours == pytest.approx(flagship.total_s * gpus / 3600)


def test_flagship_launch_per_node_is_the_serve_roles(flagship: planmod.Plan) -> None:
    hosts, site, profile = _flagship_files()
    head, workers = _group(hosts, "vllm_head"), _group(hosts, "vllm_workers")
    assert [n.host for n in flagship.nodes] == head + workers
    assert [n.role for n in flagship.nodes] == ["head"] + ["worker"] * len(workers)
    image = f"{profile['image']['reference']}@{site['vllm_image_digest']}"
    for rank, node in enumerate(flagship.nodes):
        assert node.argv[:2] == [profile["launch"]["runtime"], "run"]
        assert image in node.argv and profile["model"]["name"] in node.argv
        assert "--enable-prefix-caching" in node.argv
        assert ("--headless" in node.argv) is (rank > 0)
        if workers:
            assert f"--node-rank={rank}" in node.argv
        # Environment values travel in the runtime's environment, only their names in argv.
        for key, value in profile["launch"]["env"].items():
            assert f"-e={key}" in node.argv and node.env[key] == str(value)
    text = planmod.render_text(flagship)
    assert all(n in text for n in head + workers) and "total" in text


def test_secrets_in_the_launch_are_redacted(tmp_path: Path) -> None:
    inv = tmp_path / "site"
    shutil.copytree(FLAGSHIP, inv)
    site = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())
    site["vllm_serve_multinode_env"] = {"HF_TOKEN": "hf_plantedsecret1",
                                        "HTTPS_PROXY": "http://user:plantedpass2@proxy:3128"}
    site["vllm_serve_extra_args"] = ["--api-key", "sk-plantedsecret3"]
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    plan = planmod.build_plan(inv)
    shown = planmod.render_text(plan) + json.dumps(plan.to_dict())
    for secret in ("hf_plantedsecret1", "plantedpass2", "sk-plantedsecret3"):
        assert secret not in shown
    assert "HF_TOKEN" in shown and "proxy:3128" in shown


def test_the_cache_protocol_is_planned_on_every_data_parallel_engine(tmp_path: Path) -> None:
    """Data parallel across the two trays (one TP4 engine each): the cache probe runs its protocol on each engine,
    pinned (probes/cache/probe.py), after one warm-up request per engine."""
    inv = tmp_path / "dp"
    shutil.copytree(FLAGSHIP, inv)
    site = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())
    # expert parallel: the experts shard over both engines (without it each TP4 engine would hold all 1,680 GB of
    # weights on 4 x 288 GB, and the plan refuses it: test_plan_bound.py)
    site["vllm_parallel"] = {"tensor": 4, "data": 2, "expert": True}
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    _, _, profile = _flagship_files()
    per_engine = profile["cache"]["sessions"] * 4 + profile["cache"].get("rounds", 3)
    cache = next(s for s in planmod.build_plan(inv, vllm_python="none").stages if s.name == "cache")
    assert cache.requests == 2 * per_engine + 2 and "on each of 2 data-parallel engines" in cache.basis


def test_attach_plans_no_launch_and_no_restart(tmp_path: Path) -> None:
    inv = tmp_path / "attach"
    shutil.copytree(FLAGSHIP, inv)
    site = yaml.safe_load((inv / "group_vars" / "all.yml").read_text())
    site.update(vllm_serve_mode="attach", vllm_base_url="http://10.0.0.9:8000/v1",
                acceptance_probe_overrides={"load": {"load.soak_s": 10}})
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    plan = planmod.build_plan(inv)
    assert plan.nodes == [] and plan.base_url == "http://10.0.0.9:8000/v1"
    names = [s.name for s in plan.stages]
    assert "model_load" not in names and "cache_restart" not in names
    # An attached server is someone else's: never relaunched, the client is driven at a proposed limit.
    assert "relaunch" not in next(s for s in plan.stages if s.name == "verified_limits").what
    # The probe overrides the run applies (playbooks/tasks/probe.yml) are the plan's too.
    _, _, profile = _flagship_files()
    soak = next(s for s in plan.stages if s.name == "soak")
    slo = profile["contract"]["slo"]
    assert soak.wall_s == pytest.approx(10 + slo["ttft_p95_s"] + profile["load"]["output_tokens"] * slo["itl_p95_s"])


def test_cli_plan_json_and_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "-i", str(FLAGSHIP), "--json", "--vars", json.dumps(FILLED)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_gpu_hours"] == pytest.approx(sum(s["gpu_hours"] for s in data["stages"] if s["in_total"]),
                                                    abs=0.01)
    hosts, _, _ = _flagship_files()
    assert [n["host"] for n in data["nodes"]] == _group(hosts, "vllm_head") + _group(hosts, "vllm_workers")
    assert cli.main(["plan", "-i", "inventories/no-such-site"]) == 2
    err = capsys.readouterr().err
    assert "no such file or directory" in err and "-i inventories/<site>" in err


def test_the_plan_states_vllms_own_judgement_of_every_node(flagship: planmod.Plan) -> None:
    """vLLM itself (the lab venv's, standing in for the image's) judged each node's command (serve/vllm_check.py);
    the plan names the version, the platform it ran on and what it could not judge."""
    if flagship.vllm_check is None:
        pytest.skip("no lab vLLM environment (.venv-lab): the plan says the check was not run")
    check = flagship.vllm_check
    assert check["vllm_version"] and check["platform"] == "cpu"
    nodes = check["deployments"]["launch"]
    assert [n["host"] for n in nodes] == [n.host for n in flagship.nodes] and all(n["accepted"] for n in nodes)
    text = planmod.render_text(flagship)
    assert f"vLLM {check['vllm_version']}" in text and "re-judges every command there (compat.launch_args)" in text


def test_the_plan_refuses_what_vllm_refuses_quoting_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    """An inventory argument vLLM refuses (a tool parser this vLLM does not register) stops `plan` with exit 2
    and vLLM's own message, before any node is touched; `--vllm-python none` skips the controller's check."""
    from conftest import LAB_PYTHON, _skip_or_fail

    if not LAB_PYTHON.exists():
        _skip_or_fail(f"no lab vLLM environment at {LAB_PYTHON}: run `make lab-venv`")
    bad = json.dumps({**FILLED, "vllm_serve_extra_args": ["--tool-call-parser=not_a_parser"]})
    assert cli.main(["plan", "-i", str(FLAGSHIP), "--vars", bad]) == 2
    err = capsys.readouterr().err
    assert "refuses it at run_multi_api_server" in err and "invalid tool call parser: not_a_parser" in err
    assert "vllm/entrypoints/launchers/launcher.py" in err and "acceptance_vllm_check_python" in err
    assert cli.main(["plan", "-i", str(FLAGSHIP), "--vars", bad, "--vllm-python", "none"]) == 0
    assert "vLLM's own checks not run on the controller" in capsys.readouterr().out


def test_a_pd_deployment_is_never_relaunched_at_a_limit() -> None:
    """The lab P/D inventory as copied: the limit relaunch restarts one engine (roles/vllm_serve/tasks/relaunch.yml),
    never the pools and the router, so a P/D run drives the client at a proposed limit; the single engine's lab
    inventory relaunches (the same rule in playbooks/vars/probes.yml probe_relaunch)."""
    repo = Path(__file__).resolve().parents[2]
    # vLLM's own argument check is another test's (`none`: the plan without it, in a second, not ten)
    pd = next(s for s in planmod.build_plan(repo / "inventories" / "lab-pd", vllm_python="none").stages
              if s.name == "verified_limits")
    one = next(s for s in planmod.build_plan(repo / "inventories" / "lab", vllm_python="none").stages
               if s.name == "verified_limits")
    assert "relaunch" not in pd.what and "relaunch" in one.what
