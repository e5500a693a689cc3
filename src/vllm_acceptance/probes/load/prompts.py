"""PromptBuilder: prompts of an exact token count, counted by the server's own /tokenize."""

from __future__ import annotations

from typing import Any

import httpx

from ...load.engine import RequestSpec
from ...load.prompts import words_spec
from ...runtime.metrics import server_root


class PromptBuilder:
    """Prompts of an exact token count, counted by the server itself (POST /tokenize with the chat
    messages, so the chat template's tokens count too). Where the server has no /tokenize the count is
    estimated and the workload says so."""

    TOLERANCE = 2

    def __init__(self, base_url: str, model: str, api_key: str | None = None) -> None:
        self.url = server_root(base_url) + "/tokenize"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.available: bool | None = None
        self.max_model_len: int | None = None
        self.words_per_token = 1 / 1.3
        self.targets: dict[str, dict[str, Any]] = {}   # tag -> the shape its requests were built for
        self.known: dict[tuple[int, int, bool], int] = {}  # shape -> words that gave it
        self.calls = 0
        self.client = httpx.Client(timeout=30, headers=self.headers)  # keep-alive: 4x fewer ms per count

    def count(self, messages: list[dict[str, Any]]) -> int | None:
        if self.available is False:
            return None
        try:
            self.calls += 1
            response = self.client.post(self.url, json={"model": self.model, "messages": messages})
            data = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            data = None
        if not isinstance(data, dict) or "count" not in data:
            self.available = False
            return None
        self.available = True
        self.max_model_len = data.get("max_model_len") or self.max_model_len
        return int(data["count"])

    def spec(self, tokens: int, output: int, seed: int, tag: str, prefix: str = "",
             at_least: bool = False) -> tuple[RequestSpec, int | None]:
        """(request, its counted prompt tokens): within ``TOLERANCE`` tokens under ``tokens`` (or, with
        ``at_least``, at or over it). The word count found for a shape seeds the next request's search."""
        self.targets.setdefault(tag, {"prompt_tokens": tokens, "max_tokens": output})
        key = (tokens, len(prefix), at_least)
        words = self.known.get(key) or max(1, round(tokens * self.words_per_token))
        best: tuple[RequestSpec, int, int] | None = None
        for _ in range(10):
            # One filler text per length (the unique system line keeps requests apart): the count found
            # for a shape holds for the next seed within a token or two, so most requests cost one count.
            req = words_spec(words, output, seed, tag, prefix, text_seed=0)
            n = self.count(req.messages)
            if n is None:
                return req, None
            fits = n >= tokens if at_least else n <= tokens
            if fits and (best is None or abs(n - tokens) < abs(best[1] - tokens)):
                best = (req, n, words)
            if best is not None and abs(best[1] - tokens) <= self.TOLERANCE:
                break
            self.words_per_token = max(0.2, min(2.0, words / max(1, n)))
            words = max(1, words + (int((tokens - n) * self.words_per_token) or (1 if n < tokens else -1)))
        if best is None:  # the fixed part alone (template, system line) is over the target
            req = words_spec(1, output, seed, tag, prefix, text_seed=0)
            return req, self.count(req.messages)
        self.known[key] = best[2]
        return best[0], best[1]
