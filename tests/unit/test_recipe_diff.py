"""`recipe diff` between two real versions of the official Kimi K3 recipe (tests/fixtures/recipes/Kimi-K3-761eca2.yaml,
2026-08-05, and the vendored recipes/vllm-project/Kimi-K3.yaml, 2026-08-20), and a run whose profile's recipe
differs from the one of the last signed acceptance reopening it by name (report/reopen.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from vllm_acceptance.cli import main
from vllm_acceptance.recipe.diff import diff_recipes
from vllm_acceptance.recipe.resolve import Selection
from vllm_acceptance.report.reopen import reopen_status

ROOT = Path(__file__).resolve().parents[2]
NEW = ROOT / "recipes" / "vllm-project" / "Kimi-K3.yaml"
OLD = ROOT / "tests" / "fixtures" / "recipes" / "Kimi-K3-761eca2.yaml"


def changes(hardware: str, strategy: str) -> dict[str, dict]:
    result = diff_recipes(OLD, NEW, Selection(hardware, strategy))
    assert result["old"]["commit"] == "761eca2202c6a0af9cc734c61bb0a1c318e7878d"
    assert result["new"]["commit"] == "6f19519bb680e870356b72a06d2638d6efc6da70"
    return {c["name"]: c for c in result["changes"]}


def test_diff_names_each_argument_variable_and_version_that_changed_for_b300() -> None:
    found = changes("b300", "single_node_tp")
    assert found["arg --moe-backend"]["was"] == "auto" and found["arg --moe-backend"]["now"] is None
    assert found["arg --moe-backend"]["was_source"] == "model.base_args"
    assert "TRTLLM_RAGGED" in found["arg --attention-config"]["was"]
    assert "flashinfer" in found["arg --attention-config"]["now"]
    assert found["env VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION"]["now"] is None
    assert (found["min_vllm_version"]["was"], found["min_vllm_version"]["now"]) == ("0.27.0", "0.27.1")
    # the image is the same tag, though the old recipe named it in model.docker_image and the new one in its guide
    assert "image" not in found and "arg --max-model-len" not in found


def test_hopper_sees_only_its_own_changes() -> None:
    found = changes("h200", "single_node_tp")
    assert "arg --attention-config" not in found            # a Blackwell override
    assert "arg --moe-backend" not in found                  # hopper's marlin won over base_args' auto both times
    assert "min_vllm_version" in found


def test_the_same_recipe_has_no_change_and_the_cli_exit_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipe", "diff", str(NEW), str(NEW), "--hardware", "gb300", "--strategy", "multi_node_tp"]) == 0
    assert "no change for this deployment" in capsys.readouterr().out
    assert main(["recipe", "diff", str(OLD), str(NEW), "--hardware", "b300", "--strategy", "single_node_tp"]) == 1
    out = capsys.readouterr().out
    assert "--moe-backend: auto (model.base_args) -> absent" in out
    assert main(["recipe", "diff", str(OLD), str(NEW), "--hardware", "b300", "--strategy", "nope"]) == 2


def write_run(run_dir: Path, recipe: dict, signed: bool) -> dict:
    run_dir.mkdir(parents=True)
    report = {"inventory": "site", "profile": "kimi-k3-b300", "recipe": recipe, "hosts": [], "stages": {}}
    (run_dir / "report.json").write_text(json.dumps(report))
    if signed:
        digest = hashlib.sha256((run_dir / "report.json").read_bytes()).hexdigest()
        (run_dir / "signoff.json").write_text(json.dumps({"decision": "release", "reviewer": "L. Chen",
                                                          "signed_at": "2026-11-01T10:00:00Z",
                                                          "report_sha256": digest}))
    return report


def test_a_run_on_another_recipe_commit_reopens_the_signed_acceptance_by_name(tmp_path: Path) -> None:
    record = {"source": "vllm-project/recipes: models/moonshotai/Kimi-K3.yaml", "status": "pre-release",
              "checked": "2026-12-02", "commit": "761eca2202c6a0af9cc734c61bb0a1c318e7878d",
              "sha256": hashlib.sha256(OLD.read_bytes()).hexdigest(), "hardware": "b300", "strategy": "single_node_tp"}
    write_run(tmp_path / "site" / "run1", record, signed=True)
    same = write_run(tmp_path / "site" / "run2", record, signed=False)
    assert reopen_status(tmp_path / "site" / "run2", same)["status"] == "unchanged"
    newer = {**record, "commit": "6f19519bb680e870356b72a06d2638d6efc6da70",
             "sha256": hashlib.sha256(NEW.read_bytes()).hexdigest()}
    now = write_run(tmp_path / "site" / "run3", newer, signed=False)
    reopen = reopen_status(tmp_path / "site" / "run3", now)
    assert reopen["status"] == "reopened" and [t["trigger"] for t in reopen["fired"]] == ["recipe"]
    parts = " ".join(reopen["fired"][0]["changed"])
    assert "commit: 761eca2202c6a0af9cc734c61bb0a1c318e7878d -> 6f19519bb680e870356b72a06d2638d6efc6da70" in parts
    assert "sha256:" in parts and "recipe diff" in reopen["fired"][0]["meaning"]


def test_the_flag_the_launch_leaves_out_is_an_explained_difference(tmp_path: Path) -> None:
    """DEP across nodes: the recipe's --data-parallel-hybrid-lb is left out of the launch (recipe/resolve.py
    LEFT_OUT_ACROSS_NODES, the launch balances through the head); the diff still carries it with its source and why,
    so a recipe that drops (or changes) it is a named change, never a silent drift."""
    import shutil

    from vllm_acceptance.recipe.diff import snapshot
    from vllm_acceptance.recipe.generate import load_facts
    from vllm_acceptance.recipe.reader import load_bundle

    selection = Selection("gb300", "multi_node_dep")
    taken = snapshot(load_bundle(NEW), selection, load_facts())["arg --data-parallel-hybrid-lb"]
    assert taken == ("(set in the recipe; left out of the launch)", "strategies/multi_node_dep.yaml vllm_args")
    copy = tmp_path / "vllm-project"
    shutil.copytree(NEW.parent, copy)
    strategy = copy / "strategies" / "multi_node_dep.yaml"
    strategy.write_text(strategy.read_text().replace('  - "--data-parallel-hybrid-lb"\n', ""))
    found = {c["name"]: c for c in diff_recipes(NEW, copy / "Kimi-K3.yaml", selection)["changes"]}
    assert found["arg --data-parallel-hybrid-lb"]["was"] == "(set in the recipe; left out of the launch)"
    assert found["arg --data-parallel-hybrid-lb"]["now"] is None
