"""A recipe flag at that vLLM version's default is absent from the startup log's non-default args (issue 31,
item 7): it is read from the engine config line vLLM prints ("Initializing a V1 LLM engine ... with config:"),
else unverifiable, never failed for its absence alone; a value another source shows differently still fails.
Real captures of several vLLM versions (tests/fixtures/real/vllm/, sources in the YAML beside each log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.parsers.engine_config import engine_config
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.compat import ServerReports, check_actual_config, check_startup_log
from vllm_acceptance.rules.flag_readings import DIFFERS, MATCH, UNVERIFIABLE, read_from_startup_log

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real" / "vllm"
CPU_LAB = load_profile(ROOT / "profiles" / "cpu-lab.yml")
V032 = "v1-0.32-cpu-lab-ready-one-line-kv.log"       # both lines; launched without --load-format or --seed
V0102 = "v1-0.10.2-dev-engine-config-tp2.log"         # both lines; launched with only --tensor-parallel-size 2
V083 = "v0-0.8.3-engine-init-line.log"                # V0: no non-default args line, the engine config only


def scan(name: str):
    return scan_startup_log((REAL / name).read_text())


def reading(name: str, key: str, want):
    return read_from_startup_log(key, want, scan(name), {})


@pytest.mark.parametrize(("name", "key", "want"), [
    (V032, "load_format", "auto"), (V032, "seed", "0"), (V032, "trust_remote_code", False),
    (V0102, "load_format", "auto"), (V0102, "disable_custom_all_reduce", False), (V0102, "dtype", "bfloat16"),
    (V083, "load_format", "auto"), (V083, "enforce_eager", False), (V083, "dtype", "half"),
])
def test_flag_at_its_default_is_read_from_the_engine_config(name: str, key: str, want) -> None:
    """Absent from the non-default args (at the default) -> the engine config shows the value in effect."""
    if scan(name).non_default_args is not None:
        assert key not in scan(name).non_default_args
    got = reading(name, key, want)
    assert got.state == MATCH, got.describe()
    assert got.source.startswith("startup log engine config, line")


@pytest.mark.parametrize(("name", "key", "want", "shown"), [
    (V032, "load_format", "fastsafetensors", "auto"), (V032, "trust_remote_code", True, False),
    (V0102, "disable_custom_all_reduce", True, False), (V0102, "load_format", "fastsafetensors", "auto"),
    (V083, "enforce_eager", True, False),
])
def test_flag_set_to_another_value_fails(name: str, key: str, want, shown) -> None:
    got = reading(name, key, want)
    assert got.state == DIFFERS and got.shown == shown, got.describe()


def test_flag_shown_nowhere_is_unverifiable_and_auto_is_not_compared_with_what_it_resolved_to() -> None:
    none = reading(V032, "max_num_seqs", "4")
    assert none.state == UNVERIFIABLE
    assert "not among the server's non-default args" in none.source and "the engine config (line" in none.source
    resolved = reading(V0102, "dtype", "auto")             # the engine config prints torch.bfloat16, auto's result
    assert resolved.state == UNVERIFIABLE and "what 'auto' resolved to" in resolved.source
    # the 0.10.2 line is cut inside its last field ("quantization="): that field is not read as a value
    assert "quantization" not in scan(V0102).engine_config
    assert reading(V0102, "quantization", "fp8").state == UNVERIFIABLE


def test_the_non_default_args_still_decide_first() -> None:
    """tensor_parallel_size 2 is in both lines of the 0.10.2 capture; asked 4, it fails from the first."""
    got = reading(V0102, "tensor_parallel_size", "4")
    assert got.state == DIFFERS and got.source.startswith("startup log non-default args, line 3")


def test_engine_config_lines_of_three_versions() -> None:
    old = scan("v0-0.2-gpu-cpu-blocks-kv-too-small.log").engine_config
    assert old["max_seq_len"] == 4096 and old["seed"] == 0 and old["load_format"] == "auto"     # stray ")" closes it
    v083 = scan(V083).engine_config
    assert v083["kv_cache_dtype"] == "auto" and v083["device_config"] == "cuda"     # ",  " between two fields
    assert "served_model_name" not in v083                                          # cut inside it
    lab = scan(V032).engine_config
    assert lab["served_model_name"] == "tiny-agent" and lab["dtype"] == "torch.float32"
    assert lab["kernel_config"]["moe_backend"] == "auto" and lab["kernel_config"]["enable_flashinfer_autotune"] is True
    assert engine_config("INFO non-default args: {}") is None


def test_nested_engine_config_field_read_for_the_recipe_flag() -> None:
    """--no-enable-flashinfer-autotune (the Kimi K3 recipe) against a 0.32 server that kept it on."""
    got = reading(V032, "enable_flashinfer_autotune", False)
    assert got.state == DIFFERS and got.shown is True


# the launch recorded in the 0.32 capture's YAML
V032_ARGS = ["--enable-prefix-caching", "--max-model-len=2048", "--enable-auto-tool-choice",
             "--tool-call-parser=hermes", "--dtype=float32", "--enforce-eager"]


def with_args(profile: Profile, *extra: str) -> Profile:
    data = json.loads(json.dumps(profile.data))
    data["launch"]["args"] = V032_ARGS + list(extra)
    return Profile(data=data, source=profile.source)


def test_actual_config_and_startup_log_on_a_real_capture() -> None:
    """The lab's own 0.32 capture: a recipe flag at its default passes; the same flag asked with another value
    fails compat.actual_config.flags and compat.startup_log (a flag differing in any source fails)."""
    log = scan(V032)
    models = {"data": [{"id": "tiny-agent", "max_model_len": 2048}]}

    def flags(profile: Profile):
        reports = ServerReports(cache_config={"enable_prefix_caching": "True"}, models=models, startup=log)
        return {f.check: f for f in check_actual_config(reports, profile, "h")}["compat.actual_config.flags"]

    at_default = with_args(CPU_LAB, "--load-format=auto", "--seed=0")
    assert flags(at_default).status == Status.PASS
    other = with_args(CPU_LAB, "--load-format=fastsafetensors")
    failed = flags(other)
    assert failed.status == Status.FAIL and "--load-format=fastsafetensors: the server shows auto" in failed.reason
    startup = check_startup_log(log, other, "h", [])
    assert startup.status == Status.FAIL and "--load-format=fastsafetensors" in startup.reason
    assert check_startup_log(log, at_default, "h", []).status == Status.PASS


def test_a_config_object_is_not_compared_with_a_scalar_flag() -> None:
    """A config object against a scalar flag is another shape: unverifiable, never a difference. The line is
    hand-written in vLLM's format (generated, not a capture): device_config as a torch device object."""
    line = ("INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.9.0) with config: model='m', "
            "device_config=device(type='cuda'), seed=0, enforce_eager=False, pooler_config=None, "
            "compilation_config={\"level\":3})")
    got = read_from_startup_log("device", "cuda", scan_startup_log(line), {})
    assert got.state == UNVERIFIABLE and "not comparable" in got.source
    assert read_from_startup_log("enforce_eager", True, scan_startup_log(line), {}).state == DIFFERS
