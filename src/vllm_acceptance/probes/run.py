"""One entry for every probe, shared by the CLI and the `acceptance_probe` Ansible module."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from ..core.evidence import EvidenceStore
from ..core.findings import Consequence, Finding
from ..core.probes import probe_names
from ..core.profile import ConfigError, Profile, load_profile
from ..core.reference import check_reference_url
from ..rules.registry import missing
from ..runtime.client import OpenAIClient, ServerUnreachable
from ..scenarios import load_scenario
from . import registry
from .options import ProbeOptions, metrics_source_of, probe_secrets, request_timeout_s, setting
from .result import overall_status, write_result

__all__ = ["DEFAULT_PROFILE", "PROBES", "ProbeOptions", "probe_secrets", "request_timeout_s", "resolve_profile",
           "run_cache_restart_probe", "run_load_limit_probe", "run_probe"]

DEFAULT_PROFILE = Path(__file__).resolve().parents[3] / "profiles" / "cpu-lab.yml"
PROBES = probe_names()


def resolve_profile(path: str | None) -> Profile | None:
    if path:
        return load_profile(path)
    return load_profile(DEFAULT_PROFILE) if DEFAULT_PROFILE.is_file() else None


def run_probe(opts: ProbeOptions, *, write_result_json: bool = True) -> tuple[str, list[Finding], dict[str, Any]]:
    """Run one probe; write OUT/result.json (the CLI's contract; a run's stage files instead, see
    probes/stage.py); return (status, findings, details).

    Raises ConfigError on bad input and client.ServerUnreachable when the base URL does not answer.
    """
    if opts.kind not in PROBES:
        raise ConfigError(f"probe {opts.kind!r}: unknown (choose one of {', '.join(PROBES)})")
    probe = registry.get(opts.kind)
    check_reference_url(opts.reference_url, f"reference URL (--reference-url, inventory "
                        f"{'quality' if opts.kind == 'quality' else 'agent'}_reference_url)", opts.reference_api_key)
    secrets = probe_secrets(opts)
    store = EvidenceStore(opts.out_dir, secrets=secrets)
    client = OpenAIClient(opts.base_url, api_key=opts.api_key, timeout_s=request_timeout_s(opts))
    try:
        client.models()  # fail early (exit 2) when the URL is wrong, before any evidence is judged
        try:
            scenario = load_scenario(str(setting(opts, "agent.scenario")))
            findings, details = probe.run(opts, client, store, scenario)
        except (ConfigError, ServerUnreachable):
            raise
        except Exception as exc:  # noqa: BLE001 - a probe that breaks is a missing stage, never a pass
            ev = store.write_text("probe-error.txt", traceback.format_exc())
            findings = [missing(probe.kind.stopped_check, None,
                                f"the {opts.kind} probe stopped: {type(exc).__name__}: {exc}",
                                Consequence(probe.kind.consequence), evidence=[ev])]
            details = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        client.close()
    if write_result_json:
        return write_result(opts.out_dir, opts.kind, findings, details, secrets), findings, details
    return overall_status(findings), findings, details


def run_cache_restart_probe(opts: ProbeOptions, details: dict[str, Any], restart_error: str | None,
                            restart_log: str | None) -> tuple[Any, dict[str, Any] | None]:
    """The cache protocol's request after a restart made between two probe calls (probes/stage.py)."""
    from .cache import run_cache_restart

    store = EvidenceStore(opts.out_dir, secrets=[opts.api_key] if opts.api_key else [])
    client = OpenAIClient(opts.base_url, api_key=opts.api_key, timeout_s=request_timeout_s(opts))
    try:
        scenario = load_scenario(str(setting(opts, "agent.scenario")))
        cfg = registry.get("cache").config(opts, scenario)
        return run_cache_restart(client, metrics_source_of(opts), cfg, store, details, restart_error, restart_log)
    finally:
        client.close()


def run_load_limit_probe(opts: ProbeOptions, details: dict[str, Any], prior: list[Finding],
                         relaunch_error: str | None, relaunch_log: str | None) -> tuple[list[Finding], dict[str, Any]]:
    """The load stage's next proposed limit, on the server relaunched with its flags between two probe
    calls (probes/stage.py)."""
    from .load.limit import run_load_limit

    store = EvidenceStore(opts.out_dir, secrets=[opts.api_key] if opts.api_key else [])
    cfg = registry.get("load").config(opts, {})
    return run_load_limit(opts.base_url, metrics_source_of(opts), cfg, store, details, prior,
                          relaunch_error=relaunch_error, relaunch_log=relaunch_log)
