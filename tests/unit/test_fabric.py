"""GB300 NVL72 trays judged against the hardware table (docs/checks.md: compat.gpu_visibility,
compat.topology, compat.fabric_manager, interconnect.fabric_state, interconnect.nvlink_domain,
interconnect.imex, interconnect.fabric_path, interconnect.nccl_bandwidth).

The trays are built from real captures (tests/fixtures/real/): `nvidia-smi -q -x` of a GB300 NVL72 tray
(NVIDIA/k8s-test-infra) and `nvidia-imex-ctl -N` of an 18-tray IMEX domain (AWS ParallelCluster docs).
The rest of each tray's evidence is the generated "good" node (tests/fixtures/generated-nodes/) moved to
the capture's driver; the NCCL INFO lines are generated from NCCL's own format strings
(docs/sources.md#nccl-fabric-lines): no public capture of an nccl-tests run between GB300 trays exists.
Each fault is injected into one tray, which its check must name."""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.hardware import load_hardware_table
from vllm_acceptance.parsers.nccl_tests import detect_fabric
from vllm_acceptance.parsers.nvidia_smi import parse_xml
from vllm_acceptance.preflight.stage import judge
from vllm_acceptance.rules.fabric import check_nvlink_domain
from vllm_acceptance.rules.node.imex import check_imex, parse_imex_nodes
from vllm_acceptance.verdict import decide

from nodefixtures import NODES, build_evidence

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
GB300_XML = (REAL / "nvidia-smi-xml" / "k8s-test-infra-gb300-tray.xml").read_text()
IMEX_18 = (REAL / "imex" / "aws-parallelcluster-p6e-gb200-18-nodes.txt").read_text()
TRAYS = {"gb300-n01": "172.31.48.81", "gb300-n02": "172.31.48.98"}   # two nodes of the real IMEX capture
TODAY = dt.date(2026, 9, 1)
CAPTURE_DRIVER, GENERATED_DRIVER = "580.173.02", "580.95.05"


def nvl72_profile() -> Profile:
    """Kimi K3 as the recipe runs it on GB300 NVL72: TP8 over two 4-GPU trays in one NVLink domain."""
    kimi = load_profile(ROOT / "profiles" / "kimi-k3.yml")
    data = copy.deepcopy(kimi.data)
    data["hardware"].update({"class": "gb300", "nvlink_domain": "mnnvl", "fabric_manager": "switch_tray",
                             "gpu_class": "GB300", "gpus_per_node": 4, "min_gpus": 8, "min_nodes": 2})
    data["parallel"] = {**data.get("parallel", {}), "tensor": 8, "pipeline": 1, "data": 1}
    data.setdefault("thresholds", {}).pop("nccl_busbw_gbps", None)
    return Profile(data=data, source="test: kimi-k3 on GB300 NVL72")


def _write(base: Path, name: str, stdout: str, rc: int = 0) -> None:
    (base / f"{name}.txt").write_text(stdout)
    (base / f"{name}.json").write_text(json.dumps({"cmd": name, "rc": rc, "stderr": "", "missing": False}))


def _query_csv(xml: str) -> str:
    gpus = parse_xml(xml)
    return "".join(f"{g.index}, {g.name}, {g.uuid}, {gpus.driver_version}, {g.memory_total_mib} MiB, {g.pci_bus_id}\n"
                   for g in gpus.gpus)


def nccl_output(factor: float = 1.0, fabric: str = "mnnvl") -> str:
    """The generated good node's all_reduce_perf table, ranks 4-7 moved to the second tray, bus bandwidth
    scaled by `factor`, after NCCL INFO lines (generated, in NCCL's own formats) of the fabric used."""
    text = (NODES / "good" / "all_reduce_perf.txt").read_text()
    text = re.sub(r"(Rank\s+[4-7] .*? on\s+)gb300-n01", r"\1gb300-n02", text)

    def scale(row: re.Match[str]) -> str:
        cells = row.group(0).split()
        for i in (6, 7, 10, 11):
            cells[i] = f"{float(cells[i]) * factor:.2f}"
        return "  ".join(cells)
    text = re.sub(r"(?m)^\s+\d+\s+\d+\s+float\s+sum.*$", scale, text)
    if fabric == "mnnvl":
        info = ["gb300-n01:48213:48290 [0] NCCL INFO NCCL_MNNVL_ENABLE set by environment to 1",
                "gb300-n01:48213:48290 [0] NCCL INFO MNNVL 1 cliqueId 7ffe cliqueSize 8 cliqueRank 0 nvlDomainSize 8",
                "gb300-n01:48213:48290 [0] NCCL INFO NVLS multicast support is available on dev 0",
                "gb300-n01:48213:48290 [0] NCCL INFO Channel 00 : 3[3] -> 4[0] via P2P/MNNVL",
                "gb300-n01:48213:48290 [0] NCCL INFO Channel 01 : 3[3] -> 4[0] via P2P/MNNVL"]
    else:   # MNNVL off: the ring leaves the tray over InfiniBand
        info = ["gb300-n01:48213:48290 [0] NCCL INFO NCCL_MNNVL_ENABLE set by environment to 0",
                "gb300-n01:48213:48290 [0] NCCL INFO MNNVL 0 cliqueId 0 cliqueSize 1 cliqueRank 0",
                "gb300-n01:48213:48291 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA",
                "gb300-n01:48213:48291 [3] NCCL INFO Channel 01/0 : 3[3] -> 4[0] [send] via NET/IB/1/GDRDMA"]
    return "\n".join(info) + "\n" + text


def tray(run_dir: Path, host: str, *, xml: str = GB300_XML, imex: str = IMEX_18, imex_state: str = "active",
         nccl: str | None = None, imex_inside: list[str] | None = ["channel0"]) -> Path:  # noqa: B006
    """A healthy GB300 NVL72 tray (4 GPUs), from the real captures; keyword arguments inject a fault."""
    base = build_evidence("good", run_dir, host=host, launch={"imex_address": TRAYS[host]})
    for path in base.glob("*.txt"):
        path.write_text(path.read_text().replace(GENERATED_DRIVER, CAPTURE_DRIVER))
    probe = json.loads((base / "image_probe.txt").read_text())
    # the tray's container, started with the IMEX channel requested, sees the host's channel0 (the probe lists it)
    probe.update({"device_count": 4, "devices": ["NVIDIA GB300"] * 4, "imex_channels": imex_inside})
    _write(base, "image_probe", json.dumps(probe))
    _write(base, "imex_channels_host", "channel0\n")
    _write(base, "nvidia_smi_xml", xml)
    _write(base, "nvidia_smi_query", _query_csv(xml))
    _write(base, "imex_active", imex_state + "\n", 0 if imex_state == "active" else 3)
    _write(base, "imex_nodes", imex)
    _write(base, "nccl_allreduce", nccl if nccl is not None else nccl_output())
    return base


def run(tmp_path: Path, profile: Profile | None = None, **faults_by_host: dict
        ) -> tuple[list[Finding], dict[str, Finding]]:
    for host in TRAYS:
        tray(tmp_path, host, **faults_by_host.get(host.replace("-", "_"), {}))
    findings = judge(tmp_path, profile or nvl72_profile(), list(TRAYS), today=TODAY)
    return findings, {f"{f.check}@{f.host}" if f.host else f.check: f for f in findings}


# --- the hardware table --------------------------------------------------------------------

def test_every_class_of_the_recipe_has_a_sourced_node_shape() -> None:
    table = load_hardware_table()
    assert set(table) == {"h200", "b200", "b300", "gb200", "gb300", "mi355x"}
    assert all(row.sources and row.gpus_per_node in (4, 8) for row in table.values())
    gb300 = table["gb300"]
    assert (gb300.gpus_per_node, gb300.cpu_arch, gb300.nvlink_domain, gb300.gpus_per_nvlink_domain) == \
        (4, "aarch64", "mnnvl", 72)
    assert (gb300.threshold("mnnvl").fail, gb300.threshold("infiniband").warn) == (600, 180)
    assert table["b300"].nvlink_domain == "nvswitch" and table["b300"].gpus_per_node == 8


# --- healthy trays -------------------------------------------------------------------------

def test_two_healthy_gb300_trays_pass_every_compatibility_check_and_release(tmp_path: Path) -> None:
    findings, by = run(tmp_path)
    bad = [(f.check, f.host, f.status.value, f.reason) for f in findings
           if f.status not in (Status.PASS, Status.NOT_APPLICABLE)]
    assert bad == []
    for host in TRAYS:   # a 4-GPU tray is the node shape, not a missing half of an 8-GPU node
        assert by[f"compat.gpu_visibility@{host}"].status == Status.PASS
        assert by[f"interconnect.fabric_state@{host}"].status == Status.PASS
        assert by[f"interconnect.fabric_path@{host}"].observed["fabric"] == "mnnvl"
        assert by[f"compat.fabric_manager@{host}"].status == Status.NOT_APPLICABLE
    assert by["compat.topology"].observed["tp_spans_nodes"] is True
    assert by["interconnect.nvlink_domain"].status == Status.PASS
    assert by["interconnect.imex"].status == Status.PASS
    assert decide(findings).verdict == "release"


def test_the_generated_gb300_flagship_profile_releases_on_two_healthy_trays(tmp_path: Path) -> None:
    """profiles/kimi-k3-gb300.yml as the recipe generator writes it (class gb300, mnnvl, switch_tray, TP8)."""
    findings, by = run(tmp_path, load_profile(ROOT / "profiles" / "kimi-k3-gb300.yml"))
    assert by["interconnect.imex"].status == Status.PASS and by["compat.topology"].status == Status.PASS
    assert decide(findings).verdict == "release"


def test_two_healthy_gb200_trays_pass_on_the_gb200_row(tmp_path: Path) -> None:
    """The real GB200 NVL72 tray capture under class gb200: the table has no published MNNVL baseline for
    GB200, so the bandwidth is judged by the profile's own threshold (kept here)."""
    profile = nvl72_profile()
    profile.data["hardware"].update({"class": "gb200", "gpu_class": "GB200"})
    profile.data["thresholds"]["nccl_busbw_gbps"] = 300
    gb200 = (REAL / "nvidia-smi-xml" / "k8s-test-infra-gb200-tray.xml").read_text()
    for host in TRAYS:
        base = tray(tmp_path, host, xml=gb200)
        probe = json.loads((base / "image_probe.txt").read_text())
        _write(base, "image_probe", json.dumps({**probe, "devices": ["NVIDIA GB200"] * 4}))
    findings = judge(tmp_path, profile, list(TRAYS), today=TODAY)
    bad = [(f.check, f.host, f.status.value, f.reason) for f in findings
           if f.status not in (Status.PASS, Status.NOT_APPLICABLE)]
    assert bad == []
    bandwidth = next(f for f in findings if f.check == "interconnect.nccl_bandwidth")
    assert bandwidth.expected == 300 and bandwidth.observed["fabric"] == "mnnvl"


def test_one_tray_cannot_hold_tp8_on_gb300(tmp_path: Path) -> None:
    tray(tmp_path, "gb300-n01")
    findings = judge(tmp_path, nvl72_profile(), ["gb300-n01"], today=TODAY)
    topology = next(f for f in findings if f.check == "compat.topology")
    assert topology.status == Status.FAIL and "2 needed" in topology.reason


# --- each broken tray fails its own check, naming it ------------------------------------------

def _gb300_with(**fabric: str) -> str:
    """The real GB300 capture with one <fabric> field changed on every GPU (fault injection)."""
    xml = GB300_XML
    for tag, value in fabric.items():
        xml = re.sub(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>{value}</{tag}>", xml)
    return xml


@pytest.mark.parametrize("fault, words", [
    ({"clusterUuid": "00000000-0000-0000-0000-000000000000"}, "never initialised"),
    ({"state": "In Progress"}, "fabric state In Progress"),
    ({"bandwidth": "Degraded"}, "fabric bandwidth Degraded"),
])
def test_a_tray_whose_fabric_is_not_up_is_a_rebuild_naming_it(tmp_path: Path, fault: dict, words: str) -> None:
    findings, by = run(tmp_path, gb300_n02={"xml": _gb300_with(**fault)})
    failed = by["interconnect.fabric_state@gb300-n02"]
    assert failed.status == Status.FAIL and words in failed.reason and "tray gb300-n02" in failed.reason
    assert by["interconnect.fabric_state@gb300-n01"].status == Status.PASS
    assert decide(findings).verdict == "rebuild_environment"


def test_a_tray_of_another_rack_is_named_by_the_nvlink_domain_check(tmp_path: Path) -> None:
    other_rack = _gb300_with(clusterUuid="00000002-0000-0000-0000-000000000002")
    findings, by = run(tmp_path, gb300_n02={"xml": other_rack})
    domain = by["interconnect.nvlink_domain"]
    assert domain.status == Status.FAIL and "gb300-n02" in domain.reason and "00000002" in domain.reason
    assert by["interconnect.fabric_state@gb300-n02"].status == Status.PASS   # its own fabric is fine
    assert decide(findings).verdict == "rebuild_environment"


def test_another_partition_is_named_too(tmp_path: Path) -> None:
    _, by = run(tmp_path, gb300_n01={"xml": _gb300_with(cliqueId="32765")})
    assert by["interconnect.nvlink_domain"].status == Status.FAIL
    assert "gb300-n01" in by["interconnect.nvlink_domain"].reason


def test_imex_down_on_one_tray_fails_naming_it(tmp_path: Path) -> None:
    findings, by = run(tmp_path, gb300_n02={"imex_state": "inactive"})
    imex = by["interconnect.imex"]
    assert imex.status == Status.FAIL and "tray gb300-n02: nvidia-imex is inactive" in imex.reason
    assert decide(findings).verdict == "rebuild_environment"


def test_an_imex_node_not_ready_or_a_domain_without_the_tray_fails(tmp_path: Path) -> None:
    degraded = IMEX_18.replace("172.31.48.98    - READY     ", "172.31.48.98    - UNAVAILABLE").replace(
        "Domain State: UP", "Domain State: DEGRADED")
    _, by = run(tmp_path, gb300_n01={"imex": degraded})
    assert by["interconnect.imex"].status == Status.FAIL
    assert "IMEX Domain State DEGRADED" in by["interconnect.imex"].reason
    assert "172.31.48.98 is UNAVAILABLE" in by["interconnect.imex"].reason
    other_domain = IMEX_18.replace("172.31.48.98 ", "172.31.60.10 ")
    _, by = run(tmp_path / "other", gb300_n01={"imex": other_domain})
    assert "172.31.48.98 is not in tray gb300-n01's IMEX node list" in by["interconnect.imex"].reason


def test_imex_evidence_absent_is_missing_never_a_pass(tmp_path: Path) -> None:
    _, by = run(tmp_path, gb300_n01={"imex": ""})
    assert by["interconnect.imex"].status == Status.MISSING
    for rule in (check_imex, check_nvlink_domain):   # no tray at all is not an NVLink domain
        assert rule([], nvl72_profile()).status == Status.MISSING


def test_an_unreachable_tray_leaves_the_domain_checks_missing(tmp_path: Path) -> None:
    tray(tmp_path, "gb300-n01")
    by = {f.check: f for f in judge(tmp_path, nvl72_profile(), list(TRAYS), today=TODAY) if f.host is None}
    for check in ("interconnect.nvlink_domain", "interconnect.imex"):
        assert by[check].status == Status.MISSING and "gb300-n02" in by[check].reason, check


def test_degraded_bandwidth_inside_the_rack_is_expand_capacity(tmp_path: Path) -> None:
    findings, by = run(tmp_path, gb300_n01={"nccl": nccl_output(factor=0.6)},
                       gb300_n02={"nccl": nccl_output(factor=0.6)})
    bandwidth = by["interconnect.nccl_bandwidth@gb300-n01"]
    assert bandwidth.status == Status.FAIL and "over mnnvl" in bandwidth.reason and "< 600" in bandwidth.reason
    assert "tray gb300-n01" in bandwidth.reason
    assert decide(findings).verdict == "expand_capacity"
    # 759.5 GB/s on 8 GPUs: below the 72-GPU rack's 800 warn bound, above its 600 fail bound. No figure is
    # published for 8 GPUs, so it cannot be called degraded (issue 41: a healthy tray pair landed on warn)
    _, by = run(tmp_path / "warn", gb300_n01={"nccl": nccl_output(factor=0.9)})
    bandwidth = by["interconnect.nccl_bandwidth@gb300-n01"]
    assert bandwidth.status == Status.INCONCLUSIVE and "no published figure for that GPU count" in bandwidth.reason


def test_an_infiniband_fallback_inside_the_rack_fails_the_fabric_path(tmp_path: Path) -> None:
    findings, by = run(tmp_path, gb300_n02={"nccl": nccl_output(factor=0.23, fabric="infiniband")})
    path = by["interconnect.fabric_path@gb300-n02"]
    assert path.status == Status.FAIL and "tray gb300-n02" in path.reason and "infiniband" in path.reason
    # judged against the fabric it crossed: ~194 GB/s is healthy InfiniBand, so the path is the finding
    assert by["interconnect.nccl_bandwidth@gb300-n02"].status == Status.PASS
    assert decide(findings).verdict == "rebuild_environment"


def test_an_all_reduce_without_nccl_info_lines_leaves_the_path_inconclusive(tmp_path: Path) -> None:
    table_only = (NODES / "good" / "all_reduce_perf.txt").read_text()
    _, by = run(tmp_path, gb300_n01={"nccl": table_only})
    assert by["interconnect.fabric_path@gb300-n01"].status == Status.INCONCLUSIVE
    assert by["interconnect.fabric_path@gb300-n02"].status == Status.PASS


# --- the parsers on the real captures ------------------------------------------------------

def test_the_real_imex_capture_reads_18_ready_nodes_and_an_up_domain() -> None:
    domain = parse_imex_nodes(IMEX_18)
    assert domain.up and len(domain.nodes) == 18 and not domain.not_ready and not domain.broken_links
    assert parse_imex_nodes((NODES / "good" / "all_reduce_perf.txt").read_text()).errors   # not IMEX output


def test_fabric_lines_of_each_transport() -> None:
    assert detect_fabric(nccl_output()).fabric == "mnnvl"
    assert detect_fabric(nccl_output(fabric="infiniband")).fabric == "infiniband"
    assert detect_fabric((NODES / "good" / "all_reduce_perf.txt").read_text()).fabric is None


def test_fabric_manager_on_the_tray_is_judged_where_the_profile_says_it_runs_there(tmp_path: Path) -> None:
    """Some clouds' GB300 VMs run nvidia-fabricmanager on the node (hardware.fabric_manager: node)."""
    profile = nvl72_profile()
    profile.data["hardware"]["fabric_manager"] = "node"
    _, by = run(tmp_path, profile)
    assert by["compat.fabric_manager@gb300-n01"].status == Status.PASS
    for host in TRAYS:
        (tmp_path / "evidence" / "preflight" / host / "fabricmanager_active.txt").write_text("inactive\n")
    down = {f"{f.check}@{f.host}": f for f in judge(tmp_path, profile, list(TRAYS), today=TODAY)}
    assert down["compat.fabric_manager@gb300-n02"].status == Status.FAIL


# --- HGX classes: the node's own NVSwitch, Fabric Manager on the node --------------------------

def _class_profile(key: str, **hardware: object) -> Profile:
    kimi = load_profile(ROOT / "profiles" / "kimi-k3.yml")
    data = copy.deepcopy(kimi.data)
    data["hardware"].update({"class": key, "gpus_per_node": 8, "min_nodes": 1, **hardware})
    data["hardware"].pop("nvlink_domain", None)
    data["hardware"].pop("fabric_manager", None)
    data["parallel"] = {**data.get("parallel", {}), "tensor": 8, "pipeline": 1, "data": 1}
    return Profile(data=data, source=f"test: class {key}")


def test_an_hgx_class_needs_fabric_manager_on_the_node_and_no_nvlink_domain_checks(tmp_path: Path) -> None:
    """The generated 8-GPU node (Fabric Manager active, its version == the driver's) under an HGX class with an
    aarch64 uname (the class's x86_64 would fail compat.gpu_visibility, as the next test shows)."""
    build_evidence("good", tmp_path, host="hgx-1")
    data = _class_profile("b300", gpu_class="GB300").data
    findings = judge(tmp_path, Profile(data=data, source="test"), ["hgx-1"], today=TODAY)
    by = {f.check: f for f in findings}
    assert by["compat.fabric_manager"].status == Status.PASS      # the node's own Fabric Manager, as before
    for check in ("interconnect.fabric_state", "interconnect.nvlink_domain", "interconnect.imex",
                  "interconnect.fabric_path"):
        assert by[check].status == Status.NOT_APPLICABLE and "nvswitch" in by[check].reason, check
    fm_down = tmp_path / "fm-down"
    build_evidence("fm-inactive", fm_down, host="hgx-1")
    down = {f.check: f for f in judge(fm_down, Profile(data=data, source="test"), ["hgx-1"], today=TODAY)}
    assert down["compat.fabric_manager"].status == Status.FAIL


def test_a_cluster_of_another_cpu_architecture_than_its_class_fails_gpu_visibility(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="n1")      # uname: aarch64, GPUs: 8 x NVIDIA GB300
    findings = judge(tmp_path, _class_profile("b300"), ["n1"], today=TODAY)
    visibility = next(f for f in findings if f.check == "compat.gpu_visibility")
    assert visibility.status == Status.FAIL and "CPU architecture aarch64" in visibility.reason


# --- a profile whose collective backend is not NCCL (the rehearsal's lab image) ---------------------

def _gloo_allreduce(host: str, rank: int, busbw: float) -> str:
    """The in-image all-reduce's JSON line as the rehearsal's gloo run between two trays printed it."""
    return json.dumps({"tool": "torch.distributed all_reduce", "node_rank": rank, "nnodes": 2, "host": host,
                       "gpus_expected": 4, "master": "10.213.0.13:29512", "gpus_visible": 0, "backend": "gloo",
                       "rows": [{"bytes": 2097152, "time_us": 9003.5, "algbw_gbps": busbw, "busbw_gbps": busbw,
                                 "wrong": 0}],
                       "ranks": [{"rank": 0, "host": "gb300-n01", "device": "cpu"},
                                 {"rank": 1, "host": "gb300-n02", "device": "cpu"}],
                       "world_size": 2, "nccl_version": None, "torch_version": "2.13.0+cpu"}) + "\n"


@pytest.mark.parametrize("busbw, status", [(0.233, Status.PASS), (0.005, Status.FAIL)])
def test_a_gloo_all_reduce_is_judged_by_the_profiles_threshold_not_the_nvlink_table(
        tmp_path: Path, busbw: float, status: Status) -> None:
    """The rehearsal's GB300 trays (profiles/rehearsal-gb300-nvl72.yml, collective_backend gloo): gloo on the
    host network crosses no NVLink, so the table's MNNVL figures (fail below 600 GB/s) do not judge it and
    fabric_path has no NCCL line to read; its own thresholds.nccl_busbw_gbps (0.1) does, both ways."""
    profile = load_profile(ROOT / "profiles" / "rehearsal-gb300-nvl72.yml")
    for rank, host in enumerate(TRAYS):
        base = tray(tmp_path, host)
        (base / "nccl_allreduce.txt").write_text("")
        (base / "nccl_allreduce.json").write_text(json.dumps({"cmd": "all_reduce_perf", "rc": 127, "missing": True,
                                                              "stderr": "all_reduce_perf: command not found"}))
        _write(base, "nccl_allreduce_image", _gloo_allreduce(host, rank, busbw))
    findings = judge(tmp_path, profile, list(TRAYS), today=TODAY)
    by = {f"{f.check}@{f.host}": f for f in findings}
    for host in TRAYS:
        bandwidth = by[f"interconnect.nccl_bandwidth@{host}"]
        assert bandwidth.status == status and bandwidth.expected == 0.1, bandwidth
        assert bandwidth.observed["backend"] == "gloo" and bandwidth.observed["fabric"] is None
        assert by[f"interconnect.fabric_path@{host}"].status == Status.NOT_APPLICABLE
