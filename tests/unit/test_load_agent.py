"""Load agents (load/agent.py): the steps of the load probe split over every loadgen host's agent, the
records merged with their host, each host's self-check kept; a host that is absent, refuses the run's
token or does not answer stops the send naming it. The agents run in threads here, against a small
streaming server; the namespace-host version against the real lab vLLM is in
tests/integration/test_loadgen_distributed.py."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest
from test_loadgen import StreamServer, specs

from vllm_acceptance.load.agent import AgentPool, LoadgenDown, serve, split
from vllm_acceptance.load.engine import now


@pytest.fixture(scope="module")
def stream() -> Iterator[StreamServer]:
    s = StreamServer()
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def agents() -> list[dict]:
    endpoints = []
    for host in ("lg-a", "lg-b"):
        port = _free_port()
        threading.Thread(target=serve, args=("127.0.0.1", port, host, "run-token"),
                         kwargs={"idle_timeout_s": 60}, daemon=True).start()
        endpoints.append({"host": host, "address": "127.0.0.1", "port": port})
    for e in endpoints:   # listening before the tests connect
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", e["port"]), timeout=1).close()
                break
            except OSError:
                threading.Event().wait(0.05)
    return endpoints


def test_a_step_is_split_over_the_hosts_and_merged_with_each_hosts_self_check(stream: StreamServer,
                                                                               agents: list[dict]) -> None:
    pool = AgentPool(agents, ["lg-a", "lg-b"], "run-token")
    try:
        clocks = pool.connect()
        assert [c["host"] for c in clocks] == ["lg-a", "lg-b"] and all(abs(c["clock_offset_s"]) < 0.05 for c in clocks)
        seen = []
        records, checks = pool.send(stream.url("ok"), "m", specs(7), 3, stage="ramp_c3", timeout_s=10,
                                    stage_deadline_s=60, on_record=seen.append)
    finally:
        pool.close()
    assert len(records) == 7 and len(seen) == 7 and all(r.status == "ok" for r in records)
    hosts = sorted(r.worker.split("/", 1)[0] for r in records)
    assert hosts == ["lg-a"] * 4 + ["lg-b"] * 3                     # round-robin shares: 4 and 3
    assert sorted(checks) == ["lg-a", "lg-b"]
    assert all(c[0]["host"] == h and c[0]["requests"] == (4 if h == "lg-a" else 3) for h, c in checks.items())
    assert all(r.sent is not None and r.sent >= r.scheduled - 0.05 for r in records)   # on the controller's clock


def test_an_agent_that_serves_another_run_is_named(agents: list[dict]) -> None:
    with pytest.raises(LoadgenDown, match="lg-a: wrong token"):
        AgentPool(agents, ["lg-a"], "another-run").connect()


def test_a_loadgen_host_without_an_agent_is_named_never_left_out(agents: list[dict]) -> None:
    with pytest.raises(LoadgenDown, match="no load agent on loadgen host"):
        AgentPool(agents, ["lg-a", "lg-b", "lg-c"], "run-token")
    dead = [{"host": "lg-d", "address": "127.0.0.1", "port": _free_port()}]
    with pytest.raises(LoadgenDown, match="lg-d: its load agent at 127.0.0.1:.* does not answer"):
        AgentPool(dead, ["lg-d"], "run-token").connect()


def test_shares_cover_every_request_and_the_concurrency() -> None:
    shares = split(specs(5), 4, 3)
    assert [len(s) for s, _ in shares] == [2, 2, 1] and [c for _, c in shares] == [2, 1, 1]
    assert split(specs(1), 4, 2)[1] == ([], 0)       # a host with no request sends nothing


def test_a_host_that_drops_out_mid_step_is_named_never_a_smaller_load(stream: StreamServer, agents: list[dict]) -> None:
    """A fake agent that greets, tells the time, then closes the connection when given its share."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def flaky() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as rfile:
            for line in rfile:
                op = json.loads(line)["op"]
                if op == "hello":
                    conn.sendall(b'{"op": "hello", "host": "lg-x"}\n')
                elif op == "clock":
                    conn.sendall(json.dumps({"op": "clock", "time": now()}).encode() + b"\n")
                else:
                    return   # the share arrives: the host goes away

    threading.Thread(target=flaky, daemon=True).start()
    pool = AgentPool([*agents, {"host": "lg-x", "address": "127.0.0.1", "port": port}], ["lg-a", "lg-x"], "run-token")
    try:
        pool.connect()
        with pytest.raises(LoadgenDown, match=r"lg-x .* closed the connection .*stage soak"):
            pool.send(stream.url("ok"), "m", specs(4), 2, stage="soak", timeout_s=10, stage_deadline_s=60)
    finally:
        pool.close()
        listener.close()
