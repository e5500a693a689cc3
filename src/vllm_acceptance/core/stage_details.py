"""The stage details as typed data (issue 27 item 3; docs/architecture.md "The stage details, typed").

Each stage writes `stages/<stage>.json` (core/rundir.py `RunDir.write_stage`) and report.json carries them under
`stages`; the report, its diff, the re-open check and the monitoring read them through these classes, by field,
instead of chaining `.get(...) or {}`. One class per stage; the fields are the ones a reader uses, each with its
default here, once. A stage may write more (`extra="allow"`: kept, shown by the generic tables).

Reading is lenient on purpose: stage files come from older runs and from stages that stopped half-way. A value of
the wrong type is dropped (the field keeps its default) instead of failing the report, and a stage that is absent
or not a mapping reads as all defaults. Rows of tables (load steps, cache requests, agent cases and exchanges) and
the agent's rates stay mappings: their readers render them as tables.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Number = int | float


class Details(BaseModel):
    """One stage's details; unknown fields kept."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def read(cls, value: Any) -> Self:
        """The details in `value` (a stage file's mapping); fields of the wrong type dropped, never an error."""
        if not isinstance(value, dict):
            return cls()
        data = {str(k): v for k, v in value.items()}
        while True:
            try:
                return cls.model_validate(data)
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e.get("loc")}
                if not bad & set(data):
                    return cls()
                for key in bad:
                    data.pop(key, None)

    def value(self, name: str) -> Any:
        """A field named at run time (a declared one or one the stage wrote beyond them); None when absent."""
        return getattr(self, name, None)

    def has(self, name: str) -> bool:
        """Whether the stage wrote `name` (a default does not count)."""
        return name in self.model_fields_set

    def document(self) -> dict[str, Any]:
        """What the stage wrote, as a mapping (for the generic tables and templates)."""
        return self.model_dump(exclude_unset=True)

    def __bool__(self) -> bool:
        return bool(self.model_fields_set)


class PreflightDetails(Details):
    hosts: dict[str, Any] = Field(default_factory=dict)   # node name -> that node's facts (driver, image, GPUs)


class ServeDetails(Details):
    version: str | None = None
    vllm_version: str | None = None
    model: str | None = None
    base_url: str | None = None
    max_model_len: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: Number | None = None
    max_concurrency_len: int | None = None
    ready_s: Number | None = None
    tp_size: int | None = None
    pp_size: int | None = None
    dp_size: int | None = None
    world_size: int | None = None
    dist_backend: str | None = None
    nccl_version: str | None = None
    cache_config: dict[str, Any] = Field(default_factory=dict)
    warnings: list[Any] = Field(default_factory=list)
    errors: list[Any] = Field(default_factory=list)
    fallbacks: list[Any] = Field(default_factory=list)
    nccl_errors: list[Any] = Field(default_factory=list)
    # A P/D deployment (serve/pools.py serve_record): the router users call, and each pool's instances
    # {"name", "base_url", "metrics_url", "stop_command", "start_command"}: what the probes get as ProbeOptions.pools.
    entry_point: str | None = None
    pools: dict[str, list[dict[str, str]]] = Field(default_factory=dict)


class Workload(Details):
    """The shape of the load probe's ramp sessions (probes/load/)."""

    context_tokens: Number | None = None
    ramp_context_tokens: Number | None = None
    prompt_tokens: Number | None = None
    output_tokens: Number | None = None


class LoadDetails(Details):
    contract_concurrency: Number | None = None
    knee: Number | None = None
    steps: list[Any] = Field(default_factory=list)
    workload: Workload | None = None
    limits: dict[str, Any] | None = Field(default_factory=dict)


class CacheDetails(Details):
    block_size: int | None = None
    shared_prefix_tokens: int | None = None
    expected_hot_hits: Number | None = None
    requests: list[Any] = Field(default_factory=list)


class AgentDetails(Details):
    rates: dict[str, Any] = Field(default_factory=dict)
    cases: list[Any] = Field(default_factory=list)
    exchanges: list[Any] = Field(default_factory=list)
    evidence_root: str | None = None


class TeardownDetails(Details):
    """What happened to the server at the end of the run (the vllm_serve role's stop tasks)."""

    action: str | None = None
    runtime: str | None = None
    container: str | None = None
    pid: int | str | None = None
    nodes: list[str] = Field(default_factory=list)
    gone: bool | None = None
    when: str | None = None
    left_on: list[str] = Field(default_factory=list)
    port_closed: bool | None = None
    base_url: str | None = None


class StageDetails(BaseModel):
    """Every stage's details of one run (report.json `stages`)."""

    preflight: PreflightDetails = Field(default_factory=PreflightDetails)
    serve: ServeDetails = Field(default_factory=ServeDetails)
    cache: CacheDetails = Field(default_factory=CacheDetails)
    agent: AgentDetails = Field(default_factory=AgentDetails)
    load: LoadDetails = Field(default_factory=LoadDetails)
    teardown: TeardownDetails = Field(default_factory=TeardownDetails)

    @classmethod
    def of(cls, report: Any) -> StageDetails:
        """The stages of a report.json mapping; all defaults when it has none."""
        stages = report.get("stages") if isinstance(report, dict) else None
        return cls.from_stages(stages)

    @classmethod
    def from_stages(cls, stages: Any) -> StageDetails:
        stages = stages if isinstance(stages, dict) else {}
        return cls(**{name: kind.read(stages.get(name)) for name, kind in STAGE_TYPES.items()})


STAGE_TYPES: dict[str, type[Details]] = {
    "preflight": PreflightDetails, "serve": ServeDetails, "cache": CacheDetails, "agent": AgentDetails,
    "load": LoadDetails, "teardown": TeardownDetails,
}
