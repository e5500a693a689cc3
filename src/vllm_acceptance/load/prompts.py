"""The load's prompts: deterministic agent-like filler and a request of about N prompt tokens, each with a
unique first line so that no two requests share a cache block (the load probe, probes/load/, counts
tokens exactly with /tokenize; the distributed workers, load/worker.py, estimate them)."""

from __future__ import annotations

import random

from .engine.records import RequestSpec

WORDS = ("node", "driver", "fabric", "gpu", "cache", "ticket", "health", "service", "gateway", "engine",
         "memory", "queue", "tensor", "parallel", "prefill", "decode", "token", "status", "window", "owner")


def filler(n_words: int, seed: int) -> str:
    """Deterministic agent-like filler text of n_words words."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def spec(tokens: int, output: int, seed: int, tag: str, prefix: str = "") -> RequestSpec:
    """A request of about ``tokens`` prompt tokens, estimated at 1.3 tokens a word (the distributed load
    workers' shape; the load probe counts with /tokenize instead, see PromptBuilder)."""
    return words_spec(max(1, int(tokens / 1.3)), output, seed, tag, prefix)


def words_spec(words: int, output: int, seed: int, tag: str, prefix: str = "",
               text_seed: int | None = None) -> RequestSpec:
    """The unique system line comes first, so two requests share no cache block whatever the filler."""
    return RequestSpec(messages=[{"role": "system", "content": prefix + f"Request {tag}-{seed}."},
                                 {"role": "user", "content": filler(words, seed if text_seed is None else text_seed)}],
                       max_tokens=output, tag=tag, extra={"temperature": 0.0, "ignore_eos": True})
