"""A deployment that carries P/D pools or speculative decoding has its answers proven against a reference: the
quality stage is required for it whether or not the inventory's acceptance_probes names it, and a run without it is
incomplete, never a release (core/arithmetic.py required_paths, report/build.py). The K3 recipe's own fp8 KV
launch is the accepted path itself: no stage required for it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.core.arithmetic import launch_paths, profile_paths, required_paths
from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.core.profile_model import ProfileModel
from vllm_acceptance.report.build import collect_findings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "reports"))
import samples  # noqa: E402 - the sample run builder lives with the fixtures

ROOT = Path(__file__).resolve().parents[2]


def model(name: str) -> ProfileModel:
    return load_profile(ROOT / "profiles" / f"{name}.yml").model


def test_the_paths_that_change_the_arithmetic_are_read_from_the_launch() -> None:
    assert launch_paths(["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}']) == [
        "speculative decoding (--speculative-config)"]
    assert launch_paths(["--kv-cache-dtype=fp8_e4m3"]) == ["fp8 KV cache (--kv-cache-dtype fp8_e4m3)"]
    assert launch_paths(["-dcp", "2"]) == ["decode context parallel (--decode-context-parallel-size 2)"]
    assert launch_paths(["--kv-cache-dtype", "auto", "--decode-context-parallel-size", "1"]) == []
    assert profile_paths(model("lab-pd"))[0] == "P/D pools decode, prefill"
    assert profile_paths(model("cpu-lab-spec")) == ["speculative decoding (--speculative-config)"]
    assert profile_paths(model("cpu-lab")) == []


def test_the_recipes_own_fp8_kv_requires_no_quality_stage() -> None:
    k3 = model("kimi-k3")
    assert "fp8 KV cache (--kv-cache-dtype fp8)" in profile_paths(k3) and required_paths(k3) == []
    assert required_paths(model("lab-pd")) == ["P/D pools decode, prefill"]


@pytest.mark.parametrize("args", [["--speculative-config", '{"method":"ngram"}'],
                                  ['--speculative-config={"method":"dspark","num_speculative_tokens":8}']])
def test_a_run_of_such_a_deployment_without_the_quality_stage_misses_it(args: list[str], tmp_path: Path) -> None:
    run_dir, _ = samples.build("release", tmp_path)
    findings, _ = collect_findings(run_dir)
    assert not [f for f in findings if f.check.startswith("quality.")]      # the recipe's launch (fp8 KV) as is
    frozen = run_dir / "evidence" / "profile.yml"
    data = yaml.safe_load(frozen.read_text())
    data.setdefault("launch", {})["args"] = [*(data["launch"].get("args") or []), *args]
    frozen.write_text(yaml.safe_dump(data, sort_keys=False))
    meta = json.loads((run_dir / "run.json").read_text())
    assert "quality" not in (meta.get("inventory_vars") or {}).get("acceptance_probes", [])
    findings, _ = collect_findings(run_dir)
    quality = [f for f in findings if f.check.startswith("quality.")]
    assert [(f.check, f.status) for f in quality] == [("quality.parity", Status.MISSING)]
    assert "name quality in acceptance_probes" in quality[0].reason
