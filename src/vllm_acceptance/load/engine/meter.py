"""The client's self-check per worker process (:class:`_Meter`): CPU, wall time, event-loop lag
(:class:`_LoopLag`) and read cost per chunk, which ``rules/loadgen.py`` judges so a saturated client
is never mistaken for a slow server."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

from vllm_acceptance.load.stats import distribution

from .client import _Client
from .records import Record


class _LoopLag:
    """Event-loop lag: how late a 10 ms sleep wakes up; a busy loop delays every reader and send."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.task: asyncio.Task[None] | None = None
        self.t0: float | None = None

    async def _run(self) -> None:
        perf, interval, samples = time.perf_counter, self.interval_s, self.samples
        while True:
            self.t0 = perf()
            await asyncio.sleep(interval)
            samples.append(max(0.0, perf() - self.t0 - interval))

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            # The cycle under way counts too (how overdue it is so far): a run shorter than one
            # interval still has a measured lag, never an empty one.
            if self.t0 is not None:
                self.samples.append(max(0.0, time.perf_counter() - self.t0 - self.interval_s))


class _Meter:
    """Per worker process self-check: CPU, wall time, event-loop lag, read-side cost."""

    def __init__(self, proc: int, sender: str) -> None:
        self.proc, self.sender = proc, sender
        self.lag = _LoopLag()
        self.cpu0 = time.process_time()
        self.wall0 = time.perf_counter()

    def result(self, client: _Client, records: Sequence[Record]) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall0
        cpu = time.process_time() - self.cpu0
        chunks = sum(r.chunks for r in records)
        return {"process": self.proc, "pid": os.getpid(), "sender": self.sender, "wall_s": wall, "cpu_s": cpu,
                "cpu_pct": 100.0 * cpu / wall if wall > 0 else None, "cores": len(os.sched_getaffinity(0)),
                "loop_lag_s": distribution(self.lag.samples), "chunks": chunks, "requests": len(records),
                **client.selfcheck(),
                "chunk_us": (client.read_busy_s / chunks * 1e6) if chunks else None}
