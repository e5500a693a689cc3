"""Issue 41 item 6: the interconnect judged for what the launch uses and what was measured.

- compat.peermem only on the path that needs it (RDMA with the recipe's DMA-BUF fallback);
- interconnect.rdma from the launch's interconnect (the inventory's vllm_interconnect over the profile's);
- interconnect.imex judged on the trays of the group (a node of the domain outside it: a warning naming it);
- interconnect.fabric_state judges the fabric health summary and its conditions.

Real artefacts: the GB300 tray's `nvidia-smi -q -x` (NVIDIA/k8s-test-infra), the 18-node `nvidia-imex-ctl -N`
(AWS ParallelCluster docs), a RoCE port down (`ibv_devinfo`, deepseek-ai/DeepEP#60); faults are injected into
them one field at a time, with the values real drivers print (docs/sources.md#nvlink-domain).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_fabric import IMEX_18, TODAY, TRAYS, _gb300_with, nccl_output, run

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.preflight.stage import judge, node_contexts
from vllm_acceptance.rules.compat import check_peermem, check_rdma
from vllm_acceptance.rules.launched import launched_plan
from vllm_acceptance.verdict import decide

from nodefixtures import build_evidence

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
B300 = load_profile(ROOT / "profiles" / "kimi-k3-b300.yml")       # HGX nodes, interconnect nvlink
GB300 = load_profile(ROOT / "profiles" / "kimi-k3-gb300.yml")     # NVL72 trays, interconnect nvl
PORT_DOWN = (REAL / "ibv-devinfo" / "deepep-60-roce-port-down.txt").read_text()
HOSTS = ["node-a", "node-b"]


def _rewrite(base: Path, name: str, text: str) -> None:
    (base / f"{name}.txt").write_text(text)


def _nodes(tmp_path: Path, *, ibv: str | None = None, peermem: bool = True) -> None:
    for host in HOSTS:
        base = build_evidence("good", tmp_path, host=host)
        if ibv is not None:
            _rewrite(base, "ibv_devinfo", ibv)
            (base / "rdma_link.txt").unlink()
            (base / "rdma_link.json").unlink()
        if not peermem:
            lines = (base / "lsmod.txt").read_text().splitlines()
            kept = [ln.replace("nvidia_uvm,nvidia_peermem,", "nvidia_uvm,").replace("nvidia_peermem,", "")
                    for ln in lines if not ln.startswith("nvidia_peermem")]
            _rewrite(base, "lsmod", "\n".join(kept) + "\n")


def _contexts(tmp_path: Path, profile, **inventory):
    return node_contexts(tmp_path, profile, HOSTS, plan=launched_plan(profile, inventory))


# --- interconnect.rdma: the launch's interconnect ---------------------------------------------------

def test_rdma_in_the_inventory_with_every_port_down_fails_the_rdma_check(tmp_path: Path) -> None:
    _nodes(tmp_path, ibv=PORT_DOWN)
    rdma = check_rdma(_contexts(tmp_path, B300, vllm_interconnect="rdma")[0])
    assert rdma.status == Status.FAIL and rdma.reason == "no RDMA port is ACTIVE"
    assert "rdma (profile + inventory)" in rdma.observed["interconnect"]
    # the profile's own interconnect (NVLink inside the node) without the inventory's: no RDMA to judge
    assert check_rdma(_contexts(tmp_path, B300)[0]).status == Status.NOT_APPLICABLE


def test_rdma_in_the_inventory_with_active_ports_passes(tmp_path: Path) -> None:
    _nodes(tmp_path)
    assert check_rdma(_contexts(tmp_path, B300, vllm_interconnect="rdma")[0]).status == Status.PASS


# --- compat.peermem: only on the DMA-BUF fallback over RDMA -----------------------------------------

def test_peermem_is_required_on_the_dmabuf_fallback_over_rdma(tmp_path: Path) -> None:
    _nodes(tmp_path, peermem=False)
    ctx = _contexts(tmp_path, B300, vllm_interconnect="rdma", vllm_nccl_dmabuf_workaround=True)[0]
    peermem = check_peermem(ctx)
    assert peermem.status == Status.FAIL and "NCCL_DMABUF_ENABLE" in peermem.reason
    assert "modprobe nvidia_peermem" in peermem.action
    _nodes(tmp_path / "loaded")
    ctx = _contexts(tmp_path / "loaded", B300, vllm_interconnect="rdma", vllm_nccl_dmabuf_workaround=True)[0]
    assert check_peermem(ctx).status == Status.PASS


def test_peermem_is_not_required_over_dmabuf_or_the_nvlink_fabric(tmp_path: Path) -> None:
    _nodes(tmp_path, peermem=False)
    over_dmabuf = check_peermem(_contexts(tmp_path, B300, vllm_interconnect="rdma")[0])
    assert over_dmabuf.status == Status.NOT_APPLICABLE and "DMA-BUF" in over_dmabuf.reason
    over_nvl = check_peermem(_contexts(tmp_path, GB300)[0])
    assert over_nvl.status == Status.NOT_APPLICABLE and "'nvl'" in over_nvl.reason
    # the launch the role was told about (the inventory's launch env) decides: the fallback there needs it
    for host in HOSTS:
        build_evidence("good", tmp_path / "inputs", host=host,
                       launch={"launch_env": {"NCCL_DMABUF_ENABLE": "0", "UCX_TLS": "rc,cuda_copy"}})
        base = tmp_path / "inputs" / "evidence" / "preflight" / host
        lines = [ln for ln in (base / "lsmod.txt").read_text().splitlines() if not ln.startswith("nvidia_peermem")]
        _rewrite(base, "lsmod", "\n".join(lines) + "\n")
    ctx = _contexts(tmp_path / "inputs", B300, vllm_interconnect="rdma")[0]
    assert check_peermem(ctx).status == Status.FAIL


# --- interconnect.imex: the group's trays decide ---------------------------------------------------

def _imex_with(address: str, state: str, domain: str = "DEGRADED") -> str:
    text = IMEX_18.replace(f"{address:<16s}- READY      ", f"{address:<16s}- {state:<11s}")
    return text.replace("Domain State: UP", f"Domain State: {domain}")


def test_a_degraded_imex_domain_elsewhere_is_a_warning_naming_the_tray_and_releases(tmp_path: Path) -> None:
    degraded = _imex_with("172.31.50.44", "UNAVAILABLE")          # node #5, not one of the group's trays
    assert "172.31.50.44    - UNAVAILABLE" in degraded
    findings, by = run(tmp_path, gb300_n01={"imex": degraded}, gb300_n02={"imex": degraded})
    imex = by["interconnect.imex"]
    assert imex.status == Status.WARN, imex.reason
    assert "172.31.50.44 is UNAVAILABLE" in imex.reason and "not a tray of this group" in imex.reason
    assert decide(findings).verdict == "release"


def test_a_tray_of_the_group_not_ready_still_fails(tmp_path: Path) -> None:
    degraded = _imex_with(TRAYS["gb300-n02"], "UNAVAILABLE")
    findings, by = run(tmp_path, gb300_n01={"imex": degraded})
    imex = by["interconnect.imex"]
    assert imex.status == Status.FAIL and "172.31.48.98 is UNAVAILABLE" in imex.reason
    assert decide(findings).verdict == "rebuild_environment"


def test_broken_links_between_the_group_trays_fail_and_elsewhere_warn(tmp_path: Path) -> None:
    rows = IMEX_18.splitlines()
    row0 = next(i for i, ln in enumerate(rows) if ln.strip().startswith("0 ") and ln.count("C") == 18)
    cells = rows[row0].split()
    inside = list(cells)
    inside[2] = "N"                                   # 0 -> 1: between the two trays of the group
    outside = list(cells)
    outside[6] = "N"                                  # 0 -> 5: to a node outside the group
    for name, row, status in (("inside", inside, Status.FAIL), ("outside", outside, Status.WARN)):
        text = "\n".join(rows[:row0] + ["       " + "        ".join([row[0], "   ".join(row[1:])])]
                         + rows[row0 + 1:])
        _, by = run(tmp_path / name, gb300_n01={"imex": text})
        assert by["interconnect.imex"].status == status, (name, by["interconnect.imex"].reason)


# --- interconnect.fabric_state: the health summary ----------------------------------------------------

@pytest.mark.parametrize("fault, words", [
    ({"summary": "Unhealthy"}, "fabric health Summary Unhealthy"),
    ({"route_unhealthy": "True"}, "Route Unhealthy True"),
    ({"route_recovery_in_progress": "True"}, "Route Recovery in progress True"),
    ({"access_timeout_recovery": "True"}, "Access Timeout Recovery True"),
    ({"incorrect_configuration": "Insufficient Nvlinks"}, "Incorrect Configuration Insufficient Nvlinks"),
])
def test_an_unhealthy_fabric_summary_fails_the_fabric_state(tmp_path: Path, fault: dict, words: str) -> None:
    findings, by = run(tmp_path, gb300_n02={"xml": _gb300_with(**fault)})
    state = by["interconnect.fabric_state@gb300-n02"]
    assert state.status == Status.FAIL and words in state.reason and "tray gb300-n02" in state.reason
    assert by["interconnect.fabric_state@gb300-n01"].status == Status.PASS
    assert decide(findings).verdict == "rebuild_environment"


def test_the_real_tray_capture_reads_a_healthy_summary(tmp_path: Path) -> None:
    _, by = run(tmp_path)
    gpus = by["interconnect.fabric_state@gb300-n01"].observed["gpus"]
    assert {(g["health"], g["route_unhealthy"], g["incorrect_configuration"]) for g in gpus} == \
        {("Healthy", "False", "None")}


def test_judge_wires_the_rules(tmp_path: Path) -> None:
    _nodes(tmp_path, ibv=PORT_DOWN)
    findings = judge(tmp_path, B300, HOSTS, today=TODAY)
    assert {f.status for f in findings if f.check == "interconnect.rdma"} == {Status.NOT_APPLICABLE}


# --- interconnect.nccl_bandwidth: bounds for the shape measured ----------------------------------------

def _up_to_1g(factor: float) -> str:
    """The two trays' all_reduce_perf (test_fabric.nccl_output: 8 GPUs, NCCL's MNNVL INFO lines) cut at 1 GB,
    as an `-e 1G` run (the in-image test's largest size) prints it, bus bandwidth scaled by `factor`."""
    lines = nccl_output(factor=factor).splitlines()
    return "\n".join(ln for ln in lines if not (ln.split()[:1] and ln.split()[0].isdigit()
                                                 and int(ln.split()[0]) > (1 << 30))) + "\n"


def test_the_size_curve_scales_the_rack_figures_to_1_gb() -> None:
    from vllm_acceptance.hardware import hardware_class, load_size_curves
    from vllm_acceptance.rules.interconnect import bounds_for_shape

    curve = load_size_curves()["mnnvl"]
    assert curve.at(1 << 30) == pytest.approx(724.06) and curve.at(16 << 30) == pytest.approx(846.82)
    assert curve.at(1 << 20) is None                          # below the published sizes the curve says nothing
    table = hardware_class("gb300").threshold("mnnvl")
    assert (table.ranks, table.bytes) == (72, 16 << 30)
    bounds, basis, published = bounds_for_shape(table, "mnnvl", 8, 1 << 30)
    assert (bounds.warn, bounds.fail, published) == (pytest.approx(684.0, abs=0.2), pytest.approx(513.0, abs=0.2),
                                                     False)
    assert "scaled by x0.855" in basis and "coreweave/nccl-tests/pull/43" in basis
    same, _, published = bounds_for_shape(table, "mnnvl", 72, 8 << 30)     # on the curve's saturated part
    assert (same.warn, published) == (800, True)


def test_a_healthy_tray_pair_measured_up_to_1_gb_passes(tmp_path: Path) -> None:
    findings, by = run(tmp_path, gb300_n01={"nccl": _up_to_1g(0.9)}, gb300_n02={"nccl": _up_to_1g(0.9)})
    bandwidth = by["interconnect.nccl_bandwidth@gb300-n01"]
    assert bandwidth.status == Status.PASS, bandwidth.reason           # 740 GB/s at 1 GB: below 800, a healthy link
    assert bandwidth.observed["largest_message_bytes"] == 1 << 30 and "scaled" in bandwidth.reason
    assert decide(findings).verdict == "release"


def test_a_degraded_link_measured_up_to_1_gb_fails_and_an_unclear_one_is_inconclusive(tmp_path: Path) -> None:
    _, by = run(tmp_path, gb300_n01={"nccl": _up_to_1g(0.55)})
    degraded = by["interconnect.nccl_bandwidth@gb300-n01"]
    assert degraded.status == Status.FAIL and "< 513" in degraded.reason          # 452 GB/s
    _, by = run(tmp_path / "between", gb300_n01={"nccl": _up_to_1g(0.8)})
    between = by["interconnect.nccl_bandwidth@gb300-n01"]
    assert between.status == Status.INCONCLUSIVE and "up to 16 GB" in between.action   # 658 GB/s
