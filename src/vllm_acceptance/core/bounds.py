"""The arithmetic of a run's upper bounds (docs/plan.md "How each bound is computed"): what one request, one
wave of requests, one ramp step and the whole ramp may take on a deployment that meets its contract, capped by
the timeouts the run enforces. The probes state their own plans with it (probes/load/plan.py,
probes/cache/plan.py, probes/agent/plan.py) from the settings they run with; `plan` adds them up, and the
progress line of a run (progress.py) says the same ramp steps and step bound.

A request that meets the contract gets its first token within the TTFT SLO and each next one within the ITL
SLO, so it ends within `ttft_p95_s + output_tokens x itl_p95_s` (not the e2e SLO: a contract that forces
4,096 output tokens at 0.1 s per token takes 410 s whatever its e2e SLO says). A request never runs past its
request timeout (the client cuts it), and a load step never past `load.stage_timeout_s` (the step's deadline).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StageBound:
    """One stage of a run as its probe plans it: the requests it sends (None: not counted ahead, the soak) and
    the most seconds it takes (`bound_s`), with how that was computed. `in_total`: False for what runs only when
    the contract does not hold (the relaunches at proposed limits)."""

    name: str
    what: str
    requests: int | None
    bound_s: float
    basis: str
    in_total: bool = True
    steps: list[dict[str, Any]] = field(default_factory=list)


def _num(slo: Mapping[str, Any], key: str) -> float | None:
    value = slo.get(key)
    return float(value) if value is not None and float(value) > 0 else None


def request_bound_s(slo: Mapping[str, Any], output_tokens: int, timeout_s: float) -> tuple[float, str]:
    """(the most seconds one request of `output_tokens` takes on a deployment that meets `slo`, how it was
    computed): TTFT + output tokens x ITL from the contract's SLO, at most the request timeout. Without a TTFT or
    ITL SLO the request timeout is the bound (the e2e SLO bounds a p95, not what the run waits)."""
    ttft, itl = _num(slo, "ttft_p95_s"), _num(slo, "itl_p95_s")
    timeout = float(timeout_s)
    if ttft is None or itl is None:
        return timeout, f"request timeout {timeout:g} s (the contract states no TTFT and ITL SLO)"
    contract = ttft + output_tokens * itl
    if contract >= timeout:
        return timeout, (f"request timeout {timeout:g} s (TTFT {ttft:g} s + {output_tokens:,} output tokens x ITL "
                         f"{itl:g} s = {contract:g} s is longer)")
    return contract, f"TTFT {ttft:g} s + {output_tokens:,} output tokens x ITL {itl:g} s = {contract:g} s"


def waves(requests: int, concurrency: int) -> int:
    """Waves of `requests` sent with `concurrency` in flight: a request slot frees within one request's bound."""
    return math.ceil(max(0, requests) / max(1, concurrency))


def ramp_plan(ramp: Sequence[int], contract: int, max_step: int) -> list[int]:
    """The ramp's steps: the profile's steps, then doubling past the contract up to ``max_step`` (the real
    knee). The load probe runs exactly these (probes/load/stages.py stage_ramp)."""
    steps = sorted({int(c) for c in ramp if c >= 1})
    if contract not in steps:
        steps = sorted({*steps, contract})
    nxt = steps[-1] * 2
    while nxt <= max_step:
        steps.append(nxt)
        nxt *= 2
    if steps[-1] < max_step and steps[-1] >= contract:
        steps.append(max_step)
    return steps


def step_requests(per_step: int, concurrency: int) -> int:
    """Requests of one load step at `concurrency`: `load.requests_per_step`, at least one per slot."""
    return max(int(per_step), int(concurrency))


def step_bound_s(requests: int, concurrency: int, request_s: float, stage_timeout_s: float) -> float:
    """One load step: its waves x one request's bound, at most the step's deadline (load.stage_timeout_s)."""
    return min(waves(requests, concurrency) * request_s, float(stage_timeout_s))


@dataclass(frozen=True)
class RampBound:
    always: list[int]           # the steps up to the contract: each runs (unless one breaks)
    budgeted: list[int]         # the steps past it: each starts only while the ramp has run under its budget
    requests: int               # all steps' requests (every step run)
    step_s: dict[int, float]    # each step's bound
    bound_s: float              # the whole ramp's bound

    def describe(self) -> str:
        text = ", ".join(str(c) for c in self.always)
        if self.budgeted:
            text += " then " + ", ".join(str(c) for c in self.budgeted) + " while under the ramp budget"
        return text


def ramp_bound(ramp: Sequence[int], contract: int, max_step: int, per_step: int, request_s: float,
               stage_timeout_s: float, budget_s: float) -> RampBound:
    """The ramp's steps and bound. The steps up to the contract all run; a step past it starts only while the
    ramp has run no longer than `budget_s` (stage_ramp), so the last one starts by `budget_s` and ends within its
    own bound: the ramp ends within max(steps up to the contract, budget + the longest later step), and never
    later than every step at its bound."""
    steps = ramp_plan(ramp, contract, max_step)
    step_s = {c: step_bound_s(step_requests(per_step, c), c, request_s, stage_timeout_s) for c in steps}
    always = [c for c in steps if c <= contract]
    budgeted = [c for c in steps if c > contract]
    first = sum(step_s[c] for c in always)
    later = [step_s[c] for c in budgeted]
    bound = min(first + sum(later), max(first, float(budget_s) + max(later))) if later else first
    return RampBound(always, budgeted, sum(step_requests(per_step, c) for c in steps), step_s, bound)
