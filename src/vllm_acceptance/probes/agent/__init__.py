"""Agent interface conformance (docs/acceptance.md "Agent interface"): tool calls, separation, streaming,
multi-turn, the planned fallback, structured output, the reference client on the real calls; every
defect attributed to a layer.

This module sends and records; the judgement is in ``probes/agent/rules.py``. Every exchange is kept as
evidence (request body, raw response, parsed result, decision). Every scenario detail (tools, tasks,
the fallback plan, write tools and their idempotency keys) comes from the scenario pack.

Rates resolve their threshold: the number of tool-call turns is chosen from the threshold (zero errors
in n turns bounds the rate at about 3/n with 95 % confidence, so 1 % needs 299 turns), sent
concurrently, bounded by ``agent.turn_budget``; each rate is reported with its 95 % bound and judged on
the bound. A format error is retried (``agent.retry_attempts``) and validated; a limited observation
needs every error recovered and the bound under the threshold.

The package: common.py (settings, constants, helpers), base.py (shared state, request bodies,
layer attribution), rates.py (the rate run over the case set), conversation.py (streaming, multi-turn,
fallback, images), interface.py (structured output, executor safety, gateway, client library),
comparison.py (under load, against a reference) and probe.py (AgentProbe, the run in order).
"""

from __future__ import annotations

from . import unit  # registers the probe (probes/registry.py)
from .common import BATCH, GATEWAY_REASON, REPEATED, AgentProbeConfig, exchange_row, solid_png_base64, turn_target
from .probe import AgentProbe

__all__ = ["unit", "BATCH", "GATEWAY_REASON", "REPEATED", "AgentProbe", "AgentProbeConfig", "exchange_row",
           "solid_png_base64", "turn_target"]
