"""playbooks/build_image.yml on a namespace build host with a fake `docker` (no Docker engine here).

The source is a real local git repository (a stand-in for the model's vLLM branch), cloned by the
stock git module on the build host; a patch is really applied with `git apply`. The fake docker
records its argv and "builds" by writing a digest. What is checked: the lineage recorded and the
experimental profile written, valid, and never released as the official profile.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.lab.nshosts import HostSpec
from vllm_acceptance.verdict import decide

from support.hosts import REPO, ClusterFactory, ansible_bin, ansible_env

pytestmark = pytest.mark.hosts

FIXTURES = REPO / "tests" / "fixtures" / "rebuild"
K3_8GPU = REPO / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml"   # the 8-GPU node model (see its header)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}).stdout.strip()


def source_repo(root: Path) -> tuple[Path, str, Path]:
    src = root / "vllm-src"
    (src / "docker").mkdir(parents=True)
    (src / "requirements").mkdir()
    (src / "docker" / "Dockerfile").write_text("ARG CUDA_VERSION=12.9.1\nFROM nvidia/cuda:${CUDA_VERSION}-devel\n")
    (src / "requirements" / "cuda.txt").write_text("torch==2.9.0\n")
    (src / "requirements" / "common.txt").write_text("transformers==4.57.0\n")
    git(src, "init", "-q", "-b", "kimi-k3")
    git(src, "add", ".")
    git(src, "commit", "-q", "-m", "kimi k3 branch")
    patch = root / "0001-cu129-pin.patch"
    (src / "requirements" / "cuda.txt").write_text("torch==2.9.0+cu129\n")
    patch.write_text(git(src, "diff") + "\n")
    git(src, "checkout", "-q", "--", ".")
    return src, git(src, "rev-parse", "HEAD"), patch


def test_build_image_records_lineage_and_writes_an_experimental_profile(ns_hosts: ClusterFactory,
                                                                        tmp_path: Path) -> None:
    bin_dir = tmp_path / "builder-bin"
    bin_dir.mkdir()
    shutil.copy(FIXTURES / "docker-build.sh", bin_dir / "docker")
    src, commit, patch = source_repo(tmp_path)
    cluster = ns_hosts([HostSpec("builder", bin_dir)], name="build-host")
    inventory = cluster.write_inventory(tmp_path / "inventory.yml", group="image_builders")
    run_dir, profile_path = tmp_path / "build", tmp_path / "profiles" / "kimi-k3-cu129.yml"
    extra = {"acceptance_profile_path": str(K3_8GPU), "build_image_owner": "inference-team",
             "build_image_exit_date": "2099-01-31", "build_image_source_repo": f"file://{src}",
             "build_image_source_ref": "kimi-k3", "build_image_patches": [str(patch)],
             "build_image_workdir": str(tmp_path / "work"), "build_image_run_dir": str(run_dir),
             "build_image_profile_dest": str(profile_path), "build_image_tag": "registry.local/ml/vllm:kimi-k3-cu129",
             "build_image_driver_min_branch": 575, "build_image_driver_min_version": "575.51.03"}
    proc = subprocess.run([ansible_bin(), "-i", str(inventory), "playbooks/build_image.yml", "-e", json.dumps(extra)],
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    argv = (bin_dir / ".state" / "calls.log").read_text().splitlines()
    build = next(line for line in argv if line.startswith("build "))
    assert f"org.opencontainers.image.revision={commit}" in build and "--build-arg=CUDA_VERSION=12.9.1" in build
    assert "vllm-acceptance.exit-date=2099-01-31" in build
    # The patch was really applied in the clone that was built.
    assert (tmp_path / "work" / "src" / "requirements" / "cuda.txt").read_text() == "torch==2.9.0+cu129\n"
    lineage = json.loads((run_dir / "evidence" / "build" / "lineage.json").read_text())
    assert lineage["source_commit"] == commit and lineage["patches"] == [patch.name]
    assert lineage["image_digest"].startswith("sha256:") and len(lineage["image_digest"]) == 71
    assert lineage["rollback_image"] == "vllm/vllm-openai:kimi-k3"
    assert (run_dir / "evidence" / "build" / "source" / "requirements" / "cuda.txt").is_file()
    build_log = (run_dir / "evidence" / "build" / "build.log").read_text()
    assert "naming to registry.local/ml/vllm:kimi-k3-cu129" in build_log

    profile = load_profile(profile_path)  # schema-valid
    assert profile.experimental and profile.name == "kimi-k3-cu129"
    assert profile.get("lineage.owner") == "inference-team" and profile.get("lineage.exit_date") == "2099-01-31"
    assert profile.get("lineage.source_commit") == commit
    assert profile.get("lineage.image_digest") == lineage["image_digest"] == profile.get("image.digest")
    assert profile.get("image.cuda_major") == 12 and profile.get("driver.min_branch") == 575
    assert yaml.safe_load(profile_path.read_text())["lineage"]["base_profile"] == "kimi-k3"
    # Runs on it carry the lineage and are never an official release.
    passing = [Finding(check="compat.driver_branch", status=Status.PASS, host="n1")]
    assert decide(passing, experimental=profile.experimental).verdict != "release"
    # The whole lineage: branch, dependency sources read from the inputs, compile options, input checksums.
    assert lineage["source_branch"] == "kimi-k3" and lineage["compile_options"] == {"CUDA_VERSION": "12.9.1"}
    assert lineage["dependency_sources"] == ["image nvidia/cuda:${CUDA_VERSION}-devel"]
    assert set(lineage["inputs"]) == {"src/docker/Dockerfile", "src/requirements/cuda.txt",
                                      "src/requirements/common.txt", f"patches/{patch.name}"}
    assert profile.get("lineage.inputs") == lineage["inputs"]
    assert lineage_cli(profile_path) == 3  # complete, but not reproduced yet: release not allowed

    # Rebuilt from the recorded inputs alone (the commit, the kept patch): the same digest.
    record = run_dir / "evidence" / "build" / "lineage.json"
    again = {"acceptance_profile_path": extra["acceptance_profile_path"], "build_image_reproduce_from": str(record),
             "build_image_workdir": str(tmp_path / "work2"), "build_image_run_dir": str(tmp_path / "rebuild")}
    reproduce(inventory, again)
    rebuilt = json.loads((run_dir / "evidence" / "build" / "reproduction.json").read_text())
    assert rebuilt["image_digest"] == lineage["image_digest"] and rebuilt["source_commit"] == commit
    assert lineage_cli(profile_path) == 0  # complete, reproducible: release allowed on its own profile only
    # (A build whose digest moves with the same inputs, the fake's .state/unpinned, is judged in
    # tests/unit/test_lineage.py on the records such a run wrote: tests/fixtures/remediation/lineage.)


def reproduce(inventory: Path, extra: dict[str, object]) -> None:
    proc = subprocess.run([ansible_bin(), "-i", str(inventory), "playbooks/build_image.yml", "-e", json.dumps(extra)],
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def lineage_cli(profile_path: Path) -> int:
    return cli.main(["lineage", str(profile_path)])


def test_build_without_owner_or_exit_date_is_refused(ns_hosts: ClusterFactory, tmp_path: Path) -> None:
    bin_dir = tmp_path / "builder-bin"
    bin_dir.mkdir()
    shutil.copy(FIXTURES / "docker-build.sh", bin_dir / "docker")
    cluster = ns_hosts([HostSpec("builder", bin_dir)], name="build-host")
    inventory = cluster.write_inventory(tmp_path / "inventory.yml", group="image_builders")
    extra = {"acceptance_profile_path": str(K3_8GPU), "build_image_source_ref": "kimi-k3"}
    proc = subprocess.run([ansible_bin(), "-i", str(inventory), "playbooks/build_image.yml", "-e", json.dumps(extra)],
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0 and "refused" in proc.stdout and "build_image_owner" in proc.stdout
    assert not (bin_dir / ".state").exists()  # docker never ran
