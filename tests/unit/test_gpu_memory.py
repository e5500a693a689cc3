"""Parsing nvidia-smi's -lms memory stream into the load stage's memory timeline (parsers/gpu_memory)."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_acceptance.parsers.gpu_memory import LABEL, memory_rows, parse_memory_csv, parse_timestamp, peaks

FAKE = Path(__file__).resolve().parents[1] / "fixtures" / "sampler" / "bin" / "nvidia-smi"
T0 = dt.datetime(2026, 11, 30, 10, 20, 30, 123000, tzinfo=dt.UTC).timestamp()
STREAM = (
    "2026/11/30 10:20:30.123, 0, 81234\n"
    "2026/11/30 10:20:30.123, 1, 1024\n"
    "2026/11/30 10:20:30.623, 0, 81300\n"
    "2026/11/30 10:20:30.623, 1, [N/A]\n"
    "2026/11/30 10:20:31.123, 0, 812"  # cut by the kill: must not read as 812 MiB
)


def test_rows_have_the_timeline_shape_and_drop_the_cut_line() -> None:
    rows = parse_memory_csv(STREAM, "gb300-a01")
    assert rows[0] == {"t": T0, "bytes": 81234 * 2**20, "series": "gpu0@gb300-a01", "label": LABEL}
    assert [(r["series"], r["bytes"] // 2**20) for r in rows] == [
        ("gpu0@gb300-a01", 81234), ("gpu1@gb300-a01", 1024), ("gpu0@gb300-a01", 81300)]
    assert rows[2]["t"] - rows[0]["t"] == 0.5
    assert peaks(rows) == {"gpu0@gb300-a01": 81300 * 2**20, "gpu1@gb300-a01": 1024 * 2**20}
    assert peaks(rows, start=T0 + 0.1) == {"gpu0@gb300-a01": 81300 * 2**20}


def test_header_units_and_column_order_follow_the_stream() -> None:
    text = ("memory.used [MiB], index, timestamp\n"
            "500 MiB, 3, 2026/11/30 10:20:30.123\n"
            "memory.used [MiB], index, timestamp\n"
            "2 GiB, 3, 2026/11/30 10:20:31.123\n")
    rows = parse_memory_csv(text, "n")
    assert [(r["series"], r["bytes"]) for r in rows] == [("gpu3@n", 500 * 2**20), ("gpu3@n", 2 * 2**30)]


def test_garbage_and_wrong_width_lines_are_skipped() -> None:
    text = "Failed to initialize NVML: Driver/library version mismatch\n1, 2\n\n2026/11/30 10:20:30.123, x, 5\n"
    assert parse_memory_csv(text, "n") == []
    assert parse_timestamp("2026/13/40 99:99:99.000") is None


def test_the_fake_binary_output_parses_per_gpu(tmp_path: Path) -> None:
    proc = subprocess.run([str(FAKE), "--query-gpu=timestamp,index,memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, env={"TZ": "UTC", "FAKE_GPUS": "4"}, check=True)
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "node7.csv").write_text(proc.stdout)
    rows = memory_rows(tmp_path, "memory")
    assert sorted(r["series"] for r in rows) == [f"gpu{i}@node7" for i in range(4)]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises_on_any_text(text: str) -> None:
    for row in parse_memory_csv(text, "h"):
        assert set(row) == {"t", "bytes", "series", "label"} and row["bytes"] >= 0


SAMPLE = st.tuples(st.integers(0, 10**6), st.integers(0, 15), st.integers(0, 2**20))


@settings(max_examples=200, deadline=None)
@given(st.lists(SAMPLE, max_size=20), st.data())
def test_a_cut_stream_gives_a_prefix_of_the_rows_never_a_wrong_value(samples, data) -> None:
    lines = []
    for offset_ms, gpu, mib in samples:
        t = dt.datetime.fromtimestamp(T0 + offset_ms / 1000, dt.UTC)
        lines.append(f"{t:%Y/%m/%d %H:%M:%S}.{t.microsecond // 1000:03d}, {gpu}, {mib}\n")
    text = "".join(lines)
    full = parse_memory_csv(text, "h")
    assert [(r["series"], r["bytes"]) for r in full] == [(f"gpu{g}@h", m * 2**20) for _, g, m in samples]
    cut = data.draw(st.integers(0, len(text)))
    partial = parse_memory_csv(text[:cut], "h")
    assert partial == full[: len(partial)]
    assert len(partial) == text[:cut].count("\n")
