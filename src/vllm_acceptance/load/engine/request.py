"""The request side, built once before a run: the chat URL, the streaming body, and the whole
HTTP/1.1 request as bytes (the sending path only writes them)."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .records import RequestSpec


def chat_url(base_url: str) -> str:
    """``http://h:p`` or ``http://h:p/v1`` -> the chat completions URL."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if not base.endswith("/v1"):
        base += "/v1"
    return base + "/chat/completions"


def build_body(model: str, spec: RequestSpec) -> bytes:
    """Request body: streaming with usage forced on, `extra` merged over the defaults."""
    body: dict[str, Any] = {"model": model, "messages": spec.messages, "max_tokens": spec.max_tokens}
    body.update(spec.extra)
    body["stream"] = True
    body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str
    host_header: str
    tls: bool


def _target(url: str) -> _Target:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base URL {url!r}: give http://HOST:PORT[/v1] or https://HOST:PORT[/v1]")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return _Target(host=parts.hostname, port=port, path=path, host_header=parts.netloc.rsplit("@", 1)[-1],
                   tls=tls)


def _request_bytes(target: _Target, api_key: str | None, body: bytes) -> bytes:
    """The whole request, built once before the run: the sending path only writes bytes."""
    head = (f"POST {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\nAccept-Encoding: identity\r\n"
            "Connection: keep-alive\r\nUser-Agent: vllm-acceptance-loadgen\r\n"
            f"Content-Length: {len(body)}\r\n")
    if api_key:
        head += f"Authorization: Bearer {api_key}\r\n"
    return head.encode("latin-1") + b"\r\n" + body
