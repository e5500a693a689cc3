"""The closed and open loops in one process (:func:`run_closed_loop`, :func:`run_open_loop` and their
``_sync`` forms): each request built before the run, records handed to ``on_record`` as they complete,
the self-check appended at the end."""

from __future__ import annotations

import asyncio
import gc
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from vllm_acceptance.load.stats import Arrival, arrival_offsets

from .client import _Client
from .clock import now
from .exchange import _Exchange
from .meter import _Meter
from .records import Record, RequestSpec
from .request import _request_bytes, _target, build_body, chat_url
from .sender import _Sender


def _pause_gc() -> bool:
    """Pause the cyclic garbage collector for a run; True if it was on.

    A full collection holds the GIL for tens of milliseconds once a run has made many objects
    (19 ms measured at 2,500 records), delaying sends and read timestamps alike. The engine's own
    per-request objects form no reference cycles (a finished exchange drops its timer), so the
    pause holds back little; reference counting still frees everything else at once.
    """
    was = gc.isenabled()
    gc.disable()
    return was


def _resume_gc(was: bool) -> None:
    if was:
        gc.enable()


Item = tuple[int, RequestSpec]
OnRecord = Callable[[Record], None] | None
SelfCheck = list[dict[str, Any]] | None


async def _closed(base_url: str, model: str, items: Sequence[Item], concurrency: int, *,
                  timeout_s: float, deadline: float | None, api_key: str | None, on_record: OnRecord,
                  run_id: str, proc: int = 0, selfcheck: SelfCheck = None) -> list[Record]:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    target = _target(chat_url(base_url))
    requests = {i: _request_bytes(target, api_key, build_body(model, s)) for i, s in items}
    records: list[Record] = []
    it = iter(items)
    loop = asyncio.get_running_loop()
    client = _Client(loop, target)
    meter = _Meter(proc, "closed loop")
    meter.lag.start()
    gc_paused = _pause_gc()

    async def worker(w: int) -> None:
        for i, spec in it:  # one shared iterator: a free worker takes the next request
            t = now()
            if deadline is not None and t >= deadline:
                return
            rec = Record(request_id=f"{run_id}-{i:06d}", tag=spec.tag, worker=f"p{proc}.w{w}", scheduled=t)
            done = loop.create_future()
            ex = _Exchange(rec, requests[i], lambda _e, d=done: d.done() or d.set_result(None), api_key,
                           timeout_s, deadline)
            conn = await client.open(ex)
            if conn is not None:
                client.start_on_loop(conn, ex)
            await done
            records.append(rec)
            if on_record is not None:
                on_record(rec)

    try:
        async with asyncio.TaskGroup() as tg:  # a failing on_record cancels the other workers
            for w in range(min(concurrency, max(1, len(items)))):
                tg.create_task(worker(w))
    except BaseExceptionGroup as group:  # the caller gets its own exception, not a group
        raise group.exceptions[0] from None
    finally:
        meter.lag.stop()
        client.close_all()
        _resume_gc(gc_paused)
    if selfcheck is not None:
        selfcheck.append(meter.result(client, records))
    return records


async def _open(base_url: str, model: str, items: Sequence[Item], offsets: Sequence[float], *,
                start: float | None, timeout_s: float, deadline: float | None, api_key: str | None,
                on_record: OnRecord, run_id: str, proc: int = 0, lead_s: float = 0.00015,
                selfcheck: SelfCheck = None) -> list[Record]:
    if len(offsets) != len(items):
        raise ValueError("one offset per request is needed")
    target = _target(chat_url(base_url))
    loop = asyncio.get_running_loop()
    client = _Client(loop, target)
    records: list[Record] = []
    first_error: list[BaseException] = []
    t0 = start if start is not None else now() + 0.05
    times = [t0 + o for o in offsets]
    all_done = asyncio.Event()
    state = {"launched": 0, "completed": 0, "sender_done": False}

    def check_done() -> None:
        if state["sender_done"] and state["completed"] >= state["launched"]:
            all_done.set()

    def completed(ex: _Exchange) -> None:
        state["completed"] += 1
        records.append(ex.rec)
        if on_record is not None and not first_error:
            try:
                on_record(ex.rec)
            except Exception as exc:  # noqa: BLE001 - e.g. the evidence writer failed: send nothing more
                first_error.append(exc)
                sender.stop.set()
        check_done()

    def launched(_k: int) -> None:
        state["launched"] += 1

    def sender_finished() -> None:
        state["sender_done"] = True
        check_done()

    # Everything a request needs is built before the first send: the sending path only writes bytes.
    exchanges = []
    for k, (i, spec) in enumerate(items):
        rec = Record(request_id=f"{run_id}-{i:06d}", tag=spec.tag, worker=f"p{proc}", scheduled=times[k])
        exchanges.append(_Exchange(rec, _request_bytes(target, api_key, build_body(model, spec)), completed,
                                   api_key, timeout_s, deadline))
    rate = len(times) / max(1e-3, times[-1] - times[0]) if len(times) > 1 else 1.0
    sender = _Sender(client, times, exchanges, launched, sender_finished, deadline, lead_s,
                     connect_timeout_s=min(timeout_s, 10.0), spares=max(4, min(64, int(rate * 0.02) + 4)))
    meter = _Meter(proc, "thread" if sender.direct else "loop")
    meter.lag.start()
    # The sender must get the GIL within microseconds of waking, not after the default 5 ms.
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(min(old_switch, 5e-5))
    gc_paused = _pause_gc()
    sender.start()
    try:
        await all_done.wait()
    finally:
        sender.stop.set()
        sys.setswitchinterval(old_switch)
        _resume_gc(gc_paused)
        meter.lag.stop()
        for ex in exchanges:  # cancelled run: stop the timers of what is still in flight
            if ex.timer is not None and not ex.finished:
                ex.timer.cancel()
        client.close_all()
        sender.exchanges = ()  # the run's closures and exchanges: no cycle left for the collector
    if selfcheck is not None:
        selfcheck.append({**meter.result(client, records), "sender_priority": sender.priority})
    if first_error:
        raise first_error[0]
    return records


def _new_run_id() -> str:
    return uuid.uuid4().hex[:8]


def _abs_deadline(stage_deadline_s: float | None, t0: float) -> float | None:
    return None if stage_deadline_s is None else t0 + stage_deadline_s


async def run_closed_loop(base_url: str, model: str, specs: Sequence[RequestSpec], concurrency: int, *,
                          timeout_s: float = 600.0, stage_deadline_s: float | None = None,
                          api_key: str | None = None, on_record: OnRecord = None,
                          run_id: str | None = None, selfcheck: SelfCheck = None) -> list[Record]:
    """Send `specs` with `concurrency` requests in flight until all are done or the stage deadline.

    `stage_deadline_s` counts from the call: no request starts after it and requests in flight at
    it end as ``timeout``; requests never started produce no record. `on_record` is called as
    each request completes (append it to JSONL there, so evidence survives a crash). `selfcheck`,
    when given, gets this process's client self-check appended (see :class:`_Meter`).
    """
    items = list(enumerate(specs))
    return await _closed(base_url, model, items, concurrency, timeout_s=timeout_s,
                         deadline=_abs_deadline(stage_deadline_s, now()), api_key=api_key,
                         on_record=on_record, run_id=run_id or _new_run_id(), selfcheck=selfcheck)


async def run_open_loop(base_url: str, model: str, specs: Sequence[RequestSpec], rate: float,
                        arrival: Arrival = "constant", seed: int = 0, *, timeout_s: float = 600.0,
                        stage_deadline_s: float | None = None, api_key: str | None = None,
                        on_record: OnRecord = None, run_id: str | None = None,
                        selfcheck: SelfCheck = None) -> list[Record]:
    """Send `specs` at `rate` requests/s (constant or seeded Poisson arrivals), whatever the answers.

    Latencies count from each request's scheduled time. Sends planned after the stage deadline are
    skipped (no record); requests in flight at it end as ``timeout``.
    """
    items = list(enumerate(specs))
    offsets = arrival_offsets(len(items), rate, arrival, seed)
    t0 = now() + 0.05
    return await _open(base_url, model, items, offsets, start=t0, timeout_s=timeout_s,
                       deadline=_abs_deadline(stage_deadline_s, t0), api_key=api_key,
                       on_record=on_record, run_id=run_id or _new_run_id(), selfcheck=selfcheck)


def run_closed_loop_sync(*args: Any, **kwargs: Any) -> list[Record]:
    """:func:`run_closed_loop` for callers without an event loop."""
    return asyncio.run(run_closed_loop(*args, **kwargs))


def run_open_loop_sync(*args: Any, **kwargs: Any) -> list[Record]:
    """:func:`run_open_loop` for callers without an event loop."""
    return asyncio.run(run_open_loop(*args, **kwargs))
