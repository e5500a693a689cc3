"""nvidia-smi, /proc driver version, lsmod parsers on the recorded GB300 outputs; never raising."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_acceptance.parsers.driver import branch_of, parse_fabricmanager_version, parse_proc_version
from vllm_acceptance.parsers.lsmod import parse_lsmod
from vllm_acceptance.parsers.nvidia_smi import parse_query_csv, parse_table, parse_xml

from nodefixtures import NODES


def read(case: str, name: str) -> str:
    return (NODES / case / name).read_text()


def test_query_csv_reads_every_gpu_and_the_driver() -> None:
    gpus = parse_query_csv(read("good", "nvidia-smi-query.csv"))
    assert gpus.ok and gpus.count == 8 and gpus.driver_version == "580.95.05"
    assert gpus.gpus[3].name == "NVIDIA GB300" and gpus.gpus[3].memory_total_mib == 284208
    assert gpus.gpus[3].pci_bus_id == "00000019:01:00.0"
    assert parse_query_csv(read("seven-gpus", "nvidia-smi-query.csv")).count == 7


def test_query_csv_with_header_and_other_fields() -> None:
    gpus = parse_query_csv(read("good", "nvidia-smi-query-001.csv"))
    assert gpus.ok and gpus.count == 8 and gpus.driver_version == "580.95.05"


def test_query_csv_mixed_drivers_is_an_error() -> None:
    text = "0, A, GPU-1, 580.95.05, 1 MiB, 0:1\n1, A, GPU-2, 575.57.08, 1 MiB, 0:2\n"
    assert not parse_query_csv(text).ok


def test_xml_reads_versions_gpus_and_fabric_state() -> None:
    xml = parse_xml(read("good", "nvidia-smi-q.xml"))
    assert xml.ok and xml.driver_version == "580.95.05" and xml.cuda_version == "13.0"
    assert xml.attached_gpus == 8 and xml.count == 8
    assert {g.fabric_state for g in xml.gpus} == {"Completed"}
    assert parse_xml(read("fm-inactive", "nvidia-smi-q.xml")).gpus[0].fabric_state == "In Progress"
    old = parse_xml(read("driver-575", "nvidia-smi-q.xml"))
    assert old.driver_version == "575.57.08" and old.cuda_version == "12.9"


def test_xml_truncated_or_foreign_gives_errors() -> None:
    text = read("good", "nvidia-smi-q.xml")
    assert not parse_xml(text[: len(text) // 2]).ok
    assert not parse_xml("<foo/>").ok
    assert not parse_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.").ok


def test_plain_table() -> None:
    table = parse_table(read("good", "nvidia-smi.txt"))
    assert table.driver_version == "580.95.05" and table.cuda_version == "13.0" and table.count == 8


def test_proc_driver_version_and_branch() -> None:
    good = parse_proc_version(read("good", "proc-driver-nvidia-version"))
    assert good.version == "580.95.05" and good.branch == 580 and good.open_kernel_module
    old = parse_proc_version(read("driver-575", "proc-driver-nvidia-version"))
    assert old.version == "575.57.08" and old.branch == 575
    legacy = parse_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  "
                                "Tue Mar  5 22:23:56 UTC 2024")
    assert legacy.version == "550.54.15" and legacy.open_kernel_module is False
    assert not parse_proc_version("cat: /proc/driver/nvidia/version: No such file").ok
    assert branch_of("580.65.06") == 580 and branch_of(None) is None


def test_fabricmanager_version() -> None:
    assert parse_fabricmanager_version(read("good", "nv-fabricmanager-version.txt")).version == "580.95.05"
    assert parse_fabricmanager_version("ii  nvidia-fabricmanager-580  580.95.05-1  arm64").version == "580.95.05"
    assert not parse_fabricmanager_version("command not found").ok


def test_lsmod() -> None:
    mods = parse_lsmod(read("good", "lsmod.txt"))
    assert mods.ok and mods.loaded("nvidia") and mods.loaded("nvidia_peermem")
    assert mods.modules["nvidia"].used_by == ["nvidia_uvm", "nvidia_peermem", "nvidia_modeset"]
    bare = parse_lsmod(read("no-nvidia-smi", "lsmod.txt"))
    assert not bare.loaded("nvidia") and bare.nvidia_modules() == []
    assert not parse_lsmod("").ok


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_nvidia_parsers_never_raise(text: str) -> None:
    for parser in (parse_query_csv, parse_xml, parse_table, parse_proc_version, parse_fabricmanager_version,
                   parse_lsmod):
        parser(text)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=20000))
def test_truncated_xml_never_raises(cut: int) -> None:
    parse_xml(read("good", "nvidia-smi-q.xml")[:cut])
