"""The quality probe's parity pass: the seeded prompt set sent greedy to the reference path twice and to the path
under test once, every answer written as evidence as it arrives (probes/quality/*.jsonl).

1. `reference`: each prompt alone, one at a time -- the answers compared against;
2. `floor`: the reference again, `quality.concurrency` prompts in flight -- how far the reference moves from its
   own answers when batched (its noise floor; 1.0 on a batch-invariant serving);
3. `test`: the path under test, the same way; every second prompt streamed, so both wire shapes are compared.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...core.evidence import EvidenceStore
from ...runtime.client import Exchange, OpenAIClient
from .parity import Answer, answer_of, answer_of_stream
from .parity_prompts import Prompt

PASSES = ("reference", "floor", "test")


@dataclass
class Sent:
    """One prompt's answer on one pass: the Answer, or why there is none."""

    prompt: str
    answer: Answer | None
    error: str | None = None
    streamed: bool = False
    prompt_tokens: int | None = None   # the server's usage: how long the prompt was (the long one: the contract's)


@dataclass
class PassResult:
    name: str
    url: str
    sent: list[Sent] = field(default_factory=list)
    evidence: str = ""

    def by_prompt(self) -> dict[str, Sent]:
        return {s.prompt: s for s in self.sent}


def _one(client: OpenAIClient, prompt: Prompt, body: dict[str, Any], stream: bool) -> Sent:
    ex: Exchange = client.chat_stream(body) if stream else client.chat(body)
    if not ex.ok:
        why = ex.error or f"HTTP {ex.status}: {str(ex.raw)[:300]}"
        return Sent(prompt.name, None, why, stream)
    answer = answer_of_stream(ex.chunks) if stream else answer_of(ex.body)
    usage = next((c.get("usage") for c in reversed(ex.chunks) if c.get("usage")), None) if stream else (
        (ex.body or {}).get("usage") if isinstance(ex.body, dict) else None)
    tokens = (usage or {}).get("prompt_tokens")
    return Sent(prompt.name, answer, None if answer else "the answer holds no choice", stream,
                tokens if isinstance(tokens, int) else None)


def send_pass(name: str, client: OpenAIClient, prompts: list[Prompt], *, model: str, max_tokens: int, seed: int,
              concurrency: int, store: EvidenceStore, stream_every_second: bool = False) -> PassResult:
    """Send every prompt (`concurrency` at a time); append each answer to probes/quality/<name>.jsonl as it
    arrives: the prompt, whether streamed, the tokens, their hash, the text, or the error."""
    result = PassResult(name, client.base_url)

    def record(sent: Sent) -> None:
        row: dict[str, Any] = {"pass": name, "prompt": sent.prompt, "streamed": sent.streamed, "error": sent.error,
                               "prompt_tokens": sent.prompt_tokens}
        if sent.answer is not None:
            row.update({"unit": sent.answer.unit, "tokens": list(sent.answer.tokens), "sha256_16": sent.answer.digest,
                        "text": "".join(sent.answer.texts), "finish_reason": sent.answer.finish_reason})
        result.evidence = store.append_jsonl(f"{name}.jsonl", row)
        result.sent.append(sent)

    jobs: list[tuple[Prompt, Callable[[], Sent]]] = []
    for i, prompt in enumerate(prompts):
        body = prompt.body(model, max_tokens, seed)
        stream = stream_every_second and i % 2 == 1
        jobs.append((prompt, lambda p=prompt, b=body, s=stream: _one(client, p, b, s)))
    if concurrency <= 1:
        for _, job in jobs:
            record(job())
    else:
        with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(job) for _, job in jobs]
            for future in cf.as_completed(futures):
                record(future.result())
    order = {p.name: i for i, p in enumerate(prompts)}
    result.sent.sort(key=lambda s: order.get(s.prompt, len(order)))
    return result
