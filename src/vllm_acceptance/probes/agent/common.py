"""Shared pieces of the agent probe: its settings (AgentProbeConfig), the turn target, the
constants of the rate run, and the small helpers every check uses (findings, layers, report rows)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from ...core.findings import Finding, Status
from ...rules import registry
from ...runtime.client import Exchange
from .rules import (
    CallCheck,
    turns_to_resolve,
)

REPEATED = ("agent.tool_call", "agent.trigger_consistency", "agent.separation", "agent.schema_accuracy",
            "agent.stream_tool_calls")
BATCH = 64  # turns sent per round of the rate run; the run stops early once every rate is decided


def solid_png_base64(size: int = 16, rgb: tuple[int, int, int] = (220, 30, 30)) -> str:
    """A small solid-colour PNG built with the standard library (no image files shipped)."""
    import base64
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(rgb) * size for _ in range(size))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


GATEWAY_REASON = ("the direct server (--direct-url) answers the same request cleanly ({detail}): "
                  "the defect appears between the server and the client, in the gateway")


@dataclass
class AgentProbeConfig:
    model: str
    scenario: dict[str, Any]
    repeats: int = 3  # the fewest tool-call turns (and the direct-server reference runs)
    temperature: float = 0.0
    max_tokens: int = 256
    format_error_threshold: float = 0.01
    schema_accuracy_min: float = 0.99
    turn_budget: int = 1000
    concurrency: int = 8
    retry_attempts: int = 1
    images: bool = False
    image_tokens: int | None = None  # prompt tokens one probe image adds, where the profile states it
    reasoning_parser: str | None = None
    cases: int = 300  # distinct call-requiring cases of the case set (at least; the thresholds may need more)
    other_cases: int = 60  # multi-turn, irrelevance and structured cases beside them
    case_seed: int = 0
    seed: int | None = None  # agent.seed: each request carries `seed` + its position, so a sampled run repeats
    case_tools: str = "sample"  # "pack": every case offers exactly the pack's tools (scenarios/cases.py)
    consistency_cases: int = 10  # single cases repeated `repeats` times for trigger consistency
    abstain_min: float = 0.9  # irrelevance cases: the abstention rate's 95 % lower bound
    reference_model: str | None = None  # the reference endpoint's model name (agent.reference_agreement)
    reference_min: float = 0.80  # tool-call F1 on triggering vs the reference (K2-Vendor-Verifier, K2-0905)
    under_load: int = 0  # the case set sent again with this many requests in flight (agent.under_load)
    wrong_tool_rate: float = 0.01  # agent.tool_choice: calls of a read tool the case does not expect (95 % bound)
    wrong_write_tool_rate: float = 0.0  # agent.tool_choice: a write tool the case does not expect (0: any one fails)
    reference_min_cases: int = 36  # cases both answer before any reference result counts (agent.reference_*)
    reference_argument_min: float = 0.9  # agent.reference_arguments: share of both-call cases whose arguments agree
    stream_cases: int | None = None  # call cases also sent streamed in every pass (None: all; agent.stream_cases)
    case_pack: str | None = None  # a vendored case pack added to the case set (agent.case_pack; case_packs.py)


def turn_target(cfg: AgentProbeConfig) -> int:
    """Turns needed so that zero errors resolve both thresholds, at least `repeats`, at most the budget."""
    need = max(cfg.repeats, cfg.cases, turns_to_resolve(cfg.format_error_threshold),
               turns_to_resolve(1.0 - cfg.schema_accuracy_min))
    return min(need, cfg.turn_budget)


def case_counts(cfg: AgentProbeConfig) -> tuple[int, int]:
    """(call-requiring cases, other cases) of the case set (rates.py case_set; probes/agent/plan.py): the turns
    the thresholds need, and `agent.other_cases` beside them, a fifth of the calls at most (5 at the least)."""
    calls = turn_target(cfg)
    return calls, min(cfg.other_cases, max(5, calls // 5))


def _finding(check: str, status: Status, layer: str | None, ev: list[str], **kw: Any) -> Finding:
    return registry.get(check).result(status, layer=layer, evidence=ev, **kw)


def _layer_of(check: CallCheck) -> str | None:
    return check.problems[0][0] if check.problems else None


def exchange_row(case: str, ex: Exchange, parsed: Any, decision: dict[str, Any], path: str) -> dict[str, Any]:
    """One request of the probe as the report's agent table shows it: answer shape and the client's decision."""
    choices = (ex.body or {}).get("choices") if isinstance(ex.body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    calls = (parsed or {}).get("tool_calls") if isinstance(parsed, dict) else None
    names = [str((c.get("function") or {}).get("name")) for c in calls or [] if isinstance(c, dict)]
    problems = decision.get("problems") if isinstance(decision.get("problems"), list) else []
    valid = decision.get("valid")
    if valid is None and "problems" in decision:
        valid = not problems
    return {"case": case, "http_status": ex.status, "finish_reason": first.get("finish_reason"),
            "calls": len(names), "names": names, "valid": valid, "problems": len(problems),
            "timed_out": bool(ex.timed_out), "evidence": path}



def _validation_error(content: str | None, schema: dict[str, Any]) -> str | None:
    """The client validation of a structured answer: None when it parses and validates."""
    try:
        jsonschema.validate(json.loads(content or ""), schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        return str(exc).splitlines()[0][:200]
    return None
