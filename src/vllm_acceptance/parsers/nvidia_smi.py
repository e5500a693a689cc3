"""nvidia-smi outputs: `--query-gpu ... --format=csv[,noheader]`, `-q -x` XML and the plain table.

The "CUDA Version" nvidia-smi reports is what the *driver* can support, never the CUDA runtime
inside an image: it is read here only to be recorded, and no rule judges the image by it.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from .base import Parsed

QUERY_FIELDS = ("index", "name", "uuid", "driver_version", "memory.total", "pci.bus_id")


@dataclass
class Gpu:
    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    driver_version: str | None = None
    memory_total_mib: int | None = None
    pci_bus_id: str | None = None
    fabric_state: str | None = None
    fabric_status: str | None = None


@dataclass
class GpuList(Parsed):
    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None   # the driver's supported CUDA API, not the image's runtime
    attached_gpus: int | None = None

    @property
    def count(self) -> int:
        return len(self.gpus)

    @property
    def names(self) -> list[str]:
        return [g.name or "" for g in self.gpus]

    @property
    def driver_versions(self) -> set[str]:
        found = {g.driver_version for g in self.gpus if g.driver_version}
        if self.driver_version:
            found.add(self.driver_version)
        return found


def _mib(value: str | None) -> int | None:
    if not value:
        return None
    match = re.match(r"\s*(\d+)\s*(MiB)?", value)
    return int(match.group(1)) if match else None


def parse_query_csv(text: str, fields: tuple[str, ...] = QUERY_FIELDS) -> GpuList:
    """Rows of `nvidia-smi --query-gpu=<fields> --format=csv[,noheader]` (header optional)."""
    result = GpuList()
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[0].replace(" ", "").lower().startswith(fields[0].lower() + ",") \
            or lines and "[MiB]" in lines[0]:
        header = [h.strip().split(" [")[0] for h in lines[0].split(",")]
        fields = tuple(header)
        lines = lines[1:]
    if not lines:
        result.errors.append("no GPU rows in nvidia-smi --query-gpu output")
        return result
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            result.errors.append(f"expected {len(fields)} columns, got {len(cells)}: {line[:100]!r}")
            continue
        row = dict(zip(fields, cells, strict=True))
        index = row.get("index", "")
        result.gpus.append(Gpu(
            index=int(index) if index.isdigit() else None,
            name=row.get("name"), uuid=row.get("uuid"),
            driver_version=row.get("driver_version"),
            memory_total_mib=_mib(row.get("memory.total")),
            pci_bus_id=row.get("pci.bus_id")))
    versions = {g.driver_version for g in result.gpus if g.driver_version}
    if len(versions) == 1:
        result.driver_version = versions.pop()
    elif len(versions) > 1:
        result.errors.append(f"GPUs report different driver versions: {sorted(versions)}")
    return result


def _text(node: ET.Element | None, path: str) -> str | None:
    if node is None:
        return None
    found = node.find(path)
    if found is None or found.text is None:
        return None
    value = found.text.strip()
    return value or None


def parse_xml(text: str) -> GpuList:
    """`nvidia-smi -q -x`: nvidia_smi_log / driver_version, cuda_version, attached_gpus, gpu/..."""
    result = GpuList()
    try:
        root = ET.fromstring(text.strip())
    except (ET.ParseError, ValueError) as exc:
        result.errors.append(f"not valid XML: {exc}")
        return result
    if root.tag != "nvidia_smi_log":
        result.errors.append(f"root element is <{root.tag}>, expected <nvidia_smi_log>")
        return result
    result.driver_version = _text(root, "driver_version")
    result.cuda_version = _text(root, "cuda_version")
    attached = _text(root, "attached_gpus")
    result.attached_gpus = int(attached) if attached and attached.isdigit() else None
    for position, gpu in enumerate(root.findall("gpu")):
        minor = _text(gpu, "minor_number")
        result.gpus.append(Gpu(
            index=int(minor) if minor and minor.isdigit() else position,
            name=_text(gpu, "product_name"), uuid=_text(gpu, "uuid"),
            driver_version=result.driver_version,
            memory_total_mib=_mib(_text(gpu, "fb_memory_usage/total")),
            pci_bus_id=gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
            fabric_state=_text(gpu, "fabric/state"), fabric_status=_text(gpu, "fabric/status")))
    if result.driver_version is None:
        result.errors.append("no <driver_version> element")
    if result.attached_gpus is not None and result.attached_gpus != len(result.gpus):
        result.errors.append(f"attached_gpus says {result.attached_gpus}, {len(result.gpus)} <gpu> elements")
    return result


_HEADER = re.compile(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)")
_ROW = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+([0-9A-Fa-f:.]+)\s")


def parse_table(text: str) -> GpuList:
    """The plain `nvidia-smi` table: header versions and the GPU rows."""
    result = GpuList()
    header = _HEADER.search(text)
    if header:
        result.driver_version, result.cuda_version = header.group(1), header.group(2)
    else:
        result.errors.append("no 'Driver Version: ... CUDA Version: ...' header")
    for line in text.splitlines():
        row = _ROW.match(line)
        if row:
            result.gpus.append(Gpu(index=int(row.group(1)), name=row.group(2).strip(),
                                   driver_version=result.driver_version, pci_bus_id=row.group(4)))
    return result
