"""A corrupting OpenAI-compatible gateway for fault tests: a reverse proxy in front of a real vLLM.

A fault-injection stand-in (the project allows stand-ins for faults): it forwards every request to
the upstream vLLM and, on `POST /v1/chat/completions`, rewrites the answer according to one mode,
so the agent probe can be shown to find the defect and to name the layer that caused it:

* `passthrough`             -- bytes forwarded unchanged; must raise no alarm;
* `markup_in_content`       -- tool calls moved into `content` as hermes markup, `tool_calls` empty,
                               `finish_reason` `stop`: what a parser that missed the format returns;
* `drop_stream_tool_calls`  -- `tool_calls` removed from streamed deltas only;
* `reasoning_into_content`  -- reasoning copied into `content` (the reasoning field is kept); when
                               the upstream has no reasoning parser (the CPU lab) a fixed stand-in
                               reasoning text is supplied in `reasoning_content` and copied;
* `change_arg_types`        -- tool-call argument values change type inside the JSON string
                               (string -> list of string, number/bool -> string);
* `drop_field`              -- one field removed (`--drop-field`, dotted path, `*` for every item;
                               default `choices.*.finish_reason`);
* `markup_one_in_five`      -- `markup_in_content` on every fifth response that carries tool calls;
* `stall_nth`               -- the chosen chat completions (`--nth 2,5`: the 2nd and 5th POST, counted
                               from 1) are held for `--stall-s` seconds: a non-streamed one gets no
                               byte at all, a streamed one its first chunk and then silence. Below the
                               client's timeout that is a slow answer, above it a hung one; a client
                               that gave up is not forwarded afterwards. Other requests pass untouched.

* `shift_stream_index`      -- streamed tool-call deltas after a call's first one get `index + 1`: a
                               client assembling by index gets one call split in two (a nameless
                               one carrying the arguments);
* `stamp_system`            -- the chosen chat completion requests (`--nth`, `0` = every one) get a
                               timestamp put in front of their system message before they are
                               forwarded: a gateway that "personalises" the prompt breaks the
                               byte-identical prefix, so the prefix cache cannot hit.
* `replace_system`          -- the chosen chat completion requests (`--nth`, `0` = every one) get their
                               system message replaced by one fixed company prompt (a gateway's
                               "system prompt injection"): the client's session-unique system prompt
                               never reaches the server, so every session shares one cached prefix.
* `drop_tool_results`       -- `tool` messages removed from every chat completion request (a gateway
                               that does not carry tool results): the model answers without them.
* `drop_rank_header`        -- the `X-data-parallel-rank` request header is not forwarded (a gateway that
                               passes only the headers it knows): a data-parallel server behind it balances
                               every request over its engines, whatever engine the client asked for.
* `change_arg_types_under_load` -- `change_arg_types`, but only on answers that complete while
                               `--min-in-flight` (default 3) or more chat completions are in flight at
                               the gateway (counting the answered one): a defect that appears only under
                               concurrency; requests served one or two at a time pass untouched.
* `empty_stream_tool_calls_under_load` -- a streamed answer whose first tool-call delta arrives while
                               `--min-in-flight` (default 3) or more chat completions are in flight gets
                               every tool-call delta emptied (`tool_calls: []`, finish_reason kept): the
                               kimi_k2 streaming parser's failure under concurrent load (vllm-project/vllm
                               #54701, docs/sources.md#stream-under-load). Non-streamed answers, and
                               streams served one or two at a time, pass untouched.

* `swap_tool_name`          -- every non-streamed tool call's function name replaced by `--swap-to`
                               (default `create_ticket`, the ops pack's write tool), arguments kept: a
                               gateway that maps tool names wrongly; a write tool the case never
                               asked for is called. Streamed answers pass untouched.
* `perturb_free_text`       -- in non-streamed tool calls, the string values under the `--text-keys`
                               argument names (default `title,evidence,description,summary,reason,message,
                               note`, at any depth) get ` (v N)` appended, N counting the answers; keys,
                               enums, ids untouched. `--nth K`: only answers to a request body the gateway
                               sees for the K-th time or later (default 1: every answer). With `--nth 2`
                               the first answer to every request is the server's own and a re-sent request
                               (a repeat) is worded differently: what a GPU server that is not
                               batch-invariant can do (healthy: no alarm); with the default, as a
                               reference it disagrees on arguments only.
* `refuse_after_nth`        -- the first `--nth` chat completions (one number) are forwarded untouched,
                               every later one is answered HTTP 503 without reaching the server: an
                               endpoint (a reference with a quota) that answers a few cases only.

* `corrupt_after_tokens`      -- every answer's tokens after the `--after-tokens` N-th (default 4) replaced by
                               the N-th one repeated, in every field that carries them: `token_ids`
                               (vLLM's return_token_ids), `logprobs.content`, the text (`content`, rebuilt
                               from the tokens' texts where logprobs carry them, else cut after N
                               whitespace-separated words and filled with the repeated word) and tool-call
                               arguments past that share of the answer, both streamed (per chunk, counting
                               tokens across chunks) and not: a path that produces garbage after N tokens
                               (garbled P/D output, vllm-project/vllm#52627; docs/checks.md quality.parity).

`/metrics`, `/tokenize`, `/v1/models`, `/health` and everything else pass untouched.

    python -m vllm_acceptance.lab.gateway --upstream http://127.0.0.1:8011/v1 --port 8091 --mode M

prints `gateway listening on http://127.0.0.1:8091/v1` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import copy
import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MODES = ("passthrough", "markup_in_content", "drop_stream_tool_calls", "reasoning_into_content",
         "change_arg_types", "drop_field", "markup_one_in_five", "stall_nth", "shift_stream_index", "stamp_system",
         "strip_images", "replace_system", "drop_tool_results", "change_arg_types_under_load", "drop_rank_header",
         "swap_tool_name", "perturb_free_text", "refuse_after_nth", "empty_stream_tool_calls_under_load",
         "corrupt_after_tokens")
# Non-streamed-only answer rewrites (streamed answers pass these modes untouched).
PLAIN_ONLY = ("swap_tool_name", "perturb_free_text")
DEFAULT_SWAP_TO = "create_ticket"
ANSWERS_KEPT = ("refuse_after_nth",)  # modes that leave every answer they let through untouched
# perturb_free_text: how often the gateway has seen the body of the request being served (task-local: the proxy
# serves each request in its own task, rewrite_request and rewrite_body run in it).
_SIGHTING: contextvars.ContextVar[int] = contextvars.ContextVar("sighting", default=1)
DEFAULT_TEXT_KEYS = ("title", "evidence", "description", "summary", "reason", "message", "note")
# The modes that rewrite requests only and leave the answers alone.
REQUEST_ONLY = ("stall_nth", "stamp_system", "strip_images", "replace_system", "drop_tool_results", "drop_rank_header")
RANK_HEADER = "x-data-parallel-rank"   # vLLM's OpenAI server pins a request to this data-parallel rank
GATEWAY_SYSTEM = "You are the company assistant. Follow the company policy and answer briefly."
DEFAULT_DROP_FIELD = "choices.*.finish_reason"
STAND_IN_REASONING = "The user asks about live node state, so I must call a tool before answering."
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}

Json = dict[str, Any]


# --- pure rewrites (unit-tested) -------------------------------------------------------------

def calls_to_markup(calls: list[Json]) -> str:
    """Hermes wire format of the given tool calls: what a parser should have consumed."""
    parts = []
    for call in calls:
        fn = call.get("function") or {}
        try:
            args: Any = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            args = fn.get("arguments")
        parts.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>")
    return "\n".join(parts)


def change_value_types(value: Any) -> Any:
    """Each leaf changes type, the keys stay: what a gateway that "normalises" arguments does."""
    if isinstance(value, dict):
        return {k: change_value_types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [change_value_types(v) for v in value]
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool | int | float):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return value


def change_arguments(arguments: str) -> str:
    try:
        return json.dumps(change_value_types(json.loads(arguments)))
    except ValueError:
        return arguments  # not JSON to begin with: leave the model's own defect visible


def perturb_text(value: Any, keys: tuple[str, ...], mark: str, key: str = "") -> Any:
    """String values under the free-text `keys` (at any depth) with `mark` appended; everything else kept."""
    if isinstance(value, dict):
        return {k: perturb_text(v, keys, mark, k) for k, v in value.items()}
    if isinstance(value, list):
        return [perturb_text(v, keys, mark, key) for v in value]
    if isinstance(value, str) and key in keys:
        return value + mark
    return value


def drop_path(obj: Any, path: str) -> int:
    """Remove the field at a dotted path (`*` = every list item / dict value); return how many."""
    head, _, rest = path.partition(".")
    if not rest:
        if isinstance(obj, dict) and head in obj:
            del obj[head]
            return 1
        return 0
    if head == "*":
        items = obj if isinstance(obj, list) else list(obj.values()) if isinstance(obj, dict) else []
        return sum(drop_path(item, rest) for item in items)
    if isinstance(obj, dict) and head in obj:
        return drop_path(obj[head], rest)
    if isinstance(obj, list) and head.isdigit() and int(head) < len(obj):
        return drop_path(obj[int(head)], rest)
    return 0


def _markup_message(message: Json, choice: Json) -> None:
    calls = message.get("tool_calls") or []
    if not calls:
        return
    message["content"] = (message.get("content") or "") + calls_to_markup(calls)
    message["tool_calls"] = []
    if choice.get("finish_reason") == "tool_calls":
        choice["finish_reason"] = "stop"


def _reasoning_message(message: Json) -> None:
    reasoning = message.get("reasoning_content") or message.get("reasoning") or STAND_IN_REASONING
    message.setdefault("reasoning_content", reasoning)
    message["content"] = reasoning + (message.get("content") or "")


@dataclass
class Corruptor:
    """One gateway's fault. Shared state: the count of tool-call responses (one-in-five)."""

    mode: str
    drop_field: str = DEFAULT_DROP_FIELD
    every: int = 5
    nth: tuple[int, ...] = (1,)
    stall_s: float = 3600.0
    tool_responses: int = 0
    corrupted: int = 0
    chat_requests: int = 0
    in_flight: int = 0  # chat completions the gateway is serving now
    min_in_flight: int = 3  # change_arg_types_under_load: corrupt only at this many in flight or more
    swap_to: str = DEFAULT_SWAP_TO  # swap_tool_name: the name every call gets
    text_keys: tuple[str, ...] = DEFAULT_TEXT_KEYS  # perturb_free_text: the argument names of free text
    sightings: dict[str, int] = field(default_factory=dict)  # perturb_free_text: request body hash -> times seen
    after_tokens: int = 4  # corrupt_after_tokens: the tokens kept before the corruption

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: choose one of {', '.join(MODES)}")

    def refuse_this(self) -> bool:
        """refuse_after_nth: True for a chat completion past the first `nth[0]` (counted by stall_this)."""
        hit = self.mode == "refuse_after_nth" and self.chat_requests > self.nth[0]
        self.corrupted += hit
        return hit

    def stall_this(self) -> bool:
        """Count one chat completion request; stall_nth: True when it is one of the chosen."""
        self.chat_requests += 1
        hit = self.mode == "stall_nth" and self.chat_requests in self.nth
        self.corrupted += hit
        return hit

    def _strip_images(self, data: bytes) -> bytes:
        try:
            body = json.loads(data)
        except ValueError:
            return data
        for message in body.get("messages") or []:
            if isinstance(message.get("content"), list):
                kept = [p for p in message["content"] if not str(p.get("type", "")).startswith("image")]
                self.corrupted += len(message["content"]) - len(kept)
                message["content"] = kept
        return json.dumps(body).encode()

    def _drop_tool_results(self, data: bytes) -> bytes:
        try:
            body = json.loads(data)
        except ValueError:
            return data
        messages = body.get("messages") or []
        kept = [m for m in messages if m.get("role") != "tool"]
        self.corrupted += len(messages) - len(kept)
        body["messages"] = kept
        return json.dumps(body).encode()

    def rewrite_request(self, data: bytes) -> bytes:
        """stamp_system: a timestamp in front of the system message of the chosen requests (counted by
        stall_this, which runs first); replace_system: that system message replaced by GATEWAY_SYSTEM."""
        if self.mode == "perturb_free_text":
            key = hashlib.sha256(data).hexdigest()
            self.sightings[key] = self.sightings.get(key, 0) + 1
            _SIGHTING.set(self.sightings[key])
            return data
        if self.mode == "strip_images":
            return self._strip_images(data)
        if self.mode == "drop_tool_results":
            return self._drop_tool_results(data)
        if self.mode not in ("stamp_system", "replace_system") or \
                (0 not in self.nth and self.chat_requests not in self.nth):
            return data
        try:
            body = json.loads(data)
        except ValueError:
            return data
        for message in body.get("messages") or []:
            if message.get("role") == "system" and isinstance(message.get("content"), str):
                if self.mode == "replace_system":
                    message["content"] = GATEWAY_SYSTEM
                    self.corrupted += 1
                    break
                message["content"] = f"[{time.strftime('%Y-%m-%dT%H:%M:%S')}.{time.time_ns() % 10**9:09d}] " + \
                    message["content"]
                self.corrupted += 1
                break
        return json.dumps(body).encode()

    def _count_tool_response(self) -> bool:
        """markup_one_in_five: count a response with tool calls; True when this one is corrupted."""
        self.tool_responses += 1
        hit = self.tool_responses % self.every == 0
        self.corrupted += hit
        return hit

    def rewrite_body(self, body: Json) -> Json:
        """A non-streamed chat completion, rewritten by the mode (a copy; the input is left alone)."""
        body = copy.deepcopy(body)
        choices = body.get("choices") or []
        if self.mode == "drop_field":
            drop_path(body, self.drop_field)
            return body
        if self.mode in (*REQUEST_ONLY, "shift_stream_index", *ANSWERS_KEPT):
            return body
        if self.mode == "change_arg_types_under_load" and self.in_flight < self.min_in_flight:
            return body
        if self.mode == "empty_stream_tool_calls_under_load":
            return body  # streams only
        if self.mode == "corrupt_after_tokens":
            for choice in choices:
                self.corrupted += corrupt_choice(choice, self.after_tokens)
            return body
        has_calls = any((c.get("message") or {}).get("tool_calls") for c in choices)
        markup = self.mode == "markup_in_content" or (
            self.mode == "markup_one_in_five" and has_calls and self._count_tool_response())
        for choice in choices:
            message = choice.get("message") or {}
            if markup:
                _markup_message(message, choice)
            elif self.mode == "reasoning_into_content":
                _reasoning_message(message)
            elif self.mode in ("change_arg_types", "change_arg_types_under_load"):
                self.corrupted += bool(message.get("tool_calls"))
                for call in message.get("tool_calls") or []:
                    fn = call.get("function") or {}
                    fn["arguments"] = change_arguments(fn.get("arguments") or "")
            elif self.mode in PLAIN_ONLY:
                self._plain_only(message)
        return body

    def _plain_only(self, message: Json) -> None:
        """swap_tool_name / perturb_free_text on one non-streamed message."""
        calls = message.get("tool_calls") or []
        if not calls:
            return
        self.tool_responses += 1
        for call in calls:
            fn = call.get("function") or {}
            if self.mode == "swap_tool_name":
                self.corrupted += fn.get("name") != self.swap_to
                fn["name"] = self.swap_to
                continue
            if _SIGHTING.get() < self.nth[0]:
                continue
            try:
                args = json.loads(fn.get("arguments") or "")
            except ValueError:
                continue
            changed = perturb_text(args, self.text_keys, f" (v {self.tool_responses})")
            if changed != args:
                self.corrupted += 1
                fn["arguments"] = json.dumps(changed)

    def stream(self) -> StreamRewriter:
        return StreamRewriter(self)


@dataclass
class StreamRewriter:
    """Rewrites one streamed response chunk by chunk (state per request)."""

    corruptor: Corruptor
    calls: dict[int, Json] = field(default_factory=dict)
    markup: bool | None = None  # decided at the first tool-call delta
    seen_reasoning: bool = False
    injected: bool = False
    emptied: bool | None = None  # empty_stream_tool_calls_under_load: decided at the first tool-call delta
    tokens: dict[int, int] = field(default_factory=dict)  # corrupt_after_tokens: tokens seen per choice index
    nth_token: dict[int, tuple[Any, Json | None, str]] = field(default_factory=dict)  # ... its N-th (id, entry, text)

    @property
    def mode(self) -> str:
        return self.corruptor.mode

    def rewrite(self, chunk: Json) -> Json:
        chunk = copy.deepcopy(chunk)
        if self.mode == "drop_field":
            drop_path(chunk, self.corruptor.drop_field)
            return chunk
        if self.mode in (*REQUEST_ONLY, *PLAIN_ONLY, *ANSWERS_KEPT):
            return chunk
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta")
            if delta is None:
                continue
            if self.mode == "drop_stream_tool_calls":
                delta.pop("tool_calls", None)
            elif self.mode == "shift_stream_index":
                for call in delta.get("tool_calls") or []:
                    index = call.get("index", 0)
                    if index in self.calls:
                        call["index"] = index + 1
                    else:
                        self.calls[index] = {}
            elif self.mode in ("markup_in_content", "markup_one_in_five"):
                self._markup_delta(choice, delta)
            elif self.mode == "change_arg_types":
                self._types_delta(choice, delta)
            elif self.mode == "reasoning_into_content":
                self._reasoning_delta(choice, delta)
            elif self.mode == "empty_stream_tool_calls_under_load":
                self._empty_delta(delta)
            elif self.mode == "corrupt_after_tokens":
                self._corrupt_delta(choice, delta)
        return chunk

    def _corrupt_delta(self, choice: Json, delta: Json) -> None:
        """corrupt_after_tokens on one chunk: its tokens counted after those of the earlier chunks."""
        index = choice.get("index", 0)
        seen = self.tokens.get(index, 0)
        ids = choice.get("token_ids")
        entries = (choice.get("logprobs") or {}).get("content")
        count = len(ids) if isinstance(ids, list) else len(entries) if isinstance(entries, list) else int(
            bool(delta.get("content") or delta.get("tool_calls")))
        if count == 0:
            return
        keep = max(0, self.corruptor.after_tokens - seen)
        self.tokens[index] = seen + count
        if keep >= count:
            if keep == count or seen + count == self.corruptor.after_tokens:
                self.nth_token[index] = _last_token(ids, entries, delta)
            return
        if index not in self.nth_token:   # the N-th token is in this chunk
            self.nth_token[index] = _nth_in(ids, entries, delta, keep)
        nth_id, nth_entry, nth_text = self.nth_token[index]
        self.corruptor.corrupted += seen <= self.corruptor.after_tokens
        if isinstance(ids, list):
            choice["token_ids"] = ids[:keep] + [nth_id] * (count - keep)
        if isinstance(entries, list):
            kept = entries[:keep]
            choice["logprobs"]["content"] = kept + [copy.deepcopy(nth_entry or {"token": nth_text})
                                                    for _ in range(count - keep)]
            if delta.get("content") is not None:
                delta["content"] = "".join(str(e.get("token", "")) for e in kept) + nth_text * (count - keep)
        elif delta.get("content"):
            delta["content"] = (delta["content"] if keep else "") + nth_text * (count - keep)
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if fn.get("arguments"):
                fn["arguments"] = _garble(fn["arguments"], 0)

    def _empty_delta(self, delta: Json) -> None:
        """Every tool-call delta of this stream emptied when its first arrived under load (counting this one)."""
        if not delta.get("tool_calls"):
            return
        if self.emptied is None:
            self.emptied = self.corruptor.in_flight >= self.corruptor.min_in_flight
            self.corruptor.corrupted += self.emptied
        if self.emptied:
            delta["tool_calls"] = []

    def _collect(self, delta: Json) -> None:
        for call in delta.pop("tool_calls", None) or []:
            slot = self.calls.setdefault(call.get("index", 0), {"id": None, "type": "function",
                                                                "function": {"name": "", "arguments": ""}})
            slot["id"] = call.get("id") or slot["id"]
            fn = call.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""

    def _markup_delta(self, choice: Json, delta: Json) -> None:
        if delta.get("tool_calls") and self.markup is None:
            self.markup = self.mode == "markup_in_content" or self.corruptor._count_tool_response()
        if not self.markup:
            return
        self._collect(delta)
        if choice.get("finish_reason") and self.calls:
            delta["content"] = (delta.get("content") or "") + calls_to_markup(
                [self.calls[i] for i in sorted(self.calls)])
            if choice["finish_reason"] == "tool_calls":
                choice["finish_reason"] = "stop"

    def _types_delta(self, choice: Json, delta: Json) -> None:
        # Argument fragments are not JSON on their own: hold them, send the changed whole at the end.
        for call in delta.get("tool_calls") or []:
            slot = self.calls.setdefault(call.get("index", 0), {"arguments": ""})
            fn = call.get("function") or {}
            slot["arguments"] += fn.pop("arguments", None) or ""
        if choice.get("finish_reason") and self.calls:
            delta["tool_calls"] = (delta.get("tool_calls") or []) + [
                {"index": i, "function": {"arguments": change_arguments(self.calls[i]["arguments"])}}
                for i in sorted(self.calls)]

    def _reasoning_delta(self, choice: Json, delta: Json) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            self.seen_reasoning = True
            delta["content"] = reasoning + (delta.get("content") or "")
            return
        substantive = delta.get("content") or delta.get("tool_calls") or choice.get("finish_reason")
        if substantive and not self.seen_reasoning and not self.injected:
            self.injected = True
            delta["reasoning_content"] = STAND_IN_REASONING
            delta["content"] = STAND_IN_REASONING + (delta.get("content") or "")


# --- corrupt_after_tokens: the pure rewrites ---------------------------------------------------

def _garble(text: str, keep: int) -> str:
    """`text` after its first `keep` characters replaced by `!` (what a path emitting garbage leaves in a field)."""
    return text[:keep] + "!" * max(0, len(text) - keep)


def _nth_in(ids: Any, entries: Any, delta: Json, keep: int) -> tuple[Any, Json | None, str]:
    """The token repeated after the N-th: the chunk's token at `keep - 1` (its first when N falls before it)."""
    at = max(0, keep - 1)
    entry = entries[at] if isinstance(entries, list) and len(entries) > at else None
    token_id = ids[at] if isinstance(ids, list) and len(ids) > at else None
    text = str(entry.get("token", "")) if entry else (str(delta.get("content") or "").split(" ")[0] or "!")
    return token_id, entry, text


def _last_token(ids: Any, entries: Any, delta: Json) -> tuple[Any, Json | None, str]:
    n = len(ids) if isinstance(ids, list) else len(entries) if isinstance(entries, list) else 1
    return _nth_in(ids, entries, delta, n)


def corrupt_choice(choice: Json, after: int) -> bool:
    """corrupt_after_tokens on one non-streamed choice (in place); True when it had tokens past the N-th."""
    ids = choice.get("token_ids")
    entries = (choice.get("logprobs") or {}).get("content")
    message = choice.get("message") or {}
    content = message.get("content")
    words = str(content or "").split(" ")
    total = len(ids) if isinstance(ids, list) else len(entries) if isinstance(entries, list) else len(words)
    if total <= after:
        return False
    at = max(0, after - 1)
    if isinstance(ids, list):
        choice["token_ids"] = ids[:after] + [ids[at]] * (total - after)
    if isinstance(entries, list) and entries:
        nth = entries[at]
        choice["logprobs"]["content"] = entries[:after] + [copy.deepcopy(nth) for _ in range(total - after)]
        # the text is the tokens' texts (the end-of-sequence token's aside: vLLM leaves it out of content)
        if content is not None and "".join(str(e.get("token", "")) for e in entries).startswith(content):
            message["content"] = "".join(str(e.get("token", "")) for e in choice["logprobs"]["content"])
        elif content:
            message["content"] = _garble(content, len("".join(str(e.get("token", "")) for e in entries[:after])))
    elif content:
        word = words[at] if at < len(words) else "!"
        message["content"] = " ".join(words[:after] + [word] * (len(words) - after))
    share = after / total
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        arguments = str(fn.get("arguments") or "")
        fn["arguments"] = _garble(arguments, int(len(arguments) * share))
    return True


# --- the proxy -------------------------------------------------------------------------------

def upstream_root(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _forward_headers(headers: Any, drop: tuple[str, ...] = ()) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in drop}


def make_app(upstream: str, corruptor: Corruptor) -> Any:
    """The aiohttp application: everything proxied, chat completions rewritten by the mode."""
    import aiohttp
    from aiohttp import web

    root = upstream_root(upstream)

    async def on_startup(app: web.Application) -> None:
        # One connection per request: a kept-alive upstream connection that the server closed meanwhile
        # turned a request into a 500 ("Server disconnected") under load, a fault the test did not ask for.
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                               connector=aiohttp.TCPConnector(force_close=True))

    async def on_cleanup(app: web.Application) -> None:
        await app["session"].close()

    async def proxy(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        data = await request.read()
        chat = request.method == "POST" and request.path.rstrip("/") == "/v1/chat/completions"
        rewrite = chat and corruptor.mode not in ("passthrough", *REQUEST_ONLY)
        streamed = False
        if rewrite or chat:
            try:
                streamed = bool(json.loads(data or b"{}").get("stream"))
            except (ValueError, AttributeError):
                rewrite = False  # not a JSON body: let the upstream answer the client's error
        if chat:
            corruptor.in_flight += 1
            try:
                return await _forward(request, session, data, chat, rewrite, streamed)
            finally:
                corruptor.in_flight -= 1
        return await _forward(request, session, data, chat, rewrite, streamed)

    async def _forward(request: web.Request, session: Any, data: bytes, chat: bool, rewrite: bool,
                       streamed: bool) -> web.StreamResponse:
        stall = chat and corruptor.stall_this()
        if chat:
            data = corruptor.rewrite_request(data)
        if chat and corruptor.refuse_this():
            return web.json_response({"error": {"message": "quota exhausted (refuse_after_nth)", "code": 503}},
                                     status=503)
        if stall:
            how = "streamed: after its first chunk" if streamed else "no byte"
            print(f"stalling chat request #{corruptor.chat_requests} ({how}) for {corruptor.stall_s:g} s", flush=True)
        if stall and not streamed:
            await asyncio.sleep(corruptor.stall_s)
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499)  # the client gave up: nothing is forwarded
        async with session.request(request.method, root + request.path_qs, data=data,
                                   headers=_forward_headers(request.headers, (RANK_HEADER,) if
                                                            corruptor.mode == "drop_rank_header" else ())) as up:
            headers = _forward_headers(up.headers)
            if stall and streamed and up.status == 200:
                return await _stream(request, up, headers, lambda chunk: chunk, stall_after_first=True)
            if rewrite and up.status == 200 and streamed:
                return await _stream(request, up, headers, corruptor.stream().rewrite)
            if rewrite and up.status == 200:
                body = corruptor.rewrite_body(await up.json(content_type=None))
                return web.Response(status=200, headers=headers, body=json.dumps(body).encode())
            out = web.StreamResponse(status=up.status, headers=headers)
            await out.prepare(request)
            async for piece in up.content.iter_any():
                await out.write(piece)
            await out.write_eof()
            return out

    async def _stream(request: web.Request, up: Any, headers: dict[str, str],
                      rewrite_chunk: Callable[[Json], Json], stall_after_first: bool = False) -> web.StreamResponse:
        out = web.StreamResponse(status=200, headers=headers)
        await out.prepare(request)
        sent_chunks = 0
        async for raw in up.content:
            if stall_after_first and sent_chunks == 1:
                stall_after_first = False
                await asyncio.sleep(corruptor.stall_s)
                if request.transport is None or request.transport.is_closing():
                    return out  # the client gave up
            sent_chunks += 1
            line = raw.decode().rstrip("\r\n")
            if not line:
                continue
            payload = line[5:].strip() if line.startswith("data:") else None
            if payload is None or payload == "[DONE]":
                await out.write((line + "\n\n").encode())
                continue
            try:
                chunk = rewrite_chunk(json.loads(payload))
            except ValueError:
                await out.write((line + "\n\n").encode())
                continue
            await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await out.write_eof()
        return out

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


async def serve(upstream: str, host: str, port: int, corruptor: Corruptor) -> None:
    from aiohttp import web

    runner = web.AppRunner(make_app(upstream, corruptor), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"gateway listening on http://{host}:{port}/v1 (mode {corruptor.mode})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.lab.gateway", description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="the vLLM base URL, e.g. http://127.0.0.1:8011/v1")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="passthrough")
    parser.add_argument("--drop-field", default=DEFAULT_DROP_FIELD,
                        help="dotted path removed in drop_field mode (`*` = every item)")
    parser.add_argument("--every", type=int, default=5, help="markup_one_in_five: corrupt every Nth tool response")
    parser.add_argument("--nth", default="1", help="stall_nth / stamp_system / replace_system / refuse_after_nth "
                                                   "(the answered count): the chat completion "
                                                   "requests chosen, counted from 1 (comma-separated, e.g. 2,5; "
                                                   "stamp_system, replace_system: 0 = all)")
    parser.add_argument("--stall-s", type=float, default=3600.0, help="stall_nth: how long each is held")
    parser.add_argument("--swap-to", default=DEFAULT_SWAP_TO, help="swap_tool_name: the name every call gets")
    parser.add_argument("--text-keys", default=",".join(DEFAULT_TEXT_KEYS),
                        help="perturb_free_text: comma-separated argument names whose string values are free text")
    parser.add_argument("--min-in-flight", type=int, default=3,
                        help="change_arg_types_under_load: corrupt only answers completing with this many chat "
                             "completions in flight or more; empty_stream_tool_calls_under_load: empty only streams "
                             "whose first tool-call delta arrives with this many in flight or more")
    parser.add_argument("--after-tokens", type=int, default=4,
                        help="corrupt_after_tokens: the tokens of each answer kept before the corruption (N >= 1)")
    args = parser.parse_args(argv)
    if args.after_tokens < 1:
        parser.error("--after-tokens must be >= 1 (the N-th token is the one repeated)")
    if args.every < 1:
        parser.error("--every must be >= 1")
    try:
        nth = tuple(int(x) for x in args.nth.split(","))
    except ValueError:
        parser.error(f"--nth {args.nth!r}: comma-separated request numbers, e.g. 2,5")
    if not nth or min(nth) < (0 if args.mode in ("stamp_system", "replace_system") else 1) or args.stall_s < 0:
        parser.error("--nth numbers must be >= 1 and --stall-s >= 0")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.upstream, args.host, args.port,
                          Corruptor(args.mode, drop_field=args.drop_field, every=args.every, nth=nth,
                                    stall_s=args.stall_s, min_in_flight=args.min_in_flight,
                                    swap_to=args.swap_to, after_tokens=args.after_tokens,
                                    text_keys=tuple(k for k in args.text_keys.split(",") if k))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
