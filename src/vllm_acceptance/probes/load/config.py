"""The load probe's settings (LoadProbeConfig): the contract, the ramp, the stages' sizes and timeouts, the
thresholds and the loadgen hosts, read from the profile and the overrides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.profile import Profile
from ...core.profile_model import setting_of
from ...rules.loadgen import ClientLimits


@dataclass
class LoadProbeConfig:
    model: str
    contract_concurrency: int = 4
    context_tokens: int = 1536
    max_output_tokens: int = 64
    max_model_len: int = 2048
    ramp: list[int] = field(default_factory=lambda: [1, 2, 4])
    max_step: int | None = None            # the ramp's bound past the contract (default 4 x contract)
    ramp_budget_s: float = 300.0           # no new step past the contract after this long
    contract_share: float = 0.5            # share of ramp requests at the contracted context
    requests_per_step: int = 8
    prompt_tokens: int = 256
    output_tokens: int = 32
    long_prompt_tokens: int = 1400
    soak_s: float = 20.0
    request_timeout_s: float = 60.0
    stage_timeout_s: float = 300.0
    slo: dict[str, float] = field(default_factory=dict)
    max_preemptions: int = 0
    memory_growth_pct: float = 20.0
    api_key: str | None = None
    server_pid: int | None = None
    server_log: str | None = None
    sample_interval_s: float = 0.25
    verify_limit: bool = True
    nodes: int | None = None
    interconnect: str | None = None
    parallel: dict[str, Any] = field(default_factory=dict)
    client: ClientLimits = field(default_factory=ClientLimits)  # the load generator's self-check
    # Loadgen hosts besides the controller (load/agent.py): their agents send the ramp, mixed and soak steps.
    agent_hosts: list[str] = field(default_factory=list)
    agent_endpoints: list[dict[str, Any]] = field(default_factory=list)
    agent_token: str | None = None

    @property
    def ramp_bound(self) -> int:
        return self.max_step or 4 * self.contract_concurrency

    @classmethod
    def from_profile(cls, profile: Profile | None, overrides: dict[str, Any], **kw: Any) -> LoadProbeConfig:
        model = profile.model if profile else None

        def get(dotted: str, _default: Any = None) -> Any:   # ClientLimits.from_profile passes its own default
            return setting_of(model, dotted, overrides)     # the model's (core/profile_model.py) is the one

        max_step = get("load.max_step")
        return cls(
            contract_concurrency=int(get("contract.concurrency")),
            context_tokens=int(get("contract.context_tokens")),
            max_output_tokens=int(get("contract.max_output_tokens")),
            max_model_len=int(get("model.max_model_len")),
            ramp=[int(c) for c in get("load.ramp")],
            max_step=int(max_step) if max_step is not None else None,
            ramp_budget_s=float(get("load.ramp_budget_s")),
            contract_share=float(get("load.contract_share")),
            requests_per_step=int(get("load.requests_per_step")),
            prompt_tokens=int(get("load.prompt_tokens")),
            output_tokens=int(get("load.output_tokens")),
            long_prompt_tokens=int(get("load.long_prompt_tokens")),
            soak_s=float(get("load.soak_s")),
            request_timeout_s=float(get("load.request_timeout_s")),
            stage_timeout_s=float(get("load.stage_timeout_s")),
            slo=dict(get("contract.slo")),
            max_preemptions=int(get("thresholds.max_preemptions")),
            memory_growth_pct=float(get("thresholds.memory_growth_pct")),
            sample_interval_s=float(get("load.sample_interval_s")),
            verify_limit=bool(get("load.verify_limit")),
            nodes=get("hardware.min_nodes") if model else None, interconnect=get("hardware.interconnect"),
            parallel=dict(get("parallel") or {}),
            client=ClientLimits.from_profile(get), **kw)
