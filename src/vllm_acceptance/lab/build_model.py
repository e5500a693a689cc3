"""Build the lab's tiny tool-calling model locally, for real vLLM on CPU.

No weights can be downloaded on the lab machine (docs/lab.md "Real vLLM on CPU"), so this module
writes a complete Hugging Face model directory from nothing: a LlamaForCausalLM (hidden 128,
2 layers, 4 heads of dim 32, float32), a byte-level BPE tokenizer trained here by `tokenizers`
on a deterministic built-in corpus, a chat template, config and generation config.

Random weights never emit a tool call, so the weights are *programmed* (set by hand):

* the embedding of every token carries a constant unit (dim 0) plus one "class" unit: a
  filler unit for ordinary tokens, or a dedicated unit for the few tokens the program reads
  (the tools marker, the tool-response marker, the newline that ends the generation prompt,
  and the tokens of the two canned answers);
* layer 0, head 0 attends (position-free, through RoPE's slowest pair) to a `<tools>` marker
  anywhere in the prompt and writes a "tools present" flag; head 1 does the same for
  `<tool_response>`;
* layer 0's MLP computes AND gates: newline AND tools AND NOT tool-response -> "emit
  <tool_call>"; newline AND tool-response -> "answer after the tool";
* the LM head maps those features to `<tool_call>` or to the first token of a canned answer,
  chains each canned-answer token to its successor (a bigram), and adds a context-free
  preference over the whole vocabulary: EOS first, then JSON closers (`"`, `}`, `]`), then `:`
  and `,`, digits, words, whitespace last. Inside vLLM's grammar (tool-call structural tags with
  `--tool-strict-level parameter`, or `response_format`) that preference picks the shortest valid
  completion, so arguments always terminate and validate; outside it, EOS ends the turn.

Serve it with `--tool-call-parser hermes --tool-strict-level parameter` (docs/lab.md flags). Without
a grammar (strict level `auto` and no `"strict": true` tool) the model emits `<tool_call>` and
EOS: vLLM's hermes parser then fails to load the empty JSON and returns the text as content with
finish_reason `stop` -- a reproducible tool-call format error, useful as a fault, not a default.

The seed only moves tiny tie-breaking noise, so every seed behaves the same and the same seed
gives byte-identical files. Run with the lab venv's python (torch, transformers, tokenizers):

    PYTHONPATH=src python -m vllm_acceptance.lab.build_model --out DIR [--variant hermes] [--seed 0]

Only this module imports torch/transformers/tokenizers, and only inside functions, so the
controller package (no torch) can import the constants below.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .weights import D_CONST

VARIANTS = ("hermes", "kimi_k3")
SERVED_MODEL_NAME = "tiny-agent"

HIDDEN = 128
LAYERS = 2
HEADS = 4
HEAD_DIM = HIDDEN // HEADS  # 32: vLLM's CPU attention needs head_dim >= 32
INTERMEDIATE = 256
VOCAB_SIZE = 4096
MAX_POSITIONS = 4096
# A large RoPE base leaves the slowest rotary pair (dims 15/31 of a head) almost still over the
# whole context (< 0.01 rad at 4096 positions), so the marker heads attend by content only.
ROPE_THETA = 1.0e6
RMS_EPS = 1e-6

EOS = "<|im_end|>"
BOS_LIKE = "<|im_start|>"
PAD = "<|endoftext|>"

# Residual-stream layout of the program (dims of the 128-wide hidden state). Dim 0 (D_CONST, 1 for
# every token) carries the context-free vocabulary preference; dim 1 is the filler class (weights.py).
D_TOOLS_FLAG = 2  # written by layer 0 head 0: a tools marker is in the prompt
D_RESP_FLAG = 3  # written by layer 0 head 1: a tool-response marker is in the prompt
D_EMIT_CALL = 4  # MLP gate: start a tool call now
D_EMIT_ANSWER = 5  # MLP gate: answer in text after a tool result
D_CLASS0 = 8  # first dedicated class unit
D_NOISE = 96  # dims >= this carry seeded noise only

# Preferred content of a string that may not close yet (first candidate that is one token).
STRING_FILLERS = ("test", "node", "x")

MARKER_POS = 15  # head dim paired with 31 by RoPE (neox layout): the slowest-rotating pair


@dataclass(frozen=True)
class Variant:
    """Wire format of one model family: its markers, template and canned answers."""

    name: str
    template_file: str
    call_start: str  # token that opens a tool call in the model's output
    call_end: str
    tools_marker: str  # token present in the prompt only when tools were rendered
    response_marker: str  # token present in the prompt only after a tool result
    extra_tokens: tuple[str, ...]
    plain_answer: str  # reply without tools
    tool_answer: str  # reply after a tool result
    corpus_extra: tuple[str, ...] = ()  # wire-format text the tokenizer should learn merges for


HERMES = Variant(
    name="hermes",
    template_file="hermes.jinja",
    call_start="<tool_call>",
    call_end="</tool_call>",
    tools_marker="<tools>",
    response_marker="<tool_response>",
    extra_tokens=(
        "<tool_call>", "</tool_call>", "<tools>", "</tools>", "<tool_response>", "</tool_response>",
    ),
    plain_answer="Hello, I am the tiny lab agent.",
    tool_answer="Done: tool result received!",
)


# Kimi K3's XTML channels (vLLM's kimi_k3 tool/reasoning parsers). The canned answers below are
# what the K3 variant writes after its generation prompt `<|open|>think<|sep|>`: a think channel,
# then a call of the ops-agent pack's required tool (tools declared, no tool result yet), or a
# reply (after a tool result, or without tools). See k3_program for how they become weights.
K3_THINK = "Reading the request first.<|close|>think<|sep|>"
# Tokenized piece by piece: the second argument's `argument` and `string` are split (`a` +
# `rgument`, `s` + `tring`), so that the last four tokens tell the two arguments apart at each
# step (the grammar reads bytes, not tokens).
K3_CALL_PIECES = (
    '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_node_status" index="1"<|sep|>'
    '<|open|>argument key="node" type="string"<|sep|>node-07<|close|>argument<|sep|>',
    "<|open|>a", 'rgument key="include" type="s', 'tring"<|sep|>gpus<|close|>argument<|sep|>'
    "<|close|>call<|sep|><|close|>tools<|sep|>",
)
K3_CALL = "".join(K3_CALL_PIECES)
K3_GENERATION_TAIL = "<|open|>think<|sep|>"

KIMI_K3 = Variant(
    name="kimi_k3",
    template_file="kimi_k3.jinja",
    call_start="<|open|>tools<|sep|>",
    call_end="<|close|>tools<|sep|>",
    tools_marker="tool_declare",
    response_marker="tool_result",
    extra_tokens=("<|open|>", "<|close|>", "<|sep|>", "tool_declare", "tool_result"),
    plain_answer="Hello, I am the tiny lab agent.",
    tool_answer="Done: tool result received!",
    corpus_extra=(K3_THINK, K3_CALL, K3_GENERATION_TAIL, '<|open|>message role="assistant"<|sep|>',
                  "<|open|>response<|sep|><|close|>response<|sep|><|close|>message<|sep|>") * 20,
)


def _variant(name: str) -> Variant:
    if name == "hermes":
        return HERMES
    if name == "kimi_k3":
        return KIMI_K3
    raise ValueError(f"unknown variant {name!r}; choose one of {', '.join(VARIANTS)}")


# --------------------------------------------------------------------------- corpus

_OPS_SENTENCES = (
    "The agent checks the node status before it opens a ticket.",
    "Call the tool with valid JSON arguments and wait for the tool response.",
    "The GPU node reported an ECC error, so the scheduler drained it.",
    "Prefix caching reuses the KV cache blocks of an identical system prompt.",
    "The deployment may take production traffic only with evidence for every check.",
    "Rebuild the environment when the driver branch or the CUDA build is out of profile.",
    "Expand capacity when queueing and preemption repeat at nominal load.",
    "The operator restarts the vLLM server and waits until the health endpoint is ready.",
    "Hello! I am the tiny lab agent. How can I help you with the cluster today?",
    "Done: the tool returned its result, and the ticket is open.",
    "Latency rose after the rollout; roll back to the previous image and compare.",
    "The tool call failed schema validation, so the client retried once and succeeded.",
    "Severity is low, medium, high or critical; labels are short lowercase words.",
    "Summarize the incident, list the affected hosts and propose the next action.",
    "Metrics show the waiting queue growing while KV cache usage stays at one hundred percent.",
    "A named tool choice forces the function; auto lets the model decide.",
    "Streaming returns the tool call in deltas that the client assembles.",
    "The user asked for the weather, but the agent only manages inference servers.",
)

_TOOL_NAMES = (
    "get_node_status", "create_ticket", "get_weather", "search_logs", "restart_service",
    "list_pods", "scale_deployment", "query_metrics", "drain_node", "get_gpu_info",
    "read_file", "run_command", "lookup_user", "send_message", "get_time",
)

_WORDS = (
    "node", "nodes", "gpu", "cpu", "memory", "disk", "network", "health", "status", "ticket",
    "title", "severity", "labels", "details", "include", "summary", "metrics", "logs", "pod",
    "service", "cluster", "region", "zone", "rack", "host", "name", "arguments", "type",
    "object", "string", "integer", "number", "boolean", "array", "properties", "required",
    "enum", "items", "description", "function", "parameters", "low", "medium", "high",
    "critical", "true", "false", "null", "ok", "error", "warning", "info", "debug", "owner",
    "team", "id", "count", "limit", "query", "start", "end", "since", "until", "value",
    "unit", "seconds", "tokens", "requests", "latency", "throughput", "queue", "cache",
    "prefix", "hits", "queries", "model", "server", "version", "driver", "image", "build",
    "city", "location", "celsius", "fahrenheit", "temperature", "user", "assistant", "system",
    "tool", "content", "role", "message", "result", "output", "input", "reason", "action",
)


# More everyday and operations English, so that ordinary prompts tokenize into words, not bytes.
_MORE_WORDS = """
a about above accept acceptance access account across action active actual add added address
admin after again against agent agents alert alerts all allocate allow allowed almost alone along
already also always amount an analysis and another answer any api app append application apply
approve are area around arrive article as ask asked assign at attach attempt attention audit
authentication author automatic available average avoid away back backend backup bad balance
bandwidth base batch be because become been before begin behind being below benchmark best better
between big bind block blocked blocks body book boot both bottom bound box branch break bridge
bring broken browser bucket buffer bug build built bundle busy but button by bytes calendar call
called calls can cancel capacity card care carry case catch category cause certificate chain
change changed channel chapter character chart check checked checks child choice choose chunk
class clean clear click client close closed cloud code collect column come command comment commit
common company compare compile complete completed compute condition config configure connect
connection consider console constant contain container context continue contract control copy
core correct cost could country course cover create created credential critical current customer
cycle daily dashboard data database date day dead deadline deal decide decision decode default
defect define delay delete deliver demand deny depend deploy deployment describe design detail
detect device different direct directory disable discover display document does domain done down
download draft drain drop during each early edge edit effect either email empty enable encode
endpoint engine enough ensure enter entry environment equal error errors event every evidence
exact example exceed except exchange exit expect expected explain export expose extend fail failed
failure fast feature field figure file files fill filter final find finish first fix flag flow
follow for force form format forward found free from front full gateway general get give global go
good grant graph group grow guard half handle happen hard hardware hash have header heap help here
hidden history hold home hook hour how however idle if ignore implement import in incident index
inside install instance interconnect interface internal interval into inventory is issue it item
job join just keep kernel key kind know label language large last later layer lead leader learn
least leave left length less level library license life light like line link list listen little
live load local lock log long look loop lost machine main make manage manager many map mark match
may mean measure member merge method might migrate minute mirror miss mode modify module monitor
month more most move much must need network never new next no none normal not note notice now
number observe of off offer office old on once one only open operator option or order other our
out over owner package page pair panel parse part pass password patch path pause peak pending
people per percent perform period permission person phase pick place plan platform play please
point policy pool port position possible post power prefer prepare present press previous price
primary print priority private probe problem process produce product profile program project
proof protocol provide proxy public publish pull push put quality question quick quota rate
rather read ready real reason receive received recent record recover reduce refresh region
register release reload remain remote remove repair repeat replace replica reply report request
require reset resource respond response rest restore retry return review right risk rollback
route row rule run running safe same sample save scale schedule schema scope score script search
second secret section secure see select self send sent separate sequence serve session set setting
several shard share short should show shut side sign signal simple since single size skip slow
small snapshot socket some soon sort source space special spend split stable stack stage standard
state step still stop storage store stream strict structure subject submit success such suggest
support sure switch sync table take target task team test text than thank that the their them then
there these they thing think this those thread threshold through time timeout to today together
token too top topic total trace track traffic transfer trigger trust try tune turn under unit
update upgrade upload usage use used valid validate variable verify very view visible volume wait
want watch way we week weight well were what when where which while who why will window with
within without word work worker would write wrong year yes yet you your
"""

_SENTENCE_FRAMES = (
    "Please {a} the {b} and {c} the {d} before {e}.",
    "Can you {a} {b} for the {c} {d}?",
    "I need to {a} the {b} because the {c} is {d}.",
    "The {a} {b} will {c} when the {d} {e}.",
    "We {a} {b} {c} and then {d} it.",
)


def _corpus(variant: Variant) -> list[str]:
    """A deterministic training corpus: English ops text, JSON, tool schemas and chat markup."""
    lines: list[str] = list(_OPS_SENTENCES)
    lines.append(variant.plain_answer)
    lines.append(variant.tool_answer)
    for line in variant.corpus_extra:
        # Learn the words between the markers; the markers themselves are added tokens.
        lines.extend(part for part in re.split(r"<\|\w+\|>", line) if part)
    for i, name in enumerate(_TOOL_NAMES):
        props = {
            _WORDS[(i * 7 + j) % len(_WORDS)]: {
                "type": ("string", "integer", "boolean", "array", "object")[(i + j) % 5],
                "description": " ".join(_WORDS[(i + j * 3 + k) % len(_WORDS)] for k in range(4)),
            }
            for j in range(3)
        }
        schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": _OPS_SENTENCES[i % len(_OPS_SENTENCES)],
                "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]},
            },
        }
        lines.append(json.dumps(schema))
        args = {k: ("x" if i % 2 else 0) for k in props}
        lines.append(json.dumps({"name": name, "arguments": args}))
        lines.append(json.dumps({"name": name, "arguments": {}}, separators=(",", ":")))
    words = _MORE_WORDS.split()
    n = len(words)
    for i in range(3000):
        # A fixed multiplicative walk over the word list: varied, reproducible English-ish text.
        pick = [words[(i * m + o) % n] for m, o in ((7, 1), (13, 5), (31, 11), (61, 17), (97, 23))]
        frame = _SENTENCE_FRAMES[i % len(_SENTENCE_FRAMES)]
        line = frame.format(a=pick[0], b=pick[1], c=pick[2], d=pick[3], e=pick[4])
        lines.append(line[0].upper() + line[1:] if i % 2 else line)
    for i, w in enumerate(words):
        # Inflections and title case: the merges real English text needs beyond base forms.
        lines.append(f"{w.title()} {w}s {w}ed {w}ing {w}er re{w} un{w} {w.upper()} /{w}/{words[(i * 3) % n]}")
    for i in range(400):
        # Numbers, ids and short JSON records: gives digits, quotes and braces realistic merges.
        w1, w2, w3 = (_WORDS[(i * k + 3) % len(_WORDS)] for k in (1, 5, 11))
        rec = {"id": i, w1: w2, "count": (i * 37) % 1000, "ok": i % 3 == 0, "tags": [w3], "meta": {}}
        lines.append(json.dumps(rec))
        lines.append(f"The {w1} {w2} reported {w3} on host-{i % 17} at {(i * 13) % 24:02d}:{i % 60:02d}.")
        lines.append(f"{w1}_{w2} = {(i * 7919) % 10007}; {w3}: [] {{}} \"\" null")
    return lines


# --------------------------------------------------------------------------- tokenizer


def train_tokenizer(variant: Variant) -> Any:
    """Train a byte-level BPE tokenizer (tokenizers) on the built-in corpus; deterministic."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Digits one by one (as Qwen does): numbers stay sane and the vocabulary goes to words.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = [PAD, BOS_LIKE, EOS]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(variant.extra_tokens),
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(variant), trainer=trainer)
    # Tool markup is added as normal (non-special) tokens, like Qwen's <tool_call>: vLLM's hermes
    # parser reads them from the text, and skip_special_tokens must not remove them.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in variant.extra_tokens])
    return tok


def _hf_tokenizer(tok: Any, chat_template: str) -> Any:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = chat_template
    return hf


def chat_template(variant: str = "hermes") -> str:
    """The chat template text of a variant (a file beside this module)."""
    v = _variant(variant)
    return resources.files("vllm_acceptance.lab").joinpath("chat_templates", v.template_file).read_text()


# --------------------------------------------------------------------------- weights


def _preference(text: str) -> float:
    """Context-free next-token preference (logit units before the constant scale).

    Inside a grammar this order picks the shortest valid JSON: close what is open before
    anything else, separators only when closing is not allowed, digits before words, whitespace
    last (xgrammar may allow any whitespace; preferring it would never end).
    """
    if text == "":
        return -2.0
    if text == '"':
        # Above everything: inside a string any other token is valid content and would go on.
        return 4.6
    if all(c in '"}]' for c in text):
        # Close as much as is open at once (`}}` ends the arguments and the call object).
        return (4.4 if text.startswith('"') else 4.0) + 0.01 * len(text)
    if text in ("{}", "[]", '""'):
        return 3.9
    if text == ":" or text == '":':
        return 3.7
    if text == ",":
        return 3.6
    if text == "0":
        return 3.5
    if text.isdigit():
        # Short numbers, small digits first ("1" when 0 is below a minimum).
        return 3.0 - 0.1 * len(text) - 0.01 * int(text[0])
    if text.isspace():
        return 0.0
    if all(c in '"{}[],: ' for c in text):
        return 2.5
    # Longer words first: a forced key or enum value then takes few tokens.
    return 1.0 + 0.01 * min(len(text), 50)


@dataclass(frozen=True)
class _Ids:
    eos: int
    call_start: int
    newline: int
    tools_marker: int
    response_marker: int
    plain: tuple[int, ...]
    after_tool: tuple[int, ...]


def _ids(tok: Any, variant: Variant) -> _Ids:
    def one(text: str) -> int:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != 1:
            raise RuntimeError(f"{text!r} must be one token, got {ids}")
        return int(ids[0])

    plain = tuple(tok.encode(variant.plain_answer, add_special_tokens=False).ids)
    after = tuple(tok.encode(variant.tool_answer, add_special_tokens=False).ids)
    chain = plain + after
    if len(set(chain)) != len(chain):
        # The answers are bigram chains: a repeated token would have two successors.
        raise RuntimeError(f"canned answers must not share or repeat tokens: {chain}")
    return _Ids(
        eos=one(EOS),
        call_start=one(variant.call_start),
        newline=one("\n"),
        tools_marker=one(variant.tools_marker),
        response_marker=one(variant.response_marker),
        plain=plain,
        after_tool=after,
    )


def _program(tok: Any, variant: Variant, seed: int) -> dict[str, Any]:
    """Hand-set weights of the whole model as a state dict of float32 tensors."""
    import torch

    from .weights import blank_llama

    gen = torch.Generator().manual_seed(seed)
    ids = _ids(tok, variant)
    vocab = tok.get_vocab_size()
    f32 = torch.float32

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=f32)

    # Embeddings: constant unit + one class unit; a whisper of seeded noise in the top dims.
    classes: dict[int, int] = {}
    for tid in (ids.tools_marker, ids.response_marker, ids.newline, *ids.plain, *ids.after_tool):
        classes[tid] = D_CLASS0 + len(classes)
    if D_CLASS0 + len(classes) > D_NOISE:
        raise RuntimeError("too many class units for the hidden size")
    sd = blank_llama(vocab, HIDDEN, HIDDEN, INTERMEDIATE, LAYERS, classes, D_NOISE, gen)

    # Layer 0 attention: head h reads marker class unit -> writes flag dim. Normalised inputs
    # are ~6-8 per unit, so q.k/sqrt(32) ~ 25 puts ~all weight on the marker when present;
    # without it every value is 0 and so is the head's output.
    p = "model.layers.0.self_attn."
    for head, (marker, flag) in enumerate(
        ((ids.tools_marker, D_TOOLS_FLAG), (ids.response_marker, D_RESP_FLAG))
    ):
        row = head * HEAD_DIM
        sd[p + "q_proj.weight"][row + MARKER_POS, D_CONST] = 1.5
        sd[p + "k_proj.weight"][row + MARKER_POS, classes[marker]] = 1.5
        sd[p + "v_proj.weight"][row, classes[marker]] = 1.0
        sd[p + "o_proj.weight"][flag, row] = 1.0 / 8.0  # flag ~1, the scale of an embedding unit

    # Layer 0 MLP: SwiGLU AND gates, silu(G * (sum of units - threshold)) * const.
    p = "model.layers.0.mlp."
    gate, up, down = sd[p + "gate_proj.weight"], sd[p + "up_proj.weight"], sd[p + "down_proj.weight"]
    nl = classes[ids.newline]
    g = 4.0
    # emit tool call: newline + tools - response - 1.5 > 0 only for (1, 1, 0)
    gate[0, nl], gate[0, D_TOOLS_FLAG], gate[0, D_RESP_FLAG], gate[0, D_CONST] = g, g, -g, -1.5 * g
    # answer after a tool result: newline + response - 1.5 > 0 only for (1, 1)
    gate[1, nl], gate[1, D_RESP_FLAG], gate[1, D_CONST] = g, g, -1.5 * g
    up[0, D_CONST] = up[1, D_CONST] = 1.0
    down[D_EMIT_CALL, 0] = down[D_EMIT_ANSWER, 1] = 1.0

    # LM head: global preference on the constant unit (+ seeded tie-breaking noise), bigram
    # chains for the canned answers, and the two gate features.
    head = zeros(vocab, HIDDEN)
    for tid in range(vocab):
        head[tid, D_CONST] = _preference(tok.decode([tid]))
    head[:, D_CONST] += 0.002 * torch.randn(vocab, generator=gen)
    head[ids.eos, D_CONST] = 5.0
    # When a string must go on (minLength, pattern), fill it with a word rather than braces.
    filler = next(f for f in STRING_FILLERS if len(tok.encode(f, add_special_tokens=False).ids) == 1)
    head[tok.token_to_id(filler), D_CONST] = 4.3
    for special in (PAD, BOS_LIKE, variant.call_start, variant.tools_marker, variant.response_marker):
        head[tok.token_to_id(special), D_CONST] = -5.0
    chain_from = {ids.newline: ids.plain[0]}
    for seq in (ids.plain, ids.after_tool):
        for a, b in zip(seq, seq[1:], strict=False):
            chain_from[a] = b
    for prev, nxt in chain_from.items():
        head[nxt, classes[prev]] = 8.0
    head[ids.call_start, D_EMIT_CALL] = 4.0
    head[ids.after_tool[0], D_EMIT_ANSWER] = 4.0
    sd["lm_head.weight"] = head
    return {k: v.contiguous() for k, v in sd.items()}


def k3_cases(tok: Any, variant: Variant) -> list[Any]:
    """The K3 variant's canned answers as token sequences, each with the flags that select it."""
    from .k3_program import Case

    def ids(*pieces: str) -> tuple[int, ...]:
        return tuple(t for piece in pieces for t in tok.encode(piece, add_special_tokens=False).ids)

    tail, eos = ids(K3_GENERATION_TAIL), (tok.token_to_id(EOS),)
    close = "<|close|>response<|sep|>"
    answers = (
        (True, False, (K3_THINK, *K3_CALL_PIECES)),
        (None, True, (K3_THINK, variant.tool_answer, close)),
        (False, False, (K3_THINK, variant.plain_answer, close)),
    )
    return [Case(tools, result, tail + ids(*pieces) + eos, len(tail) - 1) for tools, result, pieces in answers]


def _program_k3(tok: Any, variant: Variant, seed: int) -> dict[str, Any]:
    from . import k3_program as k3

    rules = k3.compile_rules(k3_cases(tok, variant))
    specials = {tok.token_to_id(t) for t in (PAD, BOS_LIKE, variant.tools_marker, variant.response_marker)}
    eos = tok.token_to_id(EOS)
    filler = next(f for f in STRING_FILLERS if len(tok.encode(f, add_special_tokens=False).ids) == 1)
    filler_id = tok.token_to_id(filler)

    def preference(tid: int) -> float:
        # The hermes variant's order (EOS, closers, ...); markers only when a rule asks for them.
        if tid == eos:
            return 5.0
        if tid in specials:
            return -5.0
        if tid == filler_id:
            return 4.3
        return _preference(tok.decode([tid]))

    markers = (tok.token_to_id(variant.tools_marker), tok.token_to_id(variant.response_marker))
    return k3.program(tok.get_vocab_size(), rules, markers, preference, seed, LAYERS)


def _config(tok: Any, variant: Variant) -> Any:
    from transformers import LlamaConfig

    from . import k3_program as k3

    hidden, heads, head_dim, inter = ((k3.HIDDEN, k3.HEADS, k3.HEAD_DIM, k3.INTERMEDIATE)
                                      if variant.name == "kimi_k3" else (HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE))
    eos = tok.token_to_id(EOS)
    return LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=LAYERS,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=RMS_EPS,
        rope_theta=ROPE_THETA,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=tok.token_to_id(BOS_LIKE),
        eos_token_id=eos,
        pad_token_id=tok.token_to_id(PAD),
        torch_dtype="float32",
    )


# --------------------------------------------------------------------------- build


def build_model(out_dir: Path, variant: str = "hermes", seed: int = 0) -> Path:
    """Write the tiny model directory (config, safetensors, tokenizer, template) to out_dir.

    Deterministic: the same variant and seed give byte-identical files. The directory is built
    beside out_dir and swapped in whole, so a server starting meanwhile never reads half a model.
    Returns out_dir.
    """
    v = _variant(variant)
    return build_swapped_in(Path(out_dir), lambda tmp: _write_model(tmp, v, seed))


def build_swapped_in(out_dir: Path, write: Callable[[Path], None]) -> Path:
    """Let `write` fill a directory beside out_dir, then swap it in whole (a server starting meanwhile
    never reads half a model); returns out_dir."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.building-{os.getpid()}"
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        if out_dir.exists():
            out_dir.rename(old)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return out_dir


def _write_model(out_dir: Path, v: Variant, seed: int) -> None:
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    tok = train_tokenizer(v)
    template = chat_template(v.name)
    hf_tok = _hf_tokenizer(tok, template)
    hf_tok.save_pretrained(out_dir)
    # vLLM and transformers read the template from tokenizer_config.json or chat_template.jinja;
    # write the latter explicitly so both transformers 4 and 5 layouts find it.
    (out_dir / "chat_template.jinja").write_text(template)

    cfg = _config(tok, v)
    cfg.save_pretrained(out_dir)
    GenerationConfig(
        eos_token_id=cfg.eos_token_id,
        bos_token_id=cfg.bos_token_id,
        pad_token_id=cfg.pad_token_id,
        do_sample=False,
    ).save_pretrained(out_dir)
    weights = _program_k3(tok, v, seed) if v.name == "kimi_k3" else _program(tok, v, seed)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "lab_model.json").write_text(
        json.dumps(
            {
                "variant": v.name,
                "seed": seed,
                "served_model_name": SERVED_MODEL_NAME,
                "plain_answer": v.plain_answer,
                "tool_answer": v.tool_answer,
                "tool_call_start": v.call_start,
                "tool_call_end": v.call_end,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )


def digest(out_dir: Path) -> dict[str, str]:
    """sha256 of every file in a built model directory (for determinism checks)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(out_dir).iterdir())
        if p.is_file()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    ap.add_argument("--variant", default="hermes", choices=VARIANTS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        out = build_model(args.out, args.variant, args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    print(json.dumps({"out": str(out), "variant": args.variant, "seed": args.seed,
                      "build_seconds": round(time.monotonic() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
