"""Serve-stage rules: the startup log against the recipe and the running server's actual configuration
(docs/checks.md, compat.startup_log, compat.actual_config.*)."""

from __future__ import annotations

from typing import Any

from ..core.findings import Consequence, Finding, Status, missing
from ..core.profile import Profile
from ..parsers.base import version_at_least
from ..parsers.startup_log import StartupScan
from .context import ROUTE_DRIVER, ROUTE_IMAGE, ROUTE_ISOLATED, ROUTE_SELF_BUILT
from .launched import LaunchedPlan, launched_plan

# --- compat.startup_log (called by the serve stage) -----------------------------------------

_LAYOUT_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local")


def _profile_arg_values(profile: Profile) -> dict[str, Any]:
    """--name=value -> {name_with_underscores: value}; --flag -> True; --no-flag -> {flag: False}."""
    out: dict[str, Any] = {}
    for arg in profile.get("launch.args", []) or []:
        name, sep, value = str(arg).lstrip("-").partition("=")
        key = name.replace("-", "_")
        if sep:
            out[key] = value
        elif key.startswith("no_"):
            out[key[3:]] = False
        else:
            out[key] = True
    return out


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return str(expected).lower() == str(actual).lower()
    if isinstance(actual, (dict, list)):
        return True   # structured values (e.g. --attention-config JSON) are compared by the serve stage
    return str(expected) == str(actual)


def check_startup_log(scan: StartupScan | None, profile: Profile, host: str | None,
                      evidence: list[str], plan: LaunchedPlan | None = None) -> Finding:
    """The startup log against the recipe: version, options, device and backend initialisation,
    parallel layout, no backend fallback, no NCCL error, KV cache initialised; warnings listed."""
    check = "compat.startup_log"
    if scan is None or scan.lines == 0:
        return missing(check, host, "no startup log captured (save it from the container's first line)",
                       evidence=evidence)
    observed = scan.summary()
    minimum = str(profile.get("vllm.min_version"))
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
        workaround = profile.get("launch.multinode.dmabuf_workaround_env", {}) or {"NCCL_DMABUF_ENABLE": "0"}
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
    wanted = {k: v for k, v in _profile_arg_values(profile).items() if k not in _LAYOUT_ARGS}
    wanted.update({"tensor_parallel_size": plan.tensor, "pipeline_parallel_size": plan.pipeline})
    mismatched = {k: (v, scan.non_default_args[k]) for k, v in wanted.items()
                  if scan.non_default_args and k in scan.non_default_args and not _same(v, scan.non_default_args[k])}
    if mismatched:
        problems.append(f"launch options differ from the profile (expected, actual): {mismatched}")
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
    if not scan.ready or not scan.kv_cache_initialised or scan.version is None:
        lacking = [name for name, ok in (("ready line", scan.ready), ("KV cache size line", scan.kv_cache_initialised),
                                         ("version line", scan.version is not None)) if not ok]
        return Finding(check=check, status=Status.INCONCLUSIVE, host=host, observed=observed, expected=expected,
                       rule=rule, evidence=evidence, reason="log lacks: " + ", ".join(lacking),
                       action="capture the whole log from the first line to ready")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


# --- compat.actual_config (called by the serve stage) ---------------------------------------

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
    """argv of the running server -> {flag_with_underscores: value}; the last occurrence wins
    (argparse semantics); --no-x sets x False."""
    flags: dict[str, Any] = {}
    index = 0
    while index < len(process_args):
        arg = process_args[index]
        index += 1
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        key = name.replace("-", "_")
        if not sep and index < len(process_args) and not process_args[index].startswith("--"):
            value, sep = process_args[index], "="
            index += 1
        if sep:
            flags[key] = value
        elif key.startswith("no_"):
            flags[key[3:]] = False
        else:
            flags[key] = True
    return flags


def check_actual_config(cache_config_info: dict[str, Any] | None, process_args: list[str] | None,
                        models: dict[str, Any] | None, profile: Profile, host: str | None,
                        evidence: list[str]) -> list[Finding]:
    """What the running server actually does: prefix caching per vllm:cache_config_info, required
    flags and parsers from the process's argv, max_model_len from /v1/models."""
    return [_actual_prefix_caching(cache_config_info, profile, host, evidence),
            _actual_flags(cache_config_info, process_args, profile, host, evidence),
            _actual_max_model_len(models, profile, host, evidence)]


def _expected_prefix_caching(profile: Profile) -> bool:
    values = _profile_arg_values(profile)
    if "enable_prefix_caching" in values:
        return bool(_truthy(values["enable_prefix_caching"]))
    return "enable_prefix_caching" in (profile.get("launch.required_flags", []) or [])


def _actual_prefix_caching(info: dict[str, Any] | None, profile: Profile, host: str | None,
                           evidence: list[str]) -> Finding:
    check = "compat.actual_config.prefix_caching"
    expected = _expected_prefix_caching(profile)
    rule = f"vllm:cache_config_info enable_prefix_caching == {expected}"
    if not info or "enable_prefix_caching" not in info:
        return missing(check, host, "no vllm:cache_config_info with enable_prefix_caching from /metrics",
                       evidence=evidence)
    actual = _truthy(info.get("enable_prefix_caching"))
    observed = {k: info.get(k) for k in ("enable_prefix_caching", "block_size", "cache_dtype",
                                         "gpu_memory_utilization", "num_gpu_blocks", "prefix_caching_hash_algo")
                if k in info}
    if actual is not expected:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, reason=f"prefix caching is {actual} on the running server",
                       action="fix the launch configuration (the flag did not reach the process), re-run")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


def _actual_flags(info: dict[str, Any] | None, process_args: list[str] | None, profile: Profile,
                  host: str | None, evidence: list[str]) -> Finding:
    check = "compat.actual_config.flags"
    if process_args is None:
        return missing(check, host, "no argv of the running server", evidence=evidence)
    flags = process_flags(process_args)
    required = list(profile.get("launch.required_flags", []) or [])
    expected: dict[str, Any] = {flag: True for flag in required}
    for key, field_name in (("tool_call_parser", "model.tool_call_parser"),
                            ("reasoning_parser", "model.reasoning_parser")):
        if profile.get(field_name):
            expected[key] = profile.get(field_name)
    observed: dict[str, Any] = {}
    problems = []
    for key, want in expected.items():
        have = flags.get(key)
        if key == "enable_prefix_caching" and info and "enable_prefix_caching" in info and have is None:
            have = _truthy(info["enable_prefix_caching"])     # on by default: the config is the truth
        observed[key] = have
        if want is True and _truthy(have) is not True:
            problems.append(f"--{key.replace('_', '-')} not in effect")
        elif want is not True and str(have) != str(want):
            problems.append(f"--{key.replace('_', '-')}={have!r}, profile {want!r}")
    rule = "required flags and the profile's parsers in effect on the running process"
    if problems:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, reason="; ".join(problems),
                       action="launch with the profile's args (the running process differs from the plan)")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


def _actual_max_model_len(models: dict[str, Any] | None, profile: Profile, host: str | None,
                          evidence: list[str]) -> Finding:
    check = "compat.actual_config.max_model_len"
    expected = profile.get("model.max_model_len")
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list) or not entries:
        return missing(check, host, "no /v1/models answer with models", evidence=evidence)
    served = profile.get("model.served_name") or profile.get("model.name")
    entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == served), None)
    if entry is None and len(entries) == 1 and isinstance(entries[0], dict):
        entry = entries[0]
    observed = {"models": [e.get("id") for e in entries if isinstance(e, dict)],
                "max_model_len": entry.get("max_model_len") if entry else None}
    rule = f"/v1/models {served} max_model_len == {expected}"
    if entry is None or entry.get("max_model_len") is None:
        return missing(check, host, f"/v1/models has no {served!r} with max_model_len", evidence=evidence)
    if entry.get("max_model_len") != expected:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, reason=f"max_model_len {entry.get('max_model_len')} != {expected}",
                       action="launch with --max-model-len of the profile, or record a lowered contract limit")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")
