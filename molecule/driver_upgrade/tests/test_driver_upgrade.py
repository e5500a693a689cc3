"""After converge every node runs the target driver, Fabric Manager at the same version, installed once."""

from __future__ import annotations

TARGET = "580.95.05"


def test_nvidia_smi_reports_the_target_driver(host) -> None:
    out = host.check_output("nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv")
    versions = {line.split(",")[1].strip() for line in out.splitlines()[1:]}
    assert versions == {TARGET}


def test_kernel_module_and_fabric_manager_match(host) -> None:
    assert TARGET in host.file("/usr/local/bin/.state/proc-driver-nvidia-version").content_string
    assert host.check_output("nv-fabricmanager --version").strip().endswith(TARGET)


def test_installed_once_in_one_transaction(host) -> None:
    installs = [line for line in host.file("/usr/local/bin/.state/calls.log").content_string.splitlines()
                if " pkg install " in line]
    assert len(installs) == 1, installs  # the idempotence run installed nothing
    assert f"nvidia-driver-580-open={TARGET}" in installs[0] and f"nvidia-fabricmanager-580={TARGET}" in installs[0]
