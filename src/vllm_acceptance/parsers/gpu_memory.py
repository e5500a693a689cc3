"""Per-GPU memory timeline from ``nvidia-smi --query-gpu=... --format=csv -lms N``
(docs/acceptance.md "Capacity under load").

The role ``gpu_memory_sampler`` runs, on every GPU node for the whole load stage::

    TZ=UTC nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms 500

and fetches the stream to ``evidence/memory/<host>.csv``. Each line is one GPU at one instant::

    2026/11/30 10:20:30.123, 0, 81234

This turns it into the rows ``stages["load"]["memory_timeline"]`` plots:
``{"t": epoch s, "bytes": int, "series": "gpu<i>@<host>", "label": "GPU memory used"}``.

Robustness, because the file is a stream cut by ``kill``: a last line without its newline may be
cut mid-number (``8123`` of ``81234``), so it is dropped, never read as a smaller value; header
lines (``--format=csv`` without ``noheader``, possibly repeated) set the column order; units
(``81234 MiB``) are honoured; ``[N/A]``/``[Not Supported]`` values and lines that do not parse
are skipped. Nothing here raises on any input text.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.rundir import RunDir

DEFAULT_FIELDS = ("timestamp", "index", "memory.used")
LABEL = "GPU memory used"
UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30}
TIMESTAMP_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")


def _field_name(header_cell: str) -> str:
    """``memory.used [MiB]`` -> ``memory.used``."""
    return header_cell.split("[", 1)[0].strip().lower()


def _is_header(cells: list[str]) -> bool:
    return any(_field_name(c) in ("memory.used", "index") for c in cells) and not any(
        _digits(c.strip()[:1]) for c in cells)


def _digits(text: str) -> bool:
    # ASCII only: str.isdigit() accepts '²', which int() rejects.
    return text.isascii() and text.isdigit()


def parse_timestamp(text: str, utc_offset_s: float = 0.0) -> float | None:
    """nvidia-smi's ``YYYY/MM/DD HH:MM:SS.mmm`` (node-local time; the role runs it with TZ=UTC)."""
    for fmt in TIMESTAMP_FORMATS:
        try:
            naive = dt.datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
        try:
            return naive.replace(tzinfo=dt.UTC).timestamp() - utc_offset_s
        except (OverflowError, ValueError, OSError):
            return None
    return None


def parse_mib(text: str, default_unit: str = "mib") -> int | None:
    """``81234`` (nounits: MiB) or ``81234 MiB`` -> bytes; None for ``[N/A]`` and anything else."""
    parts = text.strip().split()
    if not parts or len(parts) > 2:
        return None
    unit = (parts[1] if len(parts) == 2 else default_unit).lower()
    if unit not in UNITS or not _digits(parts[0]):
        return None
    return int(parts[0]) * UNITS[unit]


def parse_memory_csv(text: str, host: str, fields: Sequence[str] = DEFAULT_FIELDS, *,
                     utc_offset_s: float = 0.0) -> list[dict[str, Any]]:
    """Rows of the memory timeline from one node's ``-lms`` CSV stream (see the module docstring)."""
    lines = text.split("\n")
    lines.pop()  # the text after the last newline: empty, or a line cut by the kill
    columns = [f.strip().lower() for f in fields]
    rows: list[dict[str, Any]] = []
    for line in lines:
        cells = [c.strip() for c in line.rstrip("\r").split(",")]
        if _is_header(cells):
            columns = [_field_name(c) for c in cells]
            continue
        row = _row(dict(zip(columns, cells, strict=False)) if len(cells) == len(columns) else {}, host,
                   utc_offset_s)
        if row is not None:
            rows.append(row)
    return rows


def _row(values: dict[str, str], host: str, utc_offset_s: float) -> dict[str, Any] | None:
    if not values or not _digits(values.get("index", "")):
        return None
    used = parse_mib(values.get("memory.used", ""))
    t = parse_timestamp(values.get("timestamp", ""), utc_offset_s)
    if used is None or t is None:
        return None
    return {"t": t, "bytes": used, "series": f"gpu{int(values['index'])}@{host}", "label": LABEL}


def parse_memory_file(path: str | os.PathLike[str], host: str | None = None) -> list[dict[str, Any]]:
    """Rows from one fetched ``evidence/memory/<host>.csv`` (host defaults to the file's stem)."""
    p = Path(path)
    return parse_memory_csv(p.read_text(encoding="utf-8", errors="replace"), host or p.stem)


def memory_rows(run_dir: Path, subdir: str = "evidence/memory") -> list[dict[str, Any]]:
    """Every node's rows from ``<run_dir>/evidence/memory/*.csv``, sorted by time."""
    rows = [r for path in sorted(RunDir(run_dir).at(subdir).glob("*.csv")) for r in parse_memory_file(path)]
    return sorted(rows, key=lambda r: r["t"])


# The server's container memory sampled beside the GPUs (roles/gpu_memory_sampler start.yml, issue 42 item 4): one
# line per sample, ``2026/12/06 21:43:45.425, 1000`` (UTC time, the cgroup v2 memory.stat `anon` bytes), fetched
# to ``evidence/memory/cgroup/<host>.csv``. Rows: series ``cgroup:<host>`` (probes/load/soak.py CONTAINER_SERIES).
CONTAINER_LABEL = "server container anonymous memory (cgroup v2 memory.stat anon)"
CONTAINER_DIR = "evidence/memory/cgroup"


def parse_container_memory_csv(text: str, host: str) -> list[dict[str, Any]]:
    """Rows of a node's container memory stream; a line cut by the kill (no newline) and lines that do not
    parse are dropped, never read as a smaller value. Nothing here raises on any input text."""
    lines = text.split("\n")
    lines.pop()
    rows: list[dict[str, Any]] = []
    for line in lines:
        stamp, sep, value = line.rstrip("\r").rpartition(",")
        t = parse_timestamp(stamp) if sep else None
        if t is not None and _digits(value.strip()):
            rows.append({"t": t, "bytes": int(value.strip()), "series": f"cgroup:{host}", "label": CONTAINER_LABEL})
    return rows


def container_memory_rows(run_dir: Path) -> list[dict[str, Any]]:
    """Every node's container memory rows (``<run_dir>/evidence/memory/cgroup/*.csv``), sorted by time."""
    rows = [r for path in sorted(RunDir(run_dir).at(CONTAINER_DIR).glob("*.csv"))
            for r in parse_container_memory_csv(path.read_text(encoding="utf-8", errors="replace"), path.stem)]
    return sorted(rows, key=lambda r: r["t"])


def peaks(rows: Sequence[dict[str, Any]], start: float | None = None, end: float | None = None) -> dict[str, int]:
    """Peak bytes per series, optionally within [start, end] (a stage's window)."""
    out: dict[str, int] = {}
    for r in rows:
        if (start is None or r["t"] >= start) and (end is None or r["t"] <= end):
            out[r["series"]] = max(out.get(r["series"], 0), r["bytes"])
    return out
