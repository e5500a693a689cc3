"""The comparison of the quality probe (docs/checks.md quality.parity): two greedy answers to one prompt, token by
token, and the divergence measure of a prompt set against the reference's own noise floor.

An answer is read as a token sequence from what the server returned, best first: vLLM's `token_ids` (the
`return_token_ids` extension of chat completions, vllm/entrypoints/openai/chat_completion/protocol.py in vLLM 0.32:
`token_ids` on each choice, per chunk when streamed), else the tokens of `logprobs.content` (OpenAI's shape, any
server), else the text split into characters (a reference that returns neither: the first divergence is then a
character position, said so in `unit`).

Where the serving is batch-invariant the reference reproduces itself on every prompt (its floor is 1.0) and any
divergence of the path under test is a fault. Where it is not (most GPU kernels: the batch a request shares changes
the reduction order), the reference sent twice -- once alone, once among the others -- diverges on some prompts by
itself; the path under test may then be no worse than that floor by more than `margin`, on two measures: the share
of prompts identical, and the mean prefix agreement (first divergent position / tokens compared; 1.0 when
identical).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WINDOW = 6   # tokens of text shown on each side of a first divergence
_SPECIAL = re.compile(r"^(<\|[^|<>]{1,40}\|>|</?s>|<eos>)$")


@dataclass(frozen=True)
class Answer:
    """One answer as compared: its tokens (ids, or token texts, or characters), their texts, and the unit."""

    tokens: tuple[Any, ...]
    texts: tuple[str, ...]
    unit: str            # "token_id", "token_text" or "char"
    finish_reason: str | None = None

    @property
    def digest(self) -> str:
        return hashlib.sha256(repr(self.tokens).encode()).hexdigest()[:16]


def answer_of(body: Mapping[str, Any] | None) -> Answer | None:
    """The first choice of a non-streamed chat completion as an Answer; None when it holds no answer."""
    choices = (body or {}).get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        return None
    choice = choices[0]
    message = choice.get("message") or {}
    return _answer(choice.get("token_ids"), _logprob_tokens(choice), _text_of(message), choice.get("finish_reason"))


def answer_of_stream(chunks: Sequence[Mapping[str, Any]]) -> Answer | None:
    """The first choice of a streamed chat completion, its chunks joined; None when no chunk carried a choice."""
    ids: list[int] = []
    logprob: list[str] = []
    text: list[str] = []
    finish = None
    seen = has_ids = has_logprobs = False
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            seen = True
            if choice.get("token_ids") is not None:
                has_ids = True
                ids.extend(choice["token_ids"])
            entries = _logprob_tokens(choice)
            if entries is not None:
                has_logprobs = True
                logprob.extend(entries)
            delta = choice.get("delta") or {}
            text.append(_text_of(delta))
            finish = choice.get("finish_reason") or finish
    if not seen:
        return None
    return _answer(ids if has_ids else None, logprob if has_logprobs else None, "".join(text), finish)


def _text_of(message: Mapping[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    joined = "".join(f"{(c.get('function') or {}).get('name') or ''}{(c.get('function') or {}).get('arguments') or ''}"
                     for c in calls if isinstance(c, Mapping))
    return str(message.get("content") or "") + joined


def _logprob_tokens(choice: Mapping[str, Any]) -> list[str] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None
    return [str(entry.get("token", "")) for entry in content if isinstance(entry, Mapping)]


def _answer(ids: Sequence[int] | None, tokens: Sequence[str] | None, text: str, finish: str | None) -> Answer:
    if ids is not None:
        texts = tuple(tokens) if tokens is not None and len(tokens) == len(ids) else tuple(str(i) for i in ids)
        return Answer(tuple(int(i) for i in ids), texts, "token_id", finish)
    if tokens is not None:
        return Answer(tuple(tokens), tuple(tokens), "token_text", finish)
    return Answer(tuple(text), tuple(text), "char", finish)


@dataclass(frozen=True)
class Divergence:
    """How the answer under test differs from the reference's on one prompt."""

    identical: bool
    position: int | None        # first divergent position (0-based); None when identical
    compared: int               # positions both answers have
    agreement: float            # position / compared length; 1.0 when identical
    reference_token: Any = None
    test_token: Any = None
    reference_window: str = ""
    test_window: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"identical": self.identical, "first_divergence": self.position, "compared": self.compared,
                "prefix_agreement": round(self.agreement, 4), "reference_token": self.reference_token,
                "test_token": self.test_token, "reference_window": self.reference_window,
                "test_window": self.test_window}


def compare(reference: Answer, test: Answer) -> Divergence:
    """Token by token (in the reference's unit when both share it; else both as text). A shorter answer that is
    a prefix of the other diverges where it ends (one stopped early)."""
    if reference.unit != test.unit:
        reference, test = _as_chars(reference), _as_chars(test)
    ref, got = reference.tokens, test.tokens
    longest = max(len(ref), len(got))
    position = next((i for i in range(min(len(ref), len(got))) if ref[i] != got[i]), None)
    if position is None and len(ref) != len(got):
        position = min(len(ref), len(got))
    if position is None:
        return Divergence(True, None, longest, 1.0)
    return Divergence(
        False, position, longest, position / longest if longest else 1.0,
        reference_token=_token_at(reference, position), test_token=_token_at(test, position),
        reference_window=_window(reference, position), test_window=_window(test, position))


def _as_chars(answer: Answer) -> Answer:
    """The answer as characters; a token answer's end-of-sequence token (`<|im_end|>`, `</s>`: in the tokens, not
    in the content vLLM returns) left out when the answer stopped on it."""
    texts = answer.texts
    if answer.unit != "char" and answer.finish_reason == "stop" and texts and _SPECIAL.match(texts[-1]):
        texts = texts[:-1]
    text = "".join(texts)
    return Answer(tuple(text), tuple(text), "char", answer.finish_reason)


def _token_at(answer: Answer, position: int) -> dict[str, Any] | None:
    if position >= len(answer.tokens):
        return None    # the answer ended here
    return {"token": answer.tokens[position], "text": answer.texts[position]}


def _window(answer: Answer, position: int) -> str:
    """The text around a position: WINDOW tokens before, the divergent one in [brackets], WINDOW after."""
    before = "".join(answer.texts[max(0, position - WINDOW):position])
    at = "".join(answer.texts[position:position + 1])
    after = "".join(answer.texts[position + 1:position + 1 + WINDOW])
    return f"{before}[{at}]{after}" if at else f"{before}[end]"


@dataclass(frozen=True)
class Measure:
    """The divergence measure of a prompt set: share identical and mean prefix agreement."""

    prompts: int
    identical: int
    agreement: float

    @property
    def identical_share(self) -> float:
        return self.identical / self.prompts if self.prompts else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "identical": self.identical,
                "identical_share": round(self.identical_share, 4), "prefix_agreement": round(self.agreement, 4)}


def measure(divergences: Sequence[Divergence]) -> Measure:
    n = len(divergences)
    return Measure(n, sum(d.identical for d in divergences),
                   sum(d.agreement for d in divergences) / n if n else 0.0)
