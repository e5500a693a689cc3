"""nccl-tests output (`all_reduce_perf` and friends): bus bandwidth and the ranks' hosts."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .base import Parsed


@dataclass
class NcclRow:
    size_bytes: int
    busbw_oop: float
    busbw_ip: float
    wrong: int


@dataclass
class NcclPerf(Parsed):
    rows: list[NcclRow] = field(default_factory=list)
    avg_busbw: float | None = None
    ranks: int = 0
    hosts: list[str] = field(default_factory=list)
    out_of_bounds: int | None = None

    @property
    def max_busbw(self) -> float | None:
        values = [max(r.busbw_oop, r.busbw_ip) for r in self.rows]
        return max(values) if values else None

    @property
    def wrong_results(self) -> int:
        return sum(r.wrong for r in self.rows)


_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+.*?\bon\s+(\S+)\s+device")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d+)")


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_all_reduce_perf(text: str) -> NcclPerf:
    result = NcclPerf()
    hosts: list[str] = []
    for line in text.splitlines():
        rank = _RANK.match(line)
        if rank:
            result.ranks += 1
            if rank.group(2) not in hosts:
                hosts.append(rank.group(2))
            continue
        avg = _AVG.search(line)
        if avg:
            result.avg_busbw = _float(avg.group(1))
            continue
        oob = _OOB.search(line)
        if oob:
            result.out_of_bounds = int(oob.group(1))
            continue
        cells = line.split()
        # size count type redop root time algbw busbw #wrong time algbw busbw #wrong
        if len(cells) == 13 and cells[0].isdigit():
            numbers = [_float(c) for c in (cells[7], cells[11])]
            wrong = [c for c in (cells[8], cells[12]) if c.isdigit()]
            if None not in numbers:
                result.rows.append(NcclRow(size_bytes=int(cells[0]), busbw_oop=numbers[0] or 0.0,
                                           busbw_ip=numbers[1] or 0.0,
                                           wrong=sum(int(w) for w in wrong)))
    result.hosts = hosts
    if not result.rows:
        result.errors.append("no result rows (not nccl-tests output, or the test failed)")
    return result
