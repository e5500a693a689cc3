"""Speculative decoding judged around the quality probe's parity pass (docs/checks.md `quality.spec_acceptance`,
`quality.spec_throughput`; issue 45 item 4). A `PathCheck` (probes/quality/hooks.py).

It applies where the served launch has a speculative config: the running server's argv as the serve stage
recorded it (evidence/serve/process-args.json of the run), else the profile's launch.args. Before the parity
pass it reads the server's spec-decode counters; after it, the difference is the acceptance over the pass's
requests. When the pass moved too few drafts it sends its own seeded greedy requests
(quality.spec_decode.requests) and reads again; too few still is inconclusive with the count, never pass.
Then the throughput with and without it: the same seeded requests through the load engine (load/engine) at
contract.concurrency to the path under test and to the reference without speculative decoding
(quality_reference_url), each side warmed first, the halves sent path, reference, reference, path."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...core.argv import parse_flags
from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...core.rundir import RunDir
from ...load.engine import RecordSink, RequestSpec, run_closed_loop_sync, summarize
from ...load.prompts import words_spec
from ...load.stats import client_summary
from ...rules.loadgen import ClientLimits, saturation
from ...rules.registry import get
from ...runtime.metrics import MetricsError, Snapshot
from ..options import ProbeOptions, metrics_source_of, setting
from .spec_acceptance import SPEC_FAMILIES, Acceptance, AcceptanceFloor, SpecCounts, judge_acceptance

ACCEPTANCE = "quality.spec_acceptance"
THROUGHPUT = "quality.spec_throughput"
FLAG = "speculative_config"


def speculative_config(opts: ProbeOptions) -> tuple[dict[str, Any] | None, str]:
    """(the served speculative config, where it was read); (None, why) when the launch has none."""
    served = _served_args(opts)
    if served is not None:
        args, source = served
    elif opts.profile is not None:
        args, source = list(opts.profile.model.launch.args), "the profile's launch.args"
    else:
        return None, "no served argv and no profile: no speculative config known"
    value = parse_flags(args).get(FLAG)
    if value in (None, True, False):
        return None, f"no --speculative-config in {source}"
    try:
        config = json.loads(str(value))
    except ValueError:
        return {"unparsed": str(value)}, source
    return (config if isinstance(config, dict) else {"value": config}), source


def _served_args(opts: ProbeOptions) -> tuple[list[str], str] | None:
    """The argv the serve stage recorded for this run (the probe's out_dir is <run>/probes/<kind>)."""
    run = RunDir(Path(opts.out_dir).parent.parent)
    path = run.evidence_path("serve", "process-args.json")
    try:
        args = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(args, list):
        return None
    return [str(a) for a in args], "evidence/serve/process-args.json (the running server's argv)"


def acceptance_floor(opts: ProbeOptions) -> AcceptanceFloor:
    return AcceptanceFloor(min_drafts=int(setting(opts, "quality.spec_decode.min_drafts")),
                           min_acceptance_length=float(setting(opts, "quality.spec_decode.min_acceptance_length")),
                           min_continuation=float(setting(opts, "quality.spec_decode.min_continuation")),
                           min_position_drafts=int(setting(opts, "quality.spec_decode.min_position_drafts")))


def reference_of(opts: ProbeOptions) -> str | None:
    """The reference path without speculative decoding: ProbeOptions.quality_reference_url where the quality
    probe's options carry it, else the quality probe's own reference_url (the options are per probe)."""
    url = getattr(opts, "quality_reference_url", None)
    return url or (opts.reference_url if opts.kind == "quality" else None)


def seeded_requests(n: int, max_tokens: int, seed: int, tag: str, words: int = 48) -> list[RequestSpec]:
    """Greedy requests of the load engine's seeded filler (load/prompts.py), the same for a seed."""
    return [words_spec(words, max_tokens, seed + i, tag) for i in range(n)]


def _snapshot(opts: ProbeOptions, store: EvidenceStore, name: str) -> tuple[Snapshot | None, str, str | None]:
    """(snapshot, evidence path, error)."""
    try:
        snap = metrics_source_of(opts).snapshot()
    except MetricsError as exc:
        return None, store.write_text(f"{name}.error.txt", str(exc)), str(exc)
    return snap, store.write_text(f"{name}.prom", snap.raw), None


class SpecDecodeCheck:
    name = "spec_decode"

    def applies(self, opts: ProbeOptions) -> bool:
        return speculative_config(opts)[0] is not None

    def before(self, opts: ProbeOptions, store: EvidenceStore) -> dict[str, Any]:
        snap, path, error = _snapshot(opts, store, "spec-metrics-before")
        counts = SpecCounts.of(snap) if snap is not None else None
        return {"counts": counts, "evidence": [path], "error": error,
                "exported": snap is not None and counts is not None}

    def after(self, opts: ProbeOptions, before: dict[str, Any], parity: dict[str, Any] | None,
              store: EvidenceStore) -> list[Finding]:
        config, source = speculative_config(opts)
        evidence = list(before.get("evidence") or [])
        acceptance = judge_spec_acceptance(opts, before, store, evidence, config, source)
        return [acceptance, judge_spec_throughput(opts, store)]


def judge_spec_acceptance(opts: ProbeOptions, before: dict[str, Any], store: EvidenceStore, evidence: list[str],
                          config: dict[str, Any] | None, source: str) -> Finding:
    check = get(ACCEPTANCE)
    configuration = {"speculative_config": config, "read_from": source}
    first: SpecCounts | None = before.get("counts")
    if first is None:
        why = before.get("error") or ("the server exports none of " + ", ".join(SPEC_FAMILIES) +
                                      " although its launch has a speculative config")
        return check.missing(None, f"spec-decode counters before the pass: {why}", evidence=evidence)
    floor = acceptance_floor(opts)
    moved, error = _read_since(opts, store, "spec-metrics-after", first, evidence)
    sent = 0
    if moved is not None and moved.drafts < floor.min_drafts:
        sent = int(setting(opts, "quality.spec_decode.requests"))
        _send_seeded(opts, store, sent, evidence)
        moved, error = _read_since(opts, store, "spec-metrics-after-seeded", first, evidence)
    if moved is None:
        return check.missing(None, f"spec-decode counters after the pass: {error}", evidence=evidence)
    acc = Acceptance.of_counts(moved, "server /metrics counters, after - before")
    status, reasons = judge_acceptance(acc, floor)
    record = {"counts": moved.to_dict(), **acc.to_dict(), "floor": asdict(floor), "seeded_requests_sent": sent,
              "status": status, "reasons": reasons, **configuration}
    evidence.append(store.write_json("spec-acceptance.json", record))
    observed = acc.to_dict()
    expected = {"min_acceptance_length": floor.min_acceptance_length, "min_continuation": floor.min_continuation,
                "min_drafts": floor.min_drafts}
    if status == "inconclusive":
        return check.inconclusive(None, observed=observed, expected=expected, evidence=evidence,
                                  reason="; ".join(reasons), configuration=configuration,
                                  action="send more requests through the speculative path (quality.spec_decode."
                                         "requests) and re-run; a method that never drafts on them is not judged")
    if status == "fail":
        return check.fail(None, observed=observed, expected=expected, evidence=evidence, reason="; ".join(reasons),
                          configuration=configuration,
                          action="check the draft model / method against the served weights (vllm#51009), or "
                                 "launch without --speculative-config until its acceptance holds")
    per_position = " / ".join(f"{rate:.2f}" for rate in acc.rates)
    return check.passed(None, observed=observed, expected=expected, evidence=evidence, configuration=configuration,
                        reason=f"mean acceptance length {acc.mean_length or 0:.2f} >= floor "
                               f"{floor.min_acceptance_length:g} over {acc.drafts:g} drafts (per position "
                               f"{per_position})")


def _read_since(opts: ProbeOptions, store: EvidenceStore, name: str, first: SpecCounts,
                evidence: list[str]) -> tuple[SpecCounts | None, str | None]:
    snap, path, error = _snapshot(opts, store, name)
    evidence.append(path)
    if snap is None:
        return None, error
    now = SpecCounts.of(snap)
    if now is None:
        return None, "the spec-decode series disappeared from /metrics (a restarted server?)"
    moved = now.since(first)
    if moved.drafts < 0 or moved.accepted < 0:
        return None, "the spec-decode counters fell: the server restarted during the pass"
    return moved, None


def _send_seeded(opts: ProbeOptions, store: EvidenceStore, n: int, evidence: list[str]) -> None:
    specs = seeded_requests(n, int(setting(opts, "quality.spec_decode.max_tokens")), 0, "spec-seeded")
    sink_path = store.path("spec-seeded.jsonl")
    sink = RecordSink(sink_path)
    try:
        run_closed_loop_sync(opts.base_url, opts.model, specs, min(n, 4), api_key=opts.api_key, on_record=sink,
                             timeout_s=float(setting(opts, "load.request_timeout_s")))
    finally:
        sink.close()
    evidence.append(store.rel(sink_path))


def judge_spec_throughput(opts: ProbeOptions, store: EvidenceStore) -> Finding:
    check = get(THROUGHPUT)
    reference = reference_of(opts)
    n = int(setting(opts, "quality.spec_decode.throughput_requests"))
    if not reference:
        return check.not_applicable(None, "no reference without speculative decoding (quality_reference_url): "
                                          "throughput with and without it not measured")
    if n == 0:
        return check.not_applicable(None, "quality.spec_decode.throughput_requests is 0: not measured")
    concurrency = int(setting(opts, "contract.concurrency"))
    n = max(n, concurrency)
    tolerance = float(setting(opts, "quality.spec_decode.throughput_tolerance"))
    words = max(1, int(int(setting(opts, "load.prompt_tokens")) / 1.3))
    specs = seeded_requests(n, int(setting(opts, "load.output_tokens")), 1000, "spec-throughput", words)
    ref_model = getattr(opts, "quality_reference_model", None) or opts.reference_model or opts.model
    ref_key = getattr(opts, "quality_reference_api_key", None) or opts.reference_api_key
    sides = {"path": (opts.base_url, opts.model, opts.api_key), "reference": (reference, ref_model, ref_key)}
    # Each side warmed with `concurrency` requests first (not measured: a fresh server's first requests pay its
    # one-time costs), then measured in two halves in the order path, reference, reference, path, so that a drift
    # of the shared machine or network over the measurement weighs on both sides alike (an ABBA design).
    warm = seeded_requests(concurrency, int(setting(opts, "load.output_tokens")), 5000, "spec-throughput-warm", words)
    for side, (url, model, key) in sides.items():
        _measure(opts, store, f"warm-{side}", url, model, key, warm, concurrency)
    half = max(concurrency, len(specs) // 2)
    first, second = specs[:half], specs[half:] or specs[:half]
    rounds = [("path", first, "1"), ("reference", first, "1"), ("reference", second, "2"), ("path", second, "2")]
    parts: dict[str, list[dict[str, Any]]] = {"path": [], "reference": []}
    for side, part, label in rounds:
        url, model, key = sides[side]
        parts[side].append(_measure(opts, store, f"{side}-{label}", url, model, key, part, concurrency))
    rows = {side: combine(measured) for side, measured in parts.items()}
    record = {"requests": n, "concurrency": concurrency, "tolerance": tolerance, "order": [
        f"{side} half {label}" for side, _, label in rounds], "warm_up_requests": concurrency, **rows,
        "halves": parts}
    evidence = [store.write_json("spec-throughput.json", record),
                *(store.rel(store.path(f"spec-throughput-{side}-{label}.jsonl")) for side, _, label in rounds)]
    status, reason, observed = judge_throughput(rows["path"], rows["reference"], tolerance)
    expected = {"min_ratio": round(1 - tolerance, 4), "concurrency": concurrency}
    if status == "inconclusive":
        return check.inconclusive(None, observed=observed, expected=expected, evidence=evidence, reason=reason,
                                  action="re-run the measurement on a quiet load generator and servers")
    if status == "fail":
        return check.fail(None, observed=observed, expected=expected, evidence=evidence, reason=reason,
                          action="serve without --speculative-config at this concurrency (the recipe makes it "
                                 "opt-in for throughput), or lower num_speculative_tokens and measure again")
    return check.passed(None, observed=observed, expected=expected, evidence=evidence, reason=reason)


def _measure(opts: ProbeOptions, store: EvidenceStore, label: str, url: str, model: str, api_key: str | None,
             specs: list[RequestSpec], concurrency: int) -> dict[str, Any]:
    sink_path = store.path(f"spec-throughput-{label}.jsonl")
    sink = RecordSink(sink_path)
    selfcheck: list[dict[str, Any]] = []
    try:
        records = run_closed_loop_sync(url, model, specs, concurrency, api_key=api_key, on_record=sink,
                                       selfcheck=selfcheck, timeout_s=float(setting(opts, "load.request_timeout_s")),
                                       stage_deadline_s=float(setting(opts, "load.stage_timeout_s")))
    finally:
        sink.close()
    summary = summarize(records)
    client = client_summary(selfcheck, [])
    limits = ClientLimits.from_profile(lambda dotted, default: setting(opts, dotted))
    # count: the requests planned (a request the stage deadline kept from starting leaves no record, and is
    # never read as one that was not needed)
    return {"count": len(specs), "recorded": summary["count"], "ok": summary["ok"], "errors": summary["errors"],
            "timeouts": summary["timeouts"], "usage_missing": summary["usage_missing"],
            "output_tokens": summary["output_tokens"], "duration_s": summary["duration_s"],
            "output_tokens_per_s": summary["output_tokens_per_s"],
            "client_saturated": saturation({**client, "send_lag_s": {}}, limits, {})}


def combine(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's halves as one measurement: counts and tokens added, output tokens/s over the summed durations
    (None when a half has no duration or no tokens: the measurement is then incomplete, never a figure)."""
    total: dict[str, Any] = {key: sum(int(m.get(key) or 0) for m in measured)
                             for key in ("count", "recorded", "ok", "errors", "timeouts", "usage_missing",
                                         "output_tokens")}
    durations = [m.get("duration_s") for m in measured]
    complete = all(d for d in durations) and all(m.get("output_tokens_per_s") for m in measured)
    total["duration_s"] = sum(float(d) for d in durations if d)
    total["output_tokens_per_s"] = total["output_tokens"] / total["duration_s"] if complete else None
    total["client_saturated"] = [s for m in measured for s in m.get("client_saturated") or []]
    return total


def judge_throughput(path: dict[str, Any], reference: dict[str, Any], tolerance: float
                     ) -> tuple[str, str, dict[str, Any]]:
    """(status, reason, observed) of two measurements at the same requests and concurrency."""
    observed = {"path_output_tokens_per_s": path.get("output_tokens_per_s"),
                "reference_output_tokens_per_s": reference.get("output_tokens_per_s")}
    for label, row in (("path", path), ("reference", reference)):
        if row.get("ok") != row.get("count") or row.get("usage_missing") or not row.get("output_tokens_per_s"):
            return ("inconclusive", f"the {label} measurement is incomplete: {row.get('ok')} of {row.get('count')} "
                    f"answered, {row.get('usage_missing') or 0} without usage", observed)
        if row.get("client_saturated"):
            return "inconclusive", f"load generator saturated on the {label}: " + "; ".join(
                row["client_saturated"]), observed
    ratio = float(path["output_tokens_per_s"]) / float(reference["output_tokens_per_s"])
    observed["ratio"] = round(ratio, 4)
    if ratio < 1 - tolerance:
        return ("fail", f"speculative decoding gives {ratio:.2f}x the reference's output tokens/s at this "
                f"concurrency (below {1 - tolerance:.2f}x)", observed)
    return ("pass", f"speculative decoding gives {ratio:.2f}x the reference's output tokens/s at this concurrency "
            f"(at least {1 - tolerance:.2f}x)", observed)


CHECK = SpecDecodeCheck()
