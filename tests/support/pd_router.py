"""A minimal P/D entry point for the lab tests (tests/integration/test_pd_path_lab.py): each chat completion goes to
the prefill with max_tokens 1 (the prefill writes the prompt's KV through the connector), then, unchanged, to the
decode, whose answer is returned -- the two steps of vLLM's own disaggregated-serving proxy examples. A prefill that
does not answer HTTP 200 makes the request fail with HTTP 502 and an error body (it is never sent to the decode
alone). Not the product's router (pd-deploy builds that); the lab's stand-in for it.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class PdRouter:
    def __init__(self, prefill: str, decode: str, port: int, timeout_s: float = 300.0) -> None:
        self.prefill, self.decode, self.timeout_s = prefill.rstrip("/"), decode.rstrip("/"), timeout_s
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                return

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._reply(200 if self.path == "/health" else 404, b"{}")

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                status, answer = router.route(self.path, body)
                self._reply(status, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        suffix = path[3:] if path.startswith("/v1") else path
        first = {**body, "max_tokens": 1, "stream": False}
        first.pop("max_completion_tokens", None)
        try:
            pre = httpx.post(self.prefill + suffix, json=first, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            return 502, json.dumps({"error": {"message": f"prefill unavailable: {exc}", "code": 502}}).encode()
        if pre.status_code != 200:
            return 502, json.dumps({"error": {"message": f"prefill answered HTTP {pre.status_code}",
                                              "code": 502}}).encode()
        try:
            dec = httpx.post(self.decode + suffix, json=body, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            return 502, json.dumps({"error": {"message": f"decode unavailable: {exc}", "code": 502}}).encode()
        return dec.status_code, dec.content

    def __enter__(self) -> PdRouter:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
