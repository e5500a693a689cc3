"""The re-check's light settings as probe overrides, and its cost (docs/recheck.md "What it costs").

The re-check runs the registered probes (probes/run.py, through playbooks/tasks/probe.yml) with overrides made
here from the profile's `recheck` section (core/profile_model.py Recheck); its duration and load on the
deployment are the probes' own plans (probes/*/plan.py, core/bounds.py) with those overrides, added up. No probe
logic is here: only which settings a re-check turns down.

    python -m vllm_acceptance.recheck.plan overrides --profile RUN/evidence/profile.yml   # JSON, for recheck.yml
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.bounds import StageBound
from ..core.profile import Profile, load_profile
from ..probes.agent.plan import agent_plan
from ..probes.cache.plan import cache_plan
from ..probes.load.config import LoadProbeConfig
from ..probes.load.plan import load_plan
from ..probes.options import ProbeOptions


def load_concurrency(profile: Profile) -> int:
    """The load window's concurrency: recheck.load_fraction of contract.concurrency, rounded down, at least 1."""
    model = profile.model
    return max(1, math.floor(float(model.recheck.load_fraction) * int(model.contract.concurrency)))


def light_overrides(profile: Profile) -> dict[str, dict[str, Any]]:
    """probe kind -> the overrides its probe runs with in a re-check (ProbeOptions.overrides). The load window is
    one step at the fraction's concurrency, no ramp past it, no relaunch at a proposed limit; the agent case set a
    seeded sample at low concurrency without the under-load pass; the cache protocol's fewest sessions."""
    rc = profile.model.recheck
    agent = profile.model.agent
    k = load_concurrency(profile)
    calls = int(rc.agent_cases)
    return {
        "cache": {"cache.sessions": int(rc.cache_sessions), "cache.rounds": 1},
        "agent": {"agent.cases": calls, "agent.turn_budget": calls,
                  "agent.other_cases": min(int(rc.agent_other_cases), max(0, calls // 5)),
                  "agent.concurrency": int(rc.agent_concurrency),
                  "agent.case_seed": int(rc.agent_seed if rc.agent_seed is not None else agent.case_seed),
                  "agent.repeats": 1, "agent.consistency_cases": min(2, int(agent.consistency_cases)),
                  "agent.stream_cases": min(2, calls), "agent.under_load": 0},
        # contract.concurrency: the load probe judges its window at k (its contract step, mixed and soak run at it);
        # load.max_step k: no step past it (core/bounds.py ramp_plan doubles past the contract up to max_step).
        "load": {"contract.concurrency": k, "load.ramp": [k], "load.max_step": k,
                 "load.requests_per_step": int(rc.load_requests), "load.soak_s": rc.load_window_s,
                 "load.verify_limit": False},
        "metrics": {},
    }


@dataclass
class RecheckPlan:
    """What a re-check sends to the deployment and how long it may take (the probes' own bounds)."""

    profile: str
    probes: list[str]
    contract_concurrency: int
    load_fraction: float
    load_concurrency: int
    max_in_flight: int
    stages: list[StageBound] = field(default_factory=list)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return sum(s.requests or 0 for s in self.stages if s.in_total)

    @property
    def bound_s(self) -> float:
        return sum(s.bound_s for s in self.stages if s.in_total)

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile, "probes": self.probes, "contract_concurrency": self.contract_concurrency,
                "load_fraction": self.load_fraction, "load_concurrency": self.load_concurrency,
                "max_in_flight": self.max_in_flight, "requests": self.requests, "bound_s": self.bound_s,
                "stages": [asdict(s) for s in self.stages], "overrides": self.overrides}


def _opts(profile: Profile, kind: str, overrides: dict[str, Any]) -> ProbeOptions:
    return ProbeOptions(kind=kind, base_url="http://plan.invalid/v1", model=profile.model.model.served_name
                        or profile.model.model.name, out_dir=Path("."), profile=profile, overrides=overrides)


def recheck_plan(profile: Profile) -> RecheckPlan:
    """The re-check's stages from each probe's plan with the light overrides. Attach only: the cache probe never
    restarts the server (cache_plan restart=False) and the load probe never relaunches it (ready_s None)."""
    probes = list(profile.model.recheck.probes)
    overrides = light_overrides(profile)
    stages: list[StageBound] = []
    in_flight = [1]
    if "cache" in probes:
        stages += cache_plan(_opts(profile, "cache", overrides["cache"]), restart=False)
    if "agent" in probes:
        stages.append(agent_plan(_opts(profile, "agent", overrides["agent"]), under_load=0))
        in_flight.append(int(overrides["agent"]["agent.concurrency"]))
    if "load" in probes:
        cfg = LoadProbeConfig.from_profile(profile, overrides["load"], model=profile.model.model.served_name or "")
        stages += load_plan(cfg, ready_s=None)
        in_flight.append(cfg.contract_concurrency)
    return RecheckPlan(profile=profile.name, probes=probes,
                       contract_concurrency=int(profile.model.contract.concurrency),
                       load_fraction=float(profile.model.recheck.load_fraction),
                       load_concurrency=load_concurrency(profile), max_in_flight=max(in_flight), stages=stages,
                       overrides={k: v for k, v in overrides.items() if k in probes})


def render_text(plan: RecheckPlan) -> str:
    lines = [f"re-check plan (profile {plan.profile}; attach only: nothing is launched, restarted or relaunched)",
             f"  probes: {', '.join(plan.probes)}; node chain read-only (preflight), the server's identity (attach)",
             f"  load on the deployment: at most {plan.max_in_flight} request(s) in flight; the load window at "
             f"concurrency {plan.load_concurrency} = recheck.load_fraction {plan.load_fraction:g} of the contract's "
             f"{plan.contract_concurrency}",
             f"  requests: {plan.requests} counted ahead (the load window's soak sends more for its "
             "recheck.load_window_s)",
             f"  duration: at most {plan.bound_s / 60:.1f} min of probes ({plan.bound_s:.0f} s, the probes' own "
             "bounds), plus the playbook's preflight and attach"]
    for stage in plan.stages:
        if not stage.in_total:
            continue
        sent = "?" if stage.requests is None else str(stage.requests)
        lines.append(f"    {stage.name:<18} {sent:>5} req  <= {stage.bound_s:8.0f} s  {stage.what}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.recheck.plan")
    parser.add_argument("what", choices=("overrides", "plan"))
    parser.add_argument("--profile", required=True, type=Path, help="the profile the re-check runs with (the signed "
                                                                    "run's evidence/profile.yml)")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    if args.what == "overrides":
        print(json.dumps({k: v for k, v in light_overrides(profile).items() if k in profile.model.recheck.probes}))
    else:
        print(json.dumps(recheck_plan(profile).to_dict(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
