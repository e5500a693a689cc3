"""Profiles and inventory variables: valid ones load, invalid ones name the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.core.rundir import open_run, validate_inventory_vars

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["kimi-k3", "cpu-lab", "cpu-lab-k3", "cpu-lab-vision"])
def test_shipped_profiles_are_valid(name: str) -> None:
    assert load_profile(REPO / "profiles" / f"{name}.yml").name == name


def test_kimi_profile_carries_the_recipe() -> None:
    p = load_profile(REPO / "profiles" / "kimi-k3.yml")
    assert p.get("image.reference") == "vllm/vllm-openai:kimi-k3" and p.get("image.cuda_major") == 13
    assert p.get("driver.min_version") == "580.65.06" and p.get("driver.min_branch") == 580
    assert p.get("vllm.min_version") == "0.27.1" and p.get("hardware.min_gpus") == 8
    assert "--tool-call-parser=kimi_k3" in p.get("launch.args") and p.get("model.hybrid_cache") is True
    assert p.get("launch.env")["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"


def write(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text())
    mutate(data)
    path = tmp_path / "p.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("mutate", "field", "hint"), [
    (lambda d: d["contract"].update(concurrency="lots"), "contract.concurrency", "integer"),
    (lambda d: d["launch"].update(runtime="kubernetes"), "launch.runtime", "'process', 'docker', 'podman'"),
    (lambda d: d["hardware"].pop("accelerator"), "hardware", "add the field"),
    (lambda d: d.update(colour="blue"), "(top level)", "known fields"),
    (lambda d: d.update(experimental=True), "(top level)", "lineage"),
])
def test_invalid_profile_names_field_and_fix(tmp_path: Path, mutate, field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_profile(write(tmp_path, mutate))
    message = str(err.value)
    assert str(tmp_path / "p.yml") in message and f"`{field}`" in message and hint in message


def test_missing_and_unparseable_profiles(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_profile(tmp_path / "nope.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_profile(bad)


def test_inventory_vars_are_validated() -> None:
    with pytest.raises(ConfigError, match="vllm_serve_mode"):
        validate_inventory_vars({"acceptance_profile": "cpu-lab", "acceptance_owner": "me", "vllm_serve_mode": "x"},
                                "inv")
    with pytest.raises(ConfigError, match="vllm_base_url"):
        validate_inventory_vars({"acceptance_profile": "cpu-lab", "acceptance_owner": "me",
                                 "vllm_serve_mode": "attach"}, "inv")


def test_open_run_makes_unique_directories_and_names_unknown_profiles(tmp_path: Path) -> None:
    variables = {"acceptance_profile": "cpu-lab", "acceptance_owner": "me", "vllm_serve_mode": "launch",
                 "vllm_serve_api_key": "sk-secret-1234"}
    a, _ = open_run(project_dir=REPO, reports_dir=tmp_path, inventory="lab", variables=variables, hosts=["h"])
    b, _ = open_run(project_dir=REPO, reports_dir=tmp_path, inventory="lab", variables=variables, hosts=["h"])
    assert a != b and (a / "run.json").is_file()
    assert "sk-secret-1234" not in (a / "run.json").read_text()
    with pytest.raises(ConfigError, match="allowed: .*cpu-lab"):
        open_run(project_dir=REPO, reports_dir=tmp_path, inventory="lab",
                 variables={**variables, "acceptance_profile": "kimi-k9"}, hosts=[])


def test_a_profile_read_again_is_a_fresh_copy_and_an_edited_file_is_read_anew(tmp_path: Path) -> None:
    """Profile YAML is parsed once per distinct text (core/profile.py parse_yaml): a caller changing what it got
    never changes the next read, and an edited file gives the edited values."""
    from vllm_acceptance.core.profile import parse_yaml

    first = parse_yaml("a: {b: [1, 2]}\n")
    first["a"]["b"].append(3)
    assert parse_yaml("a: {b: [1, 2]}\n") == {"a": {"b": [1, 2]}}
    source = Path(__file__).resolve().parents[2] / "profiles" / "cpu-lab.yml"
    path = tmp_path / "cpu-lab.yml"
    path.write_text(source.read_text())
    before = load_profile(path)
    path.write_text(source.read_text().replace("concurrency: 4", "concurrency: 3", 1))
    after = load_profile(path)
    assert before.data != after.data and load_profile(source).data == before.data
    path.write_text("a: [unclosed\n")
    for _ in range(2):                                     # an error is raised on every read, never cached
        with pytest.raises(ConfigError, match="not valid YAML"):
            load_profile(path)
