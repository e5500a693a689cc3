"""The parsers and the launch triage against real artefacts (tests/fixtures/real/): every expectation a
human expert wrote beside a file holds; the corpus keeps its sources and its breadth; no parser
crashes on any input and none reads another tool's output (or an unknown format) as a valid answer;
a failure no signature explains is inconclusive and names the line that was not read."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import realcorpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_acceptance.core.findings import Status
from vllm_acceptance.parsers.driver import parse_proc_version
from vllm_acceptance.parsers.nccl_tests import parse_all_reduce_perf
from vllm_acceptance.parsers.node_evidence import load_node_evidence
from vllm_acceptance.parsers.nvidia_smi import parse_query_csv, parse_smi_failure, parse_table, parse_xml
from vllm_acceptance.parsers.rdma import parse_ibv_devinfo
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.compat import NodeContext, check_driver_branch
from vllm_acceptance.rules.launch_triage import classify_launch_failure
from vllm_acceptance.rules.node.imex import parse_imex_nodes

from nodefixtures import build_evidence

ENTRIES = realcorpus.entries()
REAL = realcorpus.REAL


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_every_expectation_holds(entry: realcorpus.Entry) -> None:
    outcome = realcorpus.evaluate(entry)
    assert outcome.ok, "\n".join(outcome.mismatches)


def test_every_file_records_its_source_and_stays_small() -> None:
    for entry in ENTRIES:
        meta = entry.meta
        assert meta["kind"] in realcorpus.READERS, entry.name
        assert meta.get("source") and meta.get("trimmed") and isinstance(meta.get("expect"), dict), entry.name
        if "repository" in meta["source"]:
            assert meta.get("licence") and meta["source"].get("path") and meta["source"].get("commit"), entry.name
        assert entry.path.stat().st_size < 70_000, entry.name


def test_the_corpus_spans_versions_sites_and_layouts() -> None:
    kinds = Counter(e.kind for e in ENTRIES)
    assert kinds["vllm_log"] >= 40 and kinds["nvidia_smi_xml"] >= 8 and kinds["nvidia_smi_csv"] >= 10
    assert kinds["nvidia_smi_table"] >= 1 and kinds["nvidia_smi_error"] >= 1 and kinds["metrics"] >= 2
    expects = {e.name: e.meta["expect"] for e in ENTRIES}
    drivers = [x for n, x in expects.items() if n.startswith("driver-version/")]
    assert {d["open_kernel_module"] for d in drivers} == {True, False}
    assert {x.get("layout") for n, x in expects.items() if n.startswith("nccl-tests/")} >= {"old", "new"}
    assert {x.get("dtd") for n, x in expects.items() if n.startswith("nvidia-smi-xml/")} >= {"v11", "v12", "v13"}
    classes = {x.get("failure_class") for n, x in expects.items() if n.startswith("vllm/")}
    assert classes >= {None, "environment", "capacity", "configuration", "other"}


OTHER_PARSERS = {
    "nvidia_smi_xml": parse_xml, "nvidia_smi_csv": parse_query_csv, "nvidia_smi_table": parse_table,
    "driver_version": parse_proc_version,
    "nccl_tests": parse_all_reduce_perf, "ibv_devinfo": parse_ibv_devinfo, "vllm_log": scan_startup_log,
    "imex_nodes": parse_imex_nodes,
}


def test_no_parser_reads_another_tools_output_as_valid() -> None:
    """An unknown format is an error (-> missing/inconclusive), never a reading that could pass."""
    for entry in ENTRIES:
        text = entry.path.read_text(errors="replace")
        for kind, parse in OTHER_PARSERS.items():
            if kind == entry.kind:
                continue
            result = parse(text)
            assert result.errors, f"{kind} parser accepted {entry.name}"
        if entry.kind not in ("vllm_log", "nvidia_smi_error"):
            finding = classify_launch_failure(text, [], realcorpus.PROFILE)
            assert finding.status == Status.INCONCLUSIVE, (entry.name, finding.observed.get("rule"))


def test_an_unexplained_failure_is_inconclusive_and_names_the_unread_line() -> None:
    log = (REAL / "vllm" / "v0-ray-iso-llmrayactor-initialize-cache.log").read_text()
    finding = classify_launch_failure(log, [], realcorpus.PROFILE)
    assert finding.status == Status.INCONCLUSIVE
    assert finding.observed["unread"]["line"] == 5 and "execute_method" not in finding.observed["unread"]["text"]
    assert "return executor(*args, **kwargs)" in finding.reason


def test_a_benign_dmabuf_info_line_never_gets_the_dmabuf_remedy() -> None:
    """NCCL probing an older libmlx5 logs the symbol at INFO; only the error form justifies
    NCCL_DMABUF_ENABLE=0 (pass/fail pair: the recorded errno 524 failure gets it)."""
    benign = (REAL / "vllm" / "v1-0.25-k8s-nccl-info-dlvsym-dmabuf.log").read_text()
    scan = scan_startup_log(benign)
    assert scan.dmabuf_errors == [] and len(scan.dmabuf_mentions) == 1
    assert "NCCL_DMABUF_ENABLE" not in (classify_launch_failure(benign, [], realcorpus.PROFILE).action or "")
    error = (realcorpus.ROOT / "tests" / "fixtures" / "launch_failures" / "ic_dmabuf_errno524.log").read_text()
    finding = classify_launch_failure(error, [], realcorpus.PROFILE)
    assert finding.observed["rule"] == "interconnect.dmabuf" and "NCCL_DMABUF_ENABLE=0" in finding.action


def _break_nvidia_smi(base: Path, text: str) -> None:
    for name in ("nvidia_smi", "nvidia_smi_query", "nvidia_smi_xml"):
        (base / f"{name}.txt").write_text(text)
        (base / f"{name}.json").write_text(json.dumps({"cmd": name, "rc": 18, "stderr": "", "missing": False}))


def test_driver_library_mismatch_fails_the_node_even_when_the_module_version_passes(tmp_path: Path) -> None:
    """A node upgraded without a reboot: the kernel module (580.173.02) is above the minimum, but
    nvidia-smi cannot talk to it. That is a failed node, not a skipped source."""
    base = build_evidence("good", tmp_path, host="n1")
    good = check_driver_branch(NodeContext(load_node_evidence(tmp_path, "n1"), realcorpus.PROFILE))
    assert good.status == Status.PASS
    (base / "driver_version.txt").write_text((REAL / "driver-version" / "proprietary-580-truenas.txt").read_text())
    _break_nvidia_smi(base, (REAL / "nvidia-smi-error" / "mismatch-580-truenas.txt").read_text())
    finding = check_driver_branch(NodeContext(load_node_evidence(tmp_path, "n1"), realcorpus.PROFILE))
    assert finding.status == Status.FAIL
    assert finding.observed["failure"] == "driver_library_mismatch" and "reboot" in finding.action


def test_gpu_index_is_the_xml_order_not_the_minor_number() -> None:
    gpus = parse_xml((REAL / "nvidia-smi-xml" / "telegraf-a100-sxm4-v12.xml").read_text())
    assert [(g.index, g.minor_number) for g in gpus.gpus] == [(0, "1")]
    assert not gpus.ok   # attached_gpus says 4, one <gpu> in the file: an incomplete reading


def test_nvidia_smi_failure_kinds() -> None:
    assert parse_smi_failure("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                             "Make sure that the latest NVIDIA driver is installed and running.").kind == "no_driver"
    assert parse_smi_failure("Failed to initialize NVML: Unknown Error").kind == "nvml_init_failed"
    assert parse_smi_failure((REAL / "nvidia-smi-csv" / "linux-x86_64__nvidia-h200__590.48.01.csv").read_text()) is None


CORPUS_LINES = sorted({line for e in ENTRIES for line in e.path.read_text(errors="replace").splitlines()[:40]})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(CORPUS_LINES), max_size=25), st.text(max_size=200))
def test_no_parser_crashes_on_mixed_real_lines(lines: list[str], noise: str) -> None:
    text = "\n".join(lines) + "\n" + noise
    for parse in OTHER_PARSERS.values():
        parse(text)
    parse_smi_failure(text)
    assert classify_launch_failure(text, [], realcorpus.PROFILE).status in (Status.FAIL, Status.INCONCLUSIVE,
                                                                           Status.MISSING)


def test_other_tools_prefixes_never_hide_a_usage_error_or_a_traceback() -> None:
    """The real argparse and traceback lines behind the real prefixes of compose, k8s and journald
    (each taken from a corpus log) are still read."""
    usage = (REAL / "vllm" / "v1-0.10-rocm-unrecognized-arguments.log").read_text().strip()
    for prefix in ("vllm-1  | ", "2024-06-28T06:11:52.685300953Z ", "Aug 19 18:30:11 vllm vllm[8707]: "):
        assert scan_startup_log(prefix + usage).failure_class() == "configuration", prefix
        assert scan_startup_log(prefix + "Traceback (most recent call last):").traceback, prefix
    assert scan_startup_log(usage).failure_class() == "configuration"
    assert scan_startup_log("vllm-1  | INFO:     Started server process [1]").failure_class() is None
