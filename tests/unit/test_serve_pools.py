"""The P/D deployment's launch shape (serve/pools.py, issue 45 item 4): each pool's servers on the inventory's hosts,
the router the recipe site writes in front of them, the serve record the probes read (ProbeOptions.pools), and the
lab profile and inventory that run it (docs/lab.md "Disaggregated prefill/decode")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.cli import parse_pools
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.core.rundir import RunDir
from vllm_acceptance.probes.stage import serve_pools
from vllm_acceptance.serve import pools
from vllm_acceptance.serve.stage import ServeFacts, judge_serve

ROOT = Path(__file__).resolve().parents[2]
LAB_PD = ROOT / "profiles" / "lab-pd.yml"
HOSTS = {"prefill": ["127.0.0.1"], "decode": ["127.0.0.1"]}


def _plan(tmp_path: Path, hosts: dict[str, list[str]] | None = None) -> pools.PdPlan:
    return pools.plan(load_profile(LAB_PD), hosts or HOSTS, "127.0.0.1", "/venv/bin/python", "/models/tiny",
                      tmp_path, router_prometheus_port=8604)


def test_the_lab_plan_is_one_server_per_pool_behind_the_recipes_router(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    by_name = {i.name: i for i in plan.instances}
    assert set(by_name) == {"prefill-0", "decode-0"}
    prefill, decode = by_name["prefill-0"], by_name["decode-0"]
    assert (prefill.base_url, decode.base_url) == ("http://127.0.0.1:8601/v1", "http://127.0.0.1:8602/v1")
    # each pool's own connector role and NIXL side channel, as the profile's pd.<pool>.launch states them
    assert any('"kv_role":"kv_producer"' in a for a in prefill.spec().command())
    assert any('"kv_role":"kv_consumer"' in a for a in decode.spec().command())
    assert (prefill.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], decode.env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == ("8611", "8612")
    # command-synthesis.js pd_cluster routerLines, with the pools' URLs
    assert plan.router.command[1:] == [
        "--policy", "round_robin", "--vllm-pd-disaggregation", "--intra-node-data-parallel-size", "1",
        "--health-check-interval-secs", "5", "--prefill", "http://127.0.0.1:8601", "--decode", "http://127.0.0.1:8602",
        "--host", "127.0.0.1",
        "--port", "8603", "--prometheus-port", "8604"]
    assert plan.router.base_url == "http://127.0.0.1:8603/v1"


def test_the_router_runs_from_the_serving_venv_when_installed_there(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    assert pools.router_program("vllm-router", str(venv / "python")) == "vllm-router"      # not there: PATH
    (venv / "vllm-router").write_text("#!/bin/sh\n")
    assert pools.router_program("vllm-router", str(venv / "python")) == str(venv / "vllm-router")


def test_the_serve_record_is_what_the_probes_get_as_pools(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    record = pools.serve_record(plan)
    assert record["entry_point"] == "http://127.0.0.1:8603/v1"
    assert record["router"]["metrics_url"] == "http://127.0.0.1:8604/metrics"
    (prefill,), (decode,) = record["pools"]["prefill"], record["pools"]["decode"]
    assert prefill["metrics_url"] == "http://127.0.0.1:8601/metrics" and decode["base_url"].endswith(":8602/v1")
    assert prefill["stop_command"].endswith(f"stop --state-dir {tmp_path} --instance prefill-0")
    assert prefill["start_command"].endswith(f"start --state-dir {tmp_path} --instance prefill-0")
    # the probe CLI takes the record itself (--pools @FILE) or the pools alone
    path = tmp_path / "pd-serve.json"
    path.write_text(json.dumps(record))
    assert parse_pools(f"@{path}") == record["pools"] == parse_pools(json.dumps(record["pools"]))
    assert parse_pools(None) == {}
    with pytest.raises(ConfigError, match="base_url"):
        parse_pools('{"prefill": [{"metrics_url": "http://x/metrics"}]}')


def test_the_serve_stage_records_the_pools_and_the_probe_stage_reads_them(tmp_path: Path) -> None:
    """The hook the P/D path checks read: stages/serve.json `entry_point` and `pools` -> ProbeOptions.pools."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = pools.serve_record(_plan(tmp_path))
    facts = ServeFacts(base_url=record["entry_point"], host="localhost", launch_error="not started (unit test)",
                       pools=record["pools"])
    judge_serve(run_dir, load_profile(LAB_PD), facts)
    stage = RunDir(run_dir).stage("serve")
    assert stage["entry_point"] == "http://127.0.0.1:8603/v1" and stage["pools"] == record["pools"]
    assert serve_pools(RunDir(run_dir)) == record["pools"]
    one = tmp_path / "one"
    one.mkdir()
    judge_serve(one, load_profile(ROOT / "profiles" / "cpu-lab.yml"),
                ServeFacts(base_url="http://127.0.0.1:8011/v1", launch_error="not started (unit test)"))
    assert "pools" not in RunDir(one).stage("serve") and serve_pools(RunDir(one)) == {}      # one engine: none


def test_two_servers_of_a_deployment_on_one_address_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="both listen on 127.0.0.1:8601"):
        _plan(tmp_path, {"prefill": ["127.0.0.1", "localhost"], "decode": ["127.0.0.1"]})
    with pytest.raises(ConfigError, match="inventory group 'decode_nodes': no hosts for the decode pool"):
        _plan(tmp_path, {"prefill": ["127.0.0.1"]})


def test_a_pool_seen_as_one_engine_keeps_its_own_launch() -> None:
    profile = load_profile(LAB_PD)
    decode = pools.pool_profile(profile, "decode")
    assert decode.model.pd is None and decode.model.recipe.pool == "decode"
    assert decode.model.launch.port == 8602 and decode.model.launch.args == profile.model.pd.decode.launch.args
    with pytest.raises(ConfigError, match="no `pd` section"):
        pools.pool_profile(load_profile(ROOT / "profiles" / "cpu-lab.yml"), "decode")


def test_a_launched_plan_is_kept_for_the_stop_and_start_commands(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.save()
    again = pools.PdPlan.load(tmp_path)
    assert again == plan and again.instance("decode-0").port == 8602
    with pytest.raises(ConfigError, match="'decode-9': not an instance"):
        again.instance("decode-9")
    with pytest.raises(ConfigError, match="no P/D deployment was launched"):
        pools.PdPlan.load(tmp_path / "elsewhere")


def test_the_lab_pd_inventory_names_the_profiles_groups() -> None:
    profile = load_profile(LAB_PD)
    hosts = yaml.safe_load((ROOT / "inventories" / "lab-pd" / "hosts.yml").read_text())["all"]["children"]
    assert set(hosts["gpu_nodes"]["children"]) == {profile.model.pd.prefill.inventory_group,
                                                   profile.model.pd.decode.inventory_group}
    assert profile.model.pd.router.inventory_group in hosts and "vllm_head" in hosts
    settings = yaml.safe_load((ROOT / "inventories" / "lab-pd" / "group_vars" / "all.yml").read_text())
    assert settings["acceptance_profile"] == profile.name
    assert profile.model.launch.port == profile.model.pd.router.port          # users call the router


def test_vllms_own_argument_check_judges_each_pools_command() -> None:
    """validate's vLLM argument check (serve/vllm_check.py) gets both pools' commands, not the router's empty
    launch.args: the connector flags are judged by vLLM itself."""
    from vllm_acceptance.serve import vllm_check

    nodes = vllm_check.node_inputs(load_profile(LAB_PD), {"head": "localhost"})
    assert [n["pool"] for n in nodes] == ["prefill", "decode"]
    for node, role in zip(nodes, ("kv_producer", "kv_consumer"), strict=True):
        transfer = next(a for a in node["serve_args"] if a.startswith("--kv-transfer-config="))
        assert json.loads(transfer.split("=", 1)[1])["kv_role"] == role
    assert vllm_check.node_inputs(load_profile(ROOT / "profiles" / "cpu-lab.yml"), {})[0].get("pool") is None


def test_each_probe_reads_the_pool_whose_engine_does_what_it_measures() -> None:
    from vllm_acceptance.probes.stage import pool_metrics_url

    pools = {"prefill": [{"base_url": "http://p:8001/v1", "metrics_url": "http://p:8001/metrics"}],
             "decode": [{"base_url": "http://d:8002/v1", "metrics_url": "http://d:8002/metrics"}]}
    router = "http://r:8000/metrics"
    assert pool_metrics_url("cache", pools, router) == "http://p:8001/metrics"
    assert pool_metrics_url("load", pools, router) == "http://d:8002/metrics"
    assert pool_metrics_url("quality", pools, router) == router
    two = {**pools, "prefill": pools["prefill"] * 2}   # several instances: no one of them speaks for the pool
    assert pool_metrics_url("cache", two, router) == router
