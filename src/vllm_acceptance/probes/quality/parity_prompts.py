"""The quality probe's prompt set: fixed and seeded, so the path under test and the reference get the same bytes.

Four kinds (docs/acceptance.md "Output parity"): short questions; one long prompt up to the contract's context;
a multi-turn conversation with a tool result; a tool call. The multi-turn and tool-call prompts are the scenario
pack's own (scenarios/*.yml `tasks.required_tool`, `tool_result_ok`, `second_turn_user`, its system prompt and
tools), as the agent probe sends them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

_QUESTIONS = (
    "Explain in two sentences why a GPU kernel can return slightly different sums for the same inputs.",
    "List three things to check before rebooting a production inference node.",
    "What is the difference between throughput and latency for a language model server?",
    "Write a short haiku about a data center at night.",
    "Describe what a prefix cache stores and when it helps.",
    "Give a one-paragraph summary of how tensor parallelism splits a matrix multiplication.",
    "Name two causes of a service answering HTTP 503 and how to tell them apart.",
    "Translate 'the cluster is healthy' into French and German.",
    "Count from one to twelve in words, separated by commas.",
    "Why does greedy decoding always pick the same token for the same logits?",
    "Write a Python function that returns the median of a list of numbers.",
    "What does a KV cache hold during decoding, in one sentence?",
)
_WORDS = ("node", "queue", "request", "token", "cache", "latency", "throughput", "kernel", "batch", "memory",
          "driver", "network", "replica", "gateway", "prompt", "answer", "schedule", "tensor", "layer", "block",
          "server", "client", "trace", "metric", "alert", "window", "buffer", "stream", "shard", "record")
_TEMPLATE_TOKENS = 96   # room for the chat template and the question around the long prompt's filler


@dataclass(frozen=True)
class Prompt:
    """One prompt of the set: a name, its kind and the request fields it adds to the greedy body."""

    name: str
    kind: str   # short, long, multi_turn, tool_call
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)

    def body(self, model: str, max_tokens: int, seed: int) -> dict[str, Any]:
        """The greedy request: temperature 0, a fixed seed, a bounded max_tokens, token ids and logprobs back
        (return_token_ids: vLLM's extension; logprobs: any OpenAI server, the fallback of parity.answer_of)."""
        body: dict[str, Any] = {"model": model, "messages": self.messages, "temperature": 0, "top_p": 1,
                                "seed": seed, "max_tokens": max_tokens, "return_token_ids": True,
                                "logprobs": True, "top_logprobs": 0}
        if self.tools:
            body["tools"] = self.tools
            body["tool_choice"] = "auto"
        return body


def long_words(target_tokens: int, seed: int, words_per_token: float = 0.75) -> str:
    """Seeded filler of about `target_tokens` tokens (one common English word plus its space is about one token
    in a BPE vocabulary, a little more in a small one: at 0.75 words a token the set stays below the target;
    probe.py sizes it with the reference's /tokenize where it has one)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, int(target_tokens * words_per_token))))


def prompt_set(scenario: dict[str, Any], *, short: int, long_tokens: int, seed: int,
               words_per_token: float = 0.75) -> list[Prompt]:
    """The set, in order: `short` seeded questions, one long prompt (long_tokens > 0), the multi-turn and tool-call
    prompts of the scenario pack (when it has them)."""
    rng = random.Random(seed)
    questions = rng.sample(_QUESTIONS, k=min(short, len(_QUESTIONS)))
    questions += [rng.choice(_QUESTIONS) + f" (variant {i})" for i in range(short - len(questions))]
    out = [Prompt(f"short-{i + 1}", "short", [{"role": "user", "content": q}]) for i, q in enumerate(questions)]
    if long_tokens > 0:
        filler = long_words(max(1, long_tokens - _TEMPLATE_TOKENS), seed, words_per_token)
        out.append(Prompt("long-1", "long", [{"role": "user", "content": (
            "Here is a log of words. Read it, then say which word appears first and write one sentence about it.\n"
            + filler)}]))
    system = str(scenario.get("system_prompt") or "").strip()
    tools = list(scenario.get("tools") or [])
    task = (scenario.get("tasks") or {}).get("required_tool") or {}
    head = [{"role": "system", "content": system}] if system else []
    if task.get("user") and tools:
        out.append(Prompt("tool-call-1", "tool_call", [*head, {"role": "user", "content": task["user"]}], tools))
        call = task.get("call") or {}
        result = (scenario.get("tasks") or {}).get("tool_result_ok")
        second = (scenario.get("tasks") or {}).get("second_turn_user")
        if call.get("name") and result and second:
            out.append(Prompt("multi-turn-1", "multi_turn", [
                *head, {"role": "user", "content": task["user"]},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_quality_1", "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments") or {})}}]},
                {"role": "tool", "tool_call_id": "call_quality_1", "content": str(result)},
                {"role": "assistant", "content": "The status call answered."},
                {"role": "user", "content": str(second)}], tools))
    return out
