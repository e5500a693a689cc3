"""The connections to one server (:class:`_Client`, :class:`_Conn`): keep-alive asyncio protocols that
hand every read to the exchange in flight, idle reuse, connects on the loop or adopted from the sender
thread, and the read-side self-check counters."""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from typing import Any

from . import clock
from .clock import now
from .exchange import _Exchange
from .request import _Target


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
        ex.feed(data, clock._EPOCH_OFFSET + t0)
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
