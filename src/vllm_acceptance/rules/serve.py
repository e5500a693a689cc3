"""Serve-stage rules: the startup log against the recipe and the running server's actual configuration
(docs/checks.md, compat.startup_log, compat.actual_config.*), judged from what the server reports about
itself (rules/flag_readings.py), never from the command line it was given."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.contract import (
    LIMITING_ARGS,
    PER_ENGINE_ARGS,
    chunked_prefill_off,
    contract_window,
    launch_max_model_len,
    limits_contract,
)
from ..core.findings import Consequence, Finding, Status
from ..core.profile import Profile
from ..hardware import vllm_batched_tokens_default
from ..parsers.base import version_at_least
from ..parsers.startup_log import StartupScan
from . import registry
from .context import ROUTE_DRIVER, ROUTE_IMAGE, ROUTE_ISOLATED, ROUTE_SELF_BUILT
from .flag_readings import (
    DIFFERS,
    NOT_SHOWN,
    UNVERIFIABLE,
    FlagReading,
    cache_flags,
    parse_flags,
    read_from_cache_config,
    read_from_startup_log,
    requested_flags,
)
from .launched import LaunchedPlan, launched_plan
from .registry import missing

# --- compat.startup_log (called by the serve stage) -----------------------------------------

def _option_mismatches(scan: StartupScan, profile: Profile, plan: LaunchedPlan) -> list[str]:
    """Recipe options whose value the startup log's non-default args show differently (structured values,
    such as --attention-config's AttentionConfig repr, compared field by field); the parallel layout is the
    launched plan's (inventory vllm_parallel, else the profile's), not the profile's own."""
    if scan.non_default_args is None:
        return []
    wanted = requested_flags(profile, plan)
    readings = [read_from_startup_log(key, want, scan, {}) for key, want in wanted.items()]
    return [r.describe() for r in readings if r.state == DIFFERS]


def check_startup_log(scan: StartupScan | None, profile: Profile, host: str | None,
                      evidence: list[str], plan: LaunchedPlan | None = None) -> Finding:
    """The startup log against the recipe: version, options, device and backend initialisation,
    parallel layout, no backend fallback, no NCCL error, KV cache initialised; warnings listed."""
    check = "compat.startup_log"
    if scan is None or scan.lines == 0:
        return missing(check, host, "no startup log captured (save it from the container's first line)",
                       evidence=evidence)
    observed = scan.summary()
    minimum = str(profile.model.vllm.min_version)
    plan = plan or launched_plan(profile)
    expected = {"vllm": f">= {minimum}", "world_size": plan.engine_world, "layout": plan.layout(), "fallbacks": 0,
                "nccl_errors": 0,
                "kv_cache": "initialised"}
    rule = ("version >= profile minimum, recipe options in effect, no backend fallback, no NCCL/CUDA-driver/"
            "kernel-image error, no OOM, KV cache size and maximum concurrency read out")
    problems: list[str] = []
    consequence = Consequence.REBUILD
    actions: list[str] = []
    if scan.driver_incompatible or scan.no_kernel_image:
        problems.append("CUDA/driver incompatibility before the model loads: "
                        + (scan.driver_incompatible or scan.no_kernel_image)[0].text[:200])
        actions.append(f"environment, not flags: {ROUTE_DRIVER}; or {ROUTE_ISOLATED}; or {ROUTE_SELF_BUILT}")
    if scan.dmabuf_errors:
        workaround = profile.model.launch.multinode.dmabuf_workaround_env
        problems.append(f"mlx5dv_reg_dmabuf_mr error (errno {scan.dmabuf_errno})")
        actions.append(f"set {workaround} (falls back to nvidia_peermem; check compat.peermem), restart")
    if scan.nccl_errors:
        problems.append(f"NCCL error: {scan.nccl_errors[0].text[:200]}")
        actions.append("check topology, RDMA, peer memory, network backend and NCCL/UCX env (not the driver)")
    if scan.backend_fallbacks:
        problems.append(f"backend fallback: {scan.backend_fallbacks[0].text[:200]}")
        actions.append("make the recipe's backend available (image, flags); a fallback changes what is measured")
    if scan.version is not None and version_at_least(scan.version, minimum) is False:
        problems.append(f"vLLM {scan.version} < {minimum}")
        actions.append(ROUTE_IMAGE)
    mismatched = _option_mismatches(scan, profile, plan)
    if mismatched:
        problems.append("launch options differ from the profile: " + "; ".join(mismatched))
        actions.append("launch with the profile's args and the launched layout")
    if scan.world_size is not None and scan.world_size != plan.engine_world:
        problems.append(f"world size {scan.world_size} != launched layout tensor {plan.tensor} x pipeline "
                        f"{plan.pipeline} = {plan.engine_world} ({plan.source})")
        actions.append("launch with the planned parallel layout (vllm_parallel, else the profile's)")
    if scan.oom:
        if not problems:
            consequence = Consequence.EXPAND
        problems.append(f"OOM ({'after' if scan.model_load_s is not None else 'before/during'} model load): "
                        f"{scan.oom[0].text[:200]}")
        actions.append("capacity: check weight distribution and the parallel layout, then limits, then topology")
    if not problems and scan.failure_class() == "other":
        problems.append("startup failed (traceback) without an environment signature")
        actions.append("CUDA initialised: check model name, weight access and authorisation, GPU count, "
                       "tensor parallel settings, inter-node exchange, kernel/extension loading; a driver "
                       "upgrade is justified only when log and config prove a version incompatibility")
    if problems:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, consequence=consequence, reason="; ".join(problems),
                       action="; ".join(actions))
    if scan.non_default_args_unreadable and scan.non_default_args_line is not None:
        line = scan.non_default_args_line
        return Finding(check=check, status=Status.INCONCLUSIVE, host=host, observed=observed, expected=expected,
                       rule=rule, evidence=evidence,
                       reason=f"the recipe options could not be compared: startup log line {line.number} "
                              f"(non-default args) is unreadable: {line.text[:600]}",
                       action="report the line's format (a vLLM repr the scan does not read); compare the options "
                              "by hand meanwhile")
    if not scan.ready or not scan.kv_cache_initialised or scan.version is None or scan.non_default_args is None:
        lacking = [name for name, ok in (("ready line", scan.ready), ("KV cache size line", scan.kv_cache_initialised),
                                         ("version line", scan.version is not None),
                                         ("non-default args line (the options in effect)",
                                          scan.non_default_args is not None)) if not ok]
        return Finding(check=check, status=Status.INCONCLUSIVE, host=host, observed=observed, expected=expected,
                       rule=rule, evidence=evidence, reason="log lacks: " + ", ".join(lacking),
                       action="capture the whole log from the first line to ready")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


# --- compat.actual_config.* (called by the serve stage) -------------------------------------
# Judged from what the running server reports about itself (rules/flag_readings.py), never from the
# command line it was given: a flag asked for but not shown by the server is a finding.

@dataclass
class ServerReports:
    """What the running server says about itself, with the evidence file of each source."""

    cache_config: dict[str, Any] | None = None     # vllm:cache_config_info labels (/metrics)
    models: dict[str, Any] | None = None           # /v1/models
    startup: StartupScan | None = None             # the startup log (its non-default args line)
    process_args: list[str] | None = None          # argv: what was asked, kept for the record only
    engines: list[str] | None = None               # the `engine` labels of /metrics (one per data-parallel engine)
    metrics_evidence: list[str] = field(default_factory=list)
    models_evidence: list[str] = field(default_factory=list)
    log_evidence: list[str] = field(default_factory=list)
    argv_evidence: list[str] = field(default_factory=list)


def _truthy(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", "none", ""):
        return False
    return None


def process_flags(process_args: list[str]) -> dict[str, Any]:
    """argv of the running server -> {flag_with_underscores: value} (argparse semantics, last wins)."""
    return parse_flags(process_args)


def check_actual_config(reports: ServerReports, profile: Profile, host: str | None,
                        plan: LaunchedPlan | None = None) -> list[Finding]:
    """What the running server actually does: prefix caching and the KV-cache flags per
    vllm:cache_config_info, every other recipe flag per its startup log's non-default args (the parallel
    layout per the launched plan), max_model_len per /v1/models."""
    wanted = requested_flags(profile, plan)
    argv = parse_flags(reports.process_args) if reports.process_args is not None else {}
    return [_actual_prefix_caching(reports, wanted, host),
            _actual_cache(reports, wanted, argv, host),
            _actual_flags(reports, wanted, argv, host),
            _actual_unlisted(reports, profile, wanted, host),
            _actual_max_model_len(reports, profile, host)]


def flag_readings(reports: ServerReports, profile: Profile) -> list[FlagReading]:
    """Every recipe flag as the server shows it (stage details: the table the report prints)."""
    wanted = requested_flags(profile)
    argv = parse_flags(reports.process_args) if reports.process_args is not None else {}
    cached = cache_flags(wanted, reports.cache_config)
    return [read_from_cache_config(key, want, reports.cache_config, argv) if key in cached
            else read_from_startup_log(key, want, reports.startup, argv) for key, want in wanted.items()]


def _judge_readings(check: registry.Check, readings: list[FlagReading], host: str | None,
                    evidence: list[str]) -> Finding:
    observed = {"flags": [r.to_dict() for r in readings]}
    expected = {r.flag: r.requested for r in readings}
    wrong = [r for r in readings if r.state in (DIFFERS, NOT_SHOWN)]
    unknown = [r for r in readings if r.state == UNVERIFIABLE]
    if wrong:
        return check.fail(host, observed=observed, expected=expected, evidence=evidence,
                          reason="the running server does not run the recipe: "
                                 + "; ".join(r.describe() for r in wrong),
                          action="the flag did not reach vLLM or vLLM/the platform overrode it: compare the launch "
                                 "command, the image's vLLM version and the startup log warnings, fix the launch, "
                                 "re-run accept.yml")
    if unknown:
        return check.inconclusive(host, observed=observed, expected=expected, evidence=evidence,
                                  reason="; ".join(r.describe() for r in unknown),
                                  action="capture the server's own report (whole startup log from its first line, "
                                         "/metrics) and re-run; an unreadable line is a parser gap to report")
    return check.passed(host, observed=observed, expected=expected, evidence=evidence)


def _actual_cache(reports: ServerReports, wanted: dict[str, Any], argv: dict[str, Any],
                  host: str | None) -> Finding:
    check = registry.get("compat.actual_config.cache")
    keys = cache_flags(wanted, reports.cache_config)
    if not keys:
        return check.not_applicable(host, "the profile asks for no KV-cache flag that vllm:cache_config_info reports "
                                          "(prefix caching has its own check)")
    if reports.cache_config is None:
        return check.missing(host, "no vllm:cache_config_info from /metrics: "
                                   + ", ".join(f"--{k.replace('_', '-')}" for k in keys) + " unverified",
                             evidence=reports.metrics_evidence)
    readings = [read_from_cache_config(key, wanted[key], reports.cache_config, argv) for key in keys]
    return _judge_readings(check, readings, host, reports.metrics_evidence)


def _actual_flags(reports: ServerReports, wanted: dict[str, Any], argv: dict[str, Any],
                  host: str | None) -> Finding:
    check = registry.get("compat.actual_config.flags")
    cached = set(cache_flags(wanted, reports.cache_config))
    keys = [key for key in wanted if key not in cached and key not in ("enable_prefix_caching", "max_model_len")]
    evidence = reports.log_evidence + reports.argv_evidence
    if not keys:
        return check.not_applicable(host, "the profile asks for no flag beyond those judged from /metrics and "
                                          "/v1/models")
    if reports.startup is None or reports.startup.lines == 0:
        return check.missing(host, "no startup log: the server's own record of the arguments it runs with "
                                   "(non-default args) is missing; the argv shows only what was asked",
                             evidence=evidence)
    readings = [read_from_startup_log(key, wanted[key], reports.startup, argv) for key in keys]
    return _judge_readings(check, readings, host, evidence)


def unlisted_args(non_default: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """The server's non-default args that the profile does not list (model, host, port and the like included)."""
    return {k: v for k, v in non_default.items() if k not in wanted}


def limiting_unlisted(unlisted: dict[str, Any], profile: Profile, engines: int = 1,
                      non_default: dict[str, Any] | None = None) -> dict[str, str]:
    """Those that limit the contract's capacity (core/contract.py limits_contract), each with why; a per-engine
    argument counted once per engine that serves (`engines`), --max-num-batched-tokens against vLLM's default on
    the profile's hardware (hardware.py), chunked prefill as the server runs it (`non_default`)."""
    default, _ = vllm_batched_tokens_default(profile)
    chunked = not chunked_prefill_off(profile.data) and (non_default or {}).get("enable_chunked_prefill") is not False
    out = {k: limits_contract(profile.data, k, v, engines=engines, batched_tokens_default=default,
                              chunked_prefill=chunked) for k, v in unlisted.items()
           if k in LIMITING_ARGS or k == "max_model_len"}
    return {k: why for k, why in out.items() if why}


def served_engines(reports: ServerReports) -> tuple[int, str]:
    """(the engines that serve, where that was read): the startup log's data_parallel_size (its non-default args,
    else its engine config line) and the `engine` labels of /metrics; both read: the fewer (capacity is never
    counted above what the server shows); neither: one engine."""
    found: list[tuple[int, str]] = []
    scan = reports.startup
    if scan is not None and scan.non_default_args is not None and "data_parallel_size" in scan.non_default_args:
        found.append((_count(scan.non_default_args["data_parallel_size"]), "startup log non-default args "
                                                                            "data_parallel_size"))
    elif scan is not None and scan.engine_config is not None and "data_parallel_size" in scan.engine_config:
        found.append((_count(scan.engine_config["data_parallel_size"]), "startup log engine config "
                                                                         "data_parallel_size"))
    if reports.engines:
        found.append((len(reports.engines), f"/metrics engine labels {', '.join(reports.engines)}"))
    found = [(n, where) for n, where in found if n >= 1]
    if not found:
        return 1, "no data_parallel_size nor engine labels shown: one engine"
    count = min(n for n, _ in found)
    return count, "; ".join(f"{where}: {n}" for n, where in found)


def _count(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _actual_unlisted(reports: ServerReports, profile: Profile, wanted: dict[str, Any], host: str | None) -> Finding:
    """Every non-default argument of the running server judged (issue 28, item 4): those the profile does not list
    are recorded; a capacity-limiting one (max_num_seqs, enforce_eager, a speculative config, KV offload or
    transfer, ...) the profile does not state fails (rebuild_environment: the launch is out of the profile)."""
    check = registry.get("compat.actual_config.unlisted_args")
    evidence = reports.log_evidence
    scan = reports.startup
    if scan is None or scan.lines == 0:
        return check.missing(host, "no startup log: the server's non-default args (what it runs with beyond the "
                                   "profile) are unread", evidence=evidence)
    if scan.non_default_args is None:
        why = (f"the non-default args line is unreadable: {scan.non_default_args_line.text[:300]}"
               if scan.non_default_args_line is not None else "the startup log has no non-default args line")
        return check.inconclusive(host, evidence=evidence, reason=why,
                                  action="capture the whole startup log from its first line and re-run")
    unlisted = unlisted_args(scan.non_default_args, wanted)
    engines, engines_source = served_engines(reports)
    limiting = limiting_unlisted(unlisted, profile, engines, scan.non_default_args)
    observed = {"unlisted": unlisted, "limiting": limiting,
                "engines": {"count": engines, "source": engines_source, "per_engine_args": list(PER_ENGINE_ARGS)}}
    expected = "no capacity-limiting argument the profile does not state (" + ", ".join(sorted(LIMITING_ARGS)) + ")"
    if limiting:
        return check.fail(host, observed=observed, expected=expected, evidence=evidence,
                          reason="the server runs with arguments the profile does not state that limit capacity: "
                                 + "; ".join(f"{k}={unlisted.get(k)!r} ({why})" for k, why in limiting.items()),
                          action="launch without them (inventory vllm_serve_extra_args, the attached server's own "
                                 "command line), or write a site profile whose launch.args state them and accept that")
    return check.passed(host, observed=observed, expected=expected, evidence=evidence,
                        reason=("arguments the profile does not list, none limiting capacity: "
                                + ", ".join(sorted(unlisted))) if unlisted else "")


def _expected_prefix_caching(wanted: dict[str, Any]) -> bool:
    return bool(_truthy(wanted.get("enable_prefix_caching", False)))


def _actual_prefix_caching(reports: ServerReports, wanted: dict[str, Any], host: str | None) -> Finding:
    check = registry.get("compat.actual_config.prefix_caching")
    info, evidence = reports.cache_config, reports.metrics_evidence
    expected = _expected_prefix_caching(wanted)
    rule = f"vllm:cache_config_info enable_prefix_caching == {expected}"
    if not info or "enable_prefix_caching" not in info:
        return check.missing(host, "no vllm:cache_config_info with enable_prefix_caching from /metrics",
                             evidence=evidence)
    actual = _truthy(info.get("enable_prefix_caching"))
    observed = {k: info.get(k) for k in ("enable_prefix_caching", "block_size", "cache_dtype",
                                         "gpu_memory_utilization", "num_gpu_blocks", "prefix_caching_hash_algo")
                if k in info}
    if actual is not expected:
        return check.fail(host, observed=observed, expected=expected, rule=rule, evidence=evidence,
                          reason="the running server reports "
                                 f'enable_prefix_caching="{info.get("enable_prefix_caching")}"',
                          action="fix the launch configuration (the flag did not reach the process), re-run")
    return check.passed(host, observed=observed, expected=expected, rule=rule, evidence=evidence)


def _actual_max_model_len(reports: ServerReports, profile: Profile, host: str | None) -> Finding:
    """The served max_model_len (/v1/models) must hold the contract (context + max output); its difference from
    the recipe's --max-model-len is recorded, not failed: the recipe says to adjust it per scenario (SPEC
    "Hardware the recipe verifies"; issue 31, item 6). Who enforces a contract below it is judged by
    capacity.context_contract."""
    check = registry.get("compat.actual_config.max_model_len")
    models, evidence = reports.models, reports.models_evidence
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list) or not entries:
        return check.missing(host, "no /v1/models answer with models", evidence=evidence)
    served_name = profile.model.model.served
    entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == served_name), None)
    if entry is None and len(entries) == 1 and isinstance(entries[0], dict):
        entry = entries[0]
    if entry is None or not isinstance(entry.get("max_model_len"), int):
        return check.missing(host, f"/v1/models has no {served_name!r} with max_model_len", evidence=evidence)
    served, window = int(entry["max_model_len"]), contract_window(profile.data)
    recipe, recipe_field = launch_max_model_len(profile.data)
    observed = {"models": [e.get("id") for e in entries if isinstance(e, dict)], "max_model_len": served,
                "contract_window_tokens": window, "recipe_max_model_len": recipe, "recipe_field": recipe_field,
                "difference_from_recipe": served - recipe if recipe is not None else None}
    expected = f">= {window} (context + max output of the contract)" if window is not None else recipe
    rule = (f"/v1/models {served_name} max_model_len >= the contract's {window} tokens (context + max output); "
            f"a difference from the recipe's {recipe} is recorded")
    if window is None:
        return check.inconclusive(host, observed=observed, expected=expected, rule=rule, evidence=evidence,
                                  reason="the profile has no contract.context_tokens + max_output_tokens to judge by",
                                  action="set contract.context_tokens and contract.max_output_tokens in the profile")
    if served < window:
        return check.fail(host, observed=observed, expected=expected, rule=rule, evidence=evidence,
                          reason=f"the server serves max_model_len {served}, below the contract's {window} tokens "
                                 "(context + max output): contracted requests are rejected",
                          action=f"launch with --max-model-len >= {window} (the recipe's: {recipe}), or lower the "
                                 "contract in a site profile")
    notes = [] if recipe is None or served == recipe else [
        f"served max_model_len {served} differs from the recipe's {recipe} ({recipe_field}) by {served - recipe:+d}: "
        "recorded (the recipe adjusts it per scenario)"]
    if served > window:
        notes.append(f"{served - window} tokens over the contract are served: capacity.context_contract judges who "
                     "enforces the contract")
    return check.passed(host, observed=observed, expected=expected, rule=rule, evidence=evidence,
                        reason="; ".join(notes))
