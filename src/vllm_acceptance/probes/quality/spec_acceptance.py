"""Speculative decoding's acceptance, read from the server's own counters (docs/checks.md
`quality.spec_acceptance`; issue 45 item 4).

vLLM counts, per engine (vllm/v1/spec_decode/metrics.py, SpecDecodingStats.observe_draft): one draft per
request and step that proposed tokens (`vllm:spec_decode_num_drafts`), the tokens proposed
(`..._num_draft_tokens`), the tokens accepted (`..._num_accepted_tokens`) and, per draft position, the drafts
whose tokens were accepted up to that position (`..._num_accepted_tokens_per_pos{position="i"}`). Its own log
line ("SpecDecoding metrics: ...") derives from the same counts: mean acceptance length = 1 + accepted /
drafts (the bonus token counted), the acceptance rate at position i = accepted_per_pos[i] / drafts.

The rule (docs/checks.md): enough drafts to judge (else inconclusive, with the count), the mean acceptance
length at least the profile's floor, and no collapse after the first position: the share of drafts accepted
at position i among those accepted at position i-1 (the conditional continuation) at least the profile's
floor, judged where position i-1 holds enough accepted drafts for the ratio to mean something
(vllm#51009: near-normal at position 0, ~25 % continuation after it; docs/sources.md#spec-decode)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ...runtime.metrics import Snapshot

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SPEC_FAMILIES = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS)


@dataclass(frozen=True)
class SpecCounts:
    """The spec-decoding counters of one reading (summed over engines), or a difference of two."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]   # accepted drafts at position 0, 1, ...

    @classmethod
    def of(cls, snap: Snapshot) -> SpecCounts | None:
        """The counters of a /metrics snapshot; None when the server exports no spec-decode series (a server
        launched without a speculative config registers none)."""
        values = [snap.value(name) for name in (DRAFTS, DRAFT_TOKENS, ACCEPTED)]
        if any(v is None for v in values):
            return None
        positions: dict[int, float] = {}
        for labels in snap.labels_of(PER_POS):
            pos = labels.get("position")
            if pos is not None and pos.isdigit() and int(pos) not in positions:
                positions[int(pos)] = snap.value(PER_POS, position=pos) or 0.0
        per_pos = tuple(positions.get(i, 0.0) for i in range(max(positions) + 1)) if positions else ()
        drafts, draft_tokens, accepted = (float(v) for v in values)  # type: ignore[arg-type]
        return cls(drafts, draft_tokens, accepted, per_pos)

    def since(self, earlier: SpecCounts) -> SpecCounts:
        """What moved between `earlier` and this reading."""
        width = max(len(self.per_pos), len(earlier.per_pos))
        pos = tuple((self.per_pos[i] if i < len(self.per_pos) else 0.0)
                    - (earlier.per_pos[i] if i < len(earlier.per_pos) else 0.0) for i in range(width))
        return SpecCounts(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                          self.accepted - earlier.accepted, pos)

    def to_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted,
                "accepted_per_position": list(self.per_pos)}


@dataclass(frozen=True)
class Acceptance:
    """What the rule judges: drafts seen, mean acceptance length, acceptance rate per position."""

    drafts: float
    mean_length: float | None
    rates: tuple[float, ...]
    source: str

    @classmethod
    def of_counts(cls, counts: SpecCounts, source: str) -> Acceptance:
        if counts.drafts <= 0:
            return cls(counts.drafts, None, (), source)
        return cls(counts.drafts, 1 + counts.accepted / counts.drafts,
                   tuple(p / counts.drafts for p in counts.per_pos), source)

    def to_dict(self) -> dict[str, Any]:
        return {"drafts": self.drafts, "mean_acceptance_length": _round(self.mean_length),
                "acceptance_per_position": [_round(r) for r in self.rates],
                "continuation_per_position": [_round(c) for c in continuation(self.rates)], "source": self.source}


_LOG_LINE = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<mean>[0-9.]+),.*?Accepted: (?P<acc>[0-9]+) tokens, "
    r"Drafted: (?P<drafted>[0-9]+) tokens, Per-position acceptance rate: (?P<rates>[0-9., ]+?), Avg Draft")


def parse_log_lines(text: str, source: str) -> Acceptance | None:
    """vLLM's "SpecDecoding metrics:" log lines (vllm/v1/spec_decode/metrics.py SpecDecodingLogging), summed:
    each line's drafts are its drafted tokens over its positions (every draft proposes
    num_speculative_tokens), its per-position rates weighted by them. None when the text has no such line."""
    drafts = accepted = 0.0
    weighted: list[float] = []
    for match in _LOG_LINE.finditer(text):
        rates = [float(r) for r in match.group("rates").split(",") if r.strip()]
        if not rates:
            continue
        n = int(match.group("drafted")) / len(rates)
        drafts += n
        accepted += int(match.group("acc"))
        weighted += [0.0] * (len(rates) - len(weighted))
        for i, rate in enumerate(rates):
            weighted[i] += rate * n
    if drafts <= 0:
        return None
    return Acceptance(drafts, 1 + accepted / drafts, tuple(w / drafts for w in weighted), source)


def continuation(rates: tuple[float, ...]) -> list[float | None]:
    """The conditional continuation at positions 1, 2, ...: rate[i] / rate[i-1] (None where rate[i-1] is 0)."""
    return [(rates[i] / rates[i - 1]) if rates[i - 1] > 0 else None for i in range(1, len(rates))]


@dataclass(frozen=True)
class AcceptanceFloor:
    min_drafts: int
    min_acceptance_length: float
    min_continuation: float
    min_position_drafts: int     # accepted drafts at position i-1 before its continuation is judged


def judge_acceptance(acc: Acceptance, floor: AcceptanceFloor) -> tuple[str, list[str]]:
    """(status, reasons): `inconclusive` with the count when too few drafts, `fail` naming each breach, else
    `pass`."""
    if acc.drafts < floor.min_drafts or acc.mean_length is None:
        return "inconclusive", [f"{acc.drafts:g} drafts counted, {floor.min_drafts} needed to judge acceptance"]
    reasons = []
    if acc.mean_length < floor.min_acceptance_length:
        reasons.append(f"mean acceptance length {acc.mean_length:.2f} < {floor.min_acceptance_length:g}")
    for i, cont in enumerate(continuation(acc.rates), start=1):
        if cont is None or acc.rates[i - 1] * acc.drafts < floor.min_position_drafts:
            continue
        if cont < floor.min_continuation:
            reasons.append(f"acceptance collapses at position {i}: {acc.rates[i]:.3f} of drafts against "
                           f"{acc.rates[i - 1]:.3f} at position {i - 1} (continuation {cont:.2f} < "
                           f"{floor.min_continuation:g})")
            break
    return ("fail" if reasons else "pass"), reasons


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
