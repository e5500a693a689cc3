"""The typed profile (core/profile_model.py): every shipped profile loads into it, as written; each default a
reader uses lives in the model, once."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from vllm_acceptance.core import profile_schema
from vllm_acceptance.core.profile import Profile, load_profile, load_schema
from vllm_acceptance.core.profile_model import NO_PROFILE, ProfileModel

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "profiles").glob("*.yml"))
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "profiles").glob("**/*.yml"))


@pytest.mark.parametrize("path", SHIPPED + FIXTURES, ids=lambda p: p.name)
def test_every_profile_loads_into_the_model_as_written(path: Path) -> None:
    profile = load_profile(path)
    model = profile.model
    assert isinstance(model, ProfileModel) and model is profile.model       # built once
    assert model.document() == profile.data       # nothing lost, nothing coerced (900 stays 900, not 900.0)
    assert model.name == profile.name and model.at("model.name") == model.model.name


def test_shipped_profiles_exist() -> None:
    assert len(SHIPPED) >= 5


def _without(path: str) -> Profile:
    base = load_profile(ROOT / "profiles" / "cpu-lab.yml")
    data = copy.deepcopy(base.data)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.get(part, {})
    node.pop(last, None)
    return Profile(data=data, source="test")


@pytest.mark.parametrize(("dotted", "default"), [
    ("launch.ready_timeout_s", 900), ("launch.port", 8000), ("launch.host", "0.0.0.0"),   # noqa: S104
    ("hardware.min_nodes", 1), ("hardware.collective_backend", "nccl"), ("hardware.nvswitch", False),
    ("review.period_days", 30), ("remediation.evidence_max_age_h", 72), ("agent.repeats", 3),
    ("agent.cases", 300), ("agent.case_tools", "sample"), ("thresholds.tool_abstain_min", 0.9),
    ("thresholds.reference_agreement_min", 0.80), ("load.soak_s", 20), ("load.verify_limit", True),
    ("loadgen.processes", "auto"), ("contract.max_output_tokens", 64), ("cache.rounds", 3),
    ("launch.multinode.dmabuf_workaround_env", {"NCCL_DMABUF_ENABLE": "0"}),
])
def test_a_profile_without_the_field_reads_the_models_default(dotted: str, default: object) -> None:
    profile = _without(dotted)
    assert profile.get(dotted) is None                    # the document does not have it
    assert profile.model.at(dotted) == default            # the model does, from one place
    assert ProfileModel.default_of(dotted) == default     # ... which a run without a profile reads too


def test_a_field_every_profile_states_has_no_default_but_a_no_profile_value() -> None:
    assert ProfileModel.model_fields["load"].is_required()
    assert ProfileModel.default_of("load.request_timeout_s") == NO_PROFILE["load.request_timeout_s"]
    assert ProfileModel.default_of("no.such", "x") == "x" and ProfileModel.default_of("load.nope", 1) == 1


def test_the_model_refuses_what_the_schema_refuses() -> None:
    data = copy.deepcopy(load_profile(ROOT / "profiles" / "cpu-lab.yml").data)
    data["launch"]["surprise"] = 1
    with pytest.raises(ValidationError):
        ProfileModel.model_validate(data)
    data["launch"].pop("surprise")
    data["launch"]["port"] = 70000
    with pytest.raises(ValidationError):
        ProfileModel.model_validate(data)


# A raw read of a profile's fields: `profile.get(...)` (any receiver: ctx.profile, opts.profile, ...), or the
# document's fields by index/get (`profile.data[...]`, `profile.data.get(...)`), or `x.profile.data` at all.
RAW_READ = re.compile(r"profile\.get\(|profile\.data\s*(\[|\.get\()|\.profile\.data\b")
MODEL_FILES = {Path("src/vllm_acceptance/core/profile.py"), Path("src/vllm_acceptance/core/profile_model.py")}


def test_no_raw_profile_reads_outside_the_model() -> None:
    """Readers take the model (`profile.model.launch.ready_timeout_s`, `ProfileModel.at` for a name given as a
    string). `profile.data` as a whole stays for what handles the whole document: writing the run's
    profile.yml, the module's result, and the document checks of core/contract.py and rebuild/lineage.py."""
    offenders = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]):
        rel = path.relative_to(ROOT)
        if rel in MODEL_FILES:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if RAW_READ.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "raw profile reads (read profile.model instead):\n" + "\n".join(offenders)


def test_the_no_raw_read_pattern_catches_what_it_names() -> None:
    for line in ('profile.get("launch.port", 8000)', 'ctx.profile.get("image.digest")', 'x = profile.data["launch"]',
                 'opts.profile.data.get("agent")', "run.profile.data"):
        assert RAW_READ.search(line), line
    for line in ("profile.model.launch.port", "yaml.safe_dump(profile.data)", 'judged.get("launch")'):
        assert not RAW_READ.search(line), line


def test_the_committed_schema_is_the_one_generated_from_the_model() -> None:
    """schemas/profile.schema.json is written by `python -m vllm_acceptance.core.profile_schema`: a field, type,
    bound or default changed in core/profile_model.py and not regenerated fails here."""
    assert profile_schema.schema_path().read_text() == profile_schema.render()
    assert load_schema("profile") == profile_schema.generate()


def test_the_docs_field_table_is_the_one_generated_from_the_model() -> None:
    text = profile_schema.DOCS_FILE.read_text()
    assert profile_schema.render_docs(text) == text
    assert "| `launch.ready_timeout_s` | a number above 0 | `900` |" in text


def test_the_schema_states_each_model_default() -> None:
    schema = load_schema("profile")
    launch = schema["properties"]["launch"]["properties"]
    assert launch["ready_timeout_s"] == {"$ref": "#/$defs/posnum", "default": 900}
    assert schema["properties"]["thresholds"]["properties"]["tool_abstain_min"]["default"] == 0.9
    assert "default" not in launch["args"] and "null" in schema["properties"]["image"]["properties"]["digest"]["type"]
    assert "null" not in str(schema["properties"]["hardware"]["properties"]["interconnect"])   # absent, never null


def test_the_check_entry_point_passes_on_the_committed_files() -> None:
    assert profile_schema.main(["--check"]) == 0
