"""The typed profile (issue 27 item 3): one pydantic v2 model per section of schemas/profile.schema.json, built
once from the merged profile after the JSON Schema accepted it (core/profile.py keeps that path, and its
messages, for validation). Every default a reader uses is written here, once; a field the profile must state
has none. Readers take `Profile.model` (`profile.model.launch.ready_timeout_s`); a reader that names a field
by a string (a probe's `--set` override, the report's contract rows) uses `ProfileModel.at("load.soak_s")`.

A probe run without a profile (`vllm-acceptance probe` with no --profile) reads `ProfileModel.default_of`:
the field's default here, else NO_PROFILE (the few values a profile must state, for that case only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Number = int | float          # a JSON Schema "number": an int stays an int (900, never 900.0)
Version = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+){0,3}$")]
Date = Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
PosNum = Annotated[Number, Field(gt=0)]
PosInt = Annotated[int, Field(ge=1)]
Share = Annotated[Number, Field(ge=0, le=1)]
NonNeg = Annotated[Number, Field(ge=0)]
NonNegInt = Annotated[int, Field(ge=0)]
EnvMap = dict[str, str]


class Section(BaseModel):
    """A section of the schema with `additionalProperties: false`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def stated(self, name: str) -> bool:
        """Whether the profile wrote the field (a reader with a default of its own, e.g. the lab's address)."""
        return name in self.model_fields_set

    def document(self) -> dict[str, Any]:
        """The section as the profile wrote it (only the fields it set, by their schema names)."""
        return self.model_dump(by_alias=True, exclude_unset=True)


class OpenSection(Section):
    """A section of the schema without `additionalProperties: false` (other keys kept)."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class Lineage(Section):
    owner: Annotated[str, Field(min_length=1)]
    exit_date: Date
    base_profile: str
    source_repo: str | None = None
    source_branch: str | None = None
    source_commit: str | None = None
    dependency_sources: list[str] = []
    compile_options: dict[str, str | bool | int | float] = {}
    inputs: dict[str, str] = {}
    dockerfile: str | None = None
    lock_files: list[str] = []
    patches: list[str] = []
    build_log: str | None = None
    image_digest: str | None = None
    rollback_image: str | None = None


class Recipe(Section):
    source: str
    status: Literal["pre-release", "stable", "lab", "experimental"]
    checked: Date
    notes: list[str] = []
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None = None
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    file: str | None = None
    hardware: str | None = None
    strategy: str | None = None
    variant: str | None = None
    features: list[str] = []


class Model(Section):
    name: Annotated[str, Field(min_length=1)]
    served_name: str | None = None     # the name the server answers to; absent: `name` (Model.served)
    path: str | None = None            # absent: `name`
    max_model_len: PosInt
    hybrid_cache: bool
    multimodal: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    weights_gb: NonNeg | None = None

    @property
    def served(self) -> str:
        return self.served_name or self.name


class Image(Section):
    reference: str | None              # null: no container (process runtime)
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None = None
    cuda_major: Annotated[int, Field(ge=10)] | None
    forbidden_tag_suffixes: list[str] = []


class Vllm(Section):
    min_version: Version
    install_source: str | None = None


class Driver(Section):
    min_branch: Annotated[int, Field(ge=1)] | None
    min_version: Version | None
    lts_branches: list[int] = []


class Hardware(Section):
    accelerator: Literal["nvidia", "none"]
    gpu_class: str | None = None
    gpus_per_node: NonNegInt | None = None     # absent: the inventory's facts (readers say what they fall back to)
    min_gpus: NonNegInt
    min_nodes: PosInt = 1
    nvswitch: bool = False
    memory_estimate_gb: NonNeg | None = None
    interconnect: Literal["nvlink", "rdma", "nvl", "none"] | None = None
    collective_backend: Literal["nccl", "gloo"] = "nccl"
    class_: Literal["h200", "b200", "b300", "gb200", "gb300", "mi355x"] | None = Field(None, alias="class")
    nvlink_domain: Literal["mnnvl", "nvswitch", "none"] | None = None   # absent: the class's (hardware.py)
    fabric_manager: Literal["node", "switch_tray", "none"] | None = None  # absent: the class's (hardware.py)


class Parallel(Section):
    tensor: PosInt
    pipeline: PosInt | None = None
    data: PosInt | None = None
    expert: bool | None = None


class CommSettings(OpenSection):
    args: list[str] = []
    env: EnvMap = {}


class Multinode(Section):
    rdma: CommSettings = CommSettings()
    nvlink: CommSettings = CommSettings()
    nvl_env: EnvMap = {}
    # the variables set when the startup log shows the mlx5dv_reg_dmabuf_mr error
    dmabuf_workaround_env: EnvMap = {"NCCL_DMABUF_ENABLE": "0"}


class Provenance(Section):
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    multinode: dict[str, str] = {}


class Launch(Section):
    runtime: Literal["process", "docker", "podman"]
    args: list[str]
    env: EnvMap = {}
    host: str = "0.0.0.0"  # noqa: S104 - the address the server listens on
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    ready_timeout_s: PosNum = 900
    required_flags: list[str] = []
    multinode: Multinode = Multinode()
    site_env: EnvMap = {}
    provenance: Provenance | None = None


class Slo(Section):
    ttft_p95_s: PosNum
    itl_p95_s: PosNum | None = None
    e2e_p95_s: PosNum
    queue_p95_s: PosNum | None = None
    max_error_rate: Share | None = None


class Contract(Section):
    concurrency: PosInt
    context_tokens: PosInt
    max_output_tokens: PosInt = 64
    slo: Slo


class Thresholds(Section):
    tool_format_error_rate: Share = 0.01
    max_preemptions: NonNegInt = 0
    nccl_busbw_gbps: NonNeg | None = None
    memory_growth_pct: NonNeg = 20
    schema_accuracy_min: Share = 0.99
    tool_abstain_min: Share = 0.9
    reference_agreement_min: Share = 0.80
    cache_hit_tolerance_blocks: NonNegInt = 1


class Cache(Section):
    sessions: PosInt
    capacity_relies_on_reuse: bool
    retention_interval: NonNegInt | None = None
    rounds: NonNegInt = 3
    min_prefill_drop: Share = 0.0
    request_timeout_s: PosNum | None = None    # absent: load.request_timeout_s


class Agent(Section):
    scenario: str
    repeats: PosInt = 3
    temperature: NonNeg = 0.0
    max_tokens: PosInt = 256
    images: bool = False
    image_tokens: PosInt | None = None
    turn_budget: PosInt = 1000
    concurrency: PosInt = 8
    retry_attempts: NonNegInt = 1
    cases: PosInt = 300
    other_cases: NonNegInt = 60
    case_seed: int = 0
    seed: NonNegInt | None = None
    under_load: NonNegInt = 0
    case_tools: Literal["sample", "pack"] = "sample"
    consistency_cases: NonNegInt = 10
    request_timeout_s: PosNum | None = None    # absent: load.request_timeout_s


class Load(Section):
    ramp: Annotated[list[PosInt], Field(min_length=1)]
    requests_per_step: PosInt = 8
    prompt_tokens: PosInt = 256
    output_tokens: PosInt = 32
    long_prompt_tokens: PosInt = 1400
    soak_s: NonNeg = 20
    request_timeout_s: PosNum
    stage_timeout_s: PosNum = 300
    sample_interval_s: Annotated[Number, Field(gt=0, le=60)] = 0.25
    max_step: PosInt | None = None             # absent: 4 x contract.concurrency
    ramp_budget_s: PosNum = 300
    contract_share: Share = 0.5
    verify_limit: bool = True


class Loadgen(Section):
    max_cpu_pct: Annotated[Number, Field(ge=0, le=100)] = 90.0
    max_send_lag_p99_s: NonNeg = 0.005
    send_lag_ttft_fraction: Share = 0.1
    max_loop_lag_p99_s: NonNeg = 0.05
    processes: Literal["auto"] | PosInt = "auto"
    target_cpu_pct: Annotated[Number, Field(gt=0, le=100)] = 60.0


class Review(Section):
    period_days: PosInt = 30
    owner: str | None = None


class Remediation(Section):
    evidence_max_age_h: PosInt = 72


class ProfileModel(Section):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    extends: Annotated[str, Field(min_length=1)] | None = None
    description: str | None = None
    experimental: bool = False
    lineage: Lineage | None = None
    recipe: Recipe
    model: Model
    image: Image
    vllm: Vllm
    driver: Driver
    hardware: Hardware
    parallel: Parallel
    launch: Launch
    contract: Contract
    thresholds: Thresholds = Thresholds()
    cache: Cache
    agent: Agent
    load: Load
    loadgen: Loadgen = Loadgen()
    review: Review = Review()
    remediation: Remediation = Remediation()

    def at(self, dotted: str, default: Any = None) -> Any:
        """The field named by a dotted path ("load.soak_s"), its default when the profile left it out; a section
        as the profile wrote it (a mapping); `default` only for a name the model does not have."""
        node: Any = self
        for part in dotted.split("."):
            if isinstance(node, BaseModel):
                name = _attribute(type(node), part)
                if name is None:
                    return default
                node = getattr(node, name)
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                return default
        return node.document() if isinstance(node, Section) else node

    @classmethod
    def default_of(cls, dotted: str, default: Any = None) -> Any:
        """The model's default for a field (a run without a profile): its default here, else NO_PROFILE's."""
        model: type[BaseModel] = cls
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            name = _attribute(model, part)
            if name is None:
                return default
            info = model.model_fields[name]
            if i == len(parts) - 1:
                if not info.is_required():
                    value = info.get_default(call_default_factory=True)
                    return value.document() if isinstance(value, Section) else value
                return NO_PROFILE.get(dotted, default)
            inner = _section_type(info.annotation)
            if inner is None:
                return default
            model = inner
        return default


def _attribute(model: type[BaseModel], key: str) -> str | None:
    """The attribute of `model` behind the schema's key (`class` is `class_`)."""
    for name, info in model.model_fields.items():
        if (info.alias or name) == key:
            return name
    return None


def _section_type(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


# What a probe run without a profile uses for a field every profile states (the schema requires it).
NO_PROFILE: dict[str, Any] = {
    "contract.concurrency": 4,
    "contract.context_tokens": 1536,
    "contract.slo": {},
    "model.max_model_len": 2048,
    "model.hybrid_cache": False,
    "cache.sessions": 3,
    "cache.capacity_relies_on_reuse": True,
    "agent.scenario": "ops-agent",
    "load.ramp": [1, 2, 4],
    "load.request_timeout_s": 60,
    "parallel": {},
}


def setting_of(model: ProfileModel | None, dotted: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """A setting named by a dotted path: the override (`--set`) first, then the profile's field (its model
    default when left out), then, without a profile, `ProfileModel.default_of`."""
    if overrides and dotted in overrides:
        return overrides[dotted]
    return model.at(dotted) if model is not None else ProfileModel.default_of(dotted)
