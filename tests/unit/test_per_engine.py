"""Contract arithmetic per engine (issue 41, item 3): --max-num-seqs and --max-num-batched-tokens apply per engine
(each data-parallel rank schedules its own, vllm/v1/core/sched/scheduler.py), so they are multiplied by the engines
that serve the contract before any comparison: at validation, in the plan, and in compat.actual_config.unlisted_args
of a running server (the engines it shows: its startup log's data_parallel_size, the `engine` labels of /metrics).
Raising --max-num-batched-tokens above vLLM's default for the hardware never limits; lowering it below does.

The attached-server cases start from the real lab capture (tests/fixtures/real/vllm/v1-0.32-cpu-lab-max-num-seqs-1.log,
vLLM 0.32 CPU) and write it as the same server started with other arguments would print it (`as_started_with`): the
non-default args line and the engine config line, nothing else; the DP=2 line shape is vLLM's own (vllm-project/vllm
#18567: `non-default args: {'tensor_parallel_size': 2, 'data_parallel_size': 2}`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.contract import limits_contract
from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.core.rundir import open_run
from vllm_acceptance.hardware import vllm_batched_tokens_default
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.serve import ServerReports, check_actual_config, served_engines

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "fixtures" / "real" / "vllm" / "v1-0.32-cpu-lab-max-num-seqs-1.log"
LAB = load_profile(REPO / "profiles" / "cpu-lab.yml")
DEP16 = load_profile(REPO / "profiles" / "kimi-k3-gb300-dep16.yml")
CHECK = "compat.actual_config.unlisted_args"


def as_started_with(text: str, **args: object) -> str:
    """The real capture as the same server started with `args` prints it: each in the non-default args line (a new
    key first, an existing one replaced), data_parallel_size also in the engine config line."""
    def edit(match: re.Match[str]) -> str:
        body = match.group(2)
        for key, value in args.items():
            pattern = re.compile(rf"'{key}': [^,}}]+")
            body = pattern.sub(f"'{key}': {value!r}", body) if pattern.search(body) else f"'{key}': {value!r}, {body}"
        return f"{match.group(1)}{{{body}}}"
    text = re.sub(r"(non-default args: )\{(.*)\}", edit, text, count=1)
    if "data_parallel_size" in args:
        text = re.sub(r"data_parallel_size=\d+", f"data_parallel_size={args['data_parallel_size']}", text, count=1)
    return text


def unlisted(text: str, engines: list[str] | None = None, profile=LAB):
    reports = ServerReports(startup=scan_startup_log(text), log_evidence=["evidence/serve/startup.log"],
                            engines=engines)
    return {f.check: f for f in check_actual_config(reports, profile, "localhost")}[CHECK]


def test_max_num_seqs_counts_once_per_engine_the_server_shows() -> None:
    """The lab capture runs --max-num-seqs 1 for a contract of 4: one engine fails; the same server with four
    data-parallel engines serves 4 and passes; engine labels of /metrics that show fewer engines than the log win."""
    real = REAL.read_text()
    one = unlisted(real)
    assert one.status == Status.FAIL and one.observed["engines"]["count"] == 1
    four = as_started_with(real, data_parallel_size=4)
    passed = unlisted(four)
    assert passed.status == Status.PASS, passed.reason
    assert passed.observed["engines"] == {"count": 4, "per_engine_args": ["max_num_seqs", "max_num_batched_tokens"],
                                          "source": "startup log non-default args data_parallel_size: 4"}
    fewer = unlisted(four, engines=["0", "1"])
    assert fewer.status == Status.FAIL and "1 per engine x 2 engines = 2" in fewer.reason
    assert unlisted(real, engines=["0", "1", "2", "3"]).status == Status.FAIL    # the log shows one engine


def test_raising_max_num_batched_tokens_is_no_limit_lowering_it_is() -> None:
    """vLLM's default for the lab (CPU API server) is 2048 per engine (hardware.py, vllm/engine/arg_utils.py
    get_batch_defaults): 8192 passes, 1024 fails as rebuild."""
    assert vllm_batched_tokens_default(LAB)[0] == 2048
    real = REAL.read_text()
    seqs = {"max_num_seqs": 4}
    assert unlisted(as_started_with(real, max_num_batched_tokens=8192, **seqs)).status == Status.PASS
    low = unlisted(as_started_with(real, max_num_batched_tokens=1024, **seqs))
    assert low.status == Status.FAIL and "below vLLM's default for this hardware (2048)" in low.reason
    # without chunked prefill a contracted request (1984 + 64 tokens) must fit one step: 1024 cannot hold it
    off = unlisted(as_started_with(real, max_num_batched_tokens=1024, enable_chunked_prefill=False, **seqs))
    assert off.status == Status.FAIL and "without chunked prefill one contracted request (2048" in off.reason


def test_served_engines_reads_the_engine_config_line_when_the_args_line_does_not_say() -> None:
    text = REAL.read_text().replace("data_parallel_size=1", "data_parallel_size=2", 1)
    count, source = served_engines(ServerReports(startup=scan_startup_log(text)))
    assert count == 2 and source == "startup log engine config data_parallel_size: 2"


BASE = {"acceptance_owner": "me", "vllm_serve_mode": "launch"}


def _open(tmp_path: Path, profile: str, extra: list[str], **more: object) -> Path:
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path, inventory="site", hosts=["h"],
                          variables={**BASE, "acceptance_profile": profile, "vllm_serve_extra_args": extra, **more},
                          batched_tokens_default=lambda p: vllm_batched_tokens_default(p)[0])
    return run_dir


def test_dep16_at_32_sequences_per_engine_is_512_in_all_and_accepted(tmp_path: Path) -> None:
    """The Why of issue 41: DEP16 with --max-num-seqs 32 per engine (512 in all) was refused as below the
    contract's 64; 2 per engine (32 in all) still is, with the arithmetic shown."""
    assert (_open(tmp_path / "a", "kimi-k3-gb300-dep16", ["--max-num-seqs", "32"]) / "run.json").is_file()
    with pytest.raises(ConfigError) as caught:
        _open(tmp_path / "b", "kimi-k3-gb300-dep16", ["--max-num-seqs", "2"])
    assert "2 per engine x 16 engines = 32, below the contract's 64" in str(caught.value)
    # the inventory's vllm_parallel is the launch's data-parallel size
    with pytest.raises(ConfigError, match="32 per engine x 1 engines|32, below the contract's 64"):
        _open(tmp_path / "c", "kimi-k3-gb300-dep16", ["--max-num-seqs", "32"],
              vllm_parallel={"tensor": 4, "data": 1})


def test_raising_max_num_batched_tokens_is_accepted_at_validation(tmp_path: Path) -> None:
    """On B300 vLLM's default is 16384, on H200 8192 (GPU memory, get_batch_defaults): 12000 is a raise on H200 and
    a cut on B300; 32768 is a raise on both."""
    assert (_open(tmp_path / "a", "kimi-k3-h200", ["--max-num-batched-tokens", "12000"]) / "run.json").is_file()
    assert (_open(tmp_path / "b", "kimi-k3-b300", ["--max-num-batched-tokens", "32768"]) / "run.json").is_file()
    with pytest.raises(ConfigError, match=r"12000, below vLLM's default for this hardware \(16384\)"):
        _open(tmp_path / "c", "kimi-k3-b300", ["--max-num-batched-tokens", "12000"])
    # unknown hardware: only a value at or above the largest GPU default is certainly no cut
    assert limits_contract(DEP16.data, "max_num_batched_tokens", 12000) is not None
    assert limits_contract(DEP16.data, "max_num_batched_tokens", 16384) is None


def test_validate_cli_accepts_the_per_engine_sequences(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes:\n      hosts: {t01: {}, t02: {}}\n"
                                   "    vllm_head:\n      hosts: {t01: {}}\n")     # the plan needs the head (gate.py)
    site = {**BASE, "acceptance_profile": "kimi-k3-gb300-dep16", "acceptance_vllm_check_python": "none",
            "vllm_serve_extra_args": ["--max-num-seqs", "32", "--max-num-batched-tokens", "32768"]}
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    assert cli.main(["validate", "-i", str(inv), "--project", str(REPO)]) == 0, capsys.readouterr().err
    site["vllm_serve_extra_args"] = ["--max-num-seqs", "3"]
    (inv / "group_vars" / "all.yml").write_text(yaml.safe_dump(site))
    assert cli.main(["validate", "-i", str(inv), "--project", str(REPO)]) == 2
    assert "3 per engine x 16 engines = 48, below the contract's 64" in capsys.readouterr().err


def test_the_plan_shows_per_engine_arguments_times_engines() -> None:
    from vllm_acceptance.plan import _capacity_notes

    facts = {"mode": "launch", "parallel": {}, "extra_args": ["--max-num-seqs", "32"]}
    assert _capacity_notes(DEP16, facts) == [
        "per engine: --max-num-seqs 32 per engine x 16 engine(s) = 512 concurrent sequences for the contract's 64"]
