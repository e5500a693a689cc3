"""Load engine against a real local streaming server (aiohttp.web on 127.0.0.1, in a thread)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import pytest
from aiohttp import web

from vllm_acceptance.load import engine as loadgen
from vllm_acceptance.load.engine import Record, RequestSpec, chat_url, run_load
from vllm_acceptance.load.engine.stream import _Stream
from vllm_acceptance.load.stats import arrival_offsets, percentile, summarize

KEY = "sk-test-5ecret-value-123"
USAGE_EXTRA = 1000  # the server reports completion_tokens = max_tokens + this: never a chunk count


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class StreamServer:
    """Tiny OpenAI-like streaming server with misbehaving routes, run in its own thread."""

    def __init__(self) -> None:
        self.auth_seen: list[str | None] = []
        self.bodies: list[dict] = []
        self.stall_until = 0.0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/{mode}/v1/chat/completions", self.handle)
        runner = self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = runner.addresses[0][1]
        ready.set()
        self.loop.run_forever()

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        body = await request.json()
        self.auth_seen.append(request.headers.get("Authorization"))
        self.bodies.append(body)
        n = int(body["max_tokens"])
        if mode == "http500":
            # Echo the credentials back, as a badly written gateway might: they must not reach records.
            return web.Response(status=500, text=f"boom {request.headers.get('Authorization')}")
        if mode == "plainjson":  # a gateway that ignores stream=true
            return web.json_response({"object": "chat.completion", "choices": []})
        if mode == "slow":
            await asyncio.sleep(float(body.get("delay", 5)))
        if mode == "stall":
            if self.stall_until == 0.0:
                self.stall_until = time.time() + float(body.get("stall", 0.4))
            await asyncio.sleep(max(0.0, self.stall_until - time.time()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk({"role": "assistant", "content": ""}))
        for i in range(n):
            await resp.write(_chunk({"content": f" t{i}"}))
            if mode == "drop" and i == 2:
                assert request.transport is not None
                request.transport.close()  # connection dies mid-stream
                return resp
            if mode == "gappy" and i == 0:
                await asyncio.sleep(0.3)
        await resp.write(_chunk({}, finish="length"))
        if mode != "nousage":
            usage = {"prompt_tokens": 7, "completion_tokens": n + USAGE_EXTRA, "total_tokens": 0}
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        if mode != "nodone":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def server() -> Iterator[StreamServer]:
    s = StreamServer()
    yield s
    s.close()


def specs(n: int, max_tokens: int = 5, **extra: object) -> list[RequestSpec]:
    return [RequestSpec(messages=[{"role": "user", "content": f"q{i}"}], max_tokens=max_tokens,
                        tag=f"t{i}", extra=dict(extra)) for i in range(n)]


# --- network behaviour --------------------------------------------------------------------------


def test_record_fields_and_usage_based_tokens(server: StreamServer) -> None:
    got: list[Record] = []
    recs = loadgen.run_closed_loop_sync(server.url("ok"), "m", specs(3, 6, ignore_eos=True), 2,
                                        timeout_s=10, api_key=KEY, on_record=got.append)
    assert len(recs) == 3 and got == recs
    for r in recs:
        assert r.status == "ok" and r.http_status == 200 and r.error is None
        assert r.completion_tokens == 6 + USAGE_EXTRA  # from usage, not the 6 chunks it streamed
        assert r.prompt_tokens == 7
        assert r.chunks == 8  # role + 6 tokens + finish
        assert len(r.itl_s) == 6  # gaps after the first token chunk
        assert r.finish_reason == "length"
        assert r.scheduled <= r.sent <= r.first_chunk <= r.first_token <= r.end
        assert r.worker.startswith("p0.w")
    assert {r.tag for r in recs} == {"t0", "t1", "t2"}
    assert len({r.request_id for r in recs}) == 3
    body = server.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["model"] == "m"
    assert server.auth_seen[-1] == f"Bearer {KEY}"


def test_first_token_skips_role_only_chunk_and_itl_sees_gap(server: StreamServer) -> None:
    (r,) = loadgen.run_closed_loop_sync(server.url("gappy"), "m", specs(1, 4), 1, timeout_s=10)
    assert r.status == "ok"
    assert r.first_token is not None and r.first_chunk is not None
    # The 0.3 s stall comes after token 0: it must appear as an inter-chunk gap, not in TTFT.
    assert max(r.itl_s) >= 0.25
    assert r.end - r.first_token >= 0.25


def test_missing_usage_is_not_estimated(server: StreamServer) -> None:
    (r,) = loadgen.run_closed_loop_sync(server.url("nousage"), "m", specs(1, 4), 1, timeout_s=10)
    assert r.status == "ok" and r.completion_tokens is None and r.chunks == 6
    s = summarize([r])
    assert s["usage_missing"] == 1 and s["output_tokens"] == 0


def test_stream_without_done_is_an_error(server: StreamServer) -> None:
    (r,) = loadgen.run_closed_loop_sync(server.url("nodone"), "m", specs(1, 3), 1, timeout_s=10)
    assert r.status == "error" and "[DONE]" in (r.error or "")


def test_request_timeout(server: StreamServer) -> None:
    (r,) = loadgen.run_closed_loop_sync(server.url("slow"), "m", specs(1, 3, delay=3), 1, timeout_s=0.3)
    assert r.status == "timeout" and "timed out after 0.3 s" in (r.error or "")
    assert 0.25 <= r.end - r.sent < 2.0


def test_hung_requests_are_counted_and_named_in_the_load_step(server: StreamServer) -> None:
    from vllm_acceptance.probes.load import LoadProbeConfig, step_row

    def one(tag: str, delay: float) -> RequestSpec:
        return RequestSpec(messages=[{"role": "user", "content": tag}], max_tokens=3, tag=tag,
                           extra={"delay": delay})

    mixed = [one("fast-1", 0), one("slow-1", 3), one("fast-2", 0), one("slow-2", 3), one("fast-3", 0)]
    recs = loadgen.run_closed_loop_sync(server.url("slow"), "m", mixed, 2, timeout_s=0.5)
    row = step_row(2, recs, [], 0, LoadProbeConfig(model="m", request_timeout_s=0.5))
    slow = sorted(r.request_id for r in recs if r.tag.startswith("slow"))
    assert row["timeouts"] == 2 and sorted(row["timed_out"]) == slow
    assert row["errors"] == 2 and row["ok"] == 3 and row["meets_slo"] is False


def test_stage_deadline_bounds_the_stage(server: StreamServer) -> None:
    t0 = time.time()
    recs = loadgen.run_closed_loop_sync(server.url("slow"), "m", specs(5, 3, delay=3), 2,
                                        timeout_s=30, stage_deadline_s=0.4)
    assert time.time() - t0 < 2.5
    assert len(recs) == 2  # the two in flight; the other three were never started
    assert all(r.status == "timeout" and r.error == "stage deadline reached" for r in recs)


def test_connection_dropped_mid_stream_is_recorded(server: StreamServer) -> None:
    (r,) = loadgen.run_closed_loop_sync(server.url("drop"), "m", specs(1, 50), 1, timeout_s=10)
    assert r.status == "error"
    assert r.error and "mid-answer" in r.error  # a cut stream is named, not taken for a short answer
    assert r.first_token is not None and r.completion_tokens is None


def test_connection_refused_is_recorded() -> None:
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nobody listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (r,) = loadgen.run_closed_loop_sync(f"http://127.0.0.1:{port}", "m", specs(1), 1, timeout_s=5)
    assert r.status == "error" and r.http_status is None
    assert "Connect" in (r.error or "") or "refused" in (r.error or "")


def test_http_error_body_recorded_without_api_key(server: StreamServer) -> None:
    (r,) = loadgen.run_closed_loop_sync(server.url("http500"), "m", specs(1), 1, timeout_s=60, api_key=KEY)
    assert r.status == "error" and r.http_status == 500
    assert r.error and r.error.startswith("HTTP 500: boom")
    assert KEY not in json.dumps(r.to_dict())


def test_open_loop_latency_counts_from_schedule_when_server_stalls(server: StreamServer) -> None:
    server.stall_until = 0.0
    # 10 requests at 20/s over 0.45 s; the server answers nothing until 0.4 s after the first one.
    recs = loadgen.run_open_loop_sync(server.url("stall"), "m", specs(10, 2, stall=0.4), 20.0,
                                      timeout_s=10)
    assert len(recs) == 10 and all(r.status == "ok" for r in recs)
    recs.sort(key=lambda r: r.scheduled)
    first = recs[0].scheduled
    gaps = [b.scheduled - a.scheduled for a, b in zip(recs, recs[1:], strict=False)]
    assert all(abs(g - 0.05) < 1e-6 for g in gaps)  # the schedule itself is exact
    for r in recs:
        # Sent on time, not after earlier answers: well under the 0.4 s stall even on a loaded machine.
        assert r.sent - r.scheduled < 0.15
        assert r.e2e is not None and r.ttft is not None
        # e2e includes the whole stall as seen from this request's scheduled time
        assert r.e2e >= (first + 0.4) - r.scheduled - 0.02
    assert recs[0].e2e >= 0.38


def test_open_loop_counts_client_lag_against_latency(server: StreamServer) -> None:
    """A blocked event loop cannot hide: the sender thread still sends on schedule, the answers read
    late carry the block in their latency from the schedule, and the self-check names the loop lag."""
    blocked = []

    def slow_writer(rec: Record) -> None:
        if not blocked:
            blocked.append(rec)
            time.sleep(0.3)  # blocks the event loop: nothing is read for 0.3 s

    checks: list[dict] = []
    recs = loadgen.run_open_loop_sync(server.url("ok"), "m", specs(8, 2), 40.0, timeout_s=10,
                                      on_record=slow_writer, selfcheck=checks)
    assert len(recs) == 8 and all(r.status == "ok" for r in recs)
    block_end = blocked[0].end + 0.3
    during = [r for r in recs if blocked[0].end < r.scheduled < block_end - 0.05]
    assert during, "requests were scheduled while the loop was blocked"
    for r in during:  # read only after the block: their latency from the schedule includes it
        assert r.e2e is not None and r.e2e >= block_end - r.scheduled - 0.01
    (check,) = checks
    assert check["loop_lag_s"]["max"] >= 0.29 and check["sender"] == "thread"
    assert check["requests"] == 8 and check["chunks"] == sum(r.chunks for r in recs)


def test_open_loop_stage_deadline_skips_later_sends(server: StreamServer) -> None:
    recs = loadgen.run_open_loop_sync(server.url("ok"), "m", specs(40, 2), 20.0, timeout_s=10,
                                      stage_deadline_s=0.5)
    # 40 planned over 2 s; only those planned before 0.5 s are sent (0.0, 0.05, ... 0.45). One still in
    # flight at the deadline ends as a timeout ("stage deadline reached"), never as a later send.
    assert len(recs) == 10 and all(r.status in ("ok", "timeout") for r in recs)
    assert sum(r.status == "ok" for r in recs) >= 5


def test_on_record_failure_stops_the_run(server: StreamServer) -> None:
    def broken(rec: Record) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        loadgen.run_closed_loop_sync(server.url("ok"), "m", specs(6, 2), 2, timeout_s=10, on_record=broken)
    sent_before = len(server.bodies)
    with pytest.raises(OSError, match="disk full"):
        loadgen.run_open_loop_sync(server.url("ok"), "m", specs(40, 2), 20.0, timeout_s=10, on_record=broken)
    assert len(server.bodies) - sent_before < 40  # the schedule stopped after the failure


def test_poisson_open_loop_sends_all(server: StreamServer) -> None:
    recs = loadgen.run_open_loop_sync(server.url("ok"), "m", specs(20, 2), 200.0, "poisson", 3,
                                      timeout_s=10)
    assert len(recs) == 20 and all(r.status == "ok" for r in recs)
    offs = arrival_offsets(20, 200.0, "poisson", 3)
    t0 = min(r.scheduled for r in recs)
    assert sorted(r.scheduled - t0 for r in recs) == pytest.approx(offs, abs=1e-6)


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_run_load_multiprocess_merges_records(server: StreamServer, mode: str) -> None:
    got: list[Record] = []
    recs = run_load(server.url("ok"), "m", specs(12, 3), mode=mode, concurrency=4, rate=100.0,
                    processes=2, timeout_s=10, api_key=KEY, on_record=got.append, run_id="mp")
    assert len(recs) == 12 and len(got) == 12
    assert all(r.status == "ok" and r.completion_tokens == 3 + USAGE_EXTRA for r in recs)
    assert sorted(r.request_id for r in recs) == [f"mp-{i:06d}" for i in range(12)]
    assert {r.worker.split(".")[0] for r in recs} == {"p0", "p1"}
    if mode == "open":
        t0 = min(r.scheduled for r in recs)
        by_id = sorted(recs, key=lambda r: r.request_id)
        assert [r.scheduled - t0 for r in by_id] == pytest.approx([i / 100.0 for i in range(12)], abs=1e-6)


# --- SSE parsing (pure) ---------------------------------------------------------------------------


def _stream_bytes(n: int, sep: bytes = b"\n\n") -> bytes:
    events = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk({"content": f" {i}"}) for i in range(n)]
    events += [_chunk({"content": ""}, finish="stop"),
               b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":99}}\n\n',
               b": keep-alive\n\n", b"data: [DONE]\n\n"]
    return b"".join(e.replace(b"\n\n", sep) for e in events)


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n"])
def test_stream_parser_is_independent_of_read_boundaries(sep: bytes) -> None:
    data = _stream_bytes(4, sep)
    for cut in range(1, len(data)):
        rec = Record(request_id="x", tag="", worker="w", scheduled=0.0)
        st = _Stream(rec)
        st.feed(data[:cut], 1.0)
        st.feed(data[cut:], 2.0)
        st.finish()
        assert st.done, cut
        assert (rec.chunks, rec.completion_tokens, rec.prompt_tokens, rec.finish_reason) == (6, 99, 3, "stop")
        assert len(rec.itl_s) == 4 and rec.first_token in (1.0, 2.0)  # 3 tokens + finish after the first


def test_stream_parser_detects_error_event_after_tokens() -> None:
    rec = Record(request_id="x", tag="", worker="w", scheduled=0.0)
    st = _Stream(rec)
    st.feed(_chunk({"content": "a"}) + _chunk({"content": "b"}), 1.0)
    st.feed(b'data: {"error":{"message":"engine dead","code":500}}\n\ndata: [DONE]\n\n', 2.0)
    assert rec.error and "engine dead" in rec.error


def test_stream_parser_content_that_looks_like_usage_is_still_a_token() -> None:
    rec = Record(request_id="x", tag="", worker="w", scheduled=0.0)
    st = _Stream(rec)
    st.feed(_chunk({"content": "a"}) + _chunk({"content": 'say "usage" now'}), 1.0)
    assert rec.chunks == 2 and rec.completion_tokens is None and rec.error is None


def test_body_forces_streaming_with_usage() -> None:
    spec = RequestSpec(messages=[], max_tokens=3, extra={"stream": False, "stream_options": {"x": 1},
                                                         "temperature": 0})
    body = json.loads(loadgen.build_body("m", spec))
    assert body["stream"] is True and body["stream_options"] == {"x": 1, "include_usage": True}
    assert body["temperature"] == 0 and body["max_tokens"] == 3


@pytest.mark.parametrize(("base", "url"), [
    ("http://h:1", "http://h:1/v1/chat/completions"),
    ("http://h:1/", "http://h:1/v1/chat/completions"),
    ("http://h:1/v1", "http://h:1/v1/chat/completions"),
    ("http://h:1/gw/v1/chat/completions", "http://h:1/gw/v1/chat/completions"),
])
def test_chat_url(base: str, url: str) -> None:
    assert chat_url(base) == url


def test_gateway_ignoring_stream_is_an_error_with_the_body(server: StreamServer) -> None:
    (r,) = loadgen.run_closed_loop_sync(server.url("plainjson"), "m", specs(1), 1, timeout_s=5)
    assert r.status == "error" and r.http_status == 200
    assert r.error and "unparsed tail" in r.error and "chat.completion" in r.error


def test_record_sink_appends_jsonl_and_survives_torn_line(tmp_path, server: StreamServer) -> None:
    path = tmp_path / "records.jsonl"
    with loadgen.RecordSink(path) as sink:
        recs = loadgen.run_closed_loop_sync(server.url("ok"), "m", specs(3, 2), 2, timeout_s=10,
                                            api_key=KEY, on_record=sink)
        assert len(path.read_text().splitlines()) == 3  # written as they completed, before close
    with path.open("a") as f:
        f.write('{"request_id": "torn')
    back = loadgen.read_records(path)
    assert sorted(r.request_id for r in back) == sorted(r.request_id for r in recs)
    assert KEY not in path.read_text()
    assert summarize(back)["ok"] == 3


def test_record_roundtrip_rounds_gaps() -> None:
    r = Record(request_id="a", tag="t", worker="w", scheduled=1.0, itl_s=[0.123456789])
    d = json.loads(json.dumps(r.to_dict()))
    assert d["itl_s"] == [0.1234568]
    assert Record.from_dict({**d, "unknown_future_field": 1}).itl_s == [0.1234568]


# --- statistics (pure) ----------------------------------------------------------------------------


def test_percentile_linear_interpolation() -> None:
    vals = [1.0, 2.0, 3.0, 4.0]
    assert percentile(vals, 50) == 2.5
    assert percentile(vals, 0) == 1.0 and percentile(vals, 100) == 4.0
    assert percentile(list(range(101)), 99) == 99
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def _rec(i: int, status: str = "ok", **kw: object) -> dict:
    base = {"request_id": str(i), "tag": "", "worker": "w", "scheduled": 100.0 + i, "sent": 100.0 + i,
            "first_token": 100.5 + i, "end": 102.5 + i, "status": status, "completion_tokens": 21,
            "chunks": 22, "itl_s": [0.1, 0.1]}
    base.update(kw)
    return base


def test_summarize_counts_rates_and_latencies() -> None:
    recs = [_rec(i) for i in range(8)]
    recs.append(_rec(8, "error", first_token=None, completion_tokens=None))
    recs.append(_rec(9, "timeout", end=130.0, completion_tokens=None))
    s = summarize(recs)
    assert (s["count"], s["ok"], s["errors"], s["timeouts"]) == (10, 8, 1, 1)
    assert s["error_rate"] == pytest.approx(0.2)
    assert s["duration_s"] == pytest.approx(30.0)  # first scheduled (100) to last end (130)
    assert s["output_tokens"] == 8 * 21
    assert s["output_tokens_per_s"] == pytest.approx(8 * 21 / 30.0)
    assert s["requests_per_s"] == pytest.approx(8 / 30.0)
    assert s["ttft_s"]["p50"] == pytest.approx(0.5) and s["ttft_s"]["count"] == 8
    assert s["e2e_s"]["p99"] == pytest.approx(2.5)
    assert s["tpot_s"]["p50"] == pytest.approx(2.0 / 20)  # (end - first token) / (21 - 1)
    assert s["itl_s"]["count"] == 16


def test_summarize_latency_from_schedule_not_send() -> None:
    s = summarize([_rec(0, sent=100.3)])  # sent 0.3 s late: e2e still counts from 100.0
    assert s["e2e_s"]["p50"] == pytest.approx(2.5)
    assert s["send_lag_s"]["p50"] == pytest.approx(0.3)


def test_summarize_empty() -> None:
    s = summarize([])
    assert s["count"] == 0 and s["error_rate"] is None and s["ttft_s"]["p50"] is None


def test_arrival_offsets() -> None:
    assert arrival_offsets(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    p = arrival_offsets(4000, 100.0, "poisson", seed=7)
    assert p == arrival_offsets(4000, 100.0, "poisson", seed=7)
    assert p != arrival_offsets(4000, 100.0, "poisson", seed=8)
    assert p[-1] / 3999 == pytest.approx(0.01, rel=0.06)  # mean gap 1/rate
    with pytest.raises(ValueError):
        arrival_offsets(3, 0.0)
    with pytest.raises(ValueError):
        arrival_offsets(3, 1.0, "bursty")  # type: ignore[arg-type]
