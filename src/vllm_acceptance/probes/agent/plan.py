"""The agent probe's own plan: its requests and upper bound (core/bounds.py) from the settings it runs with
(unit.py config) and the order of probe.py AgentProbe.run; `plan` adds it up (docs/plan.md "How each bound is
computed")."""

from __future__ import annotations

from typing import Any

from ...core.bounds import StageBound, request_bound_s, waves
from ...scenarios import load_scenario
from ...scenarios.case_packs import pack_cases
from ...scenarios.cases import TOOL_CHOICES
from ..options import ProbeOptions, request_timeout_s, setting
from .common import BATCH, case_counts
from .unit import config


def single_requests(scenario: dict[str, Any], images: bool) -> dict[str, int]:
    """The requests each single case of AgentProbe.run sends, one at a time (conversation.py, interface.py):
    streaming (plain and streamed), multi_turn (the call, then the answer to its result), failed_tool_fallback
    (the answer, then the model's retries or the client's ticket and its resend), structured_output (whole and
    cut), multimodal (with and without the image, where agent.images). executor_safety and client_library
    send nothing (they read the calls already answered)."""
    retries = int(((scenario.get("tasks") or {}).get("fallback") or {}).get("retries", 1))
    return {"streaming": 2, "multi_turn": 2, "failed_tool_fallback": 1 + max(retries, 2), "structured_output": 2,
            "multimodal": 2 if images else 0}


def batch_waves(cases: int, concurrency: int) -> int:
    """send_cases (rates.py): the cases in rounds of BATCH, each round's requests `concurrency` at a time."""
    full, rest = divmod(cases, BATCH)
    return full * waves(BATCH, concurrency) + waves(rest, concurrency)


def agent_plan(opts: ProbeOptions, under_load: int | None = None) -> StageBound:
    """The case set at agent.concurrency (in rounds of BATCH), the consistency repeats, the single cases one
    request at a time, then (agent.under_load, or `under_load` as the run passes it) the answered cases again
    with that many in flight. Each request at most TTFT + agent.max_tokens x ITL (or the request timeout)."""
    scenario = str(setting(opts, "agent.scenario"))
    cfg = config(opts, load_scenario(scenario))
    loaded = int(under_load if under_load is not None else cfg.under_load)
    calls, others = case_counts(cfg)
    # rates.py case_set adds choice_cases: required and named are call cases, none an other case
    calls, others = calls + len(TOOL_CHOICES) - 1, others + 1
    calls += len(pack_cases(cfg.case_pack)) if cfg.case_pack else 0  # agent.case_pack: call cases too
    repeats = cfg.consistency_cases * max(1, cfg.repeats)
    single = single_requests(cfg.scenario, cfg.images)
    one = sum(single.values())
    # agent.stream_tool_calls (streaming.py): the first agent.stream_cases call cases (all: null) streamed too,
    # alone at agent.concurrency and mixed into the under-load pass.
    twins = calls if cfg.stream_cases is None else min(cfg.stream_cases, calls)
    again = calls + others + twins if loaded > 0 else 0
    n_waves = (batch_waves(calls + others, cfg.concurrency) + waves(repeats, cfg.concurrency)
               + waves(twins, cfg.concurrency) + one + (waves(again, loaded) if again else 0))
    one_s, how = request_bound_s(dict(setting(opts, "contract.slo") or {}), cfg.max_tokens, request_timeout_s(opts))
    sent = calls + others + repeats + twins + one + again
    under = f" + the {again} cases and streamed twins again at agent.under_load {loaded}" if again else ""
    return StageBound(
        "agent", f"tool calls ({scenario}): the case set{', again under load' if again else ''}, then {one} "
        "single-case requests", sent, n_waves * one_s,
        f"{calls} call cases + {others} other cases (rounds of {BATCH}) + {repeats} repeats + {twins} streamed twins "
        f"at agent.concurrency "
        f"{cfg.concurrency}{under} + {one} single-case requests one at a time: {n_waves} waves x {one_s:g} s "
        f"({how}); a format error's retries (agent.retry_attempts, only where calls fail) are not counted")
