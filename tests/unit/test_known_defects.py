"""Issue 41 item 7: component versions with a published defect for this model, judged at preflight against the
NCCL version read inside the image (src/vllm_acceptance/data/known_defects.yml, docs/sources.md#known-defects)."""

from __future__ import annotations

import json
from pathlib import Path

from test_fabric import TRAYS, run, tray

from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.rules.defects import known_defects
from vllm_acceptance.verdict import decide


def _with_nccl(base: Path, version: str) -> None:
    probe = json.loads((base / "image_probe.txt").read_text())
    probe["nccl_version"] = version
    (base / "image_probe.txt").write_text(json.dumps(probe))


def test_every_entry_names_its_source_and_exact_versions() -> None:
    defects = known_defects()
    assert {d.source for d in defects} >= {"https://github.com/NVIDIA/nccl/issues/2167",
                                          "https://github.com/vast-ai/base-image/pull/233"}
    assert all(d.affected and all(v.count(".") == 2 for v in d.affected) and d.fix for d in defects)


def test_an_image_with_a_listed_nccl_is_a_warning_naming_the_defect(tmp_path: Path) -> None:
    for host in TRAYS:
        _with_nccl(tray(tmp_path, host), "2.30.7")
    from test_fabric import nvl72_profile

    from vllm_acceptance.preflight.stage import judge
    findings = judge(tmp_path, nvl72_profile(), list(TRAYS))
    found = next(f for f in findings if f.check == "compat.known_defects")
    assert found.status == Status.WARN and found.consequence == Consequence.LIMIT
    assert "NCCL 2.30.7" in found.reason and "vast-ai/base-image/pull/233" in found.reason
    assert "2.28.9" in found.action
    assert decide(findings).verdict == "limited_observation"


def test_the_generated_images_nccl_is_not_listed_and_passes(tmp_path: Path) -> None:
    findings, by = run(tmp_path)
    assert by["compat.known_defects@gb300-n01"].status == Status.PASS
    assert "2.27.7" in by["compat.known_defects@gb300-n01"].reason
    assert decide(findings).verdict == "release"


def test_no_nccl_version_inside_the_image_is_inconclusive(tmp_path: Path) -> None:
    base = tray(tmp_path, "gb300-n01")
    probe = json.loads((base / "image_probe.txt").read_text())
    del probe["nccl_version"]
    (base / "image_probe.txt").write_text(json.dumps(probe))
    (base / "nccl_allreduce.txt").write_text("")
    from test_fabric import nvl72_profile

    from vllm_acceptance.preflight.stage import judge
    found = next(f for f in judge(tmp_path, nvl72_profile(), ["gb300-n01"]) if f.check == "compat.known_defects")
    assert found.status == Status.INCONCLUSIVE
