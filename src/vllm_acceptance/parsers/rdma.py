"""RDMA devices: `ibv_devinfo` and `rdma link` (iproute2)."""

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

    @property
    def devices(self) -> list[str]:
        return sorted({p.device for p in self.ports})

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
        elif key == "port" and device is not None:
            number = value.split()[0] if value else ""
            port = RdmaPort(device=device, port=int(number) if number.isdigit() else 0)
            result.ports.append(port)
        elif port is not None and key == "state":
            port.state = value.split()[0] if value else None
        elif port is not None and key == "link_layer":
            port.link_layer = value or None
    if not result.ports:
        result.errors.append("no hca_id/port entries (no RDMA devices, or not ibv_devinfo output)")
    return result


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
