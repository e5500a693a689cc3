"""Host driver facts: /proc/driver/nvidia/version and the Fabric Manager version line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import Parsed

# NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  (dvs-builder@...)
# NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.173.02  Tue Jun 23 08:38:17 UTC 2026   (proprietary)
# NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  35.3.1  Release Build ...       (Jetson L4T)
_NVRM = re.compile(r"NVRM version:.*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)\s")
_GCC = re.compile(r"GCC version:\s*(.+)")


@dataclass
class DriverVersion(Parsed):
    version: str | None = None
    branch: int | None = None
    open_kernel_module: bool | None = None
    gcc: str | None = None


def branch_of(version: str | None) -> int | None:
    """The driver branch is the leading number: 580.95.05 -> 580 (R580). Jetson's L4T numbers
    (35.3.1) are not driver branches: None."""
    if not version:
        return None
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() and int(head) >= 100 else None


def parse_proc_version(text: str) -> DriverVersion:
    result = DriverVersion()
    match = _NVRM.search(text + " ")
    if not match:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        result.errors.append("no 'NVRM version: ... <x.y.z>' line (is the nvidia kernel module loaded?)"
                             + (f"; read instead: {first[:200]!r}" if first else ""))
        return result
    result.version = match.group(1)
    result.branch = branch_of(result.version)
    if result.branch is None:
        result.errors.append(f"{result.version} is not a desktop/datacenter driver version (Jetson L4T?)")
    result.open_kernel_module = "Open Kernel Module" in match.group(0)
    gcc = _GCC.search(text)
    result.gcc = gcc.group(1).strip() if gcc else None
    return result


@dataclass
class FabricManagerVersion(Parsed):
    version: str | None = None


_FM = re.compile(r"Fabric\s*Manager\s+version\s+is\s*:?\s*(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)
_PKG = re.compile(r"(?:fabricmanager|nvidia-fabricmanager)[-\w]*\s+(\d{3}\.\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_fabricmanager_version(text: str) -> FabricManagerVersion:
    """`nv-fabricmanager --version` ('Fabric Manager version is : 580.95.05') or a package listing."""
    result = FabricManagerVersion()
    match = _FM.search(text) or _PKG.search(text)
    if match:
        result.version = match.group(1)
    else:
        result.errors.append("no Fabric Manager version in the output")
    return result
