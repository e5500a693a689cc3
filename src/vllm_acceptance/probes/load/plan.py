"""The load probe's own plan: its stages, requests and upper bounds (core/bounds.py), from the settings it runs
with (LoadProbeConfig) and the code paths of probes/load/stages.py and soak.py; `plan` adds them up
(docs/plan.md "How each bound is computed")."""

from __future__ import annotations

from ...core.bounds import StageBound, ramp_bound, request_bound_s, step_bound_s, step_requests
from .config import LoadProbeConfig
from .stages import MIXED_WINDOWS

# propose_limits (probes/load/rules.py) proposes at most two limits: fewer sessions, then a shorter context.
MAX_PROPOSED_LIMITS = 2


def load_plan(cfg: LoadProbeConfig, ready_s: float | None = None) -> list[StageBound]:
    """The load probe's stages in the order probes/load/probe.py runs them. `ready_s`: the bound of a relaunch
    (launch.ready_timeout_s) where a proposed limit is verified on a relaunched server, None where the client is
    driven at it on the server as launched."""
    timeout, deadline = cfg.request_timeout_s, cfg.stage_timeout_s
    long_s, long_how = request_bound_s(cfg.slo, cfg.max_output_tokens, timeout)
    short_s, short_how = request_bound_s(cfg.slo, cfg.output_tokens, timeout)
    c = cfg.contract_concurrency
    # stage_context_contract: at the contract, one token over, and one over the served max_model_len where the
    # launch serves more than the contract (each with the contract's max output tokens).
    wide = cfg.max_model_len > cfg.context_tokens + cfg.max_output_tokens
    contract_n = 3 if wide else 2
    ramp = ramp_bound(cfg.ramp, c, cfg.ramp_bound, cfg.requests_per_step, long_s, deadline, cfg.ramp_budget_s)
    step_how = (f"each step max(load.requests_per_step {cfg.requests_per_step}, c) requests in ceil(n / c) waves x "
                f"{long_s:g} s ({long_how}), at most load.stage_timeout_s {deadline:g} s")
    past = (f"; the steps past the contract start only while the ramp has run under load.ramp_budget_s "
            f"{cfg.ramp_budget_s:g} s: the last ends within that + its own bound" if ramp.budgeted else "")
    out = [
        StageBound("long_prompt", f"one prompt of {min(cfg.long_prompt_tokens, cfg.context_tokens)} tokens", 1,
                   long_s, f"1 request: {long_how}"),
        StageBound("context_contract", "at the contracted context, one token over" + (
                   f", one over the served max_model_len {cfg.max_model_len}" if wide else ""), contract_n,
                   contract_n * long_s, f"{contract_n} requests one at a time x {long_s:g} s"),
        StageBound("ramp", f"concurrency {ramp.describe()}", ramp.requests, ramp.bound_s, step_how + past,
                   steps=[{"concurrency": k, "requests": step_requests(cfg.requests_per_step, k),
                           "bound_s": ramp.step_s[k], "always": k in ramp.always}
                          for k in ramp.always + ramp.budgeted]),
        verified_limits(cfg, long_s, ready_s),
    ]
    # stage_mixed: a lone repeated request, then each window's 2 x c requests at c, then a lone repeated one.
    mixed_n = MIXED_WINDOWS * 2 * c
    window_s = step_bound_s(2 * c, c, long_s, deadline)
    mixed_s = MIXED_WINDOWS * window_s + (MIXED_WINDOWS + 1) * short_s
    out.append(StageBound("mixed", f"short, long, cold and repeated at concurrency {c} (or the verified limit)",
                          mixed_n + MIXED_WINDOWS + 1, mixed_s,
                          f"{MIXED_WINDOWS} windows of 2 x c requests in 2 waves x {long_s:g} s (at most "
                          f"load.stage_timeout_s) + {MIXED_WINDOWS + 1} lone repeated x {short_s:g} s"))
    # stage_soak: batches of c short requests until load.soak_s has passed; the last batch started before it.
    out.append(StageBound("soak", f"steady load at concurrency {c} (or the verified limit) for load.soak_s", None,
                          cfg.soak_s + short_s, f"load.soak_s {cfg.soak_s:g} s + its last batch {short_s:g} s "
                                                f"({short_how})"))
    return out


def verified_limits(cfg: LoadProbeConfig, request_s: float, ready_s: float | None) -> StageBound:
    """One step at each proposed limit (stage_verify), on the server relaunched with its flags or with the client
    driven at it; only when the contract does not hold, so beside the total. The limit's concurrency is known
    only then (1 at the least): each step is bounded at that, and by load.stage_timeout_s."""
    n = MAX_PROPOSED_LIMITS
    step = step_bound_s(step_requests(cfg.requests_per_step, 1), 1, request_s, cfg.stage_timeout_s)
    requests = n * step_requests(cfg.requests_per_step, cfg.contract_concurrency)
    if ready_s is None:
        return StageBound("verified_limits", f"one step at each proposed limit (at most {n}), the client driven at "
                          "it; only when the contract does not hold", requests, n * step,
                          f"{n} x one step of at most {step:g} s; worst case, not in the total", in_total=False)
    return StageBound("verified_limits", f"relaunch at each proposed limit (at most {n}), one step each; only "
                      "when the contract does not hold", requests, n * (ready_s + step),
                      f"{n} x (launch.ready_timeout_s {ready_s:g} s + one step of at most {step:g} s); worst case, "
                      "not in the total", in_total=False)


def step_count(cfg: LoadProbeConfig) -> int:
    """The ramp steps the load probe may run (stage_ramp walks exactly these)."""
    plan = ramp_bound(cfg.ramp, cfg.contract_concurrency, cfg.ramp_bound, cfg.requests_per_step, 0.0,
                      cfg.stage_timeout_s, cfg.ramp_budget_s)
    return len(plan.always) + len(plan.budgeted)
