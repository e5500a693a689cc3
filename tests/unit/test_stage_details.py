"""The stage details, typed (core/stage_details.py; issue 27 item 3): read by field, nothing lost on the way, a
wrong value dropped instead of failing a report, and no reader left chaining `.get()` into report.json's stages."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from vllm_acceptance.core.stage_details import STAGE_TYPES, LoadDetails, ServeDetails, StageDetails

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "reports"))
import samples  # noqa: E402 - the sample run builder lives with the fixtures


def assert_reads_back(report: dict) -> int:
    """Each stage's typed reading gives back what the stage wrote: the same values of the same types (a 5 stays
    5, not 5.0). The launch-mode run's real report is checked the same way (tests/integration/test_pipeline_lab.py)."""
    typed, seen = StageDetails.of(report), 0
    for name in STAGE_TYPES:
        raw = (report.get("stages") or {}).get(name)
        if isinstance(raw, dict):
            seen += 1
            assert json.dumps(getattr(typed, name).document(), sort_keys=True) == json.dumps(raw, sort_keys=True)
    return seen


@pytest.mark.parametrize("kind", samples.KINDS)
def test_every_sample_stage_reads_back_exactly(kind: str, tmp_path: Path) -> None:
    _, report = samples.build(kind, tmp_path)
    assert assert_reads_back(report) >= (1 if kind == "early_death" else 3)


def test_fields_are_read_with_their_types_and_defaults() -> None:
    typed = StageDetails.of({"stages": {"load": {"knee": 4, "contract_concurrency": 8, "steps": [{"concurrency": 1}],
                                                 "workload": {"output_tokens": 64, "shape": "agent"}},
                                        "serve": {"version": "0.32.0", "max_model_len": 2048}}})
    assert typed.load.knee == 4 and isinstance(typed.load.knee, int) and typed.load.steps == [{"concurrency": 1}]
    assert typed.load.workload is not None and typed.load.workload.output_tokens == 64
    assert typed.load.workload.value("shape") == "agent"          # a field the stage wrote beyond the declared
    assert typed.serve.max_model_len == 2048 and typed.serve.warnings == [] and typed.serve.has("version")
    assert not typed.cache and typed.cache.requests == [] and typed.teardown.action is None


def test_a_wrong_value_is_dropped_never_an_error() -> None:
    serve = ServeDetails.read({"version": "0.32.0", "max_model_len": "not a number", "warnings": "one"})
    assert serve.version == "0.32.0" and serve.max_model_len is None and serve.warnings == []
    assert not serve.has("max_model_len") and serve.document() == {"version": "0.32.0"}
    assert LoadDetails.read(["not", "a", "mapping"]) == LoadDetails() and not LoadDetails.read(None)


def test_no_reader_chains_into_the_stages_by_hand() -> None:
    """The report, the diff, the re-open check and the monitoring read stage details through StageDetails."""
    raw = re.compile(r"""get\(["']stages["']\)|\[["']stages["']\]|\bstages\.get\(["'](?!teardown)""")
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in ("report", "monitoring", "verdict.py")
             for p in sorted((ROOT / "src" / "vllm_acceptance").glob(folder if folder.endswith(".py")
                                                                     else f"{folder}/*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if raw.search(line) and not line.lstrip().startswith("#")]
    assert not found, found
