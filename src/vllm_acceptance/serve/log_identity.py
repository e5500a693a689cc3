"""Is an operator-named startup log this server's? (docs/checks.md: compat.startup_log_identity; issue 28 item 3.)

In attach mode the startup log comes from the operator: a file (`vllm_serve_startup_log`) or a command's output
(`vllm_serve_attach_log_command`: `kubectl logs ...`, `journalctl -u ...`). It is used (compat.startup_log, the
flags read from it, the launch triage) only when its content matches the running server: the version it states
equals the server's `/version`, and where the log states them, its GPU block count equals `vllm:cache_config_info`
`num_gpu_blocks` and its context length equals `/v1/models` `max_model_len`, and its non-default args are the running
process's argv (serve/log_argv.py: a stale log of the same version from before a restart with other flags differs
on a flag; issue 42 item 3). Otherwise it is another server's (or
an unverifiable) log: a finding says so and the run goes on without it (compat.startup_log is then missing).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from ..core.findings import Finding
from ..parsers.startup_log import StartupScan
from ..rules import registry
from ..runtime.client import OpenAIClient, ServerUnreachable
from ..runtime.metrics import DirectMetrics, MetricsError, cache_config, server_root
from .log_argv import argv_differences

CHECK = "compat.startup_log_identity"


@dataclass
class LiveIdentity:
    """What the running server says of itself; None where it did not answer."""

    version: str | None = None
    num_gpu_blocks: int | None = None
    max_model_len: int | None = None
    errors: list[str] = field(default_factory=list)


def _int(value: Any) -> int | None:
    try:
        return int(str(value).replace(",", ""))
    except (TypeError, ValueError):
        return None


def read_live_identity(base_url: str, api_key: str | None = None, metrics_url: str | None = None,
                       timeout_s: float = 30.0) -> LiveIdentity:
    """/version, /v1/models max_model_len and /metrics vllm:cache_config_info num_gpu_blocks of the server."""
    live = LiveIdentity()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    root = server_root(base_url)
    try:
        answer = httpx.get(f"{root}/version", headers=headers, timeout=timeout_s)
        answer.raise_for_status()
        live.version = str(answer.json().get("version") or "") or None
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        live.errors.append(f"{root}/version: {exc}")
    client = OpenAIClient(base_url, api_key=api_key, timeout_s=timeout_s)
    try:
        data = client.models().get("data") or []
        live.max_model_len = _int(data[0].get("max_model_len")) if data else None
    except (ServerUnreachable, AttributeError, IndexError) as exc:
        live.errors.append(f"{base_url}/models: {exc}")
    finally:
        client.close()
    try:
        labels = cache_config(DirectMetrics(metrics_url or root + "/metrics", headers=headers).snapshot()) or {}
        live.num_gpu_blocks = _int(labels.get("num_gpu_blocks"))
    except MetricsError as exc:
        live.errors.append(f"/metrics: {exc}")
    return live


def log_states(scan: StartupScan) -> dict[str, Any]:
    """The identity the log states: its version, GPU blocks and context length (engine config's max_seq_len, else
    the non-default max_model_len); None where it states none."""
    engine = scan.engine_config or {}
    args = scan.non_default_args or {}
    return {"version": scan.version, "num_gpu_blocks": scan.kv_cache_gpu_blocks,
            "max_model_len": _int(engine.get("max_seq_len")) or _int(args.get("max_model_len"))}


def differences(scan: StartupScan, live: LiveIdentity) -> tuple[list[str], list[str]]:
    """(what differs, what could not be compared) between the log and the server."""
    stated = log_states(scan)
    differ, unknown = [], []
    if stated["version"] is None:
        unknown.append("the log states no vLLM version (its first lines are missing?)")
    elif live.version is None:
        unknown.append("the server's /version did not answer")
    elif stated["version"] != live.version:
        differ.append(f"version {stated['version']} in the log, {live.version} on the server (/version)")
    for key, source in (("num_gpu_blocks", "vllm:cache_config_info"), ("max_model_len", "/v1/models")):
        mine, theirs = stated[key], getattr(live, key)
        if mine is None:
            continue
        if theirs is None:
            unknown.append(f"the log states {key} {mine}, the server's {source} does not")
        elif mine != theirs:
            differ.append(f"{key} {mine} in the log, {theirs} on the server ({source})")
    return differ, unknown


def check_log_identity(scan: StartupScan, live: LiveIdentity, source: str, host: str | None,
                       evidence: list[str], process_args: list[str] | None = None) -> Finding:
    """pass: the log is this server's; else inconclusive (not this server's, or not verifiable): the log is not
    used and the run cannot be a release on it. `process_args`: the running process's argv (/proc/PID/cmdline),
    compared with the log's non-default args (serve/log_argv.py); without it the log's flags are unbound."""
    check = registry.get(CHECK)
    differ, unknown = differences(scan, live)
    argv_differ, argv_open = argv_differences(scan, process_args) if process_args is not None else ([], [])
    differ += argv_differ
    if process_args is None:
        unknown.append("the running process's argv was not read (name its pid: vllm_serve_pid), so the log's "
                       "flags are not compared with what runs")
    observed = {"source": source, "log": log_states(scan),
                "server": {"version": live.version, "num_gpu_blocks": live.num_gpu_blocks,
                           "max_model_len": live.max_model_len}, "server_errors": live.errors,
                "argv_not_compared": argv_open}
    if differ:
        return check.inconclusive(host, observed=observed, expected="the running server's identity",
                                  evidence=evidence,
                                  reason=f"the startup log from {source} is not this server's: " + "; ".join(differ)
                                  + "; it is not used",
                                  action="name this server's own log (vllm_serve_attach_log_command reading the "
                                         "running unit or pod, or its file) and re-run")
    if unknown:
        return check.inconclusive(host, observed=observed, expected="the running server's identity",
                                  evidence=evidence,
                                  reason=f"the startup log from {source} cannot be tied to this server: "
                                  + "; ".join(unknown) + "; it is not used",
                                  action="give the whole log from the server's first line (its version line), "
                                         "and let /version answer, then re-run")
    also = "".join(f", {k} {v}" for k, v in log_states(scan).items() if k != "version" and v is not None)
    return check.passed(host, observed=observed, expected="the running server's identity", evidence=evidence,
                        reason=f"the startup log from {source} states this server's version {live.version}{also}")
