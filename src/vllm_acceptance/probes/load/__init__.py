"""Capacity under load (docs/acceptance.md "Capacity under load"): staged, each stage with its own evidence.

Stages, in order: the KV cache readout against the contract (no traffic), one long prompt at the
contracted context (prefill vs decode memory), the context contract (at it succeeds, just over it is
rejected for its length), the concurrency ramp at the contract's shape (the profile's share of
sessions at the contracted context, every prompt counted with the server's ``/tokenize``) past the
contract to the real knee, a run at the proposed limit when the contract does not hold, the mixed
stream and the soak (at the verified limit when there is one). A sampler scrapes the server's metrics
and memory (per-GPU where there are GPUs, the server's RSS in the lab, labelled so), each sample
tagged with its stage. A server that dies mid-stage leaves the OOM/crash record, its stage
classified, and the remaining stages are reported `missing`. All judgement is in probes/load/rules.py.

Submodules (each imports only the ones before it in this list, never this package):

- ``config``: LoadProbeConfig, the probe's settings from the profile and the overrides.
- ``crash``: the OOM markers of a server log and capacity.crash judged from the crash record.
- ``prompts``: PromptBuilder, prompts of an exact token count counted by the server's /tokenize.
- ``sampler``: Sampler, the metrics and memory sampler, and the per-engine readings of a scrape.
- ``run``: LoadRun, one call's state and sends (controller or loadgen agents), the crash record.
- ``steps``: one step's figures (step_row, missing_samples, hung_requests), the SLO and the knee.
- ``stages``: the long prompt, the context contract, the ramp, the limit verification, the mixed stream.
- ``soak``: the soak stage and its judgement on the nodes' per-GPU memory (judge_soak_gpu_memory).
- ``conclude``: Progress and conclude, the stage's findings and details from what was measured.
- ``probe``: run_load_probe, the first call: the stages in order, a limit verified or left pending.
- ``limit``: run_load_limit, the next proposed limit on the server relaunched with its flags.
"""

from __future__ import annotations

from . import unit  # registers the probe (probes/registry.py)
from .conclude import STAGE_LABELS, Progress, conclude, crash_findings, saturated_overrule
from .config import LoadProbeConfig
from .crash import OOM_MARKERS, crash_finding
from .limit import EARLY, restore, run_load_limit
from .probe import agents, judge_limit, pending_limit, read_kv, run_load_probe, stage_at_limit
from .prompts import PromptBuilder
from .run import LONE_STAGES, LoadRun
from .sampler import Sampler, engine_peaks, engine_rows
from .soak import judge_soak_gpu_memory, log_size, memory_growth_pct, proc_start_time, stage_soak
from .stages import (
    SHARED_PREFIX,
    memory_split,
    repeated_hit_ratio,
    run_step,
    served_max_model_len,
    stage_context_contract,
    stage_long_prompt,
    stage_mixed,
    stage_ramp,
    stage_verify,
    verify_one,
)
from .steps import contract_shaped, hung_requests, knee_of, meets_slo, missing_samples, snapshot_preemptions, step_row

__all__ = [
    "unit",
    "EARLY", "LONE_STAGES", "OOM_MARKERS", "SHARED_PREFIX", "STAGE_LABELS",
    "LoadProbeConfig", "LoadRun", "Progress", "PromptBuilder", "Sampler",
    "agents", "conclude", "contract_shaped", "crash_finding", "crash_findings", "engine_peaks", "engine_rows",
    "hung_requests", "judge_limit", "judge_soak_gpu_memory", "knee_of", "log_size", "meets_slo",
    "memory_growth_pct", "memory_split", "missing_samples", "pending_limit", "proc_start_time", "read_kv",
    "repeated_hit_ratio", "restore", "run_load_limit", "run_load_probe", "run_step", "saturated_overrule",
    "served_max_model_len", "snapshot_preemptions", "stage_at_limit", "stage_context_contract",
    "stage_long_prompt", "stage_mixed", "stage_ramp", "stage_soak", "stage_verify", "step_row", "verify_one",
]
