"""One HTTP/1.1 request/response on a connection (:class:`_Exchange`): status line and headers,
chunked, length- or close-delimited body framing, the timeout, and the request's end (ok, error,
timeout) with redacted error text."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from vllm_acceptance.core.redact import redact_text

from .clock import now
from .records import Record, Status
from .stream import _Stream


class _Holder(Protocol):
    """What an exchange needs of the connection it runs on (client._Conn): to be handed back when it ends."""

    def release(self, ex: _Exchange, reusable: bool) -> None: ...


ERROR_TEXT_LIMIT = 2000


def _clip(text: str, api_key: str | None) -> str:
    # Redact before clipping, so a cut cannot leave half a secret that no longer matches.
    return redact_text(text, [api_key] if api_key else None)[:ERROR_TEXT_LIMIT]


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
        self.conn: _Holder | None = None

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
