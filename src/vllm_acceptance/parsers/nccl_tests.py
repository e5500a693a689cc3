"""nccl-tests output (`all_reduce_perf` and friends): bus bandwidth and the ranks' hosts.

Two table layouts are read (real captures of both: tests/fixtures/real/nccl-tests/):
- current: `size count type redop root time algbw busbw #wrong time algbw busbw #wrong`
  (`#wrong` counts wrong elements);
- older releases: no `root` column (or no `redop` for broadcast) and an `error` column holding the
  largest deviation (`2e-07`) or `N/A` without validation: no count of wrong results exists there.
The last eight cells of a row are always the out-of-place and in-place `time algbw busbw wrong`;
rows are recognised by their shape, so MPI launcher tags (`[1,0]<stdout>:`, `[0]`) and NCCL INFO/WARN
lines inside the table are skipped or stripped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from .base import Parsed


@dataclass
class NcclRow:
    size_bytes: int
    busbw_oop: float
    busbw_ip: float
    wrong: int | None           # None: the older layout's deviation column, or no validation (N/A)
    error: float | None = None  # the older layout's largest deviation


@dataclass
class NcclPerf(Parsed):
    rows: list[NcclRow] = field(default_factory=list)
    avg_busbw: float | None = None
    ranks: int = 0
    hosts: list[str] = field(default_factory=list)
    out_of_bounds: int | None = None
    layout: str | None = None   # "new" (#wrong counts) or "old" (error deviations)
    tool: str = "nccl-tests"
    backend: str | None = "nccl"   # the in-image test says which backend it really used (nccl or gloo)

    @property
    def max_busbw(self) -> float | None:
        values = [max(r.busbw_oop, r.busbw_ip) for r in self.rows]
        return max(values) if values else None

    @property
    def wrong_results(self) -> int | None:
        """Wrong elements over all rows; None when the output carries no count (older layout, N/A)."""
        if not self.rows or any(r.wrong is None for r in self.rows):
            return None
        return sum(r.wrong or 0 for r in self.rows)

    @property
    def max_error(self) -> float | None:
        errors = [r.error for r in self.rows if r.error is not None]
        return max(errors) if errors else None


_TAGS = re.compile(r"\[\d+(?:,\d+)*\](?:<std(?:out|err)>:)?")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+.*?\bon\s+(\S+)\s+device")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")
_HEADER = re.compile(r"^#\s+size\s+count\s+type\b")
_TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16",
          "fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2"}


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _wrong(cell: str) -> tuple[int | None, float | None, str]:
    """A wrong/error cell -> (count, deviation, layout it implies)."""
    if cell.isdigit():
        return int(cell), None, "new"
    if cell == "N/A":
        return None, None, "unknown"
    value = _float(cell)
    return None, value, "old"


def _row(cells: list[str]) -> tuple[NcclRow, str] | None:
    if len(cells) < 11 or not cells[0].isdigit() or not cells[1].isdigit() or cells[2] not in _TYPES:
        return None
    tail = cells[-8:]
    numbers = [_float(tail[i]) for i in (0, 1, 2, 4, 5, 6)]
    if None in numbers:
        return None
    (w1, e1, layout1), (w2, e2, layout2) = _wrong(tail[3]), _wrong(tail[7])
    errors = [e for e in (e1, e2) if e is not None]
    wrong = None if w1 is None or w2 is None else w1 + w2
    layout = "old" if "old" in (layout1, layout2) else ("new" if layout1 == layout2 == "new" else "unknown")
    return NcclRow(size_bytes=int(cells[0]), busbw_oop=numbers[2] or 0.0, busbw_ip=numbers[5] or 0.0,
                   wrong=wrong, error=max(errors) if errors else None), layout


def parse_all_reduce_perf(text: str) -> NcclPerf:
    result = NcclPerf()
    hosts: list[str] = []
    header_layout: str | None = None
    row_layouts: set[str] = set()
    unread: str | None = None
    for raw in text.splitlines():
        line = _TAGS.sub(" ", raw).strip()
        if rank := _RANK.match(line):
            result.ranks += 1
            if rank.group(2) not in hosts:
                hosts.append(rank.group(2))
            continue
        if _HEADER.match(line):
            header_layout = "new" if "#wrong" in line else ("old" if re.search(r"\berror\b", line) else None)
            continue
        if avg := _AVG.search(line):
            result.avg_busbw = _float(avg.group(1))
            continue
        if oob := _OOB.search(line):
            result.out_of_bounds = int(oob.group(1))
            continue
        if parsed := _row(line.split()):
            result.rows.append(parsed[0])
            row_layouts.add(parsed[1])
        elif line[:1].isdigit() and unread is None:
            unread = line[:200]
    result.hosts = hosts
    result.layout = header_layout or ("old" if "old" in row_layouts else ("new" if row_layouts == {"new"} else None))
    if not result.rows:
        result.errors.append("no result rows (not nccl-tests output, or the test failed)"
                             + (f"; first line not read as a row: {unread!r}" if unread else ""))
    return result


def parse_torch_allreduce(text: str) -> NcclPerf:
    """The in-image all-reduce's JSON line (roles/preflight/files/allreduce.py) in the same shape: rows of
    bus bandwidth and wrong elements, the ranks' hosts, and the backend it really ran on."""
    result = NcclPerf(tool="torch.distributed all_reduce", backend=None, layout="new")
    data = None
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        break
    if not isinstance(data, dict):
        result.errors.append("no JSON line from the in-image all-reduce")
        return result
    result.backend = data.get("backend") if isinstance(data.get("backend"), str) else None
    ranks = data.get("ranks") if isinstance(data.get("ranks"), list) else []
    result.ranks = len(ranks)
    for rank in ranks:
        host = rank.get("host") if isinstance(rank, dict) else None
        if isinstance(host, str) and host not in result.hosts:
            result.hosts.append(host)
    for row in data.get("rows") or []:
        try:
            result.rows.append(NcclRow(size_bytes=int(row["bytes"]), busbw_oop=float(row["busbw_gbps"]),
                                       busbw_ip=float(row["busbw_gbps"]), wrong=int(row["wrong"])))
        except (KeyError, TypeError, ValueError):
            result.errors.append(f"unreadable row {row!r:.200}")
    if data.get("error"):
        result.errors.append(str(data["error"])[:600])
    elif not result.rows:
        result.errors.append("no result rows")
    return result


# --- which fabric the collective crossed (NCCL_DEBUG=INFO lines) -------------------------------
# NCCL's own format strings (docs/sources.md#nccl-fabric-lines): src/transport/p2p.cc
# "Channel %02d : %d[%d] -> %d[%d] via P2P/MNNVL%s", src/transport/net.cc
# "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s", the MNNVL init line
# "MNNVL %d cliqueId %x cliqueSize %d cliqueRank %d[ nvlDomainSize %d]", NVLS "NVLS multicast support is
# available on dev %d" and the environment echo "NCCL_MNNVL_ENABLE set by environment to %s".

_MNNVL_INIT = re.compile(r"\bMNNVL (\d) cliqueId \w+ cliqueSize (\d+)")
_VIA_MNNVL = re.compile(r"via P2P/MNNVL")
_VIA_NET = re.compile(r"\[(?:send|receive)\] via NET/([A-Za-z0-9_]+)")
_NVLS = re.compile(r"NVLS multicast support is available")
_MNNVL_ENV = re.compile(r"NCCL_MNNVL_ENABLE set by environment to (\S+)")


@dataclass
class FabricPath:
    """What the NCCL INFO log says about the path: None everywhere when the log has no INFO lines."""

    mnnvl: int | None = None          # the "MNNVL 0/1 cliqueId ..." line (last one read)
    clique_size: int | None = None
    mnnvl_channels: int = 0
    net_channels: int = 0
    nets: set[str] = field(default_factory=set)     # IB, Socket, ...
    nvls: bool = False
    mnnvl_env: str | None = None

    @property
    def fabric(self) -> str | None:
        """mnnvl (NVLink across nodes, no NET channel), infiniband / socket / net (a NET transport),
        or None when nothing was logged."""
        if self.net_channels:
            if "IB" in self.nets:
                return "infiniband"
            return "socket" if self.nets == {"Socket"} else "net"
        if self.mnnvl_channels or (self.mnnvl == 1 and (self.clique_size or 0) > 1):
            return "mnnvl"
        return None


def detect_fabric(text: str) -> FabricPath:
    path = FabricPath()
    for line in text.splitlines():
        if found := _MNNVL_INIT.search(line):
            path.mnnvl, path.clique_size = int(found.group(1)), int(found.group(2))
        if _VIA_MNNVL.search(line):
            path.mnnvl_channels += 1
        if found := _VIA_NET.search(line):
            path.net_channels += 1
            path.nets.add(found.group(1))
        if _NVLS.search(line):
            path.nvls = True
        if found := _MNNVL_ENV.search(line):
            path.mnnvl_env = found.group(1)
    return path
