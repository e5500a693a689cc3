"""Was the load generator itself the bottleneck? (docs/acceptance.md, "Capacity under load")

A capacity figure is the server's only when the client kept up: a worker process at the top of its
core, an event loop that wakes late, or sends that leave after their scheduled time all add
client time to every latency. The engine measures itself on every stage and step
(:func:`vllm_acceptance.load.stats.client_summary`); these rules judge that self-check. A
saturated step is ``inconclusive`` for capacity with the reason "load generator saturated" and the
recommendation to add worker processes or loadgen hosts; its figures never decide
``expand_capacity`` or ``limited_observation``. Thresholds come from the profile (``loadgen:``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.findings import Finding, Status
from ..core.profile_model import Loadgen
from . import registry

SATURATED = "load generator saturated"
RECOMMENDATION = ("re-run with more load generator worker processes (profile loadgen.processes) or more "
                  "loadgen hosts (inventory group loadgen), on hosts not shared with other work; the "
                  "server's figures of this step are not evidence either way")
_DEFAULTS = Loadgen()
DEFAULT_CHUNK_US = 5.0  # read-side cost per streamed chunk before one is measured (benchmarks/loadgen_ceiling.py)


@dataclass(frozen=True)
class ClientLimits:
    """When a load generator counts as saturated (profile section ``loadgen``)."""

    # the defaults are the profile model's (core/profile_model.py Loadgen), written once there
    max_cpu_pct: float = float(_DEFAULTS.max_cpu_pct)    # CPU of one worker process, % of one core
    max_send_lag_p99_s: float = float(_DEFAULTS.max_send_lag_p99_s)   # sent - scheduled, p99 over the step
    send_lag_ttft_fraction: float = float(_DEFAULTS.send_lag_ttft_fraction)  # ... and this share of TTFT p95
    max_loop_lag_p99_s: float = float(_DEFAULTS.max_loop_lag_p99_s)   # event-loop lag p99 of any worker
    processes: int | None = None        # worker processes per host; None: sized to the work ("auto")
    target_cpu_pct: float = float(_DEFAULTS.target_cpu_pct)           # sizing: expected CPU per worker process

    @classmethod
    def from_profile(cls, get: Callable[[str, Any], Any]) -> ClientLimits:
        """`get(dotted, default)` reads the profile (with overrides), as LoadProbeConfig does."""
        d = cls()
        processes = get("loadgen.processes", "auto")
        return cls(max_cpu_pct=float(get("loadgen.max_cpu_pct", d.max_cpu_pct)),
                   max_send_lag_p99_s=float(get("loadgen.max_send_lag_p99_s", d.max_send_lag_p99_s)),
                   send_lag_ttft_fraction=float(get("loadgen.send_lag_ttft_fraction", d.send_lag_ttft_fraction)),
                   max_loop_lag_p99_s=float(get("loadgen.max_loop_lag_p99_s", d.max_loop_lag_p99_s)),
                   processes=None if processes in (None, "auto") else int(processes),
                   target_cpu_pct=float(get("loadgen.target_cpu_pct", d.target_cpu_pct)))

    def send_lag_limit_s(self, slo: Mapping[str, Any]) -> float:
        """The send-lag bound: the absolute one, or a fraction of the TTFT SLO when that is tighter."""
        ttft = slo.get("ttft_p95_s")
        if ttft is None:
            return self.max_send_lag_p99_s
        return min(self.max_send_lag_p99_s, self.send_lag_ttft_fraction * float(ttft))

    def to_dict(self, slo: Mapping[str, Any]) -> dict[str, Any]:
        return {"max_cpu_pct": self.max_cpu_pct, "max_send_lag_p99_s": self.send_lag_limit_s(slo),
                "max_loop_lag_p99_s": self.max_loop_lag_p99_s}


def saturation(client: Mapping[str, Any] | None, limits: ClientLimits, slo: Mapping[str, Any]) -> list[str]:
    """Why the client was saturated during a step; [] when it kept up. No self-check cannot pass."""
    if not client or not client.get("processes"):
        return ["no load generator self-check was recorded for this step"]
    reasons = []
    for proc in client["processes"]:
        name = f"{proc.get('host') + ' ' if proc.get('host') else ''}worker process {proc.get('process', '?')}"
        cpu = proc.get("cpu_pct")
        if cpu is not None and cpu > limits.max_cpu_pct:
            reasons.append(f"{name} used {cpu:.0f}% of a core (limit {limits.max_cpu_pct:g}%)")
        lag = (proc.get("loop_lag_s") or {}).get("p99")
        if lag is not None and lag > limits.max_loop_lag_p99_s:
            reasons.append(f"{name}: event-loop lag p99 {lag * 1e3:.1f} ms "
                           f"(limit {limits.max_loop_lag_p99_s * 1e3:g} ms)")
    send = (client.get("send_lag_s") or {}).get("p99")
    bound = limits.send_lag_limit_s(slo)
    if send is not None and send > bound:
        reasons.append(f"send lag p99 {send * 1e3:.2f} ms behind the schedule (limit {bound * 1e3:g} ms)")
    return reasons


def judge_client(client: Mapping[str, Any] | None, limits: ClientLimits, slo: Mapping[str, Any]) -> dict[str, Any]:
    """The self-check as kept in a step row: figures, the verdict on them, and the limits used."""
    reasons = saturation(client, limits, slo)
    out = {k: v for k, v in (client or {}).items()}
    out.update({"saturated": bool(reasons), "reasons": reasons, "limits": limits.to_dict(slo)})
    return out


def workers_for(chunks_per_s: float | None, chunk_us: float | None, limits: ClientLimits, cpus: int) -> int:
    """Worker processes for an expected streamed-chunk rate, each kept near ``target_cpu_pct``."""
    if limits.processes:
        return limits.processes
    if not chunks_per_s:
        return 1
    need = chunks_per_s * (chunk_us or DEFAULT_CHUNK_US) / 1e6 / (limits.target_cpu_pct / 100.0)
    return max(1, min(max(1, cpus), math.ceil(need)))


def first_break_trusted(steps: Iterable[Mapping[str, Any]]) -> bool:
    """True when the ramp's first step that misses the SLO had a client that kept up, and so did
    every step below it: that failure is the server's, whatever happened at higher steps."""
    for step in sorted(steps, key=lambda s: s["concurrency"]):
        if (step.get("client") or {}).get("saturated", True):
            return False
        if not step["meets_slo"]:
            return True
    return False


def overrule(finding: Finding, checks: list[tuple[str, Mapping[str, Any]]], *, trusted_failure: bool = False
             ) -> Finding:
    """A capacity finding whose steps ran on a saturated client becomes inconclusive.

    `checks`: (step label, judged self-check) of the stage. `trusted_failure`: the failure was found
    on a step that the client carried (see :func:`first_break_trusted`), so it stands.
    """
    bad = [(label, c) for label, c in checks if c.get("saturated")]
    if not bad or finding.status in (Status.MISSING, Status.NOT_APPLICABLE):
        return finding
    if finding.status == Status.FAIL and trusted_failure:
        finding.reason += f"; ({SATURATED} only above the failing step: {', '.join(label for label, _ in bad)})"
        return finding
    was = f"{finding.status.value}{': ' + finding.reason if finding.reason else ' on its own'}"
    finding.status = Status.INCONCLUSIVE
    finding.reason = (f"{SATURATED} in {', '.join(label for label, _ in bad)}: "
                      + "; ".join(r for _, c in bad for r in c.get("reasons", [])[:3])
                      + f" (the figures alone would have said {was})")
    finding.action = RECOMMENDATION
    return finding


LOADGEN = "capacity.loadgen"


def loadgen_finding(checks: list[tuple[str, Mapping[str, Any]]], evidence: list[str]) -> Finding:
    """``capacity.loadgen``: did the client keep up on every stage and step of the load probe?"""
    check = registry.get(LOADGEN)
    observed = {label: {"saturated": c.get("saturated"), "workers": c.get("workers"),
                        "max_cpu_pct": c.get("max_cpu_pct"), "max_loop_lag_p99_s": c.get("max_loop_lag_p99_s"),
                        "send_lag_p99_s": (c.get("send_lag_s") or {}).get("p99"), "chunk_us": c.get("chunk_us"),
                        "reasons": c.get("reasons")} for label, c in checks}
    limits = checks[0][1].get("limits") if checks else None
    if not checks:
        return check.missing(None, "no load stage recorded a client self-check", evidence=evidence)
    bad = [label for label, c in checks if c.get("saturated")]
    if bad:
        return check.inconclusive(None, observed=observed, expected=limits, evidence=evidence,
                                  reason=f"{SATURATED} in {', '.join(bad)}", action=RECOMMENDATION)
    return check.passed(None, observed=observed, expected=limits, evidence=evidence)
