"""The typed profile (issue 27 item 3): one pydantic v2 model per section of schemas/profile.schema.json, built
once from the merged profile after the JSON Schema accepted it (core/profile.py keeps that path, and its
messages, for validation). Every default a reader uses is written here, once; a field the profile must state
has none. Readers take `Profile.model` (`profile.model.launch.ready_timeout_s`); a reader that names a field
by a string (a probe's `--set` override, the report's contract rows) uses `ProfileModel.at("load.soak_s")`.

A probe run without a profile (`vllm-acceptance probe` with no --profile) reads `ProfileModel.default_of`:
the field's default here, else NO_PROFILE (the few values a profile must state, for that case only)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


@dataclass(frozen=True)
class Def:
    """A type the schema names once under $defs (core/profile_schema.py writes `{"$ref": "#/$defs/NAME"}`)."""

    name: str

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return {**handler(core_schema), "x-def": self.name}


@dataclass(frozen=True)
class Nullable:
    """The profile may write null for the field (else a field defaulting to None is one left out)."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        return {**handler(core_schema), "x-nullable": True}


NULL = Nullable()

Number = int | float          # a JSON Schema "number": an int stays an int (900, never 900.0)
Version = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+){0,3}$"), Def("version")]
Date = Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"), Def("date")]
PosNum = Annotated[Number, Field(gt=0), Def("posnum")]
PosInt = Annotated[int, Field(ge=1), Def("posint")]
Share = Annotated[Number, Field(ge=0, le=1)]
NonNeg = Annotated[Number, Field(ge=0)]
NonNegInt = Annotated[int, Field(ge=0)]
EnvMap = Annotated[dict[str, str], Def("envmap")]


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
    dependency_sources: list[str] = Field([], description=(
        "where dependencies came from: package indexes, base image reference and digest"))
    compile_options: dict[str, str | int | float | bool] = Field({}, description=(
        "build args and compile flags (CUDA_VERSION, TORCH_CUDA_ARCH_LIST, ...)"))
    inputs: dict[str, str] = Field({}, description=(
        "sha256 of every build input file (Dockerfile, lock files, patches), by path"))
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
    commit: Annotated[Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None, NULL] = Field(None, description=(
        "the recipe repository commit of the file the profile was generated from (recipes/vllm-"
        "project/SOURCE.yml); a change reopens acceptance"))
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = Field(None, description=(
        "sha256 of that recipe file; a change reopens acceptance"))
    file: str | None = Field(None, description=(
        "the vendored recipe file, relative to the checkout"))
    hardware: str | None = Field(None, description=(
        "the recipe's hardware id the profile was generated for"))
    strategy: str | None = Field(None, description=(
        "the recipe's strategy the profile was generated for"))
    variant: str | None = None
    pool: Literal["prefill", "decode"] | None = Field(None, description=(
        "the pd_cluster pool this profile serves (`from-recipe --pool`; src/vllm_acceptance/recipe/pools.py)"))
    features: list[str] = []


class Model(Section):
    name: Annotated[str, Field(min_length=1)]
    served_name: str | None = None     # the name the server answers to; absent: `name` (Model.served)
    path: str | None = None            # absent: `name`
    max_model_len: PosInt
    hybrid_cache: bool
    multimodal: bool = False
    tool_call_parser: Annotated[str | None, NULL] = None
    reasoning_parser: Annotated[str | None, NULL] = None
    weights_gb: NonNeg | None = None

    @property
    def served(self) -> str:
        return self.served_name or self.name


class Image(Section):
    reference: str | None = Field(description=(
        "null: no container (process runtime)"))              # null: no container (process runtime)
    digest: Annotated[Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")] | None, NULL] = None
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
    gpu_class: Annotated[str | None, NULL] = Field(None, description=(
        "substring of nvidia-smi's GPU name, e.g. GB300"))
    gpus_per_node: NonNegInt | None = None     # absent: the inventory's facts (readers say what they fall back to)
    min_gpus: NonNegInt
    min_nodes: Annotated[int, Field(ge=1)] = 1
    nvswitch: bool = False
    memory_estimate_gb: NonNeg | None = None
    interconnect: Literal["nvlink", "rdma", "nvl", "none"] | None = None
    collective_backend: Literal["nccl", "gloo"] = Field("nccl", description=(
        "the torch.distributed backend the in-image all-reduce must run on "
        "(interconnect.nccl_bandwidth); gloo only for an image whose torch has no CUDA (the CPU "
        "lab)"))
    class_: Literal["h200", "b200", "b300", "gb200", "gb300", "mi355x"] | None = Field(
        None, alias="class", description=(
        "the row of src/vllm_acceptance/data/hardware.yml (node shape, NVLink domain, bandwidth "
        "per fabric); absent: the profile's own values"))
    nvlink_domain: Literal["mnnvl", "nvswitch", "none"] | None = Field(None, description=(
        "mnnvl: the NVLink domain spans nodes (NVL72 trays); nvswitch: within one node (HGX); "
        "none. Absent: the class's"))   # absent: the class's (hardware.py)
    fabric_manager: Literal["node", "switch_tray", "none"] | None = Field(None, description=(
        "where Fabric Manager runs: node (nvidia-fabricmanager on the GPU node, version == "
        "driver), switch_tray (NMX-Controller: the GPUs' fabric state is the proof), none. "
        "Absent: the class's"))  # absent: the class's (hardware.py)


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
    left_out: dict[str, str] = Field({}, description=(
        "recipe flags the launch leaves out, by flag: the recipe field and why (e.g. --data-parallel-hybrid-lb "
        "across nodes: the launch uses vLLM's internal load balancing; src/vllm_acceptance/recipe/resolve.py)"))


class Launch(Section):
    runtime: Literal["process", "docker", "podman"]
    args: list[str]
    env: EnvMap = {}
    host: str = "0.0.0.0"  # noqa: S104 - the address the server listens on
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    ready_timeout_s: PosNum = 900
    required_flags: list[str] = Field([], description=(
        "flags that must be in effect on the running server"))
    multinode: Multinode = Multinode()
    site_env: EnvMap = Field({}, description=(
        "variables the recipe leaves to the site (placeholders such as $IFACE_NAME): set them in "
        "vllm_serve_multinode_env; never passed as written"))
    provenance: Provenance | None = Field(None, description=(
        "where each launch argument (by flag) and variable came from in the recipe "
        "(src/vllm_acceptance/recipe/generate.py)"))


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
    nccl_busbw_gbps: Annotated[NonNeg | None, NULL] = None
    memory_growth_pct: NonNeg = 20
    schema_accuracy_min: Share = 0.99
    tool_abstain_min: Share = Field(0.9, description=(
        "irrelevance cases of the agent case set (no tool fits): the 95 % lower bound of the "
        "share answered without a tool call must reach it (default 0.9)"))
    reference_agreement_min: Share = Field(0.80, description=(
        "agent.reference_agreement: the tool-call F1 on triggering against agent_reference_url "
        "must reach it (default 0.80, the K2-0905 threshold of Moonshot's K2-Vendor-Verifier)"))
    reference_min_cases: PosInt = Field(36, description=(
        "agent.reference_agreement / agent.reference_arguments: cases answered by both the deployment and the "
        "reference before any reference result counts; fewer is inconclusive, with the count (default 36: one "
        "case then moves the F1 by less than the 2.8-point margin between K2-Vendor-Verifier's lowest official "
        "run and its bound)"))
    reference_argument_min: Share = Field(0.9, description=(
        "agent.reference_arguments: the share of the cases both sides call whose arguments agree "
        "(enums and ids exact, numbers as numbers, free text after collapsing whitespace; default 0.9)"))
    wrong_tool_rate: Share = Field(0.01, description=(
        "agent.tool_choice: the 95 % upper bound of the share of call cases answered with a read tool the case "
        "does not expect must stay <= it (default 0.01)"))
    wrong_write_tool_rate: Share = Field(0.0, description=(
        "agent.tool_choice: the same for a write tool (scenario pack write_tools) the case does not expect; "
        "0 (the default) fails on any one: a wrong write acts"))
    cache_hit_tolerance_blocks: NonNegInt = 1


class Cache(Section):
    sessions: PosInt
    capacity_relies_on_reuse: bool
    retention_interval: Annotated[NonNegInt | None, NULL] = None
    rounds: NonNegInt = Field(3, description=(
        "repeated sends of one hot prefix after the sessions, judged against hybrid retention"))
    min_prefill_drop: Share = 0.0
    request_timeout_s: PosNum | None = Field(None, description=(
        "per-request timeout (seconds) of the cache probe; a request without a complete answer in"
        " time is reported by name and is never a pass (default: load.request_timeout_s)"))


class Agent(Section):
    scenario: str
    repeats: PosInt = 3
    temperature: NonNeg = 0.0
    max_tokens: PosInt = 256
    images: bool = False
    image_tokens: Annotated[Annotated[int, Field(ge=1)] | None, NULL] = Field(None, description=(
        "prompt tokens the probe's 16x16 image adds (agent.multimodal compares exactly when set)"))
    turn_budget: PosInt = Field(1000, description=(
        "the most tool-call turns the rate run may send; the turns needed follow from "
        "thresholds.tool_format_error_rate and schema_accuracy_min (zero errors in n turns bound "
        "a rate at about 3/n, 95 %), and the report states the resolution this budget buys"))
    concurrency: PosInt = Field(8, description=(
        "tool-call turns in flight at once during the rate run"))
    retry_attempts: NonNegInt = Field(1, description=(
        "validated retries of a turn with a format error (the retry policy of a limited "
        "observation)"))
    cases: PosInt = Field(300, description=(
        "distinct call-requiring cases of the seeded case set (scenarios/cases.py), at least; the"
        " thresholds may need more, agent.turn_budget caps them (default 300)"))
    other_cases: NonNegInt = Field(60, description=(
        "multi-turn, irrelevance and structured-output cases beside them (default 60, at most a "
        "fifth of the call cases)"))
    case_seed: int = Field(0, description=(
        "the case set's seed: the same seed and pack give the same cases (default 0)"))
    seed: Annotated[NonNegInt | None, NULL] = Field(None, description=(
        "the sampling seed: each request carries this plus its position in the run, so a run at "
        "temperature > 0 repeats (default null: no seed sent). On vLLM's CPU backend a seeded "
        "request split by chunked prefill stops the engine (vLLM 0.32.0: 'CPU Generator does not "
        "use offset'): there, send it at agent.concurrency 1"))
    under_load: NonNegInt = Field(0, description=(
        "agent.under_load: the case set sent again with this many requests in flight (the "
        "contracted concurrency); 0: not measured, the check not_applicable (--under-load N "
        "overrides)"))
    stream_cases: Annotated[PosInt | None, NULL] = Field(None, description=(
        "agent.stream_tool_calls: how many of the case set's call cases are also sent streamed, the "
        "same request beside its non-streamed send, alone and in the under-load pass (mixed); "
        "default null: every call case"))
    case_pack: Annotated[Literal["kimi-vendor-verifier"] | None, NULL] = Field(None, description=(
        "a vendored, licensed case pack added to the case set as call cases (scenarios/packs/): "
        "kimi-vendor-verifier (29 of Moonshot's Kimi-Vendor-Verifier tool-call JSON schema cases, MIT, "
        "sent as the verifier sends them: tool_choice required, strict, its prompt); default null: none"))
    case_tools: Literal["sample", "pack"] = Field("sample", description=(
        "which tools a case offers: sample (default: the pack's tools and its "
        "case_set.extra_tools, each case the tools it needs and a random share of the others) or "
        "pack (exactly the pack's tools in every case)"))
    consistency_cases: NonNegInt = Field(10, description=(
        "single cases each sent agent.repeats times for agent.trigger_consistency (default 10)"))
    request_timeout_s: PosNum | None = Field(None, description=(
        "per-request timeout (seconds) of the agent probe; a request without a complete answer in"
        " time is reported by name and is never a pass (default: load.request_timeout_s)"))


# The paths the quality probe compares (docs/acceptance.md "Output parity"): what differs between them is only
# which URL is the reference (quality_reference_url, or a prefill instance of a P/D deployment) and this label.
QualityPath = Literal["reference", "pd_vs_aggregated", "spec_on_vs_off", "fp8_vs_bf16_kv", "dcp_on_vs_off",
                      "new_vs_accepted_image"]


class SpecDecode(Section):
    """quality.spec_decode: speculative decoding judged (docs/checks.md quality.spec_acceptance,
    quality.spec_throughput; probes/quality/spec_decode.py; issue 45 item 4)."""

    min_acceptance_length: Annotated[Number, Field(ge=1)] = Field(1.5, description=(
        "quality.spec_acceptance: the mean acceptance length (1 + accepted / drafts, the bonus token counted, as "
        "vLLM logs it) over the probe's requests must reach it (default 1.5: below it the 5-token DSpark chain "
        "of vllm#51009, 1.46, fails; K3 profiles set their own from the recipe's acceptance facts)"))
    min_continuation: Share = Field(0.4, description=(
        "quality.spec_acceptance: the share of drafts accepted at position i among those accepted at position "
        "i-1 must reach it at every judged position (default 0.4: vllm#51009's collapse after position 0 "
        "continued ~25 %; healthy DSpark and EAGLE chains continue 0.55-0.85)"))
    min_position_drafts: PosInt = Field(20, description=(
        "quality.spec_acceptance: a position's continuation is judged only where the position before it holds "
        "at least this many accepted drafts (fewer: too noisy to call a collapse; default 20)"))
    min_drafts: PosInt = Field(30, description=(
        "quality.spec_acceptance: drafts counted over the probe's requests before acceptance is judged; fewer is "
        "inconclusive, with the count (default 30)"))
    requests: PosInt = Field(8, description=(
        "the seeded greedy requests the spec check sends itself when the parity pass moved too few drafts "
        "(default 8)"))
    max_tokens: PosInt = Field(64, description="output tokens of each of those requests (default 64)")
    throughput_requests: NonNegInt = Field(16, description=(
        "quality.spec_throughput: requests sent to the path under test and to the reference (quality_reference_url) "
        "at contract.concurrency, each way; 0: not measured, the check not_applicable (default 16)"))
    throughput_tolerance: Share = Field(0.05, description=(
        "quality.spec_throughput: speculative decoding whose output tokens/s at the contract's concurrency fall "
        "below the reference's by more than this share is a finding (default 0.05)"))


class Quality(Section):
    path: QualityPath = Field("reference", description=(
        "quality.parity: which comparison the report names: reference (the deployment against "
        "quality_reference_url), pd_vs_aggregated (the P/D entry point against the aggregated path: "
        "quality_reference_url, else a prefill instance called directly), spec_on_vs_off, fp8_vs_bf16_kv, "
        "dcp_on_vs_off, new_vs_accepted_image (each: quality_reference_url serves the same weights the accepted "
        "way)"))
    short_prompts: PosInt = Field(6, description=(
        "short questions of the seeded prompt set (besides one long, one multi-turn, one tool-call prompt)"))
    long_prompt_tokens: Annotated[NonNegInt | None, NULL] = Field(None, description=(
        "the long prompt's size in tokens; default null: contract.context_tokens (the contract's whole "
        "context); 0: no long prompt"))
    max_tokens: PosInt = Field(32, description=(
        "tokens generated per prompt, greedy (temperature 0): the positions compared"))
    seed: int = Field(0, description="the prompt set's seed and the seed sent with every request (default 0)")
    concurrency: PosInt = Field(8, description=(
        "prompts in flight at once in the reference's second pass and the path under test's pass (the "
        "reference's first pass sends them one at a time): the batch the noise floor is measured under"))
    margin: Share = Field(0.1, description=(
        "quality.parity where the reference does not reproduce itself (not batch-invariant): the share of "
        "prompts identical and the mean prefix agreement of the path under test may fall below the reference's "
        "own floor by at most this (default 0.1)"))
    request_timeout_s: PosNum | None = Field(None, description=(
        "per-request timeout (seconds) of the quality probe; a request without an answer in time is named and "
        "is never a pass (default: load.request_timeout_s)"))
    spec_decode: SpecDecode = Field(SpecDecode(), description=(
        "speculative decoding judged around the parity pass: its acceptance floors and throughput "
        "(docs/checks.md quality.spec_acceptance, quality.spec_throughput)"))


class Load(Section):
    ramp: Annotated[list[PosInt], Field(min_length=1)]
    requests_per_step: PosInt = 8
    prompt_tokens: PosInt = 256
    output_tokens: PosInt = 32
    long_prompt_tokens: PosInt = 1400
    soak_s: NonNeg = 20
    request_timeout_s: PosNum
    stage_timeout_s: PosNum = 300
    sample_interval_s: Annotated[Number, Field(gt=0, le=60)] = Field(0.25, description=(
        "metrics/memory sampling period during load stages"))
    max_step: PosInt | None = Field(None, description=(
        "the ramp's bound past the contract (default 4 x contract.concurrency): it doubles past "
        "the contract until a limit breaks or this step"))             # absent: 4 x contract.concurrency
    ramp_budget_s: PosNum = Field(300, description=(
        "no new ramp step past the contract after this many seconds"))
    contract_share: Share = Field(0.5, description=(
        "share of ramp requests at the contracted context (context_tokens + max_output_tokens); "
        "the rest use prompt_tokens/output_tokens"))
    verify_limit: bool = Field(True, description=(
        "re-run at a proposed limit before recommending it (default true)"))


class Loadgen(Section):
    max_cpu_pct: Annotated[Number, Field(ge=0, le=100)] = Field(90.0, description=(
        "CPU of one worker process, percent of one core"))
    max_send_lag_p99_s: NonNeg = Field(0.005, description=(
        "sent - scheduled, p99 of a step (seconds)"))
    send_lag_ttft_fraction: Share = Field(0.1, description=(
        "the send lag p99 must also stay within this fraction of contract.slo.ttft_p95_s"))
    max_loop_lag_p99_s: NonNeg = Field(0.05, description=(
        "event-loop lag p99 of any worker process (seconds)"))
    processes: Literal["auto"] | PosInt = Field("auto", description=(
        "worker processes per loadgen host: auto (sized to the work) or a number"))
    target_cpu_pct: Annotated[Number, Field(gt=0, le=100)] = Field(60.0, description=(
        "sizing: expected CPU per worker process, percent of one core"))


class Review(Section):
    period_days: PosInt = 30
    owner: str | None = None


class Remediation(Section):
    evidence_max_age_h: PosInt = Field(72, description=(
        "hours; older evidence is refused (default 72)"))


class Recheck(Section):
    """The day-N re-check's light settings (docs/recheck.md): a sample of the probes, against the deployment that
    serves production traffic, so every load is a fraction of what was signed."""

    load_fraction: Annotated[Number, Field(gt=0, le=1)] = Field(0.25, description=(
        "the load window's concurrency as a share of contract.concurrency (at least 1 request in flight): "
        "what production traffic leaves room for"))
    load_requests: PosInt = Field(4, description=(
        "requests of the load window's one step (load.requests_per_step of the re-check)"))
    load_window_s: NonNeg = Field(10, description=(
        "seconds of steady load at that concurrency (load.soak_s of the re-check)"))
    agent_cases: PosInt = Field(24, description=(
        "call cases of the seeded sample of the agent case set (agent.cases and agent.turn_budget)"))
    agent_other_cases: NonNegInt = Field(4, description=(
        "multi-turn, irrelevance and structured-output cases beside them"))
    agent_concurrency: PosInt = Field(2, description="agent turns in flight at once during the re-check")
    agent_seed: Annotated[int | None, NULL] = Field(None, description=(
        "the sample's case seed (default null: the signed run's agent.case_seed, the same cases)"))
    cache_sessions: PosInt = Field(1, description="sessions of the cache protocol (cache.sessions of the re-check)")
    probes: Annotated[list[Literal["cache", "agent", "load", "metrics", "quality"]], Field(min_length=1)] = Field(
        ["cache", "agent", "load"], description=(
            "the registered probes the re-check runs, in run order (add quality for a P/D or speculative deployment: "
            "its report requires the quality stage)"))


class PdRouter(Section):
    """The entry point of a P/D deployment: the router the recipe site writes for pd_cluster (docs/profiles.md
    "Disaggregated prefill/decode")."""

    program: Annotated[str, Field(min_length=1)] = Field("vllm-router", description=(
        "the router's executable (the recipe site's command: `vllm-router --vllm-pd-disaggregation ...`)"))
    policy: Literal["random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                    "sticky_least_loaded"] = Field("round_robin", description="the recipe's router.policy")
    args: list[str] = Field([], description=(
        "the router's other flags; the launch adds --prefill/--decode (one per pool instance), --host and --port"))
    host: str = "0.0.0.0"  # noqa: S104 - the address the router listens on
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    prometheus_port: Annotated[int, Field(ge=1, le=65535)] | None = Field(None, description=(
        "vllm-router --prometheus-port, where its request counters are (none: the router's port + 1)"))
    inventory_group: Annotated[str, Field(min_length=1)] = Field("router", description=(
        "the inventory group of the router's host (none: the first host of gpu_nodes)"))
    provenance: dict[str, str] = {}


class PdPool(Section):
    """One pool (prefill or decode) of a P/D deployment: its servers' launch, as for one engine."""

    inventory_group: Annotated[str, Field(min_length=1)] = Field(description=(
        "the inventory group (under gpu_nodes) of the pool's hosts: one server per host, its head"))
    nodes: PosInt = 1
    min_gpus: NonNegInt = 0
    parallel: Parallel
    kv_transfer_config: dict[str, Any] = Field({}, description=(
        "the pool's --kv-transfer-config, as read from launch.args (its connector, role, load-failure policy)"))
    launch: Launch


class Pd(Section):
    connector: Annotated[str, Field(min_length=1)] = Field(description=(
        "the KV connector both pools name (kv_transfer_config.kv_connector), e.g. NixlConnector"))
    router: PdRouter = PdRouter()
    prefill: PdPool
    decode: PdPool

    @model_validator(mode="after")
    def _one_connector(self) -> Pd:
        for name in ("prefill", "decode"):
            named = getattr(self, name).kv_transfer_config.get("kv_connector")
            if named is not None and named != self.connector:
                raise ValueError(f"pd.{name}.kv_transfer_config.kv_connector {named!r}: the pools must name "
                                 f"pd.connector {self.connector!r} (set both to the same connector)")
        return self


class ProfileModel(Section):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    extends: Annotated[str, Field(min_length=1)] | None = Field(None, description=(
        "a profile this one layers on (profiles/<name>.yml or a path): deep-merged by "
        "core/profile.py, this file's values win; validated after merging"))
    description: str | None = None
    experimental: bool = False
    lineage: Lineage | None = Field(None, description=(
        "Self-built image record; required when experimental is true."))
    recipe: Recipe
    model: Model
    image: Image
    vllm: Vllm
    driver: Driver
    hardware: Hardware
    parallel: Parallel
    launch: Launch
    pd: Pd | None = Field(None, description=(
        "a disaggregated prefill/decode deployment: both pools' launch and the router (launch.port is the "
        "router's; docs/profiles.md \"Disaggregated prefill/decode\")"))
    contract: Contract
    thresholds: Thresholds
    cache: Cache
    agent: Agent
    load: Load
    quality: Quality = Field(Quality(), description=(
        "the quality probe (opt-in, acceptance_probes: quality): output parity against a reference path "
        "(docs/acceptance.md \"Output parity\")"))
    loadgen: Loadgen = Field(Loadgen(), description=(
        "the load generator's self-check and sizing: a step whose client exceeds a limit is "
        "inconclusive ('load generator saturated')"))
    review: Review = Review()
    remediation: Remediation = Field(Remediation(), description=(
        "driver change (playbooks/rebuild.yml): how old the preflight evidence proving the "
        "incompatibility may be"))
    recheck: Recheck = Field(Recheck(), description=(
        "the day-N re-check's light settings (docs/recheck.md): load fraction, agent sample, cache sessions"))

    @model_validator(mode="after")
    def _lineage_when_experimental(self) -> ProfileModel:
        if self.experimental and self.lineage is None:
            raise ValueError("lineage: required when experimental is true")
        if self.pd is not None and self.launch.port != self.pd.router.port:
            raise ValueError(f"launch.port {self.launch.port}: a P/D deployment is called through its router; set it "
                             f"to pd.router.port {self.pd.router.port}")
        return self

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
