"""Official means the recipe's image and minimums (issue 42, item 2): a profile, a site profile after `extends:`
included, whose image, CUDA major, forbidden tag suffixes, driver or vLLM minimums differ from the recipe it names
(what the recipe generates) or from the official profile it extends is judged on the experimental route: the report
says so first, the lineage checks apply, and it never releases as the recipe's deployment."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.core.rundir import open_run
from vllm_acceptance.recipe.official import recipe_deviations
from vllm_acceptance.report.build import build_report

REPO = Path(__file__).resolve().parents[2]
SAMPLES_PATH = REPO / "tests" / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples_recipe_identity", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)

# The issue's example, word for word: a site profile over the official recipe profile.
SITE = """\
extends: kimi-k3
name: acme-k3
image:
  reference: ghcr.io/acme/vllm-k3:custom
  forbidden_tag_suffixes: []
driver:
  min_branch: 570
"""
CHANGED = {"image.reference", "image.forbidden_tag_suffixes", "driver.min_branch"}


def site_profile(tmp_path: Path, text: str = SITE, name: str = "acme-k3.yml") -> Path:
    path = tmp_path / "site" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.replace("extends: kimi-k3", f"extends: {REPO / 'profiles' / 'kimi-k3.yml'}"))
    return path


def green_run(tmp_path: Path) -> Path:
    """A run whose every stage passed (the report samples' `release` run: on the official profile it releases)."""
    return samples.make_run("release", tmp_path / "reports")


def assert_off_recipe(report: dict, fields: set[str] = CHANGED) -> None:
    assert report["verdict"] == "limited_observation" and report["experimental"] is True
    first = report["verdict_reasons"][0]
    assert first.startswith("NOT THE RECIPE'S IMAGE AND MINIMUMS"), first
    assert all(f in first for f in fields), first
    assert {d["field"] for d in report["recipe_deviations"]} == fields
    scope = [f for f in report["findings"] if f["check"] == "compat.lineage.release_scope"]
    assert scope and scope[0]["status"] == "fail"
    assert report["lineage_checks"]["compat.lineage.complete"]["status"] == "fail"   # no lineage recorded


def test_the_official_profile_releases_on_a_green_run(tmp_path: Path) -> None:
    report = build_report(green_run(tmp_path), load_profile(REPO / "profiles" / "kimi-k3.yml"))
    assert report["verdict"] == "release" and report["experimental"] is False
    assert report["recipe_deviations"] == []


def test_the_issues_site_profile_never_releases_as_the_recipe(tmp_path: Path) -> None:
    profile = load_profile(site_profile(tmp_path))
    assert profile.model.image.reference == "ghcr.io/acme/vllm-k3:custom" and not profile.experimental
    report = build_report(green_run(tmp_path), profile)
    assert_off_recipe(report)
    driver = next(d for d in report["recipe_deviations"] if d["field"] == "driver.min_branch")
    assert (driver["profile"], driver["official"]) == (570, 580) and "Kimi-K3.yaml" in driver["source"]


def test_through_a_run_the_frozen_merged_profile_is_still_judged_off_recipe(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """The run freezes the merged profile (no `extends` left): run.json keeps what the chain said, and the recipe is
    regenerated from the frozen copy's recipe record; `report` on the run directory is not a release."""
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path / "reports", inventory="site",
                          hosts=samples.nodes_for("release"),
                          variables={"acceptance_profile": str(site_profile(tmp_path)), "acceptance_owner": "me",
                                     "vllm_serve_mode": "launch"})
    assert {d["field"] for d in json.loads((run_dir / "run.json").read_text())["recipe_deviations"]} == CHANGED
    green = green_run(tmp_path)
    for sub in ("findings", "stages"):
        shutil.rmtree(run_dir / sub)
        shutil.copytree(green / sub, run_dir / sub)
    shutil.copytree(green / "evidence", run_dir / "evidence", dirs_exist_ok=True)
    assert cli.main(["report", "--run-dir", str(run_dir)]) == 10           # limited_observation, not 0 (release)
    report = json.loads((run_dir / "report.json").read_text())
    assert_off_recipe(report)
    head = (run_dir / "report.md").read_text().split("## Reasons")[0]       # the first screen says so
    assert "Not the recipe's image and minimums" in head and "driver.min_branch" in head
    assert 'id="recipe-deviations"' in (run_dir / "report.html").read_text()


def test_a_copy_of_the_recipe_profile_is_compared_with_what_the_recipe_generates(tmp_path: Path) -> None:
    """No `extends`: the profile names the recipe (its recipe record) and is held to what that recipe generates."""
    data = yaml.safe_load((REPO / "profiles" / "kimi-k3.yml").read_text())
    data["name"] = "acme-k3-copy"
    data["image"]["reference"] = "ghcr.io/acme/vllm-k3:custom"
    path = tmp_path / "acme-k3-copy.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    profile = load_profile(path)
    assert profile.official_deviations == ()                             # nothing extended
    assert_off_recipe(build_report(green_run(tmp_path), profile), {"image.reference"})


@pytest.mark.parametrize("override,field", [
    ("image:\n  cuda_major: 12\n", "image.cuda_major"),
    ("image:\n  forbidden_tag_suffixes: [-cu129, -dev]\n", "image.forbidden_tag_suffixes"),   # stricter, still other
    ("driver:\n  min_version: '575.57.08'\n", "driver.min_version"),
    ("vllm:\n  min_version: '0.20.0'\n", "vllm.min_version"),
])
def test_each_official_field_counts(tmp_path: Path, override: str, field: str) -> None:
    profile = load_profile(site_profile(tmp_path, "extends: kimi-k3\nname: acme-k3\n" + override))
    assert [d["field"] for d in recipe_deviations(profile.data)] == [field]
    assert [d["field"] for d in profile.official_deviations] == [field]


def test_site_values_beside_the_image_and_minimums_keep_the_recipes_release(tmp_path: Path) -> None:
    """A site profile that pins the official image's digest and sets its own owner is still the recipe's."""
    text = ("extends: kimi-k3\nname: acme-k3\nimage:\n  digest: 'sha256:" + "a" * 64 + "'\n"
            "review:\n  owner: acme-sre\n")
    profile = load_profile(site_profile(tmp_path, text))
    report = build_report(green_run(tmp_path), profile)
    assert report["verdict"] == "release" and report["experimental"] is False and report["recipe_deviations"] == []


def test_a_recipe_that_cannot_be_regenerated_proves_nothing(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "profiles" / "kimi-k3.yml").read_text())
    data["recipe"]["file"] = "recipes/vllm-project/Kimi-K3-gone.yaml"
    rows = recipe_deviations(data)
    assert [r["field"] for r in rows] == ["recipe"] and "cannot be regenerated" in rows[0]["source"]


def test_a_site_profile_over_the_rehearsal_profile_is_held_to_it(tmp_path: Path) -> None:
    """A profile that names no recipe file (the rehearsal's) is held to the official profile it extends: the
    rehearsal's custom-image-site scenario runs this shape."""
    text = ("extends: rehearsal-gb300\nname: acme-rehearsal\nimage:\n  reference: ghcr.io/acme/vllm-k3:custom\n"
            "  forbidden_tag_suffixes: []\ndriver:\n  min_branch: 570\n")
    path = tmp_path / "acme-rehearsal.yml"
    path.write_text(text.replace("extends: rehearsal-gb300", f"extends: {REPO / 'profiles' / 'rehearsal-gb300.yml'}"))
    profile = load_profile(path)
    assert recipe_deviations(profile.data) == []
    assert {d["field"] for d in profile.official_deviations} == CHANGED
    scope = [f for f in build_report(green_run(tmp_path), profile)["findings"]
             if f["check"] == "compat.lineage.release_scope"]
    assert scope[0]["status"] == Status.FAIL.value
