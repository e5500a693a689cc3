"""Async streaming load engine for OpenAI-compatible chat completions.

Why aiohttp and this parsing loop: measured on the lab machines against a zero-work streaming
server (docs/lab.md, one client core, 64 concurrent, 256-token streams), httpx streams SSE 4-5x
slower than aiohttp (h11 parses every chunk in Python), and reading line by line halves
aiohttp's throughput. So the engine reads with ``iter_any()`` (whatever bytes arrived), splits on
the blank line that ends an SSE event, and parses JSON only where it matters: every event until
the first token, any event that names ``usage`` or ``error``, and the last token event (for its
``finish_reason``). Token events in between are only time-stamped: a raw substring test cannot
miss a real ``"usage"``/``"error"`` key because JSON escapes every quote inside a string, so a
false positive only costs a full parse. That keeps the client well above ``vllm bench serve``
(see ``benchmarks/loadgen_ceiling.py``) so a measured ceiling belongs to the server, not to us.

Timing: all times are epoch seconds taken from the monotonic clock plus one fixed offset, so
intervals never jump with NTP. Latencies count from ``scheduled``: in the open loop that is the
planned send time, so a client that falls behind cannot hide the lag (no coordinated omission);
``sent - scheduled`` is recorded so the pacing itself is evidence. Open-loop sends are timed by a
dedicated ticker thread that wakes the event loop a few hundred microseconds early, after which
the request spins to its exact time on the loop and sends; asyncio's own timers round to whole
milliseconds.

Token counts come from the final ``usage`` chunk (``stream_options.include_usage``), never from
chunk counts. The API key goes only into the Authorization header; error text is redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import queue as queue_mod
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

import aiohttp

from vllm_acceptance.core.redact import redact_text
from vllm_acceptance.load.stats import Arrival, arrival_offsets, summarize

__all__ = [
    "RequestSpec", "Record", "run_closed_loop", "run_open_loop", "run_closed_loop_sync",
    "run_open_loop_sync", "run_load", "summarize", "arrival_offsets", "chat_url", "now",
    "RecordSink", "read_records",
]

ERROR_TEXT_LIMIT = 2000
Status = Literal["ok", "error", "timeout"]

# perf_counter is CLOCK_MONOTONIC on Linux (system-wide), so one offset maps it onto the epoch in
# every process; worker processes adopt the parent's offset so their times are comparable.
_EPOCH_OFFSET = time.time() - time.perf_counter()


def now() -> float:
    """Epoch seconds from the monotonic clock (immune to wall-clock steps during a run)."""
    return _EPOCH_OFFSET + time.perf_counter()


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


def chat_url(base_url: str) -> str:
    """``http://h:p`` or ``http://h:p/v1`` -> the chat completions URL."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def build_body(model: str, spec: RequestSpec) -> bytes:
    """Request body: streaming with usage forced on, `extra` merged over the defaults."""
    body: dict[str, Any] = {"model": model, "messages": spec.messages, "max_tokens": spec.max_tokens}
    body.update(spec.extra)
    body["stream"] = True
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


def _headers(api_key: str | None) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def _clip(text: str, api_key: str | None) -> str:
    # Redact before clipping, so a cut cannot leave half a secret that no longer matches.
    return redact_text(text, [api_key] if api_key else None)[:ERROR_TEXT_LIMIT]


def _event_data(ev: bytes) -> bytes | None:
    """The data payload of one SSE event (None for comments/keep-alives and data-less events)."""
    if ev.startswith(b"data: ") and b"\n" not in ev:
        return ev[6:]
    parts = []
    for line in ev.split(b"\n"):
        if line.startswith(b"data:"):
            v = line[5:]
            parts.append(v[1:] if v.startswith(b" ") else v)
    return b"\n".join(parts) if parts else None


_TOKEN_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls")


class _Stream:
    """Per-request SSE state machine; `feed` is the hot path (one call per network read)."""

    __slots__ = ("rec", "pending", "last", "got_token", "done", "last_raw", "gaps")

    def __init__(self, rec: Record) -> None:
        self.rec = rec
        self.pending = b""
        self.last = 0.0
        self.got_token = False
        self.done = False
        self.last_raw: bytes | None = None
        self.gaps = rec.itl_s

    def feed(self, data: bytes, t: float) -> None:
        if self.pending:
            data = self.pending + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        events = data.split(b"\n\n")
        self.pending = events.pop()
        for ev in events:
            payload = ev[6:] if ev.startswith(b"data: ") and b"\n" not in ev else _event_data(ev)
            if payload is None:
                continue
            if self.got_token and b'"usage"' not in payload and b'"error"' not in payload:
                if payload == b"[DONE]":
                    self.done = True
                    continue
                # Fast path: a token chunk after the first token; timestamp it, parse later if last.
                self.rec.chunks += 1
                self.gaps.append(t - self.last)
                self.last = t
                self.last_raw = payload
                continue
            if payload == b"[DONE]":
                self.done = True
                continue
            self._parse(payload, t)

    def _parse(self, payload: bytes, t: float) -> None:
        rec = self.rec
        try:
            obj = json.loads(payload)
        except ValueError:
            rec.error = rec.error or f"unparseable SSE data: {payload[:200]!r}"
            return
        if not isinstance(obj, dict):
            return
        if obj.get("error") is not None:
            rec.error = f"error event in stream: {json.dumps(obj['error'])}"
        choices = obj.get("choices")
        if choices:
            rec.chunks += 1
            c0 = choices[0]
            delta = c0.get("delta") or {}
            if rec.first_chunk is None:
                rec.first_chunk = t
            if self.got_token:
                self.gaps.append(t - self.last)
                self.last = t
            elif any(delta.get(k) for k in _TOKEN_KEYS):
                rec.first_token = t
                self.last = t
                self.got_token = True
            if c0.get("finish_reason"):
                rec.finish_reason = c0["finish_reason"]
            self.last_raw = None
        usage = obj.get("usage")
        if isinstance(usage, dict):
            rec.prompt_tokens = usage.get("prompt_tokens")
            rec.completion_tokens = usage.get("completion_tokens")

    def finish(self) -> None:
        """Read `finish_reason` from the last fast-pathed token chunk (it rides on the last one)."""
        if self.rec.finish_reason is None and self.last_raw is not None:
            try:
                choices = json.loads(self.last_raw).get("choices") or [{}]
                self.rec.finish_reason = choices[0].get("finish_reason")
            except (ValueError, AttributeError):
                pass


async def _send_one(session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes,
                    rec: Record, timeout_s: float, deadline: float | None,
                    api_key: str | None) -> Record:
    """Send one request and stream its answer into `rec`; never raises for request failures."""
    rec.sent = now()
    budget = timeout_s
    by_deadline = False
    if deadline is not None and deadline - rec.sent < budget:
        budget = max(0.0, deadline - rec.sent)
        by_deadline = True
    stream = _Stream(rec)
    try:
        async with asyncio.timeout(budget):
            async with session.post(url, data=body, headers=headers) as resp:
                rec.http_status = resp.status
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    rec.end = now()
                    rec.error = _clip(f"HTTP {resp.status}: {text}", api_key)
                    return rec
                perf = time.perf_counter
                off = _EPOCH_OFFSET
                async for data in resp.content.iter_any():
                    stream.feed(data, off + perf())
        rec.end = now()
        stream.finish()
        if rec.error is None and not stream.done:
            tail = f"; unparsed tail: {stream.pending[:200]!r}" if stream.pending.strip() else ""
            rec.error = _clip(f"stream ended before data: [DONE]{tail}", api_key)
        rec.status = "ok" if rec.error is None else "error"
    except TimeoutError:
        rec.end = now()
        rec.status = "timeout"
        rec.error = ("stage deadline reached" if by_deadline
                     else f"request timed out after {timeout_s:g} s")
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        rec.end = now()
        rec.status = "error"
        rec.error = _clip(f"{type(exc).__name__}: {exc}", api_key)
    return rec


def _session(limit: int = 0) -> aiohttp.ClientSession:
    # Timeouts are ours (per request and stage deadline); aiohttp's own are switched off.
    conn = aiohttp.TCPConnector(limit=limit, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None),
                                 auto_decompress=False)


Item = tuple[int, RequestSpec]
OnRecord = Callable[[Record], None] | None


async def _closed(base_url: str, model: str, items: Sequence[Item], concurrency: int, *,
                  timeout_s: float, deadline: float | None, api_key: str | None, on_record: OnRecord,
                  run_id: str, proc: int = 0) -> list[Record]:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    url, headers = chat_url(base_url), _headers(api_key)
    bodies = {i: build_body(model, s) for i, s in items}
    records: list[Record] = []
    it = iter(items)

    async with _session() as session:
        async def worker(w: int) -> None:
            for i, spec in it:  # one shared iterator: a free worker takes the next request
                t = now()
                if deadline is not None and t >= deadline:
                    return
                rec = Record(request_id=f"{run_id}-{i:06d}", tag=spec.tag, worker=f"p{proc}.w{w}",
                             scheduled=t)
                await _send_one(session, url, headers, bodies[i], rec, timeout_s, deadline, api_key)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)

        try:
            async with asyncio.TaskGroup() as tg:  # a failing on_record cancels the other workers
                for w in range(min(concurrency, max(1, len(items)))):
                    tg.create_task(worker(w))
        except BaseExceptionGroup as group:  # the caller gets its own exception, not a group
            raise group.exceptions[0] from None
    return records


class _Ticker(threading.Thread):
    """Wakes the event loop just before each scheduled send.

    asyncio timers wake up to a millisecond late (epoll timeouts are rounded up to whole ms), and a
    woken thread needs tens of microseconds to run. So this thread sleeps until `lead_s` before the
    send time and hands the request to the loop (``call_soon_threadsafe`` wakes it through its
    self-pipe); the request's first step then spins the remaining microseconds on the loop itself
    and sends at once. Spinning there, not here, avoids a GIL hand-over between spin and send.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, times: Sequence[float],
                 launch: Callable[[int], None], finished: Callable[[], None],
                 deadline: float | None, lead_s: float) -> None:
        super().__init__(name="loadgen-ticker", daemon=True)
        self.loop, self.times, self.launch, self.finished = loop, times, launch, finished
        self.deadline, self.lead_s = deadline, lead_s
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            for k, target in enumerate(self.times):
                if self.stop.is_set() or (self.deadline is not None and target >= self.deadline):
                    break
                rem = target - self.lead_s - now()
                if rem > 0 and self.stop.wait(rem):
                    break
                self.loop.call_soon_threadsafe(self.launch, k)
        except RuntimeError:  # the loop closed under us (the run was cancelled): nothing to hand over
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.finished)


def _spin_until(t: float) -> None:
    """Busy-wait (blocking the loop) until `t`; only ever the last few hundred microseconds."""
    perf, target = time.perf_counter, t - _EPOCH_OFFSET
    while perf() < target:
        pass


async def _open(base_url: str, model: str, items: Sequence[Item], offsets: Sequence[float], *,
                start: float | None, timeout_s: float, deadline: float | None, api_key: str | None,
                on_record: OnRecord, run_id: str, proc: int = 0, lead_s: float = 0.0003) -> list[Record]:
    if len(offsets) != len(items):
        raise ValueError("one offset per request is needed")
    url, headers = chat_url(base_url), _headers(api_key)
    bodies = [build_body(model, s) for _, s in items]
    records: list[Record] = []
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    all_launched = asyncio.Event()
    first_error: list[BaseException] = []
    t0 = start if start is not None else now() + 0.05
    times = [t0 + o for o in offsets]

    async with _session() as session:
        async def one(k: int) -> None:
            i, spec = items[k]
            rec = Record(request_id=f"{run_id}-{i:06d}", tag=spec.tag, worker=f"p{proc}",
                         scheduled=times[k])
            _spin_until(times[k])
            await _send_one(session, url, headers, bodies[k], rec, timeout_s, deadline, api_key)
            records.append(rec)
            if on_record is not None:
                on_record(rec)

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                first_error.append(task.exception())  # type: ignore[arg-type]
                ticker.stop.set()  # e.g. the evidence writer failed: send nothing more

        def launch(k: int) -> None:
            task = loop.create_task(one(k))
            tasks.add(task)
            task.add_done_callback(done)

        ticker = _Ticker(loop, times, launch, all_launched.set, deadline, lead_s)
        # The ticker must get the GIL within microseconds of waking, not after the default 5 ms.
        old_switch = sys.getswitchinterval()
        sys.setswitchinterval(min(old_switch, 5e-5))
        ticker.start()
        try:
            await all_launched.wait()
            while tasks:
                await asyncio.gather(*list(tasks), return_exceptions=True)
        finally:
            ticker.stop.set()
            sys.setswitchinterval(old_switch)
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
                          run_id: str | None = None) -> list[Record]:
    """Send `specs` with `concurrency` requests in flight until all are done or the stage deadline.

    `stage_deadline_s` counts from the call: no request starts after it and requests in flight at
    it end as ``timeout``; requests never started produce no record. `on_record` is called as
    each request completes (append it to JSONL there, so evidence survives a crash).
    """
    items = list(enumerate(specs))
    return await _closed(base_url, model, items, concurrency, timeout_s=timeout_s,
                         deadline=_abs_deadline(stage_deadline_s, now()), api_key=api_key,
                         on_record=on_record, run_id=run_id or _new_run_id())


async def run_open_loop(base_url: str, model: str, specs: Sequence[RequestSpec], rate: float,
                        arrival: Arrival = "constant", seed: int = 0, *, timeout_s: float = 600.0,
                        stage_deadline_s: float | None = None, api_key: str | None = None,
                        on_record: OnRecord = None, run_id: str | None = None) -> list[Record]:
    """Send `specs` at `rate` requests/s (constant or seeded Poisson arrivals), whatever the answers.

    Latencies count from each request's scheduled time. Sends planned after the stage deadline are
    skipped (no record); requests in flight at it end as ``timeout``.
    """
    items = list(enumerate(specs))
    offsets = arrival_offsets(len(items), rate, arrival, seed)
    t0 = now() + 0.05
    return await _open(base_url, model, items, offsets, start=t0, timeout_s=timeout_s,
                       deadline=_abs_deadline(stage_deadline_s, t0), api_key=api_key,
                       on_record=on_record, run_id=run_id or _new_run_id())


def run_closed_loop_sync(*args: Any, **kwargs: Any) -> list[Record]:
    """:func:`run_closed_loop` for callers without an event loop."""
    return asyncio.run(run_closed_loop(*args, **kwargs))


def run_open_loop_sync(*args: Any, **kwargs: Any) -> list[Record]:
    """:func:`run_open_loop` for callers without an event loop."""
    return asyncio.run(run_open_loop(*args, **kwargs))


# ---------------------------------------------------------------------------------------------
# Multi-process mode


def _child(proc: int, epoch_offset: float, job: dict[str, Any], queue: Any, go: Any, start_at: Any) -> None:
    """Worker process: run its share of the schedule, stream records back through `queue`."""
    global _EPOCH_OFFSET
    _EPOCH_OFFSET = epoch_offset
    try:
        queue.put(("ready", proc, None))
        go.wait()
        t0 = start_at.value

        def emit(rec: Record) -> None:
            queue.put(("record", proc, rec.to_dict()))

        common = dict(timeout_s=job["timeout_s"], deadline=_abs_deadline(job["deadline_rel"], t0),
                      api_key=job["api_key"], on_record=emit, run_id=job["run_id"], proc=proc)
        if job["mode"] == "closed":
            coro = _closed(job["base_url"], job["model"], job["items"], job["concurrency"], **common)
        else:
            coro = _open(job["base_url"], job["model"], job["items"], job["offsets"], start=t0, **common)
        asyncio.run(coro)
        queue.put(("done", proc, None))
    except BaseException:  # noqa: BLE001 - report anything to the parent, which raises it
        queue.put(("fatal", proc, traceback.format_exc()))


def run_load(base_url: str, model: str, specs: Sequence[RequestSpec], *,
             mode: Literal["closed", "open"] = "closed", concurrency: int = 1, rate: float = 1.0,
             arrival: Arrival = "constant", seed: int = 0, processes: int = 1, timeout_s: float = 600.0,
             stage_deadline_s: float | None = None, api_key: str | None = None,
             on_record: OnRecord = None, run_id: str | None = None) -> list[Record]:
    """Run a closed or open loop, split across `processes` worker processes when one core is short.

    Requests are dealt round-robin; in the open loop each process takes every `processes`-th
    arrival of the one global schedule, so the merged arrivals follow it exactly. In the closed
    loop the concurrency is divided between the processes. `on_record` runs in this process as
    records arrive. Records are returned in completion order.
    """
    run_id = run_id or _new_run_id()
    if processes <= 1:
        if mode == "closed":
            return run_closed_loop_sync(base_url, model, specs, concurrency, timeout_s=timeout_s,
                                        stage_deadline_s=stage_deadline_s, api_key=api_key,
                                        on_record=on_record, run_id=run_id)
        return run_open_loop_sync(base_url, model, specs, rate, arrival, seed, timeout_s=timeout_s,
                                  stage_deadline_s=stage_deadline_s, api_key=api_key,
                                  on_record=on_record, run_id=run_id)
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
        proc = ctx.Process(target=_child, args=(p, _EPOCH_OFFSET, job, queue, go, start_at),
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

