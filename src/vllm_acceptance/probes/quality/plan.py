"""The quality probe's own plan: its requests and upper bound (core/bounds.py) from the settings it runs with
(probe.py config) and the order of probe.py run_quality_probe; `plan` adds it up (docs/plan.md "How each bound
is computed")."""

from __future__ import annotations

from typing import Any

from ...core.bounds import StageBound, request_bound_s, waves
from ...scenarios import load_scenario
from ..options import ProbeOptions, request_timeout_s, setting
from .parity_prompts import prompt_set
from .probe import config


def quality_plan(opts: ProbeOptions, scenario: dict[str, Any] | None = None) -> StageBound:
    """The parity pass (parity_pass.py): the prompt set to the reference one at a time, then to the reference and
    to the path under test `quality.concurrency` at a time. Each request at most TTFT + quality.max_tokens x ITL
    (or the request timeout). Planned as if a reference is given: without one nothing is sent."""
    scenario = scenario if scenario is not None else load_scenario(str(setting(opts, "agent.scenario")))
    cfg = config(opts, scenario)
    n = len(prompt_set(scenario, short=cfg.short_prompts, long_tokens=cfg.long_prompt_tokens, seed=cfg.seed))
    one_s, how = request_bound_s(dict(setting(opts, "contract.slo") or {}), cfg.max_tokens, request_timeout_s(opts))
    n_waves = n + 2 * waves(n, cfg.concurrency)
    return StageBound(
        "quality", f"output parity ({cfg.path}): {n} seeded greedy prompts to the reference alone, then to the "
        "reference and the path under test batched", 3 * n, n_waves * one_s,
        f"{n} prompts one at a time + 2 x {waves(n, cfg.concurrency)} waves at quality.concurrency "
        f"{cfg.concurrency}: {n_waves} waves x {one_s:g} s ({how}); the path checks' counter reads are not counted")
