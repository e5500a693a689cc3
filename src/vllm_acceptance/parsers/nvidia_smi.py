"""nvidia-smi outputs: `--query-gpu ... --format=csv[,noheader]`, `-q -x` XML, the plain table, and
the messages nvidia-smi prints instead when it cannot talk to the driver.

The "CUDA Version" nvidia-smi reports is what the *driver* can support, never the CUDA runtime
inside an image: it is read here only to be recorded, and no rule judges the image by it.

`-q -x` differs by driver branch: DTD v10/v11 (R4xx-R515), v12 (R520-R555), v13 (R560 on), which
adds `<fabric>` fields (cliqueId, clusterUuid, health) that read `N/A` off NVSwitch/NVLink-domain
systems. The GPU index (`nvidia-smi -i N`, CUDA's PCI order) is the position of the `<gpu>` element,
not `minor_number` (the /dev/nvidiaN node). Real captures of each: tests/fixtures/real/.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from .base import Parsed
from .driver import branch_of

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
    minor_number: str | None = None       # /dev/nvidiaN; not the index
    fabric_clique_id: str | None = None
    fabric_cluster_uuid: str | None = None
    fabric_health: str | None = None        # <fabric><health><summary>: Healthy / ...
    fabric_bandwidth: str | None = None     # <fabric><health><bandwidth>: Full / Degraded / N/A off NVL systems
    # The rest of <fabric><health> (R570/R580 on NVL trays; docs/sources.md#nvlink-domain): True/False each,
    # incorrect_configuration None or the misconfiguration's name; absent or N/A on other systems.
    fabric_route_recovery: str | None = None        # route_recovery_in_progress
    fabric_route_unhealthy: str | None = None       # route_unhealthy
    fabric_access_timeout_recovery: str | None = None
    fabric_incorrect_configuration: str | None = None


@dataclass
class GpuList(Parsed):
    gpus: list[Gpu] = field(default_factory=list)
    driver_version: str | None = None
    cuda_version: str | None = None   # the driver's supported CUDA API, not the image's runtime
    attached_gpus: int | None = None
    dtd_version: str | None = None    # "v12" / "v13" of `-q -x`

    @property
    def driver_branch(self) -> int | None:
        return branch_of(self.driver_version)

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


def _known(node: ET.Element | None, path: str) -> str | None:
    """Element text with nvidia-smi's "not available" spellings read as absent."""
    value = _text(node, path)
    return None if value in (None, "N/A", "[N/A]", "Not Supported", "[Not Supported]") else value


_DTD = re.compile(r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"nvsmi_device_(v\d+)\.dtd\"")


def parse_xml(text: str) -> GpuList:
    """`nvidia-smi -q -x`: nvidia_smi_log / driver_version, cuda_version, attached_gpus, gpu/..."""
    result = GpuList()
    if dtd := _DTD.search(text[:2000]):
        result.dtd_version = dtd.group(1)
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
        result.gpus.append(Gpu(
            index=position, minor_number=_text(gpu, "minor_number"),
            name=_text(gpu, "product_name"), uuid=_text(gpu, "uuid"),
            driver_version=result.driver_version,
            memory_total_mib=_mib(_text(gpu, "fb_memory_usage/total")),
            pci_bus_id=gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
            fabric_state=_known(gpu, "fabric/state"), fabric_status=_known(gpu, "fabric/status"),
            fabric_clique_id=_known(gpu, "fabric/cliqueId"), fabric_cluster_uuid=_known(gpu, "fabric/clusterUuid"),
            fabric_health=_known(gpu, "fabric/health/summary"),
            fabric_bandwidth=_known(gpu, "fabric/health/bandwidth"),
            fabric_route_recovery=_known(gpu, "fabric/health/route_recovery_in_progress"),
            fabric_route_unhealthy=_known(gpu, "fabric/health/route_unhealthy"),
            fabric_access_timeout_recovery=_known(gpu, "fabric/health/access_timeout_recovery"),
            fabric_incorrect_configuration=_known(gpu, "fabric/health/incorrect_configuration")))
    if result.driver_version is None:
        result.errors.append("no <driver_version> element")
    if result.attached_gpus is not None and result.attached_gpus != len(result.gpus):
        result.errors.append(f"attached_gpus says {result.attached_gpus}, {len(result.gpus)} <gpu> elements")
    return result


# R610 renamed the header: "KMD Version: 610.57.04     CUDA UMD Version: 13.3"
_HEADER = re.compile(r"(?:Driver|KMD) Version:\s*(\S+)\s+CUDA(?: UMD)? Version:\s*(\S+)")
# the column after the name: Persistence-M (On/Off) on Linux, Driver-Model (WDDM/TCC/MCDM) on Windows
_ROW = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off|WDDM|TCC|MCDM)\s+\|\s+([0-9A-Fa-f:.]+)\s")


def parse_table(text: str) -> GpuList:
    """The plain `nvidia-smi` table: header versions and the GPU rows."""
    result = GpuList()
    header = _HEADER.search(text)
    if header:
        result.driver_version, result.cuda_version = header.group(1), header.group(2)
    else:
        result.errors.append("no 'Driver Version: ... CUDA Version: ...' (or R610 'KMD Version: ... CUDA UMD "
                             "Version: ...') header")
    for line in text.splitlines():
        row = _ROW.match(line)
        if row:
            result.gpus.append(Gpu(index=int(row.group(1)), name=row.group(2).strip(),
                                   driver_version=result.driver_version, pci_bus_id=row.group(4)))
    return result


# --- nvidia-smi that cannot talk to the driver ----------------------------------------------

@dataclass
class SmiFailure:
    """What nvidia-smi printed instead of an answer: a node failure, never a source to skip."""

    kind: str                 # driver_library_mismatch | no_driver | nvml_init_failed
    line: str                 # the message as printed
    nvml_library_version: str | None = None
    why: str = ""


_FAILURES = (
    (re.compile(r"Failed to initialize NVML: Driver/library version mismatch", re.IGNORECASE),
     "driver_library_mismatch", "the loaded kernel module and the user-space driver libraries differ (an "
                                "upgrade without a reboot or module reload)"),
    (re.compile(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
     "no_driver", "no NVIDIA kernel driver answers (module not loaded, or not installed for this kernel)"),
    (re.compile(r"Failed to initialize NVML: (?!Driver/library).*"),
     "nvml_init_failed", "NVML could not initialise (permissions, a GPU fallen off the bus, or a driver fault)"),
)
_NVML_LIB = re.compile(r"NVML library version:\s*(\S+)")


def parse_smi_failure(text: str) -> SmiFailure | None:
    """The failure nvidia-smi reported in its output (stdout and stderr together), or None."""
    for pattern, kind, why in _FAILURES:
        if found := pattern.search(text):
            lib = _NVML_LIB.search(text)
            return SmiFailure(kind=kind, line=found.group(0).strip()[:300],
                              nvml_library_version=lib.group(1) if lib else None, why=why)
    return None
