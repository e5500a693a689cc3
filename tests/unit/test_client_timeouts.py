"""A request that hangs past the client's timeout is named as such, bounded in time, and keeps what
arrived: a real HTTP server on a local port that answers nothing, or one chunk and then nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_acceptance.runtime.client import OpenAIClient

CHUNK = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]}\n\n'


class Stalling(BaseHTTPRequestHandler):
    release = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(CHUNK)  # a streamed answer starts; a plain client waits for the whole body
        self.wfile.flush()
        if self.path.startswith("/drip"):  # a chunk every 0.2 s, forever: no read ever times out
            while not self.release.wait(0.2):
                self.wfile.write(CHUNK)
                self.wfile.flush()
        self.release.wait(30)


@pytest.fixture
def stalling() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stalling)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    Stalling.release.set()
    server.shutdown()
    server.server_close()
    Stalling.release.clear()


def test_a_hung_plain_request_times_out_by_name(stalling: str) -> None:
    client = OpenAIClient(stalling, timeout_s=0.5)
    began = time.monotonic()
    ex = client.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert time.monotonic() - began < 10
    assert not ex.ok and ex.timed_out and "request timeout 0.5 s" in ex.error
    kept = ex.evidence()
    assert kept["url"] == stalling + "/chat/completions" and kept["timed_out"] and kept["timeout_s"] == 0.5
    assert kept["request"]["messages"][0]["content"] == "hi"


def test_a_stream_stalled_after_its_first_chunk_keeps_the_chunk(stalling: str) -> None:
    client = OpenAIClient(stalling, timeout_s=0.5)
    began = time.monotonic()
    ex = client.chat_stream({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert time.monotonic() - began < 10
    assert ex.timed_out and not ex.ok and "after 1 stream chunks" in ex.error
    assert ex.body["choices"][0]["message"]["content"] == "Hi"  # what arrived before the stall is kept
    assert ex.first_byte is not None


def test_a_stream_that_drips_forever_is_cut_after_twice_the_timeout(stalling: str) -> None:
    client = OpenAIClient(stalling.replace("/v1", "/drip/v1"), timeout_s=0.5)
    began = time.monotonic()
    ex = client.chat_stream({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    took = time.monotonic() - began
    assert 1.0 <= took < 10 and ex.timed_out and len(ex.chunks) >= 3
    assert "twice the request timeout" in ex.error


def test_an_unreachable_port_is_an_error_but_not_a_timeout() -> None:
    client = OpenAIClient("http://127.0.0.1:9/v1", timeout_s=0.5)
    ex = client.chat({"model": "m", "messages": []})
    assert not ex.ok and not ex.timed_out and ex.error


def test_a_plain_answer_that_drips_forever_is_cut_after_twice_the_timeout(stalling: str) -> None:
    client = OpenAIClient(stalling.replace("/v1", "/drip/v1"), timeout_s=0.5)
    began = time.monotonic()
    ex = client.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    took = time.monotonic() - began
    assert 1.0 <= took < 10 and ex.timed_out and not ex.ok
    assert "twice the request timeout" in ex.error and ex.raw.startswith("data: ")  # what arrived is kept
