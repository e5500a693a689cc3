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
a loop busy reading hundreds of streams does not delay them (:class:`~.sender._Sender`).

Self-check: every run measures its own client (:class:`~.meter._Meter`): CPU of the worker process,
event-loop lag, time spent processing reads per chunk; with the send lag of the records this is
what ``rules/loadgen.py`` judges, so a saturated client is never mistaken for a slow server.

Token counts come from the final ``usage`` chunk (``stream_options.include_usage``), never from
chunk counts. The API key goes only into the Authorization header; error text is redacted.

Submodules (each imports only its siblings, never this package):

- ``clock``: the monotonic epoch clock (:func:`now`) and the offset worker processes adopt.
- ``records``: :class:`RequestSpec`, :class:`Record`, :class:`RecordSink`, :func:`read_records`.
- ``request``: the chat URL, the streaming body and the prebuilt HTTP/1.1 request bytes.
- ``stream``: the SSE parser of one streamed answer (``_Stream``).
- ``exchange``: one request/response's HTTP framing, timeout and end (``_Exchange``).
- ``client``: the keep-alive connections to one server (``_Conn``, ``_Client``).
- ``meter``: the per-process self-check (``_Meter``, ``_LoopLag``).
- ``sender``: the open loop's sender thread (``_Sender``).
- ``loops``: the closed and open loops in one process.
- ``multiprocess``: :func:`run_load` across worker processes (spawn target ``_child``).
"""

from __future__ import annotations

from vllm_acceptance.load.stats import arrival_offsets, summarize

from .clock import now
from .loops import (
    SelfCheck,
    run_closed_loop,
    run_closed_loop_sync,
    run_open_loop,
    run_open_loop_sync,
)
from .multiprocess import run_load
from .records import Record, RecordSink, RequestSpec, read_records
from .request import build_body, chat_url

__all__ = [
    "RequestSpec", "Record", "run_closed_loop", "run_open_loop", "run_closed_loop_sync",
    "run_open_loop_sync", "run_load", "summarize", "arrival_offsets", "chat_url", "now",
    "RecordSink", "read_records", "SelfCheck", "build_body",
]
