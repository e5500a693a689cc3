"""What the engine sends and what it records: :class:`RequestSpec`, :class:`Record`, and the JSONL
evidence of records (:class:`RecordSink`, :func:`read_records`)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Status = Literal["ok", "error", "timeout"]


@dataclass
class RequestSpec:
    """One chat request; `extra` is merged into the body (e.g. ``ignore_eos``, ``temperature``)."""

    messages: list[dict[str, Any]]
    max_tokens: int
    tag: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Record:
    """What happened to one request. Times are epoch seconds; token counts come from ``usage``."""

    request_id: str
    tag: str
    worker: str
    scheduled: float
    sent: float | None = None
    first_chunk: float | None = None   # first event with choices (often a role-only delta)
    first_token: float | None = None   # first event carrying content, reasoning or tool calls
    end: float | None = None
    status: Status = "error"
    http_status: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0                    # events with choices
    itl_s: list[float] = field(default_factory=list)  # gaps between chunks after the first token
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.scheduled

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.scheduled

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["itl_s"] = [round(g, 7) for g in self.itl_s]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class RecordSink:
    """``on_record`` callback appending one JSON line per record, flushed at once.

    A flushed line sits in the kernel's page cache, so it survives a crash of this process; pass
    ``fsync=True`` to survive a crash of the machine too (slower).
    """

    def __init__(self, path: str | os.PathLike[str], fsync: bool = False) -> None:
        self._f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._fsync = fsync

    def __call__(self, rec: Record) -> None:
        self._f.write(json.dumps(rec.to_dict(), separators=(",", ":")) + "\n")
        self._f.flush()
        if self._fsync:
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RecordSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | os.PathLike[str]) -> list[Record]:
    """Records from a JSONL file written by :class:`RecordSink`; a torn last line is skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(Record.from_dict(json.loads(line)))
            except ValueError:
                continue  # a line cut by a crash mid-write
    return out
