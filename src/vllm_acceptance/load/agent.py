"""Load agents: the load probe's ramp, mixed stream and soak sent from every loadgen host at once.

An acceptance run with loadgen hosts besides the controller (docs/acceptance.md "Capacity under
load") starts one agent per host through Ansible (playbooks/probes.yml, ``worker agent``); the
controller's load probe then sends each of those stages' steps through all of them together
(:class:`AgentPool`): the step's requests are split over the hosts, its concurrency too, every host
starts at one instant (its clock offset to the controller measured at connect and corrected), and
the records come back to the controller as they complete, merged exactly (each record keeps its
host), with each host's client self-check. A host that does not answer or drops out stops the probe
with its name (:class:`LoadgenDown`): the stage is then missing, never a silently smaller load.

Protocol: newline-delimited JSON over TCP, one controller connection at a time. The first line is
``{"op": "hello", "token": T}`` (the token of the run, given to the agent in its environment,
``VLLM_ACCEPTANCE_AGENT_TOKEN``: an agent serves only the run that started it); then ``clock``,
``send`` (records stream back as ``record`` lines, then ``done`` with the self-check) and ``bye``.
The API key never crosses this channel: the agent reads ``VLLM_API_KEY`` from its environment.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .engine.clock import now
from .engine.multiprocess import run_load
from .engine.records import Record, RequestSpec

TOKEN_ENV = "VLLM_ACCEPTANCE_AGENT_TOKEN"
DEFAULT_PORT = 29600


class LoadgenDown(RuntimeError):
    """A loadgen host did not answer or dropped out: the stage it was in has no complete load."""


# --- the agent, on a loadgen host ------------------------------------------------------------------

def _reply(wfile: Any, lock: threading.Lock, message: dict[str, Any]) -> None:
    with lock:
        wfile.write((json.dumps(message, separators=(",", ":")) + "\n").encode())
        wfile.flush()


def _wait_until(epoch: float) -> None:
    while (left := epoch - now()) > 0:
        time.sleep(min(left, 0.2) if left > 0.005 else left)


def _send(message: dict[str, Any], host: str, wfile: Any, lock: threading.Lock) -> None:
    specs = [RequestSpec(**s) for s in message["specs"]]
    checks: list[dict[str, Any]] = []
    if message.get("start_at"):
        _wait_until(float(message["start_at"]))
    started = now()
    run_load(message["base_url"], message["model"], specs, mode="closed", concurrency=int(message["concurrency"]),
             processes=int(message.get("processes") or 1), timeout_s=float(message["timeout_s"]),
             stage_deadline_s=message.get("stage_deadline_s"), api_key=os.environ.get("VLLM_API_KEY") or None,
             run_id=f"{host}-{message.get('run_id', 'x')}", selfcheck=checks,
             on_record=lambda rec: _reply(wfile, lock, {"op": "record", "record": rec.to_dict()}))
    _reply(wfile, lock, {"op": "done", "started": started, "finished": now(),
                         "selfcheck": [{**c, "host": host} for c in checks]})


def _session(conn: socket.socket, host: str, token: str) -> bool:
    """One controller connection; False when it said bye (the agent exits)."""
    rfile, wfile, lock = conn.makefile("rb"), conn.makefile("wb"), threading.Lock()
    hello = json.loads(rfile.readline() or b"{}")
    if hello.get("op") != "hello" or not hmac.compare_digest(str(hello.get("token", "")), token):
        _reply(wfile, lock, {"op": "error", "error": "wrong token: this agent serves another run"})
        return True
    _reply(wfile, lock, {"op": "hello", "host": host, "time": now(), "pid": os.getpid()})
    for line in rfile:
        message = json.loads(line)
        op = message.get("op")
        if op == "clock":
            _reply(wfile, lock, {"op": "clock", "time": now()})
        elif op == "send":
            try:
                _send(message, host, wfile, lock)
            except Exception as exc:  # noqa: BLE001 - said to the controller, which names this host
                _reply(wfile, lock, {"op": "error", "error": f"{type(exc).__name__}: {exc}"})
        elif op == "bye":
            _reply(wfile, lock, {"op": "bye"})
            return False
        else:
            _reply(wfile, lock, {"op": "error", "error": f"unknown op {op!r}"})
    return True


def serve(listen: str, port: int, host: str, token: str, *, idle_timeout_s: float = 1800.0,
          pid_file: Path | None = None) -> None:
    """Serve controller connections until a ``bye``, or ``idle_timeout_s`` without one (a run that died)."""
    if not token:
        raise ValueError(f"no token: set {TOKEN_ENV} in the agent's environment (playbooks/probes.yml does)")
    with socket.create_server((listen, port), reuse_port=False) as server:
        server.settimeout(idle_timeout_s)
        if pid_file:
            pid_file.write_text(f"{os.getpid()}\n")
        try:
            while True:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    return
                with conn:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    try:
                        if not _session(conn, host, token):
                            return
                    except (OSError, ValueError):  # the controller went away mid-session: wait for the next
                        continue
        finally:
            if pid_file:
                with contextlib.suppress(OSError):
                    pid_file.unlink()


# --- the pool, in the controller's load probe ------------------------------------------------------

@dataclass
class Agent:
    host: str
    address: str
    port: int = DEFAULT_PORT
    offset_s: float = 0.0          # the agent's clock minus the controller's
    rtt_s: float = 0.0
    sock: socket.socket | None = field(default=None, repr=False)
    rfile: Any = field(default=None, repr=False)

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.sock is not None
        self.sock.sendall((json.dumps(message, separators=(",", ":")) + "\n").encode())
        return self.read()

    def read(self) -> dict[str, Any]:
        line = self.rfile.readline() if self.rfile else b""
        if not line:
            raise LoadgenDown(f"loadgen host {self.host} ({self.address}:{self.port}) closed the connection")
        return json.loads(line)


def split(specs: Sequence[RequestSpec], concurrency: int, hosts: int) -> list[tuple[list[RequestSpec], int]]:
    """Round-robin shares of a step's requests, and of its concurrency (at least 1 where a host has work)."""
    out = []
    for i in range(hosts):
        share = list(specs[i::hosts])
        conc = concurrency // hosts + (1 if i < concurrency % hosts else 0)
        out.append((share, max(1, min(conc, len(share))) if share else 0))
    return out


class AgentPool:
    """The controller's connections to every loadgen host's agent, for the load probe's sends."""

    def __init__(self, endpoints: Sequence[dict[str, Any]], expected: Sequence[str], token: str,
                 connect_timeout_s: float = 10.0) -> None:
        by_host = {str(e["host"]): e for e in endpoints if e.get("address")}
        absent = [h for h in expected if h not in by_host]
        if absent:
            raise LoadgenDown(f"no load agent on loadgen host(s) {', '.join(absent)} (unreachable, or the agent did "
                              "not start: see the play 'Start the load agents on the loadgen hosts')")
        self.agents = [Agent(h, str(by_host[h]["address"]), int(by_host[h].get("port") or DEFAULT_PORT))
                       for h in expected]
        self.token, self.connect_timeout_s = token, connect_timeout_s

    def connect(self) -> list[dict[str, Any]]:
        """Connect, authenticate and measure each agent's clock offset (three round trips, least RTT)."""
        for agent in self.agents:
            try:
                agent.sock = socket.create_connection((agent.address, agent.port), timeout=self.connect_timeout_s)
            except OSError as exc:
                raise LoadgenDown(f"loadgen host {agent.host}: its load agent at {agent.address}:{agent.port} does "
                                  f"not answer: {exc}") from exc
            agent.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            agent.sock.settimeout(None)
            agent.rfile = agent.sock.makefile("rb")
            hello = agent.call({"op": "hello", "token": self.token})
            if hello.get("op") != "hello":
                raise LoadgenDown(f"loadgen host {agent.host}: {hello.get('error', hello)}")
            best = None
            for _ in range(3):
                t0 = now()
                remote = float(agent.call({"op": "clock"})["time"])
                t1 = now()
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, remote - (t0 + t1) / 2)
            agent.rtt_s, agent.offset_s = best if best else (0.0, 0.0)
        return [{"host": a.host, "address": a.address, "port": a.port, "clock_offset_s": round(a.offset_s, 6),
                 "rtt_s": round(a.rtt_s, 6)} for a in self.agents]

    def send(self, base_url: str, model: str, specs: Sequence[RequestSpec], concurrency: int, *, stage: str,
             timeout_s: float, stage_deadline_s: float | None, processes: int = 1,
             on_record: Callable[[Record], None] | None = None) -> tuple[list[Record], dict[str, list[dict]]]:
        """One step from every host at once: the merged records (each keeps its host in ``worker``, times
        on the controller's clock) and each host's self-check."""
        shares = split(specs, concurrency, len(self.agents))
        start = now() + max(0.05, 10 * max(a.rtt_s for a in self.agents))
        records: list[Record] = []
        checks: dict[str, list[dict[str, Any]]] = {}
        failures: list[str] = []
        lock = threading.Lock()

        # A host that stops answering (frozen, partitioned) is a drop-out once its stage could not still be running.
        silence_s = (stage_deadline_s or 600.0) + timeout_s + 60.0

        def one(agent: Agent, share: list[RequestSpec], conc: int) -> None:
            try:
                agent.sock.settimeout(silence_s)  # type: ignore[union-attr]
                agent.sock.sendall((json.dumps({  # type: ignore[union-attr]
                    "op": "send", "base_url": base_url, "model": model, "specs": [asdict(s) for s in share],
                    "concurrency": conc, "processes": processes, "timeout_s": timeout_s,
                    "stage_deadline_s": stage_deadline_s, "start_at": start + agent.offset_s, "run_id": stage},
                    separators=(",", ":")) + "\n").encode())
                while True:
                    message = agent.read()
                    if message.get("op") == "record":
                        rec = _on_controller_clock(Record.from_dict(message["record"]), agent)
                        with lock:
                            records.append(rec)
                            if on_record is not None:
                                on_record(rec)
                    elif message.get("op") == "done":
                        checks[agent.host] = list(message.get("selfcheck") or [])
                        return
                    else:
                        raise LoadgenDown(f"loadgen host {agent.host}: {message.get('error', message)}")
            except (OSError, ValueError, LoadgenDown) as exc:
                with lock:
                    failures.append(str(exc) if isinstance(exc, LoadgenDown) else
                                    f"loadgen host {agent.host} dropped out: {type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=one, args=(a, s, c), daemon=True)
                   for a, (s, c) in zip(self.agents, shares, strict=True) if s]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise LoadgenDown("; ".join(failures) + f" (stage {stage}: the merged load would be smaller than planned)")
        return records, checks

    def close(self) -> None:
        """Leave the agents running (a later call of the run connects again; the run's end stops them)."""
        for agent in self.agents:
            if agent.sock is not None:
                with contextlib.suppress(OSError):
                    agent.sock.close()
                agent.sock = None


def _on_controller_clock(rec: Record, agent: Agent) -> Record:
    """The record's times moved from the agent's clock to the controller's; its host named in ``worker``."""
    for name in ("scheduled", "sent", "first_chunk", "first_token", "end"):
        value = getattr(rec, name)
        if value is not None:
            setattr(rec, name, value - agent.offset_s)
    rec.worker = f"{agent.host}/{rec.worker}"
    return rec
