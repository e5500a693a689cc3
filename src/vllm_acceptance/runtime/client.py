"""A small OpenAI-compatible client for probes: raw bodies kept, streaming assembled by hand.

Probes need the raw HTTP exchange as evidence and must see exactly what the server sent, so
this speaks HTTP directly (httpx) instead of going through a client library that may reshape it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


class ServerUnreachable(Exception):
    """The base URL does not answer: a set-up error (exit 2), not a finding about the model."""


@dataclass
class Exchange:
    """One request and what came back, ready to be saved as evidence."""

    request: dict[str, Any]
    status: int = 0
    body: Any = None
    raw: str = ""
    error: str | None = None
    sent: float = 0.0
    first_byte: float | None = None
    end: float = 0.0
    chunks: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    timeout_s: float | None = None
    timed_out: bool = False
    headers: dict[str, str] = field(default_factory=dict)   # request headers the probe set (never credentials)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_byte is None else self.first_byte - self.sent

    def evidence(self) -> dict[str, Any]:
        return {"request": self.request, "url": self.url, **({"request_headers": self.headers} if self.headers else {}),
                "status": self.status, "response": self.body,
                "raw_stream": self.raw if self.chunks else None, "error": self.error,
                "timed_out": self.timed_out, "timeout_s": self.timeout_s,
                "timing": {"sent": self.sent, "first_token": self.first_byte, "end": self.end}}

    def fail(self, exc: httpx.HTTPError) -> None:
        """Record a transport error; a timeout says so, with the limit, and keeps what arrived."""
        if isinstance(exc, httpx.TimeoutException):
            self.timed_out = True
            got = f"after {len(self.chunks)} stream chunks" if self.chunks else "without an answer"
            self.error = f"timed out {got} (request timeout {self.timeout_s:g} s; {type(exc).__name__}: {exc})"
        else:
            self.error = f"{type(exc).__name__}: {exc}"


class OpenAIClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self.http.close()

    def _url(self, path: str) -> str:
        return f"{self.base_url}/{path.lstrip('/')}"

    def root_url(self, path: str) -> str:
        root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        return f"{root}/{path.lstrip('/')}"

    def models(self) -> dict[str, Any]:
        try:
            response = self.http.get(self._url("models"))
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"{self._url('models')} does not answer ({exc}); "
                                    "check --base-url and that the server is up") from exc
        if response.status_code != 200:
            raise ServerUnreachable(f"{self._url('models')} answered HTTP {response.status_code}: "
                                    f"{response.text[:200]}")
        return response.json()

    def tokenize(self, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
                 ) -> list[int] | None:
        """Token ids of the rendered chat prompt via the server's /tokenize; None if unsupported."""
        body: dict[str, Any] = {"model": model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        try:
            response = self.http.post(self.root_url("tokenize"), json=body)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        data = response.json()
        return data.get("tokens")

    def chat(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Exchange:
        ex = Exchange(request=body, sent=time.time(), url=self._url("chat/completions"), timeout_s=self.timeout_s,
                      headers=dict(headers or {}))
        try:
            with self.http.stream("POST", self._url("chat/completions"), json=body, headers=headers) as response:
                ex.status = response.status_code
                parts: list[bytes] = []
                for piece in response.iter_bytes():
                    parts.append(piece)
                    if time.time() - ex.sent > 2 * self.timeout_s:
                        # A body that drips forever never trips the per-read timeout: bound it too.
                        ex.raw = b"".join(parts).decode("utf-8", errors="replace")
                        raise httpx.ReadTimeout("answer still arriving after twice the request timeout")
                ex.first_byte = time.time()
                ex.raw = b"".join(parts).decode(response.encoding or "utf-8", errors="replace")
            try:
                ex.body = json.loads(ex.raw)
            except ValueError:
                ex.body = None
                ex.error = "response is not JSON"
        except httpx.HTTPError as exc:
            ex.fail(exc)
        ex.end = time.time()
        return ex

    def chat_stream(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Exchange:
        """Stream a chat completion; `body` is the assembled message (tool calls joined from deltas). `headers`
        are extra request headers (e.g. vLLM's X-data-parallel-rank), kept in the evidence."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        ex = Exchange(request=body, sent=time.time(), url=self._url("chat/completions"), timeout_s=self.timeout_s,
                      headers=dict(headers or {}))
        raw_lines: list[str] = []
        try:
            with self.http.stream("POST", self._url("chat/completions"), json=body, headers=headers) as response:
                ex.status = response.status_code
                for line in response.iter_lines():
                    raw_lines.append(line)
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        ex.error = f"unparseable stream chunk: {payload[:200]}"
                        continue
                    if ex.first_byte is None and _has_output(chunk):
                        ex.first_byte = time.time()
                    ex.chunks.append(chunk)
                    if time.time() - ex.sent > 2 * self.timeout_s:
                        # A stream that drips forever never trips the per-read timeout: bound it too.
                        raise httpx.ReadTimeout("stream still open after twice the request timeout")
        except httpx.HTTPError as exc:
            ex.fail(exc)
        ex.end = time.time()
        ex.raw = "\n".join(raw_lines)
        if ex.status != 200 and ex.error is None:
            ex.error = f"HTTP {ex.status}: {ex.raw[:300]}"
        ex.body = assemble_stream(ex.chunks)
        return ex


def _has_output(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content") \
                or delta.get("reasoning"):
            return True
    return False


def assemble_stream(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Join streamed deltas into the shape of a non-streamed response (choice 0)."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    usage = None
    for chunk in chunks:
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            if delta.get("reasoning_content") or delta.get("reasoning"):
                reasoning.append(delta.get("reasoning_content") or delta.get("reasoning"))
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call.get("index", 0), {"id": None, "type": "function",
                                                               "function": {"name": "", "arguments": ""}})
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                if fn.get("name"):
                    slot["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["function"]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None,
                               "tool_calls": [calls[i] for i in sorted(calls)]}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
