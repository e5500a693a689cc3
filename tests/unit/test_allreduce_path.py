"""Issue 41 item 7: the all-reduce path vLLM chose, read from the server's log, against the launch's interconnect.

The log lines are real: vllm-project/vllm#51986 (IB-only multi-node, the MNNVL workspace timing out) and
vllm-project/vllm#38136 (2 x GB300 TP8, the workspace initialised); docs/sources.md#known-defects."""

from __future__ import annotations

from pathlib import Path

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.rules.launched import launched_plan
from vllm_acceptance.rules.transport import check_allreduce_path

ROOT = Path(__file__).resolve().parents[2]
B300 = load_profile(ROOT / "profiles" / "kimi-k3-b300.yml")
GB300 = load_profile(ROOT / "profiles" / "kimi-k3-gb300.yml")
IB_ONLY = """\
(Worker_TP8_EP8 pid=2019) WARNING 08-13 11:11:59 [flashinfer_all_reduce.py:85] Failed to initialize FlashInfer All \
Reduce workspace: [fd_exchange] timed out connecting to /tmp/cuda_fd_xchg_2226_0_2unnfod0/fd.sock.
(Worker_TP8_EP8 pid=2019) WARNING 08-13 11:12:29 [flashinfer_all_reduce.py:85] Failed to initialize FlashInfer All \
Reduce workspace: [fd_exchange] timed out connecting to /tmp/cuda_fd_xchg_2226_0_j39d6am3/fd.sock.
"""
GB300_TP8 = """\
[flashinfer_all_reduce.py:109] Auto-selected flashinfer allreduce backend: mnnvl
[flashinfer_all_reduce.py:149] Initialized FlashInfer Allreduce norm fusion workspace with backend=mnnvl
"""


def test_the_mnnvl_all_reduce_on_ib_only_nodes_fails_citing_the_hang() -> None:
    plan = launched_plan(B300, {"vllm_parallel": {"tensor": 16}, "vllm_interconnect": "rdma"})
    finding = check_allreduce_path(IB_ONLY, B300, "b300-01", [], plan)
    assert finding.status == Status.FAIL and "vllm-project/vllm#51986" in finding.reason
    assert finding.observed["flashinfer_workspace_failures"] == 2
    chosen = check_allreduce_path(GB300_TP8, B300, "b300-01", [], plan)
    assert chosen.status == Status.FAIL and "MNNVL backend" in chosen.reason


def test_the_mnnvl_all_reduce_inside_one_nvlink_domain_passes() -> None:
    plan = launched_plan(GB300)
    finding = check_allreduce_path(GB300_TP8, GB300, "t01", [], plan)
    assert finding.status == Status.PASS and finding.observed["flashinfer_allreduce_backends"] == ["mnnvl"]


def test_a_log_naming_no_path_is_never_a_pass_and_one_node_is_not_applicable() -> None:
    plan = launched_plan(GB300)
    assert check_allreduce_path("INFO Starting vLLM server\n", GB300, "t01", [], plan).status == Status.WARN
    assert check_allreduce_path(None, GB300, "t01", [], plan).status == Status.MISSING
    single = check_allreduce_path(GB300_TP8, B300, "b300-01", [], launched_plan(B300))
    assert single.status == Status.NOT_APPLICABLE
