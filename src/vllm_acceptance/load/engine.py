"""Streaming load engine for OpenAI-compatible chat completions.

Transport: a small HTTP/1.1 client on asyncio protocols (keep-alive connections; chunked, length-
or close-delimited bodies), not a general HTTP library. Measured on the lab machines against a
zero-work streaming server (``benchmarks/loadgen_ceiling.py``): httpx streams SSE 4-5x slower than
aiohttp, and aiohttp itself spends ~5-7 us per chunk in its stream reader; a protocol's
``data_received`` gets each network read directly, with no future or task wake-up per read. Each
read is de-chunked, split on the blank line that ends an SSE event, and JSON is parsed only where
it matters: every event until the first token, any event that names ``usage`` or ``error``, and
the last token event (for its ``finish_reason``). Token events in between are only time-stamped:
a raw substring test cannot miss a real ``"usage"``/``"error"`` key because JSON escapes every
quote inside a string, so a false positive only costs a full parse.

Timing: all times are epoch seconds taken from the monotonic clock plus one fixed offset, so
intervals never jump with NTP. Latencies count from ``scheduled``: in the open loop that is the
planned send time, so a client that falls behind cannot hide the lag (no coordinated omission);
``sent - scheduled`` is recorded so the pacing itself is evidence. Open-loop sends leave from a
dedicated sender thread that writes prebuilt request bytes to kept-alive sockets at their time, so
a loop busy reading hundreds of streams does not delay them (:class:`_Sender`).

Self-check: every run measures its own client (:class:`_Meter`): CPU of the worker process,
event-loop lag, time spent processing reads per chunk; with the send lag of the records this is
what ``rules/loadgen.py`` judges, so a saturated client is never mistaken for a slow server.

Token counts come from the final ``usage`` chunk (``stream_options.include_usage``), never from
chunk counts. The API key goes only into the Authorization header; error text is redacted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import multiprocessing as mp
import os
import queue as queue_mod
import socket
import ssl
import sys
import threading
import time
import traceback
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from vllm_acceptance.core.redact import redact_text
from vllm_acceptance.load.stats import Arrival, arrival_offsets, distribution, summarize

__all__ = [
    "RequestSpec", "Record", "run_closed_loop", "run_open_loop", "run_closed_loop_sync",
    "run_open_loop_sync", "run_load", "summarize", "arrival_offsets", "chat_url", "now",
    "RecordSink", "read_records", "SelfCheck",
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


# ---------------------------------------------------------------------------------------------
# Transport: HTTP/1.1 over asyncio protocols (keep-alive; chunked, length- or close-delimited bodies)


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str
    host_header: str
    tls: bool


def _target(url: str) -> _Target:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base URL {url!r}: give http://HOST:PORT[/v1] or https://HOST:PORT[/v1]")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(host=parts.hostname, port=port, path=path, host_header=parts.netloc.rsplit("@", 1)[-1],
                   tls=tls)


def _request_bytes(target: _Target, api_key: str | None, body: bytes) -> bytes:
    """The whole request, built once before the run: the sending path only writes bytes."""
    head = (f"POST {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\nAccept-Encoding: identity\r\n"
            "Connection: keep-alive\r\nUser-Agent: vllm-acceptance-loadgen\r\n"
            f"Content-Length: {len(body)}\r\n")
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


_HEAD, _CHUNKED, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(6)
MAX_HEAD_BYTES = 64 * 1024


class _Exchange:
    """One request/response on a connection: HTTP framing in, SSE events into :class:`_Stream`."""

    __slots__ = ("rec", "stream", "request", "state", "buf", "remaining", "crlf", "keep_alive", "body",
                 "timer", "finished", "on_done", "api_key", "timeout_s", "deadline", "conn")

    def __init__(self, rec: Record, request: bytes, on_done: Callable[[_Exchange], None], api_key: str | None,
                 timeout_s: float, deadline: float | None) -> None:
        self.rec, self.request, self.on_done, self.api_key = rec, request, on_done, api_key
        self.timeout_s, self.deadline = timeout_s, deadline
        self.stream = _Stream(rec)
        self.state = _HEAD
        self.buf = b""
        self.remaining = 0
        self.crlf = False
        self.keep_alive = True
        self.body: list[bytes] | None = None  # the body of a non-200 answer, for the error text
        self.timer: asyncio.TimerHandle | None = None
        self.finished = False
        self.conn: _Conn | None = None

    # -- timing -------------------------------------------------------------------------------

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the request timeout (or the stage deadline, whichever comes first) on the loop."""
        if self.finished:
            return
        sent = self.rec.sent if self.rec.sent is not None else now()
        budget, why = self.timeout_s, f"request timed out after {self.timeout_s:g} s"
        if self.deadline is not None and self.deadline - sent < budget:
            budget, why = max(0.0, self.deadline - sent), "stage deadline reached"
        self.timer = loop.call_later(max(0.0, sent + budget - now()), self.fail, "timeout", why)

    # -- parsing ------------------------------------------------------------------------------

    def feed(self, data: bytes, t: float) -> None:
        if self.state == _HEAD:
            data = self._head(self.buf + data if self.buf else data)
            if not data:
                return
        state = self.state
        if state in (_CHUNKED, _TRAILER):
            self._chunked(data, t)
        elif state == _LENGTH:
            if len(data) >= self.remaining:
                extra = len(data) > self.remaining
                self._body(data[:self.remaining], t)
                self.remaining = 0
                self.keep_alive = self.keep_alive and not extra
                self.complete(t)
            else:
                self.remaining -= len(data)
                self._body(data, t)
        elif state == _UNTIL_CLOSE:
            self._body(data, t)
        elif state == _DONE and data:
            self.keep_alive = False  # bytes after the answer: never reuse this connection

    def _head(self, buf: bytes) -> bytes:
        """Parse the status line and headers; return what follows them (b"" while incomplete)."""
        i = buf.find(b"\r\n\r\n")
        if i < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self.fail("error", "response headers larger than 64 KiB")
            self.buf = buf
            return b""
        self.buf = b""
        lines = buf[:i].split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        try:
            status = int(status_line[1])
        except (IndexError, ValueError):
            self.fail("error", f"not an HTTP response: {buf[:200]!r}")
            return b""
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return self._head(buf[i + 4:]) if buf[i + 4:] else b""
        self.rec.http_status = status
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip().lower()
        self.keep_alive = status_line[0] == b"HTTP/1.1" and headers.get(b"connection") != b"close"
        if status != 200:
            self.body = []
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            self.state = _CHUNKED
        elif b"content-length" in headers:
            try:
                self.remaining = int(headers[b"content-length"])
            except ValueError:
                self.fail("error", f"bad Content-Length: {headers[b'content-length'][:50]!r}")
                return b""
            self.state = _LENGTH
            if self.remaining == 0:
                self.complete(now())
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
        return buf[i + 4:]

    def _chunked(self, data: bytes, t: float) -> None:
        """Decode chunked framing; one SSE feed per network read (all its chunks joined)."""
        buf = self.buf + data if self.buf else data
        pos, n, out = 0, len(buf), []
        while pos < n:
            if self.state == _TRAILER:
                if buf.startswith(b"\r\n", pos):
                    pos += 2
                else:
                    j = buf.find(b"\r\n\r\n", pos)
                    if j < 0:
                        break
                    pos = j + 4
                self.state = _DONE
                break
            if self.remaining:
                end = pos + self.remaining
                if end > n:
                    out.append(buf[pos:])
                    self.remaining -= n - pos
                    pos = n
                    break
                out.append(buf[pos:end])
                pos, self.remaining, self.crlf = end, 0, True
            if self.crlf:
                if n - pos < 2:
                    break
                pos += 2
                self.crlf = False
            j = buf.find(b"\r\n", pos)
            if j < 0:
                break
            try:
                size = int(buf[pos:j].split(b";", 1)[0], 16)
            except ValueError:
                self.fail("error", f"bad chunk header: {buf[pos:pos + 40]!r}")
                return
            pos = j + 2
            if size == 0:
                self.state = _TRAILER
            else:
                self.remaining = size
        self.buf = buf[pos:] if pos < n else b""
        if out:
            self._body(out[0] if len(out) == 1 else b"".join(out), t)
        if self.state == _DONE:
            if self.buf:
                self.keep_alive = False
            self.complete(t)

    def _body(self, data: bytes, t: float) -> None:
        if self.body is not None:
            self.body.append(data)
        else:
            self.stream.feed(data, t)

    # -- the end ------------------------------------------------------------------------------

    def lost(self, exc: BaseException | None) -> None:
        """The connection closed under this exchange."""
        if self.state == _UNTIL_CLOSE:
            self.complete(now())
        elif self.state == _HEAD and not self.buf and self.rec.http_status is None:
            self.fail("error", f"ServerDisconnectedError: connection closed before the answer began"
                               f"{f' ({exc})' if exc else ''}")
        else:
            self.fail("error", "ServerDisconnectedError: connection closed mid-answer (incomplete payload)"
                               f"{f' ({exc})' if exc else ''}")

    def complete(self, t: float) -> None:
        if self.finished:
            return
        rec = self.rec
        rec.end = now()
        if self.body is not None:
            text = b"".join(self.body).decode(errors="replace")
            rec.error = _clip(f"HTTP {rec.http_status}: {text}", self.api_key)
        else:
            stream = self.stream
            stream.finish()
            if rec.error is None and not stream.done:
                tail = f"; unparsed tail: {stream.pending[:200]!r}" if stream.pending.strip() else ""
                rec.error = _clip(f"stream ended before data: [DONE]{tail}", self.api_key)
        rec.status = "ok" if rec.error is None else "error"
        self._finish(reusable=self.keep_alive)

    def fail(self, status: Status, why: str) -> None:
        if self.finished:
            return
        rec = self.rec
        rec.end = now()
        rec.status = status
        rec.error = _clip(why, self.api_key)
        self._finish(reusable=False)

    def _finish(self, reusable: bool) -> None:
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        conn = self.conn
        if conn is not None:
            conn.release(self, reusable)
        self.on_done(self)


class _Conn(asyncio.Protocol):
    """One keep-alive connection; the exchange in flight on it gets every byte it reads."""

    def __init__(self, client: _Client, sock: socket.socket | None = None) -> None:
        self.client = client
        self.sock = sock          # set when the sender thread owns the socket (writes go straight to it)
        self.transport: asyncio.Transport | None = None
        self.ex: _Exchange | None = None
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        t0 = time.perf_counter()
        ex = self.ex
        if ex is None:  # nothing asked: a server talking out of turn; drop the connection
            self.close()
            return
        ex.feed(data, _EPOCH_OFFSET + t0)
        client = self.client
        client.read_busy_s += time.perf_counter() - t0
        client.reads += 1

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        ex = self.ex
        if ex is not None:
            ex.lost(exc)

    def release(self, ex: _Exchange, reusable: bool) -> None:
        if self.ex is ex:
            self.ex = None
        if reusable and not self.closed:
            self.idle_since = now()
            self.client.idle.append(self)
        else:
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        elif self.sock is not None:
            self.sock.close()


IDLE_MAX_S = 2.0  # reuse a kept-alive connection only this long (servers close idle ones, e.g. after 5 s)


class _Client:
    """Connections to one server, and this process's self-check counters.

    ``idle`` is a deque: the loop appends a connection when its answer is complete; the open loop's
    sender thread pops from it (deque append/pop are atomic), newest first, so old ones age out.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, target: _Target) -> None:
        self.loop, self.target = loop, target
        self.idle: collections.deque[_Conn] = collections.deque()
        self.ssl = ssl.create_default_context() if target.tls else None
        self.read_busy_s = 0.0
        self.reads = 0
        self.opened = 0
        self.all: list[_Conn] = []

    def take_idle(self) -> _Conn | None:
        """The newest live idle connection (any thread); stale ones are closed on the loop."""
        limit = now() - IDLE_MAX_S
        while True:
            try:
                conn = self.idle.pop()
            except IndexError:
                return None
            if conn.closed:
                continue
            if conn.idle_since < limit:
                self.loop.call_soon_threadsafe(conn.close)
                continue
            return conn

    async def open(self, ex: _Exchange) -> _Conn | None:
        """A connection for `ex` on the loop (idle or new); a connect failure ends `ex` as an error."""
        conn = self.take_idle()
        if conn is not None:
            return conn
        conn = _Conn(self)
        t = self.target
        ex.rec.sent = now()  # the handshake counts in the request's latency, as it would for any client
        try:
            async with asyncio.timeout(max(0.001, ex.timeout_s)):
                await self.loop.create_connection(lambda: conn, t.host, t.port, ssl=self.ssl,
                                                  server_hostname=t.host if self.ssl else None)
        except TimeoutError:
            ex.fail("timeout", f"connect timed out after {ex.timeout_s:g} s")
            return None
        except (OSError, ssl.SSLError) as exc:
            ex.fail("error", f"{type(exc).__name__}: {exc}")
            return None
        self.opened += 1
        self.all.append(conn)
        return conn

    def start_on_loop(self, conn: _Conn, ex: _Exchange) -> None:
        """Send `ex` on `conn` from the loop thread."""
        ex.conn = conn
        conn.ex = ex
        if ex.rec.sent is None:
            ex.rec.sent = now()
        assert conn.transport is not None
        conn.transport.write(ex.request)
        ex.arm(self.loop)

    def connect_blocking(self, timeout_s: float) -> socket.socket:
        """A new plain-TCP socket, connected in the calling (sender) thread."""
        sock = socket.create_connection((self.target.host, self.target.port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def adopt(self, conn: _Conn, sock: socket.socket, ex: _Exchange | None) -> None:
        """On the loop: attach a socket the sender connected (and maybe already wrote to)."""
        self.opened += 1
        self.all.append(conn)

        async def attach() -> None:
            try:
                await self.loop.create_connection(lambda: conn, sock=sock)
            except OSError as exc:
                conn.closed = True
                if ex is not None:
                    ex.fail("error", f"{type(exc).__name__}: {exc}")
                return
            if ex is None:  # a spare: ready for the sender
                conn.idle_since = now()
                self.idle.append(conn)

        self.loop.create_task(attach())
        if ex is not None:
            ex.arm(self.loop)

    def close_all(self) -> None:
        for conn in self.all:
            if not conn.closed:
                conn.close()

    def selfcheck(self) -> dict[str, Any]:
        return {"read_busy_s": self.read_busy_s, "reads": self.reads, "connections": self.opened}


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


def _raise_priority() -> str:
    """Give the calling thread a real-time priority where allowed (root or CAP_SYS_NICE).

    On a loaded host a woken sender otherwise waits milliseconds for a CPU behind ordinary
    processes; it sleeps between sends and spins only ``lead_s``, so it never holds a core for long.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # pid 0: this thread (Linux)
    except (AttributeError, OSError):
        return "normal"
    return "SCHED_FIFO"


class _Sender(threading.Thread):
    """Sends each open-loop request at its scheduled time, from its own thread.

    The event loop reads answers; a loop busy with hundreds of streams would delay a send by
    milliseconds (its callbacks run in turn, and asyncio timers round to whole milliseconds). So
    this thread sleeps until `lead_s` before each send time, spins the rest, and writes the
    prebuilt request bytes straight to a kept-alive socket (or one it connects), then tells the loop
    (``call_soon_threadsafe``) to arm the timeout. Only the sends of plain HTTP take this path; over
    TLS the thread hands each request to the loop at its time (``sender: loop`` in the self-check).
    Between sends it connects spare sockets, so a send rarely waits for a TCP handshake.
    """

    def __init__(self, client: _Client, times: Sequence[float], exchanges: Sequence[_Exchange],
                 launched: Callable[[int], None], finished: Callable[[], None], deadline: float | None,
                 lead_s: float, connect_timeout_s: float, spares: int) -> None:
        super().__init__(name="loadgen-sender", daemon=True)
        self.client, self.times, self.exchanges = client, times, exchanges
        self.launched, self.finished, self.deadline, self.lead_s = launched, finished, deadline, lead_s
        self.connect_timeout_s, self.spares = connect_timeout_s, spares
        self.direct = not client.target.tls
        self.stop = threading.Event()
        self.pending_spares = 0
        self.priority = "normal"
        self.connect_s = 0.001     # running estimate of a TCP handshake, to fit spares between sends
        self.spares_after = 0.0    # no spare connects before this time (after a refused one)

    def run(self) -> None:
        loop, perf, off = self.client.loop, time.perf_counter, _EPOCH_OFFSET
        self.priority = _raise_priority()
        try:
            for k, target in enumerate(self.times):
                if self.stop.is_set() or (self.deadline is not None and target >= self.deadline):
                    break
                self._wait(target - self.lead_s)
                if self.stop.is_set():
                    break
                goal = target - off
                while perf() < goal:
                    pass
                if self.direct:
                    self._send(k)
                else:
                    loop.call_soon_threadsafe(self._send_on_loop, k)
        except RuntimeError:  # the loop closed under us (the run was cancelled): nothing to hand over
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self.finished)

    def _wait(self, until: float) -> None:
        """Sleep until `until`, connecting spare sockets while there is time for a handshake."""
        client = self.client
        while True:
            rem = until - now()
            if rem <= 0 or self.stop.is_set():
                return
            if (self.direct and rem > 2 * self.connect_s + 0.001 and now() >= self.spares_after
                    and len(client.idle) + self.pending_spares < self.spares):
                t0 = now()
                try:
                    sock = client.connect_blocking(min(self.connect_timeout_s, max(rem, 0.05)))
                except OSError:  # the server refuses or is away: the sends will record it; retry later
                    self.spares_after = now() + 0.2
                    continue
                self.connect_s = 0.8 * self.connect_s + 0.2 * (now() - t0)
                self.pending_spares += 1
                conn = _Conn(client, sock)
                client.loop.call_soon_threadsafe(self._spare_ready, conn, sock)
                continue
            time.sleep(min(rem, 0.05))

    def _spare_ready(self, conn: _Conn, sock: socket.socket) -> None:
        self.pending_spares -= 1
        self.client.adopt(conn, sock, None)

    def _send(self, k: int) -> None:
        """At the send time, in this thread: write the request bytes; the loop does the rest."""
        client, ex = self.client, self.exchanges[k]
        loop = client.loop
        conn = client.take_idle()
        while conn is not None:
            if conn.sock is None:  # not ours to write to from here: leave it to the loop path
                conn = client.take_idle()
                continue
            ex.conn = conn
            conn.ex = ex
            ex.rec.sent = now()
            try:
                n = conn.sock.send(ex.request)
            except BlockingIOError:
                n = 0
            except OSError:  # the server closed this kept-alive socket: nothing was sent, take another
                conn.ex = None
                ex.conn = None
                conn = client.take_idle()
                continue
            rest = ex.request[n:]
            loop.call_soon_threadsafe(self._sent, k, conn, rest)
            return
        try:
            sock = client.connect_blocking(self.connect_timeout_s)
        except OSError as exc:
            ex.rec.sent = now()
            loop.call_soon_threadsafe(self._connect_failed, k, exc)
            return
        conn = _Conn(client, sock)
        ex.conn = conn
        conn.ex = ex
        ex.rec.sent = now()
        sock.sendall(ex.request)
        loop.call_soon_threadsafe(self._adopt, k, conn, sock)

    def _sent(self, k: int, conn: _Conn, rest: bytes) -> None:
        ex = self.exchanges[k]
        self.launched(k)
        if rest and conn.transport is not None:
            conn.transport.write(rest)
        ex.arm(self.client.loop)

    def _adopt(self, k: int, conn: _Conn, sock: socket.socket) -> None:
        self.launched(k)
        self.client.adopt(conn, sock, self.exchanges[k])

    def _connect_failed(self, k: int, exc: OSError) -> None:
        self.launched(k)
        self.exchanges[k].fail("error", f"ClientConnectorError: {type(exc).__name__}: {exc}")

    def _send_on_loop(self, k: int) -> None:
        """TLS: the loop opens or reuses the connection and writes (its own lag is measured)."""
        ex = self.exchanges[k]
        self.launched(k)

        async def go() -> None:
            conn = await self.client.open(ex)
            if conn is not None:
                self.client.start_on_loop(conn, ex)

        self.client.loop.create_task(go())


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

