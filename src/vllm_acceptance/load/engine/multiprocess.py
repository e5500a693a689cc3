"""Multi-process mode (:func:`run_load`): one schedule split across spawned worker processes
(:func:`_child`, a spawn target importable by this module path), records streamed back to the parent."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue as queue_mod
import traceback
from collections.abc import Sequence
from typing import Any, Literal

from vllm_acceptance.load.stats import Arrival, arrival_offsets

from . import clock
from .clock import now
from .loops import (
    OnRecord,
    SelfCheck,
    _abs_deadline,
    _closed,
    _new_run_id,
    _open,
    run_closed_loop_sync,
    run_open_loop_sync,
)
from .records import Record, RequestSpec


def _child(proc: int, epoch_offset: float, job: dict[str, Any], queue: Any, go: Any, start_at: Any) -> None:
    """Worker process: run its share of the schedule, stream records back through `queue`."""
    clock._EPOCH_OFFSET = epoch_offset
    try:
        queue.put(("ready", proc, None))
        go.wait()
        t0 = start_at.value

        def emit(rec: Record) -> None:
            queue.put(("record", proc, rec.to_dict()))

        checks: list[dict[str, Any]] = []
        common = dict(timeout_s=job["timeout_s"], deadline=_abs_deadline(job["deadline_rel"], t0),
                      api_key=job["api_key"], on_record=emit, run_id=job["run_id"], proc=proc,
                      selfcheck=checks)
        if job["mode"] == "closed":
            coro = _closed(job["base_url"], job["model"], job["items"], job["concurrency"], **common)
        else:
            coro = _open(job["base_url"], job["model"], job["items"], job["offsets"], start=t0, **common)
        asyncio.run(coro)
        queue.put(("done", proc, checks))
    except BaseException:  # noqa: BLE001 - report anything to the parent, which raises it
        queue.put(("fatal", proc, traceback.format_exc()))


def run_load(base_url: str, model: str, specs: Sequence[RequestSpec], *,
             mode: Literal["closed", "open"] = "closed", concurrency: int = 1, rate: float = 1.0,
             arrival: Arrival = "constant", seed: int = 0, processes: int = 1, timeout_s: float = 600.0,
             stage_deadline_s: float | None = None, api_key: str | None = None,
             on_record: OnRecord = None, run_id: str | None = None,
             selfcheck: SelfCheck = None) -> list[Record]:
    """Run a closed or open loop, split across `processes` worker processes when one core is short.

    Requests are dealt round-robin; in the open loop each process takes every `processes`-th
    arrival of the one global schedule, so the merged arrivals follow it exactly. In the closed
    loop the concurrency is divided between the processes. `on_record` runs in this process as
    records arrive. Records are returned in completion order. `selfcheck` gets one client
    self-check per worker process (CPU, event-loop lag, read cost; see :class:`_Meter`).
    """
    run_id = run_id or _new_run_id()
    if processes <= 1:
        if mode == "closed":
            return run_closed_loop_sync(base_url, model, specs, concurrency, timeout_s=timeout_s,
                                        stage_deadline_s=stage_deadline_s, api_key=api_key,
                                        on_record=on_record, run_id=run_id, selfcheck=selfcheck)
        return run_open_loop_sync(base_url, model, specs, rate, arrival, seed, timeout_s=timeout_s,
                                  stage_deadline_s=stage_deadline_s, api_key=api_key,
                                  on_record=on_record, run_id=run_id, selfcheck=selfcheck)
    if mode == "closed" and concurrency < processes:
        processes = concurrency
    items = list(enumerate(specs))
    offsets = arrival_offsets(len(items), rate, arrival, seed) if mode == "open" else []
    # spawn, not fork: the caller may hold threads or an event loop that a fork would copy half-way.
    ctx = mp.get_context("spawn")
    queue, go, start_at = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
    children = []
    for p in range(processes):
        job = {"mode": mode, "base_url": base_url, "model": model, "items": items[p::processes],
               "offsets": offsets[p::processes], "api_key": api_key, "timeout_s": timeout_s,
               "deadline_rel": stage_deadline_s, "run_id": run_id,
               "concurrency": concurrency // processes + (1 if p < concurrency % processes else 0)}
        proc = ctx.Process(target=_child, args=(p, clock._EPOCH_OFFSET, job, queue, go, start_at),
                           name=f"loadgen-{p}", daemon=True)
        proc.start()
        children.append(proc)
    records: list[Record] = []
    try:
        _wait_ready(queue, processes, children)
        start_at.value = now() + 0.1
        go.set()
        finished = 0
        while finished < processes:
            kind, p, payload = _get(queue, children)
            if kind == "record":
                rec = Record.from_dict(payload)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
            elif kind == "done":
                finished += 1
                if selfcheck is not None:
                    selfcheck.extend(payload or [])
            elif kind == "fatal":
                raise RuntimeError(f"load worker process {p} failed:\n{payload}")
    finally:
        for proc in children:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
    return records


def _get(queue: Any, children: list[Any]) -> tuple[str, int, Any]:
    """Next message from the workers; raise if they all died without saying why."""
    while True:
        try:
            return queue.get(timeout=1.0)
        except queue_mod.Empty:
            if not any(c.is_alive() for c in children):
                codes = [c.exitcode for c in children]
                msg = f"load worker processes exited without finishing (exit codes {codes})"
                raise RuntimeError(msg) from None


def _wait_ready(queue: Any, n: int, children: list[Any]) -> None:
    ready = 0
    while ready < n:
        kind, p, payload = _get(queue, children)
        if kind == "fatal":
            raise RuntimeError(f"load worker process {p} failed:\n{payload}")
        ready += kind == "ready"
