"""A startup log holding several starts of the server (`journalctl -u vllm -b` across a `Restart=`, `docker logs`
of a restarted container) is cut to the last start before it is read (parsers/startup_log.py `split_starts`;
issue 42 item 3): the earlier start's NCCL error is not the running server's, and a last start that fails is
still a failure."""

from __future__ import annotations

from pathlib import Path

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.parsers.startup_log import scan_startup_log, split_starts
from vllm_acceptance.rules.serve import check_startup_log

ROOT = Path(__file__).resolve().parents[2]
JOURNAL = ROOT / "tests/fixtures/serve/journal-two-starts-nccl-then-ready-generated.log"
READY = ROOT / "tests/fixtures/real/vllm/v1-0.32-cpu-lab-ready-one-line-kv.log"     # real, vLLM 0.32 lab
NCCL = ROOT / "tests/fixtures/launch_failures/ic_nccl_system_error.log"            # vLLM 0.32, NCCL error
LAB = load_profile(ROOT / "profiles/cpu-lab.yml")


def test_a_journal_with_a_restart_is_judged_on_its_last_start() -> None:
    """Before issue 42 the whole journal was read: compat.startup_log failed with the first start's NCCL error."""
    scan = scan_startup_log(JOURNAL.read_text())
    assert (scan.starts, scan.start_line) == (2, 15)
    assert not scan.nccl_errors and scan.ready and scan.version == "0.32.0"
    finding = check_startup_log(scan, LAB, "gb300-a01", ["evidence/serve/startup.log"])
    assert finding.status == Status.PASS, finding.reason
    assert finding.observed["starts"] == 2 and finding.observed["judged_from_line"] == 15
    # the same reading as the last start's log alone
    alone = scan_startup_log(READY.read_text())
    assert scan.kv_cache_tokens == alone.kv_cache_tokens and scan.non_default_args == alone.non_default_args
    assert len(scan.warnings) == len(alone.warnings)


def test_a_last_start_that_fails_still_fails() -> None:
    """The cut keeps the current start: healthy first, NCCL error after the restart, the log fails."""
    lines = JOURNAL.read_text().splitlines()
    first, units, second = lines[1:9], lines[9:14], lines[14:]
    reordered = "\n".join([lines[0], *second, *units, *first]) + "\n"
    scan = scan_startup_log(reordered)
    assert scan.starts == 2 and scan.nccl_errors
    assert check_startup_log(scan, LAB, "gb300-a01", []).status == Status.FAIL


def test_docker_logs_of_a_restarted_container_are_cut_at_the_banner() -> None:
    """No systemd lines: the second start begins at its banner, moved up over its logo's own lines."""
    text = NCCL.read_text() + READY.read_text()
    raw = text.split("\n")
    firsts = split_starts(raw)
    assert len(firsts) == 2
    assert raw[firsts[1]].endswith("[api_utils.py:347] ") and "█" in raw[firsts[1] + 1]
    scan = scan_startup_log(text)
    assert not scan.nccl_errors and scan.ready and scan.model == ".lab/models/tiny-agent"


def test_one_start_is_read_whole() -> None:
    """Every real log of the corpus holds one start: none is cut."""
    for path in sorted((ROOT / "tests/fixtures/real/vllm").glob("*.log")):
        scan = scan_startup_log(path.read_text(errors="replace"))
        assert (scan.starts, scan.start_line) == (1, 1), path.name
