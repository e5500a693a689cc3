"""Launch triage (docs/sources.md#a001, "when vLLM does not start"): save the state, then say why.

Before any retry the four evidence groups are checked as saved (`compat.launch_evidence`): the exact
image tag and digest, the vLLM install source and version, `nvidia-smi` (driver and devices), and the
full startup log from its first line to the exit. Then the failure is classified from the log and
the preflight evidence by one table of rules (`RULES`), each named, with the matched line in the
finding:

- environment   (before the model loads: CUDA driver too old for the runtime, no kernel image for
                 the device, a GPU architecture the build was not made for, no device platform found,
                 NCCL/CUDA initialisation failing on a chain preflight found incompatible)
                 -> `compat.launch_triage`, rebuild_environment, with the three routes and their entry
                 conditions; no launch flag is ever suggested (flags do not turn CUDA 13 into 12.9);
- capacity      (after allocation: OOM while loading or profiling, a KV cache smaller than
                 max-model-len needs) -> `capacity.launch_triage`, expand_capacity or a lower limit;
- configuration (model name or path, missing weights, authorisation, fewer GPUs than the layout,
                 an unknown parser or flag) -> `compat.launch_triage` with class configuration: fix the
                 configuration, never the driver;
- interconnect  (NCCL unhandled system error, the `mlx5dv_reg_dmabuf_mr` error, RDMA, the head unreachable)
                 -> `compat.launch_triage`, the recipe's specific remedy only when its message is in
                 the log (NCCL_DMABUF_ENABLE=0 only with the error form of `mlx5dv_reg_dmabuf_mr`, never
                 with NCCL's benign INFO probe of a libmlx5 that lacks the symbol).

Lines are matched wherever vLLM's text sits inside them (docker compose, journald, k8s and Ray
prefixes). The real logs of tests/fixtures/real/vllm/ (vLLM 0.2 to 0.33) pin each signature.

Environment wins over everything (order of work: the chain first); among the other classes the
earliest matching line in the log is the cause (later lines are its consequences: "Engine core
initialization failed. See root cause above"). No match is `inconclusive`, never a pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.findings import Consequence, Finding, Status, read_findings
from ..core.profile import Profile
from ..core.rundir import RunDir
from ..parsers.startup_log import wrapped_pairs
from .registry import missing

ENVIRONMENT, CAPACITY, CONFIGURATION, INTERCONNECT = "environment", "capacity", "configuration", "interconnect"
CHECK_TRIAGE = "compat.launch_triage"
CHECK_TRIAGE_CAPACITY = "capacity.launch_triage"
CHECK_EVIDENCE = "compat.launch_evidence"

# Preflight checks whose failure means the CUDA chain is incompatible (then a CUDA or NCCL init
# failure in the log is the environment, not the network).
CHAIN_CHECKS = ("compat.driver_branch", "compat.container_cuda", "compat.driver_module")

# The three routes of docs/sources.md#a001, each with its entry conditions (docs/acceptance.md "Choosing the route").
ROUTES: list[dict[str, str]] = [
    {"route": "driver_upgrade",
     "when": "incompatibility confirmed by the log; the team owns the cluster; a maintenance window; a spare "
             "node for the first test; a recorded rollback (previous driver or node reinstall); a regression "
             "workload to re-run",
     "how": "rolling: one node out of the scheduler at a time, state saved, upgrade, verify driver, container "
            "runtime and GPU visibility, smoke-test, re-run one existing workload, then the next node; stop at "
            "the first failure (playbooks/rebuild.yml route=driver)"},
    {"route": "self_built_image",
     "when": "no driver upgrade possible and the team can own a custom stack (FlashInfer, PyTorch, CUDA, vLLM)",
     "how": "an image built for the host's CUDA from the model's vLLM branch, on its own experimental profile "
            "with an owner and an exit date, full lineage (branch, commit, Dockerfile, lock files, build log, "
            "rollback image); never accepted as the official image (playbooks/rebuild.yml route=self_built)"},
    {"route": "isolated_environment",
     "when": "the shared cluster cannot change but testing must go on now",
     "how": "a separate compatible environment with an owner, a review date and criteria to move back; its "
            "results do not carry over to the shared cluster (playbooks/rebuild.yml route=isolated)"},
]


@dataclass(frozen=True)
class Rule:
    """One signature of a startup failure: `name` is reported with the matched line."""

    name: str
    klass: str
    pattern: re.Pattern[str]
    why: str
    needs_broken_chain: bool = False     # only counts when preflight found the CUDA chain incompatible
    weak: bool = False                   # a consequence of other causes: chosen only when nothing else matched


def _r(name: str, klass: str, pattern: str, why: str, needs_broken_chain: bool = False, weak: bool = False) -> Rule:
    return Rule(name, klass, re.compile(pattern), why, needs_broken_chain, weak)


RULES: tuple[Rule, ...] = (
    # environment: the CUDA chain, before the model loads
    _r("environment.driver_insufficient", ENVIRONMENT,
       r"CUDA driver version is insufficient for CUDA runtime version|cudaErrorInsufficientDriver|"
       r"The NVIDIA driver on your system is too old|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH|"
       r"system has unsupported display driver / cuda driver combination",
       "the host driver is older than the CUDA runtime in the image"),
    _r("environment.container_cuda_requirement", ENVIRONMENT,
       r"unsatisfied condition: cuda\s*>=\s*[\d.]+",
       "the container runtime refused the image: its CUDA requirement exceeds the host driver"),
    _r("environment.no_kernel_image", ENVIRONMENT,
       r"no kernel image is available for execution on the device|cudaErrorNoKernelImageForDevice",
       "the binaries were not built for this GPU architecture"),
    _r("environment.unsupported_gpu_arch", ENVIRONMENT,
       r"with CUDA capability sm_\d+ is not compatible with the current PyTorch installation|"
       r"Found GPU\d+ .+ which is of compute capability \(CC\) [\d.]+",
       "the image's PyTorch/vLLM build does not include this GPU's architecture (too new or dropped)"),
    _r("environment.no_platform", ENVIRONMENT,
       r"No platform detected, vLLM is running on UnspecifiedPlatform|Failed to infer device type",
       "vLLM found no device platform: no GPU or driver library visible to the process (container started "
       "without GPUs, driver libraries not mounted, NVML failing) or a build for another device", weak=True),
    _r("environment.forward_compat", ENVIRONMENT,
       r"forward compatibility was attempted on non supported HW|CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
       "CUDA forward compatibility is not supported on this GPU: the driver must match the runtime"),
    _r("environment.driver_library_mismatch", ENVIRONMENT,
       r"Driver/library version mismatch",
       "kernel module and user-space driver libraries differ (reload or reboot)"),
    _r("environment.cuda_init_on_broken_chain", ENVIRONMENT,
       r"CUDA initialization: |CUDA error: (?:initialization error|system not yet initialized|"
       r"unknown error|operation not supported)|cudaErrorInitializationError|ncclUnhandledCudaError|"
       r"NCCL error.*unhandled cuda error",
       "CUDA/NCCL initialisation failed and preflight found the chain incompatible", needs_broken_chain=True),
    # interconnect: the recipe's remedies, each only on its own message
    _r("interconnect.dmabuf", INTERCONNECT,
       r"mlx5dv_reg_dmabuf_mr failed|NCCL WARN.*mlx5dv_reg_dmabuf_mr|mlx5dv_reg_dmabuf_mr.*errno",
       "NCCL could not register GPU memory through DMA-BUF on the mlx5 NIC"),
    _r("interconnect.nccl_system_error", INTERCONNECT,
       r"NCCL error.*unhandled system error|ncclSystemError",
       "NCCL failed on a system call (network, RDMA, peer memory, shared memory)"),
    _r("interconnect.rdma", INTERCONNECT,
       r"NCCL WARN NET/IB|ibv_\w+ failed|NET/IB ?: ?Got completion from peer|"
       r"NCCL WARN .*\b(?:RDMA|UCX)\b",
       "an RDMA (InfiniBand/RoCE) failure during NCCL set-up"),
    _r("interconnect.remote", INTERCONNECT,
       r"ncclRemoteError|remote process exited or there was a network error",
       "a peer rank died or the network dropped during NCCL set-up"),
    _r("interconnect.rendezvous", INTERCONNECT,
       r"DistNetworkError|The client socket has timed out after \d+m?s while trying to connect to|"
       r"Connection refused.*(?:29500|29501|master)",
       "a rank could not reach the head's torch.distributed address (master address, port, firewall)"),
    # capacity: memory after allocation
    _r("capacity.kv_cache_too_small", CAPACITY,
       r"To serve at least one request with the models?'s max seq len \((?P<max_len>\d+)\), "
       r"\((?P<need>[\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory "
       r"\((?P<avail>[\d.]+) GiB\)",
       "the KV cache cannot hold one request of max-model-len"),
    _r("capacity.kv_cache_too_small", CAPACITY,
       r"The model's max seq len \((?P<max_len>\d+)\) is larger than the maximum number of tokens that can be "
       r"stored in KV cache \((?P<kv_tokens>\d+)\)",
       "the KV cache cannot hold one request of max-model-len (V0 engine wording)"),
    _r("capacity.no_cache_memory", CAPACITY, r"No available memory for the cache blocks",
       "weights and activations left no memory for the KV cache"),
    _r("capacity.cuda_oom", CAPACITY,
       r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError: CUDA out of memory|CUDA out of memory\. Tried to allocate",
       "out of GPU memory while loading weights or profiling"),
    _r("capacity.cpu_oom", CAPACITY,
       r"DefaultCPUAllocator: can't allocate memory|DefaultCPUAllocator: not enough memory",
       "out of host memory while loading weights or profiling"),
    _r("capacity.free_memory_below_utilization", CAPACITY,
       r"on startup is less than desired GPU memory utilization",
       "other processes hold GPU memory that gpu-memory-utilization counts on"),
    # configuration and access: fix the configuration, never the driver
    _r("configuration.model_not_found", CONFIGURATION,
       r"is not a local folder and is not a valid model identifier|Invalid repository ID or local directory "
       r"specified|Repo id must be in the form|is not a local folder or a valid repository name|"
       r"RepositoryNotFoundError",
       "the model name or path does not resolve"),
    _r("configuration.authorization", CONFIGURATION,
       r"is a gated repository|GatedRepoError|401 Client Error|403 Client Error|"
       r"Invalid credentials in Authorization header|Access to model .* is restricted",
       "the weights need authorisation the deployment does not have"),
    _r("configuration.missing_weights", CONFIGURATION,
       r"Cannot find any model weights with|No such file or directory: .*\.safetensors",
       "the model directory lacks the weight files"),
    _r("configuration.gpu_count", CONFIGURATION,
       r"World size \(\d+\) is larger than the number of available GPUs \(\d+\)|"
       r"Tensor parallel size .* exceeds available GPUs|No CUDA GPUs are available",
       "fewer GPUs visible than the parallel layout needs (or none passed to the container)"),
    _r("configuration.parallel_layout", CONFIGURATION,
       r"must be divisible by tensor parallel size|must be divisible by pipeline parallel size|"
       r"must be divisible by the number of data parallel node groups",
       "the parallel layout does not divide the model or the nodes"),
    _r("configuration.parser", CONFIGURATION,
       r"invalid tool call parser: \S+|invalid reasoning parser: \S+|Tool parser '[^']*' not found|"
       r"Reasoning parser '[^']*' not found",
       "a parser name the vLLM in the image does not register"),
    _r("configuration.arguments", CONFIGURATION,
       r"error: unrecognized arguments:|error: argument --[\w-]+: invalid|"
       r"error: the following arguments are required:|"
       r"you should provide the model as a positional argument|"
       r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
       "a flag or value this vLLM does not accept"),
    _r("configuration.trust_remote_code", CONFIGURATION,
       r"set the option `trust_remote_code=True`",
       "the model needs --trust-remote-code"),
    _r("configuration.port_in_use", CONFIGURATION, r"\[Errno 98\] Address already in use",
       "another process holds the listen port"),
)

ACTIONS: dict[str, str] = {
    ENVIRONMENT: "environment, not flags: no launch flag (--max-model-len, batch sizes, cache settings) turns one "
                 "CUDA major into another, so none is tuned; choose a route by its entry conditions: driver "
                 "upgrade, self-built image (experimental profile, owner, exit date) or an isolated compatible "
                 "environment; then redo the whole acceptance",
    CONFIGURATION: "configuration, not the driver: fix the named setting (model name or path, weight access and "
                   "authorisation, GPU count vs the parallel layout, parser names, flags) and launch again",
    CAPACITY: "capacity: CUDA initialised and the model started loading; check weight distribution and the "
              "parallel layout, then limits (max-model-len, gpu-memory-utilization, max-num-seqs), then "
              "topology; adding GPUs fixes nothing if the layout is wrong",
}


@dataclass
class Match:
    rule: Rule
    line: int
    text: str
    groups: dict[str, str]


def matches(log_text: str) -> list[Match]:
    """Every rule match, by line (a rule counts once, at its first line). The launch line the
    process runtime writes first (`# launch: ...`) carries flags, not messages: skipped."""
    found: dict[str, Match] = {}
    lines = log_text.splitlines()
    for number, line in enumerate(lines, start=1):
        if line.startswith("# launch:"):
            continue
        _match_line(found, number, line)
    for number, first, rest in wrapped_pairs(lines):   # long lines a terminal wrapped mid-word
        _match_line(found, number, first + rest)
    return sorted(found.values(), key=lambda m: m.line)


def _match_line(found: dict[str, Match], number: int, line: str) -> None:
    for rule in RULES:
        if rule.name in found:
            continue
        if hit := rule.pattern.search(line):
            found[rule.name] = Match(rule, number, line.strip()[:500],
                                     {k: v for k, v in hit.groupdict().items() if v is not None})


_ERRORISH = re.compile(r"\b(?:ERROR|CRITICAL|FATAL)\b|Error\b|error:|Traceback|failed|Exception|Killed|"
                       r"exited|NCCL WARN", re.IGNORECASE)


def last_error_line(log_text: str) -> dict[str, Any] | None:
    """The last line that reads like an error (else the last non-empty line): what a human reads
    first when no signature matches, named in the inconclusive finding."""
    lines = [(n, line.strip()) for n, line in enumerate(log_text.splitlines(), start=1)
             if line.strip() and not line.startswith("# launch:")]
    for number, text in reversed(lines):
        if _ERRORISH.search(text):
            return {"line": number, "text": text[:500]}
    return {"line": lines[-1][0], "text": lines[-1][1][:500]} if lines else None


def broken_chain(preflight: Iterable[Finding] | None, host: str | None = None) -> list[str]:
    """Preflight chain checks that failed (for `host` when given, else on any host)."""
    return sorted({f"{f.check}@{f.host}: {f.reason}"[:300] for f in preflight or []
                   if f.check in CHAIN_CHECKS and f.status == Status.FAIL and (host is None or f.host in (host, None))})


def choose(found: list[Match], chain: list[str]) -> Match | None:
    """Environment first (the chain before anything else); otherwise the earliest line is the cause.
    A weak signature (a consequence of several causes) decides only when no other one matched."""
    usable = [m for m in found if not m.rule.needs_broken_chain or chain]
    strong = [m for m in usable if not m.rule.weak]
    for group in (strong, usable):
        for match in group:
            if match.rule.klass == ENVIRONMENT:
                return match
        if group:
            return group[0]
    return None


def classify_launch_failure(log_text: str | None, preflight: list[Finding] | None, profile: Profile,
                            host: str | None = None, evidence: list[str] | None = None) -> Finding:
    """The triage finding of a launch that did not come up: its class, the rule and the matched line."""
    evidence = evidence or []
    if not log_text or not log_text.strip():
        return missing(CHECK_TRIAGE, host, "no startup log: save it from the first line to the exit before any "
                                           "retry, then classify", evidence=evidence)
    chain = broken_chain(preflight, host)
    found = matches(log_text)
    chosen = choose(found, chain)
    observed: dict[str, Any] = {
        "matches": [{"rule": m.rule.name, "line": m.line, "text": m.text} for m in found],
        "preflight_chain_failures": chain,
    }
    rule_text = ("source 001's fork: environment (CUDA chain before the model loads) > the earliest of "
                 "interconnect / capacity / configuration; rules: triage.RULES")
    if chosen is None:
        unread = last_error_line(log_text)
        observed["unread"] = unread
        return Finding(check=CHECK_TRIAGE, status=Status.INCONCLUSIVE, host=host, observed=observed,
                       expected="a known startup-failure signature", rule=rule_text, evidence=evidence,
                       reason="the log matches no known startup-failure signature"
                              + (f"; the line not read: {unread['line']}: {unread['text'][:200]}" if unread else ""),
                       action="read the saved log from its first line; add the signature to triage.RULES if new; "
                              "change nothing before the cause is known")
    observed.update({"class": chosen.rule.klass, "rule": chosen.rule.name, "line": chosen.line,
                     "text": chosen.text})
    consequence, action = _remedy(chosen, profile, observed)
    check = CHECK_TRIAGE_CAPACITY if chosen.rule.klass == CAPACITY else CHECK_TRIAGE
    return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected="the server starts",
                   rule=rule_text, evidence=evidence, consequence=consequence,
                   reason=f"{chosen.rule.klass}: {chosen.rule.why} (rule {chosen.rule.name}, log line "
                          f"{chosen.line}: {chosen.text[:200]})",
                   action=action, title=f"launch failed: {chosen.rule.klass}")


def _remedy(match: Match, profile: Profile, observed: dict[str, Any]) -> tuple[Consequence, str]:
    klass = match.rule.klass
    if klass == ENVIRONMENT:
        observed["routes"] = ROUTES
        return Consequence.REBUILD, ACTIONS[ENVIRONMENT]
    if klass == CONFIGURATION:
        return Consequence.REBUILD, f"{ACTIONS[CONFIGURATION]} ({match.rule.why})"
    if klass == CAPACITY:
        return Consequence.EXPAND, _capacity_action(match, profile, observed)
    return Consequence.REBUILD, _interconnect_action(match, profile)


_ESTIMATE = re.compile(r"the estimated maximum model length is (\d+)")


def _capacity_action(match: Match, profile: Profile, observed: dict[str, Any]) -> str:
    if match.rule.name != "capacity.kv_cache_too_small":
        return ACTIONS[CAPACITY]
    estimate = _ESTIMATE.search(match.text)
    contract = profile.model.contract.context_tokens
    groups = match.groups
    observed.update({"max_model_len": int(groups["max_len"]),
                     "kv_needed_gib": float(groups["need"]) if "need" in groups else None,
                     "kv_available_gib": float(groups["avail"]) if "avail" in groups else None,
                     "kv_cache_tokens": int(groups["kv_tokens"]) if "kv_tokens" in groups else None,
                     "estimated_max_model_len": int(estimate.group(1)) if estimate else None,
                     "contract_context_tokens": contract})
    if estimate and contract and int(estimate.group(1)) >= int(contract):
        return (f"a lower limit fits the contract: --max-model-len={estimate.group(1)} (>= the contracted "
                f"{contract} tokens), written into the serving config and the alerts; or expand capacity")
    return ("the KV cache cannot hold the contracted context on this memory: expand capacity (more GPUs or "
            "memory per replica, another parallel layout) or renegotiate the context limit; raising "
            "gpu-memory-utilization only helps when other processes are not using that memory")


def _interconnect_action(match: Match, profile: Profile) -> str:
    if match.rule.name == "interconnect.dmabuf":
        workaround = profile.model.launch.multinode.dmabuf_workaround_env
        env = " ".join(f"{k}={v}" for k, v in workaround.items())
        return (f"the recipe's remedy for mlx5dv_reg_dmabuf_mr: set {env} on every node (NCCL falls back to "
                "nvidia_peermem: check compat.peermem) and launch again; not a driver change")
    return ("interconnect, not the driver: check the RDMA devices and links, nvidia_peermem, the recipe's "
            "all-to-all backend and UCX_TLS/NCCL settings for this interconnect, and the master address and "
            "port between nodes; run with NCCL_DEBUG=INFO for the cause; the DMA-BUF workaround only when "
            "mlx5dv_reg_dmabuf_mr is in the log")


# --- the four evidence groups, saved before any retry ---------------------------------------

# group -> (preflight checks that carry its evidence, applies(profile, runtime))
_GROUPS: dict[str, tuple[tuple[str, ...], str]] = {
    "image": (("compat.image_identity",), "container"),
    "vllm": (("compat.vllm_version",), "always"),
    "nvidia_smi": (("compat.driver_branch", "compat.gpu_visibility"), "gpu"),
}


def evidence_groups(preflight: list[Finding] | None, profile: Profile, host: str | None,
                    startup_log_evidence: list[str], launch_command: str | None) -> Finding:
    """compat.launch_evidence: the four groups of docs/sources.md#a001 were saved before any retry."""
    runtime = str(profile.model.launch.runtime)
    groups: dict[str, dict[str, Any]] = {}
    for group, (checks, applies) in _GROUPS.items():
        container_na = applies == "container" and runtime not in ("docker", "podman")
        if container_na or (applies == "gpu" and not profile.has_gpus):
            groups[group] = {"status": "not_applicable", "why": f"{runtime} runtime" if applies == "container"
                             else "profile has no GPU"}
            continue
        paths = sorted({p for f in preflight or [] for p in f.evidence
                        if f.check in checks and f.host in (host, None) and f.status != Status.MISSING})
        groups[group] = {"status": "saved" if paths else "missing", "evidence": paths, "from": list(checks)}
    groups["startup_log"] = {"status": "saved" if startup_log_evidence else "missing",
                             "evidence": list(startup_log_evidence)}
    if runtime in ("docker", "podman"):
        groups["image"]["launch_reference"] = _image_ref(launch_command)
    lacking = [g for g, v in groups.items() if v["status"] == "missing"]
    evidence = sorted({p for v in groups.values() for p in v.get("evidence", [])})
    rule = ("source 001: image tag and digest, vLLM source and version, nvidia-smi, and the full startup log "
            "saved before any retry or change")
    if lacking:
        return Finding(check=CHECK_EVIDENCE, status=Status.MISSING, host=host, observed=groups,
                       expected=list(groups), rule=rule, evidence=evidence,
                       reason="not saved before the retry: " + ", ".join(lacking),
                       action="stop all changes; capture the missing groups (run the preflight stage) before "
                              "launching again")
    return Finding(check=CHECK_EVIDENCE, status=Status.PASS, host=host, observed=groups, expected=list(groups),
                   rule=rule, evidence=evidence, action="none")


_REF = re.compile(r"(\S+@sha256:[0-9a-f]{64}|\S+/\S+:\S+)")


def _image_ref(command: str | None) -> str | None:
    if not command:
        return None
    for token in command.split():
        if _REF.fullmatch(token) and not token.startswith("-"):
            return token
    return None


def launch_findings(run_dir: Path, profile: Profile, host: str | None, log_text: str | None,
                    log_evidence: list[str], launch_command: str | None) -> list[Finding]:
    """The serve stage's hook for a failed launch: evidence groups, then the classification."""
    preflight_path = RunDir(Path(run_dir)).findings_path("preflight")
    preflight = read_findings(preflight_path) if preflight_path.is_file() else None
    return [evidence_groups(preflight, profile, host, log_evidence, launch_command),
            classify_launch_failure(log_text, preflight, profile, host, log_evidence)]
