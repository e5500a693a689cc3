"""The open loop's sender thread (:class:`_Sender`): writes each prebuilt request to a kept-alive socket
at its scheduled time, so a loop busy reading hundreds of streams does not delay the sends."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence

from . import clock
from .client import _Client, _Conn
from .clock import now
from .exchange import _Exchange


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
        loop, perf, off = self.client.loop, time.perf_counter, clock._EPOCH_OFFSET
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
