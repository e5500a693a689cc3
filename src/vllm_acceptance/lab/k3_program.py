"""Weights of the lab's Kimi K3 variant: a tiny model that speaks K3's XTML channels.

The hermes variant only has to emit `<tool_call>`: vLLM's JSON grammar then writes the call.
K3's structural tag is looser (arguments are order-free, repeatable, and `required` is not
enforced; string values are raw text), so this variant writes its whole answer itself: a short
think channel, then either a tool call or a text reply, token by token.

Its "program" is an n-gram table compiled into the weights:

* layer 0, heads 0 and 1 set the "tools declared" and "tool result present" flags (attention
  by content to a marker token anywhere in the prompt, as in the hermes variant);
* heads 2-4 copy the class of the token 1, 2 and 3 positions back (attention by position:
  RoPE's fastest pair peaks at the wanted offset, a slow pair adds a recency slope);
* the MLP holds one AND gate per rule "these last 2-4 tokens (and these flags) -> next token";
  `compile_rules` picks, for every step of every canned answer, the shortest context that no
  other step shares with a different successor, so the table is consistent by construction;
* the LM head maps each gate to its token and keeps the context-free preference of the hermes
  variant (EOS first, then JSON closers...) for everything else, so inside a grammar that
  forbids the canned token (response_format, another tool set) the model falls back to the
  shortest valid output.

Only the lab venv (torch) runs `program`; `compile_rules` is plain Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .weights import D_CONST

HIDDEN = 512
HEADS = 8
HEAD_DIM = 64
INTERMEDIATE = 512

D_TOOLS_FLAG, D_RESP_FLAG = 2, 3  # dims 0/1: D_CONST and the filler class (weights.py)
D_CLASS0 = 8  # token classes: 8 .. 8+MAX_CLASSES
MAX_CLASSES = HEAD_DIM  # a copy head carries every class in its 64 value dims
D_PREV0 = (80, 150, 220)  # copies of the class 1, 2, 3 positions back
D_EMIT0 = 300  # one unit per target token of the rules
D_NOISE = 448

FAST_PAIR = 0  # RoPE pair rotating 1 rad per position: peaks at the wanted offset
SLOW_PAIR = HEAD_DIM // 2 - 1  # almost still over the context: attention by content
RECENCY_PAIR = 19  # theta ~2.7e-4 rad/position with base 1e6: monotonic over 4096 positions
FAST_SCORE = 40.0  # logit scale of the offset peak
RECENCY_SLOPE = 9.0  # logits lost per position back


@dataclass(frozen=True)
class Case:
    """One canned answer and the prompt flags that select it (None: either)."""

    tools: bool | None
    result: bool | None
    tokens: tuple[int, ...]  # generation-prompt tail + answer + EOS
    start: int  # index of the last prompt token (the first rule fires there)


@dataclass(frozen=True)
class Rule:
    context: tuple[int, ...]  # last 2-4 tokens, oldest first
    tools: bool | None
    result: bool | None
    target: int


def compile_rules(cases: Sequence[Case]) -> list[Rule]:
    """The shortest consistent context rule for every step of every case.

    A step's context of length L may become a rule only if every other step with the same L
    tokens (and, where flags are needed, the same flags) has the same successor; a rule that
    matches a step therefore always agrees with it. Raises ValueError when 4 tokens and the flags
    do not decide a step.
    """
    steps = [(c, i) for c in cases for i in range(c.start, len(c.tokens) - 1)]

    def ctx(case: Case, i: int, n: int) -> tuple[int, ...]:
        return tuple(case.tokens[max(0, i - n + 1): i + 1])

    rules: dict[tuple[Any, ...], Rule] = {}
    for case, i in steps:
        nxt = case.tokens[i + 1]
        rule = None
        for use_flags in (False, True):
            for n in (2, 3, 4):
                mine = ctx(case, i, n)
                if len(mine) < n:
                    break
                clash = any(
                    ctx(c2, j, n) == mine and c2.tokens[j + 1] != nxt
                    and (not use_flags or (c2.tools, c2.result) == (case.tools, case.result))
                    for c2, j in steps
                )
                if not clash:
                    tools, result = (case.tools, case.result) if use_flags else (None, None)
                    rule = Rule(mine, tools, result, nxt)
                    break
            if rule:
                break
        if rule is None:
            raise ValueError(f"step {i} of a canned answer is not decided by 4 tokens and the flags")
        rules[(rule.context, rule.tools, rule.result)] = rule
    return list(rules.values())


def program(
    vocab: int, rules: Sequence[Rule], markers: tuple[int, int],
    preference: Callable[[int], float], seed: int, layers: int,
) -> dict[str, Any]:
    """Hand-set float32 weights (a LlamaForCausalLM state dict) that run `rules`."""
    import torch

    from .weights import blank_llama

    gen = torch.Generator().manual_seed(seed)
    f32 = torch.float32
    tools_marker, result_marker = markers
    classed = sorted({t for r in rules for t in r.context} | {tools_marker, result_marker})
    if len(classed) > MAX_CLASSES:
        raise RuntimeError(f"{len(classed)} token classes; a copy head carries {MAX_CLASSES}")
    cls = {t: D_CLASS0 + k for k, t in enumerate(classed)}
    targets = sorted({r.target for r in rules})
    emit = {t: D_EMIT0 + k for k, t in enumerate(targets)}
    if D_EMIT0 + len(targets) > D_NOISE or len(rules) > INTERMEDIATE:
        raise RuntimeError("too many rules for the model size")

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=f32)

    sd = blank_llama(vocab, HIDDEN, HEADS * HEAD_DIM, INTERMEDIATE, layers, cls, D_NOISE, gen)
    # RMSNorm of an embedding (two units of 1 in 512 dims) gives 16 per unit.
    unit = (HIDDEN / 2) ** 0.5

    a = "model.layers.0.self_attn."
    q, k, v, o = (sd[a + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    scale = HEAD_DIM ** 0.5 / unit ** 2  # q.k/sqrt(d) of unit inputs -> 1 logit per weight product
    half = HEAD_DIM // 2
    # Heads 0/1: content attention to a marker anywhere -> flag ~1 (as the hermes variant).
    for head, (marker, flag) in enumerate(((tools_marker, D_TOOLS_FLAG), (result_marker, D_RESP_FLAG))):
        row = head * HEAD_DIM
        w = (30.0 * scale) ** 0.5
        q[row + SLOW_PAIR, D_CONST] = w
        k[row + SLOW_PAIR, cls[marker]] = w
        v[row, cls[marker]] = 1.0
        o[flag, row] = 1.0 / unit
    # Heads 2-4: the token `back` positions ago. Score(r) = F cos(r - back) - S r (r = distance):
    # the fast pair peaks at r = back, the recency slope breaks its 2*pi repeats.
    theta_rec = 1.0e6 ** (-2 * RECENCY_PAIR / HEAD_DIM)
    for n, back in enumerate((1, 2, 3)):
        row = (2 + n) * HEAD_DIM
        wf = (FAST_SCORE * scale) ** 0.5
        q[row + FAST_PAIR, D_CONST] = wf
        k[row + FAST_PAIR, D_CONST] = wf * math.cos(back)
        k[row + FAST_PAIR + half, D_CONST] = wf * math.sin(back)
        wr = (RECENCY_SLOPE / theta_rec * scale) ** 0.5
        q[row + RECENCY_PAIR + half, D_CONST] = wr
        k[row + RECENCY_PAIR, D_CONST] = wr
        for dim in cls.values():
            v[row + dim - D_CLASS0, dim] = 1.0
            o[D_PREV0[n] + dim - D_CLASS0, row + dim - D_CLASS0] = 1.0 / unit

    # MLP gates: silu(G * (matched units - (needed - 0.5))) * const -> emit unit of the target.
    m = "model.layers.0.mlp."
    gate, up, down = sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"], sd[m + "down_proj.weight"]
    g = 4.0
    for r_i, rule in enumerate(rules):
        needed = 0
        for back, tok in enumerate(reversed(rule.context)):
            dim = cls[tok] if back == 0 else D_PREV0[back - 1] + cls[tok] - D_CLASS0
            gate[r_i, dim] += g
            needed += 1
        for flag, want in ((D_TOOLS_FLAG, rule.tools), (D_RESP_FLAG, rule.result)):
            if want is True:
                gate[r_i, flag] += g
                needed += 1
            elif want is False:
                gate[r_i, flag] -= g
        gate[r_i, D_CONST] = -(needed - 0.5) * g
        up[r_i, D_CONST] = 1.0
        down[emit[rule.target], r_i] = 0.05

    head = zeros(vocab, HIDDEN)
    for tid in range(vocab):
        head[tid, D_CONST] = preference(tid)
    head[:, D_CONST] += 0.002 * torch.randn(vocab, generator=gen)
    for tid, dim in emit.items():
        head[tid, dim] = 3.0
    sd["lm_head.weight"] = head
    return {key: val.contiguous() for key, val in sd.items()}
