"""RDMA devices: `ibv_devinfo` and `rdma link` (iproute2).

`ibv_devinfo` is read line by line as `key: value` at any indentation (spaces or tabs, `-v` adds
capability lists and GID lines that are skipped). A device whose `phys_port_cnt` promises ports
that the text does not show (a cut paste, a truncated capture) makes the reading incomplete, and so
do port lines before any `hca_id` (they cannot be attributed). Real captures: tests/fixtures/real/.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .base import Parsed


@dataclass
class RdmaPort:
    device: str
    port: int
    state: str | None = None          # PORT_ACTIVE / ACTIVE / DOWN ...
    link_layer: str | None = None     # InfiniBand / Ethernet
    physical_state: str | None = None
    netdev: str | None = None

    @property
    def active(self) -> bool:
        return (self.state or "").upper() in ("PORT_ACTIVE", "ACTIVE")


@dataclass
class RdmaDevices(Parsed):
    ports: list[RdmaPort] = field(default_factory=list)
    hca_ids: list[str] = field(default_factory=list)          # every device named, with or without ports
    declared_ports: dict[str, int] = field(default_factory=dict)   # phys_port_cnt per device
    unattributed_lines: int = 0                                 # key/value lines before the first hca_id

    @property
    def devices(self) -> list[str]:
        return sorted({p.device for p in self.ports})

    @property
    def devices_without_ports(self) -> list[str]:
        with_ports = {p.device for p in self.ports}
        return sorted(d for d in self.hca_ids if d not in with_ports)

    @property
    def active_ports(self) -> list[RdmaPort]:
        return [p for p in self.ports if p.active]


_KV = re.compile(r"^\s*([a-z_]+):\s*(.*?)\s*$")


def parse_ibv_devinfo(text: str) -> RdmaDevices:
    result = RdmaDevices()
    device: str | None = None
    port: RdmaPort | None = None
    for line in text.splitlines():
        match = _KV.match(line)
        if not match:
            continue
        key, value = match.group(1), match.group(2)
        if key == "hca_id":
            device, port = value, None
            result.hca_ids.append(value)
        elif device is None:
            result.unattributed_lines += 1
        elif key == "phys_port_cnt" and value.split()[0:1] and value.split()[0].isdigit():
            result.declared_ports[device] = int(value.split()[0])
        elif key == "port":
            number = value.split()[0] if value else ""
            port = RdmaPort(device=device, port=int(number) if number.isdigit() else 0)
            result.ports.append(port)
        elif port is not None and key == "state":
            port.state = value.split()[0] if value else None
        elif port is not None and key == "link_layer":
            port.link_layer = value or None
    _completeness(result)
    return result


def _completeness(result: RdmaDevices) -> None:
    if not result.ports:
        result.errors.append("no hca_id/port entries (no RDMA devices, or not ibv_devinfo output)")
    if result.unattributed_lines:
        result.errors.append(f"{result.unattributed_lines} lines before the first hca_id (output cut at its start?)")
    for device, declared in result.declared_ports.items():
        seen = sum(1 for p in result.ports if p.device == device)
        if seen < declared:
            result.errors.append(f"{device}: phys_port_cnt {declared} but {seen} port sections (output cut?)")


_LINK = re.compile(r"^link\s+(\S+?)/(\d+)\s+(.*)$")


def parse_rdma_link(text: str) -> RdmaDevices:
    result = RdmaDevices()
    for line in text.splitlines():
        match = _LINK.match(line.strip())
        if not match:
            continue
        words = match.group(3).split()
        attrs = dict(zip(words[::2], words[1::2], strict=False))
        result.ports.append(RdmaPort(device=match.group(1), port=int(match.group(2)),
                                     state=attrs.get("state"), physical_state=attrs.get("physical_state"),
                                     netdev=attrs.get("netdev")))
    if not result.ports:
        result.errors.append("no 'link DEV/PORT ...' lines")
    return result
