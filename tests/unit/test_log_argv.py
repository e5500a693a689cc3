"""The startup log is the running process's start: its non-default args against the live argv (serve/log_argv.py,
compat.startup_log_identity; issue 42 item 3). Two real vLLM 0.32 lab logs of the same version and the same
max_model_len, one of them started with `--max-num-seqs 1`: before issue 42 either passed as the other's log."""

from __future__ import annotations

from pathlib import Path

from vllm_acceptance.core.findings import Status
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.serve.log_argv import argv_differences, positional_model
from vllm_acceptance.serve.log_identity import LiveIdentity, check_log_identity

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests/fixtures/real/vllm"
# Each log's command line as its source (the YAML beside it) records it: the lab launch of profiles/cpu-lab.yml.
LAB_ARGS = ["--model", ".lab/models/tiny-agent", "--served-model-name", "tiny-agent", "--host", "127.0.0.1",
            "--enable-prefix-caching", "--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser",
            "hermes", "--tool-strict-level", "parameter", "--enable-prompt-tokens-details", "--dtype", "float32",
            "--enforce-eager"]
MODULE = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
SEQS_LOG = REAL / "v1-0.32-cpu-lab-max-num-seqs-1.log"        # lab launch + --max-num-seqs 1, port 8197
SEQS_ARGV = [*MODULE, *LAB_ARGS, "--port", "8197", "--max-num-seqs", "1"]
LIVE = LiveIdentity(version="0.32.0", max_model_len=2048)
SOURCE = "the file /var/log/vllm/startup.log"


def identity(log: Path, argv: list[str] | None):
    return check_log_identity(scan_startup_log(log.read_text()), LIVE, SOURCE, "head-01", [], argv)


def test_the_log_of_the_running_argv_is_accepted() -> None:
    ok = identity(SEQS_LOG, SEQS_ARGV)
    assert ok.status == Status.PASS, ok.reason
    # `vllm serve MODEL` puts the model in the positional: the same start
    serve = ["vllm", "serve", ".lab/models/tiny-agent", *LAB_ARGS[2:], "--port", "8197", "--max-num-seqs", "1"]
    assert positional_model(serve) == ".lab/models/tiny-agent"
    assert identity(SEQS_LOG, serve).status == Status.PASS


def test_a_stale_log_from_before_a_restart_with_other_flags_is_not_used() -> None:
    """The server was restarted without --max-num-seqs 1 (same version, same max_model_len): the saved log is the
    earlier start's. The finding names the flag on each side."""
    restarted = [*MODULE, *LAB_ARGS, "--port", "8197"]
    stale = identity(SEQS_LOG, restarted)
    assert stale.status == Status.INCONCLUSIVE and "is not this server's" in stale.reason
    assert "--max-num-seqs 1 in the log, not passed on the running server" in stale.reason
    # restarted with another value: both values named
    other = identity(SEQS_LOG, [*MODULE, *LAB_ARGS, "--port", "8197", "--max-num-seqs", "4"])
    assert other.status == Status.INCONCLUSIVE
    assert "--max-num-seqs 1 in the log" in other.reason and "4 on the running server" in other.reason
    moved = identity(SEQS_LOG, [*MODULE, *LAB_ARGS, "--port", "8000", "--max-num-seqs", "1"])
    assert moved.status == Status.INCONCLUSIVE and "--port 8197 in the log" in moved.reason


def test_without_the_running_argv_the_log_is_not_bound() -> None:
    unbound = identity(SEQS_LOG, None)
    assert unbound.status == Status.INCONCLUSIVE and "vllm_serve_pid" in unbound.reason


def test_what_the_argv_cannot_show_is_recorded_not_guessed() -> None:
    """Short options (`-tp 2`) and a `--config` file may carry a logged flag: not compared, recorded; secrets
    (vLLM logs `api_key` as ***) never compared."""
    scan = scan_startup_log(SEQS_LOG.read_text())
    short = [*MODULE, *[a for a in LAB_ARGS if a != "--enforce-eager"], "--port", "8197", "--max-num-seqs", "1",
             "-O", "0"]
    differ, unknown = argv_differences(scan, short)
    assert differ == [] and any("--enforce-eager" in u for u in unknown)
    differ, _ = argv_differences(scan, [*SEQS_ARGV, "--api-key", "sk-local-123"])
    assert differ == []
