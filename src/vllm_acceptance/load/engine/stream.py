"""SSE parsing of one streamed chat completion (:class:`_Stream`): de-chunked reads in, token times,
usage and ``finish_reason`` out.

JSON is parsed only where it matters: every event until the first token, any event that names
``usage`` or ``error``, and the last token event (for its ``finish_reason``). Token events in
between are only time-stamped: a raw substring test cannot miss a real ``"usage"``/``"error"`` key
because JSON escapes every quote inside a string, so a false positive only costs a full parse.
"""

from __future__ import annotations

import json

from .records import Record


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
