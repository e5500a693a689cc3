"""Alert thresholds from the accepted run: every value with the figure it comes from, never another model's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.profile import Profile
from ..core.stage_details import StageDetails

KV_CEILING = 0.95          # above this vLLM starts preempting whatever was accepted
KV_HEADROOM = 0.10         # an accepted peak near zero still leaves room for ordinary variation
DEFAULT_MARGIN = 1.5       # latency drift allowed over the accepted p95 before a warning
DEFAULT_KV_MARGIN = 1.25
HIT_RATIO_FLOOR_FACTOR = 0.5


@dataclass(frozen=True)
class Threshold:
    key: str
    value: float
    source: str
    unit: str = ""




def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def accepted_slo(report: dict[str, Any], profile: Profile) -> dict[str, float]:
    """The profile's contracted SLO, overridden by the SLO the run's limits state (limited observation)."""
    slo = {k: float(v) for k, v in (profile.model.at("contract.slo") or {}).items() if _num(v) is not None}
    limits_slo = (report.get("limits") or {}).get("slo") or {}
    slo.update({k: float(v) for k, v in limits_slo.items() if _num(v) is not None})
    return slo


def accepted_concurrency(report: dict[str, Any], profile: Profile) -> tuple[int | None, str]:
    """The concurrency traffic was accepted at: the run's limit when it set one, else the contract."""
    limits = report.get("limits") or {}
    for key in ("client_concurrency", "max_num_seqs"):
        if _num(limits.get(key)) is not None:
            return int(limits[key]), f"report limits.{key}"
    contracted = _num(StageDetails.of(report).load.contract_concurrency)
    if contracted is not None:
        return int(contracted), "stages.load.contract_concurrency"
    if _num(profile.model.contract.concurrency) is not None:
        return int(profile.model.contract.concurrency), "profile contract.concurrency"
    return None, "no contracted concurrency"


def accepted_step(report: dict[str, Any], concurrency: int | None) -> dict[str, Any] | None:
    """The ramp step traffic was accepted at: the largest step <= the accepted concurrency that met the SLO."""
    steps = StageDetails.of(report).load.steps
    good = [s for s in steps if isinstance(s, dict) and s.get("meets_slo") and _num(s.get("concurrency")) is not None
            and (concurrency is None or s["concurrency"] <= concurrency)]
    return max(good, key=lambda s: s["concurrency"]) if good else None


def hot_hit_ratio(report: dict[str, Any]) -> tuple[float | None, str]:
    """Mean hits / prompt tokens of the clean hot requests of the cache stage (later sessions for hybrids)."""
    rows = StageDetails.of(report).cache.requests
    hot = [r for r in rows if isinstance(r, dict) and str(r.get("kind", "")).startswith("hot")
           and r.get("clean", True) and _num(r.get("hits")) is not None and _num(r.get("prompt_tokens"))]
    if not hot:
        return None, "no hot requests in stages.cache"
    later = [r for r in hot if (r.get("session") or 1) > 1]
    used = later or hot  # a hybrid model's first session may only create the retention
    ratio = sum(r["hits"] / r["prompt_tokens"] for r in used) / len(used)
    sessions = sorted({r.get("session") for r in used})
    return ratio, f"stages.cache: mean hits/prompt_tokens of {len(used)} hot requests (sessions {sessions})"


def derive_thresholds(report: dict[str, Any], profile: Profile, *, margin: float = DEFAULT_MARGIN,
                      kv_margin: float = DEFAULT_KV_MARGIN) -> dict[str, Threshold]:
    """Every alert threshold with the figure it comes from. A figure the run lacks yields no threshold."""
    out: dict[str, Threshold] = {}
    slo = accepted_slo(report, profile)
    slo_src = "report limits.slo" if (report.get("limits") or {}).get("slo") else "profile contract.slo"
    conc, conc_src = accepted_concurrency(report, profile)
    step = accepted_step(report, conc)
    at = f"stages.load.steps[concurrency={step['concurrency']}]" if step else ""

    def put(key: str, value: float | None, source: str, unit: str = "") -> None:
        if value is not None:
            out[key] = Threshold(key, round(float(value), 6), source, unit)

    for metric, slo_key in (("ttft", "ttft_p95_s"), ("e2e", "e2e_p95_s"), ("itl", "itl_p95_s")):
        slo_value = slo.get(slo_key)
        put(f"{metric}_p95_slo_s", slo_value, f"{slo_src}.{slo_key}", "s")
        figure = _num(step.get(f"{metric}_p95")) if step else None
        if figure is not None and figure > 0:
            drift = figure * margin
            # A drift warning only makes sense below the SLO: above it the SLO alert speaks.
            if slo_value is None or drift < slo_value:
                put(f"{metric}_p95_drift_s", drift, f"{at}.{metric}_p95={figure:.4g} s x margin {margin}", "s")
    put("queue_p95_slo_s", slo.get("queue_p95_s"),
        f"{slo_src}.queue_p95_s (the ramp records no per-step queue-time p95)", "s")
    put("error_ratio", max(slo.get("max_error_rate", 0.0), _num(step.get("error_rate")) or 0.0) if step
        else slo.get("max_error_rate"),
        f"max({slo_src}.max_error_rate, {at}.error_rate)" if step else f"{slo_src}.max_error_rate")
    if conc is not None:
        put("running_max", conc, f"accepted concurrency ({conc_src})")
    if step:
        put("waiting_max", _num(step.get("max_waiting")) or 0.0, f"{at}.max_waiting")
        peak = _num(step.get("max_kv_usage")) or 0.0
        put("kv_usage_max", min(KV_CEILING, max(peak * kv_margin, peak + KV_HEADROOM)),
            f"{at}.max_kv_usage={peak:.4g}: max(x {kv_margin}, + {KV_HEADROOM}), capped at {KV_CEILING}")
    allowed = _num(profile.model.thresholds.max_preemptions)
    if allowed is not None:
        accepted = _num(step.get("preemptions")) if step else None
        put("preemptions_max", max(allowed, accepted or 0.0),
            f"profile thresholds.max_preemptions={allowed:g}"
            + (f"; {at}.preemptions={accepted:g}" if accepted is not None else ""))
    ratio, ratio_src = hot_hit_ratio(report)
    if ratio is not None and ratio > 0:
        put("hit_ratio_accepted", ratio, ratio_src)
        put("hit_ratio_min", ratio * HIT_RATIO_FLOOR_FACTOR, f"{ratio_src} x {HIT_RATIO_FLOOR_FACTOR}")
    fmt = _num(profile.model.thresholds.tool_format_error_rate)
    agent_rate = _num(StageDetails.of(report).agent.rates.get("format_error_rate"))
    if fmt is not None:
        put("tool_retry_ratio", fmt, f"profile thresholds.tool_format_error_rate={fmt:g}"
            + (f" (accepted run: {agent_rate:g})" if agent_rate is not None else ""))
    return out


def monitoring_owner(report: dict[str, Any]) -> str:
    """The signed-off monitoring owner, else the owner the findings were assigned to."""
    signoff = report.get("signoff") or {}
    finding_owners = [f.get("owner") for f in report.get("findings") or [] if isinstance(f, dict) and f.get("owner")]
    return str(signoff.get("monitoring_owner") or report.get("owner") or (finding_owners[0] if finding_owners else None)
               or "unassigned: name a monitoring owner")
