"""interconnect.nccl_bandwidth from the in-image all-reduce (roles/preflight/files/allreduce.py), used where
all_reduce_perf is absent: parsed from its real outputs (tests/fixtures/allreduce/README.md) and judged
against the profile's backend and bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.parsers.nccl_tests import parse_torch_allreduce
from vllm_acceptance.parsers.node_evidence import load_node_evidence
from vllm_acceptance.rules.compat import NodeContext, check_nccl_bandwidth

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "tests" / "fixtures" / "allreduce"
KIMI = load_profile(ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
REHEARSAL = load_profile(ROOT / "profiles" / "rehearsal-gb300.yml")


def node(run_dir: Path, capture: str | None, rc: int = 0, *, nccl_tests_missing: bool = True,
         host: str = "gb300-a01") -> Path:
    """One node's preflight evidence as the role saves it: all_reduce_perf absent, the image's answer."""
    base = run_dir / "evidence" / "preflight" / host
    base.mkdir(parents=True, exist_ok=True)
    if nccl_tests_missing:
        (base / "nccl_allreduce.json").write_text(json.dumps(
            {"cmd": ["all_reduce_perf"], "rc": 127, "missing": True, "stderr": "all_reduce_perf: command not found"}))
    if capture is not None:
        (base / "nccl_allreduce_image.txt").write_text((CAPTURES / capture).read_text())
        (base / "nccl_allreduce_image.json").write_text(json.dumps(
            {"cmd": ["docker", "run", "<allreduce.py>"], "rc": rc, "stderr": ""}))
    (base / "inputs.txt").write_text(json.dumps({"runtime": "docker"}))
    return run_dir


def ctx(run_dir: Path, profile: Profile, n_hosts: int = 2) -> NodeContext:
    return NodeContext(evidence=load_node_evidence(run_dir, "gb300-a01"), profile=profile, n_hosts=n_hosts)


def test_parser_reads_rows_hosts_and_backend() -> None:
    perf = parse_torch_allreduce((CAPTURES / "gloo-2-namespace-nodes.json").read_text())
    assert perf.ok and perf.backend == "gloo" and perf.hosts == ["gb300-a01", "gb300-a03"] and perf.ranks == 2
    assert perf.wrong_results == 0 and perf.max_busbw == pytest.approx(0.491)


def test_two_nodes_over_the_profiles_backend_pass(tmp_path: Path) -> None:
    finding = check_nccl_bandwidth(ctx(node(tmp_path, "gloo-2-namespace-nodes.json"), REHEARSAL))
    assert finding.status == Status.PASS, finding.reason
    assert finding.observed["tool"] == "torch.distributed all_reduce" and "over gloo" in finding.reason
    assert "evidence/preflight/gb300-a01/nccl_allreduce_image.txt" in finding.evidence


def test_a_shaped_link_fails_below_the_bound(tmp_path: Path) -> None:
    finding = check_nccl_bandwidth(ctx(node(tmp_path, "gloo-2-namespace-nodes-40mbit.json"), REHEARSAL))
    assert finding.status == Status.FAIL and finding.consequence == Consequence.EXPAND
    assert "0.005 GB/s < 0.1 GB/s" in finding.reason


def test_gloo_never_passes_a_gpu_profile(tmp_path: Path) -> None:
    """The image's torch saw no CUDA: the GPU interconnect was not measured, whatever the figure."""
    finding = check_nccl_bandwidth(ctx(node(tmp_path, "gloo-2-namespace-nodes.json"), KIMI))
    assert finding.status == Status.INCONCLUSIVE and "not nccl" in finding.reason


def test_a_rendezvous_that_never_completed_is_inconclusive_with_the_error(tmp_path: Path) -> None:
    finding = check_nccl_bandwidth(ctx(node(tmp_path, "gloo-rendezvous-timeout.json", rc=1), REHEARSAL))
    assert finding.status == Status.INCONCLUSIVE
    assert "1/2 clients joined" in finding.reason


def test_one_node_only_does_not_measure_the_inter_node_path(tmp_path: Path) -> None:
    finding = check_nccl_bandwidth(ctx(node(tmp_path, "gloo-2-nodes-loopback.json"), REHEARSAL))
    assert finding.status == Status.INCONCLUSIVE and "one node only" in finding.reason
    assert "preflight_nccl_test_method: image" in finding.action


def test_neither_test_ran_on_a_multinode_cluster_is_missing(tmp_path: Path) -> None:
    finding = check_nccl_bandwidth(ctx(node(tmp_path, None), REHEARSAL))
    assert finding.status == Status.MISSING and "all_reduce_perf" in finding.reason


def test_wrong_elements_fail(tmp_path: Path) -> None:
    data = json.loads((CAPTURES / "gloo-2-namespace-nodes.json").read_text())
    data["rows"][-1]["wrong"] = 12
    (tmp_path / "generated-wrong.json").write_text(json.dumps(data))
    run = node(tmp_path / "run", None)
    base = run / "evidence" / "preflight" / "gb300-a01"
    (base / "nccl_allreduce_image.txt").write_text((tmp_path / "generated-wrong.json").read_text())
    (base / "nccl_allreduce_image.json").write_text(json.dumps({"cmd": [], "rc": 0, "stderr": ""}))
    finding = check_nccl_bandwidth(ctx(run, REHEARSAL))
    assert finding.status == Status.FAIL and "wrong results" in finding.reason


def test_an_image_the_runtime_refused_is_missing_with_the_runtimes_words(tmp_path: Path) -> None:
    run = node(tmp_path, None)
    base = run / "evidence" / "preflight" / "gb300-a01"
    (base / "nccl_allreduce_image.txt").write_text("")
    (base / "nccl_allreduce_image.json").write_text(json.dumps({"cmd": [], "rc": 125, "stderr": (
        "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]].")}))
    finding = check_nccl_bandwidth(ctx(run, REHEARSAL))
    assert finding.status == Status.MISSING and "could not select device driver" in finding.reason
