"""The quality probe as a unit of the probe registry (probes/registry.py): its settings (core/profile_model.py
`quality`), the reference path, the path checks around the parity pass (hooks.py PATH_CHECKS), and its run.

The reference path, first found:
- `quality_reference_url` (the probe's `reference_url`; its key from the environment variable
  `quality_reference_api_key_env` names, never argv): the same weights served the accepted way;
- for a P/D deployment without it, the first prefill instance of `opts.pools` called directly. That is the
  aggregated path: a request without `kv_transfer_params` is served whole by the instance that receives it -- vLLM
  0.32's NIXL connector acts only on `do_remote_decode`/`do_remote_prefill` (kv_connector/v1/nixl/
  pull_scheduler.py get_num_new_matched_tokens and request_finished return early without them), so the prefill
  instance prefills and decodes locally, with no KV transfer. Its parallel layout may differ from the decode
  pool's (the recipe's TEP8 prefill vs DEP decode), so the comparison relies on the reference's own floor where
  the serving is not batch-invariant (rules.py).
"""

from __future__ import annotations

import importlib
import traceback
from dataclasses import dataclass
from typing import Any

from ...core.arithmetic import launch_paths
from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...core.redact import redact_text
from ...runtime.client import OpenAIClient, ServerUnreachable
from ..options import ProbeOptions, request_timeout_s, setting
from ..registry import register
from . import rules
from .hooks import PATH_CHECKS
from .parity_pass import send_pass
from .parity_prompts import prompt_set

# The paths that change the arithmetic (docs/acceptance.md "Output parity"), read from the launch flags.
# (core/argv.py parse_flags keys: dashes as underscores; vLLM's short -dcp read beside it)


@dataclass(frozen=True)
class QualityProbeConfig:
    path: str = "reference"
    short_prompts: int = 6
    long_prompt_tokens: int = 0
    max_tokens: int = 32
    seed: int = 0
    concurrency: int = 8
    margin: float = 0.1
    model: str = ""


def config(opts: ProbeOptions, scenario: dict[str, Any]) -> QualityProbeConfig:
    """The probe's settings: `quality.*` (override, profile, default); the long prompt at most the contract's
    context less the tokens generated."""
    max_tokens = int(setting(opts, "quality.max_tokens"))
    context = setting(opts, "contract.context_tokens")
    long_tokens = setting(opts, "quality.long_prompt_tokens")
    if long_tokens is None:
        long_tokens = int(context) if context else 0
    if context:
        long_tokens = min(int(long_tokens), int(context) - max_tokens)
    return QualityProbeConfig(
        path=str(setting(opts, "quality.path")), short_prompts=int(setting(opts, "quality.short_prompts")),
        long_prompt_tokens=max(0, int(long_tokens)), max_tokens=max_tokens, seed=int(setting(opts, "quality.seed")),
        concurrency=int(setting(opts, "quality.concurrency")), margin=float(setting(opts, "quality.margin")),
        model=opts.reference_model or opts.model)


def arithmetic_paths(opts: ProbeOptions, cfg: QualityProbeConfig) -> list[str]:
    """What in this deployment changes the arithmetic against the accepted path: P/D pools, a speculative config,
    an fp8 KV cache, decode context parallel (core/arithmetic.py), or a comparison the profile names
    (quality.path)."""
    out: list[str] = []
    if opts.pools:
        out.append(f"P/D pools {', '.join(sorted(opts.pools))}")
    out += launch_paths(list(setting(opts, "launch.args") or []))
    if cfg.path != "reference":
        out.append(f"quality.path {cfg.path}")
    return out


def reference_of(opts: ProbeOptions) -> tuple[str | None, str]:
    """(the reference's base URL, where it came from)."""
    if opts.reference_url:
        return opts.reference_url, "quality_reference_url"
    for instance in opts.pools.get("prefill") or []:
        if instance.get("base_url"):
            return instance["base_url"], "a prefill instance called directly (the aggregated path)"
    return None, ""


def _path_checks() -> list[Any]:
    """The CHECK of each module of PATH_CHECKS present in this tree, in run order (an absent module is skipped)."""
    out = []
    for name in PATH_CHECKS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        out.append(module.CHECK)
    return out


def run_quality_probe(opts: ProbeOptions, client: OpenAIClient, store: EvidenceStore, scenario: dict[str, Any],
                      checks: list[Any] | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """Path checks' `before`, the parity pass, their `after`; every answer written as it arrives."""
    cfg = config(opts, scenario)
    checks = _path_checks() if checks is None else checks
    findings: list[Finding] = []
    ran: list[tuple[Any, dict[str, Any]]] = []
    skipped: list[str] = []
    for check in checks:
        try:
            if not check.applies(opts):
                skipped.append(check.name)
                continue
            ran.append((check, check.before(opts, store)))
        except Exception as exc:  # noqa: BLE001 - a path check that breaks leaves its path unproven
            findings.append(_stopped(check, exc, store))
    parity, details = _parity(opts, cfg, client, store, scenario, findings)
    names = []
    for check, before in ran:
        try:
            findings.extend(check.after(opts, before, parity, store))
            names.append(check.name)
        except Exception as exc:  # noqa: BLE001
            findings.append(_stopped(check, exc, store))
    if not any(f.check == rules.PATH_CHECKS for f in findings):
        findings.append(rules.path_checks_ran(names, skipped))
    return findings, details


def _stopped(check: Any, exc: Exception, store: EvidenceStore) -> Finding:
    name = str(getattr(check, "name", type(check).__name__))
    ev = store.write_text(f"path-check-{name}.txt", traceback.format_exc())
    return rules.path_check_missing(name, f"{type(exc).__name__}: {exc}", [ev])


def sized_prompts(reference: OpenAIClient, cfg: QualityProbeConfig, scenario: dict[str, Any]) -> list[Any]:
    """The prompt set, its long prompt sized to quality.long_prompt_tokens with the reference's /tokenize (the
    same weights: the same tokenizer); without /tokenize, the set as built (below the target)."""
    prompts = prompt_set(scenario, short=cfg.short_prompts, long_tokens=cfg.long_prompt_tokens, seed=cfg.seed)
    long = next((p for p in prompts if p.kind == "long"), None)
    measured = reference.tokenize(cfg.model, long.messages) if long else None
    if not long or not measured:
        return prompts
    ratio = 0.75 * cfg.long_prompt_tokens / len(measured) * 0.98
    for _ in range(3):   # at most the target: shrink while the template's share makes it overshoot
        sized = prompt_set(scenario, short=cfg.short_prompts, long_tokens=cfg.long_prompt_tokens, seed=cfg.seed,
                           words_per_token=ratio)
        tokens = reference.tokenize(cfg.model, next(p for p in sized if p.kind == "long").messages)
        if tokens and len(tokens) <= cfg.long_prompt_tokens:
            return sized
        ratio *= 0.95
    return prompts


def _parity(opts: ProbeOptions, cfg: QualityProbeConfig, client: OpenAIClient, store: EvidenceStore,
            scenario: dict[str, Any], findings: list[Finding]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The parity pass and its two findings; (the summary the path checks get, or None when it did not run)."""
    paths = arithmetic_paths(opts, cfg)
    url, origin = reference_of(opts)
    details: dict[str, Any] = {"path": cfg.path, "arithmetic_paths": paths}
    if not url:
        findings.extend(rules.no_reference(paths, cfg.path))
        return None, details
    shown = redact_text(url)
    details.update({"reference": shown, "reference_from": origin})
    if url.strip().rstrip("/") == opts.base_url.strip().rstrip("/"):
        findings.extend(rules.same_path(shown, cfg.path))
        return None, details
    api_key = opts.reference_api_key if opts.reference_url else opts.api_key
    reference = OpenAIClient(url, api_key=api_key, timeout_s=request_timeout_s(opts))
    try:
        try:
            reference.models()
        except ServerUnreachable as exc:
            findings.extend(rules.unreachable(shown, str(exc), cfg.path))
            return None, details
        prompts = sized_prompts(reference, cfg, scenario)
        names = [p.name for p in prompts]
        store.write_json("prompts.json", [{"name": p.name, "kind": p.kind, "messages": p.messages,
                                           "tools": [t.get("function", {}).get("name") for t in p.tools]}
                                          for p in prompts])
        common = {"max_tokens": cfg.max_tokens, "seed": cfg.seed, "store": store}
        ref = send_pass("reference", reference, prompts, model=cfg.model, concurrency=1, **common)
        floor = send_pass("floor", reference, prompts, model=cfg.model, concurrency=cfg.concurrency, **common)
    finally:
        reference.close()
    test = send_pass("test", client, prompts, model=opts.model, concurrency=cfg.concurrency,
                     stream_every_second=True, **common)
    evidence = [ref.evidence, floor.evidence, test.evidence]
    ref_finding = rules.judge_reference(names, ref, floor, label=cfg.path, evidence=evidence[:2])
    parity = rules.judge_parity(names, ref, floor, test, margin=cfg.margin, label=cfg.path, evidence=evidence)
    comparison = store.write_json("comparison.json", {"reference": shown, "reference_from": origin,
                                                      "path": cfg.path, **(parity.observed or {})})
    parity.evidence.append(comparison)
    findings.extend([ref_finding, parity])
    summary = {"requests": 3 * len(prompts), "prompts": names, "status": parity.status.value,
               "per_prompt": {p: {"answered": s.answer is not None, "streamed": s.streamed, "error": s.error,
                                  "identical": ((parity.observed or {}).get("prompts") or {}).get(p, {}).get(
                                      "identical")} for p, s in test.by_prompt().items()}}
    details.update({"parity": parity.status.value, "prompts": len(prompts),
                    "batch_invariant": (parity.observed or {}).get("batch_invariant")})
    return summary, details


def run(opts: ProbeOptions, client: OpenAIClient, store: EvidenceStore,
        scenario: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    return run_quality_probe(opts, client, store, scenario)


PROBE = register("quality", config_type=QualityProbeConfig, config=config, run=run)
