"""Image identity against the profile's official image (issue 28, item 1): an image whose repository, tag or
digest differs from the profile's is never acceptance of the official image, whatever inventory variable set it;
the run is judged on the experimental route and the report says so first."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import yaml

from vllm_acceptance.core.findings import Consequence, Status, write_findings
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.preflight.stage import judge
from vllm_acceptance.report.build import build_report, experimental_route, not_official_image
from vllm_acceptance.report.render_html import render_html
from vllm_acceptance.report.render_md import render_markdown
from vllm_acceptance.verdict import decide

from nodefixtures import build_evidence

ROOT = Path(__file__).resolve().parents[2]
KIMI = load_profile(ROOT / "profiles" / "kimi-k3.yml")
TODAY = dt.date(2026, 9, 1)
CUSTOM = "ghcr.io/acme/vllm-k3:custom"
# The "good" case's image digest (tests/fixtures/generated-nodes/good/docker-image-inspect.json).
GOOD_DIGEST = "sha256:181ec868e19acf210c3bf194732b2f2d50459a1c59df63a1d2653a6c9450c5b6"


def retag(base: Path, tags: list[str], digests: list[str]) -> None:
    """The recorded inspect as the same image would read under another name (generated from the good case)."""
    path = base / "image_inspect.txt"
    data = json.loads(path.read_text())
    entry = data[0] if isinstance(data, list) else data
    entry["RepoTags"], entry["RepoDigests"] = tags, digests
    path.write_text(json.dumps(data))


def identity(tmp_path: Path, profile=KIMI):
    findings = judge(tmp_path, profile, ["gpu-01"], today=TODAY)
    return findings, {f.check: f for f in findings if f.host == "gpu-01"}


def green_but_identity(findings):
    """Every other node check green (the recorded one-tray case leaves the topology to other tests)."""
    return [f for f in findings if f.status in (Status.PASS, Status.NOT_APPLICABLE)
            or f.check == "compat.image_identity"]


def custom_image_run(tmp_path: Path):
    base = build_evidence("good", tmp_path, host="gpu-01", image=CUSTOM)
    retag(base, [CUSTOM], ["ghcr.io/acme/vllm-k3@sha256:" + "c" * 64])
    return identity(tmp_path)


def test_a_self_built_image_on_the_official_profile_fails_identity_and_is_never_a_release(tmp_path: Path) -> None:
    findings, checks = custom_image_run(tmp_path)
    ident = checks["compat.image_identity"]
    assert ident.status == Status.FAIL and ident.consequence == Consequence.LIMIT
    assert ident.observed["official"] is False and ident.observed["official_reference"] == "vllm/vllm-openai:kimi-k3"
    assert "ghcr.io/acme/vllm-k3 is not the profile's vllm/vllm-openai" in ident.reason
    assert checks["compat.container_cuda"].status == Status.PASS       # the image itself is CUDA 13: still not it
    findings = green_but_identity(findings)
    decision = decide(findings)
    experimental_route(decision, not_official_image(KIMI, findings), findings)
    assert decision.verdict == "limited_observation" and decision.experimental
    assert decision.reasons[0].startswith("NOT THE OFFICIAL IMAGE: ghcr.io/acme/vllm-k3:custom on gpu-01")


def test_the_official_image_passes_and_leaves_the_run_on_the_official_route(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="gpu-01")
    findings, checks = identity(tmp_path)
    assert checks["compat.image_identity"].status == Status.PASS
    findings = green_but_identity(findings)
    assert not_official_image(KIMI, findings) is None
    decision = decide(findings)
    experimental_route(decision, not_official_image(KIMI, findings), findings)
    assert decision.verdict == "release" and not decision.experimental


def test_the_report_says_so_in_its_first_lines(tmp_path: Path) -> None:
    findings, _ = custom_image_run(tmp_path)
    write_findings(tmp_path / "findings" / "preflight.json", findings)
    (tmp_path / "run.json").write_text(json.dumps({"inventory": "acme", "profile": "kimi-k3", "hosts": ["gpu-01"]}))
    report = build_report(tmp_path, KIMI)
    assert report["official_image"]["reference"] == [CUSTOM] and report["experimental"] is True
    assert report["verdict_reasons"][0].startswith("NOT THE OFFICIAL IMAGE")
    head = render_markdown(report).splitlines()[:8]
    assert any("Not the official image" in line and CUSTOM in line for line in head), head
    page = render_html(report)
    assert page.index('id="verdict"') < page.index('id="official-image"') < page.index('id="experimental"')
    assert "Not the official image: never an acceptance of kimi-k3" in page


def test_another_tag_of_the_official_repository_is_not_the_official_image(tmp_path: Path) -> None:
    nightly = "vllm/vllm-openai:nightly"
    base = build_evidence("good", tmp_path, host="gpu-01", image=nightly)
    retag(base, [nightly], [f"vllm/vllm-openai@{GOOD_DIGEST}"])
    ident = identity(tmp_path)[1]["compat.image_identity"]
    assert ident.status == Status.FAIL and "tag nightly is not the profile's kimi-k3" in ident.reason


def pinned_profile(tmp_path: Path, digest: str):
    data = yaml.safe_load((ROOT / "profiles" / "kimi-k3.yml").read_text())
    data["image"]["digest"] = digest
    path = tmp_path / "kimi-k3-pinned.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_profile(path)


def test_an_inventory_digest_never_replaces_the_profile_pinned_one(tmp_path: Path) -> None:
    other = "sha256:" + "d" * 64
    profile = pinned_profile(tmp_path, other)                          # the profile pins another build
    build_evidence("good", tmp_path, host="gpu-01", image_digest=GOOD_DIGEST)   # the inventory pins what runs
    ident = identity(tmp_path, profile)[1]["compat.image_identity"]
    assert ident.status == Status.FAIL and ident.observed["official"] is False
    assert f"the inventory pins {GOOD_DIGEST}, not the profile's {other}" in ident.reason


def test_the_profile_pinned_digest_passes(tmp_path: Path) -> None:
    profile = pinned_profile(tmp_path, GOOD_DIGEST)
    build_evidence("good", tmp_path, host="gpu-01")
    assert identity(tmp_path, profile)[1]["compat.image_identity"].status == Status.PASS


def test_a_retagged_non_official_image_fails_rebuild_and_still_says_it_is_not_the_official_one(tmp_path: Path) -> None:
    """The custom name on the official image's metadata (a local retag: no RepoDigest for its repository)."""
    build_evidence("good", tmp_path, host="gpu-01", image=CUSTOM)
    findings, checks = identity(tmp_path)
    ident = checks["compat.image_identity"]
    assert ident.status == Status.FAIL and ident.consequence == Consequence.REBUILD
    assert "a retagged or locally built image" in ident.reason and ident.observed["official"] is False
    assert not_official_image(KIMI, findings)["reference"] == [CUSTOM]
