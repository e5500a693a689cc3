"""quality.spec_acceptance / quality.spec_throughput (probes/quality/spec_decode.py; docs/checks.md): judged on real
/metrics of the lab's vLLM with healthy and faulty speculative decoding (tests/fixtures/real/spec-decode/) and on
real vLLM log lines of DSpark deployments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.probes.options import ProbeOptions
from vllm_acceptance.probes.quality import spec_decode
from vllm_acceptance.probes.quality.spec_acceptance import (
    Acceptance,
    AcceptanceFloor,
    SpecCounts,
    continuation,
    judge_acceptance,
    parse_log_lines,
)
from vllm_acceptance.runtime.metrics import parse_exposition

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
SPEC = REAL / "spec-decode"
NGRAM = SPEC / "vllm-0.32-cpu-lab-ngram-k3.prom"
MISMATCHED = SPEC / "vllm-0.32-cpu-lab-draft-model-mismatched.prom"
NO_SPEC = REAL / "metrics" / "vllm-0.32-cpu-lab.prom"
FLOOR = AcceptanceFloor(min_drafts=30, min_acceptance_length=1.5, min_continuation=0.4, min_position_drafts=20)
SPEC_ARGS = ["--speculative-config",
             '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}']


def snap(path: Path) -> Any:
    return parse_exposition(path.read_text(), taken=0.0)


def zero_of(path: Path) -> str:
    """The same scrape with every spec-decode counter at 0: the server before the requests (a fresh server's
    counters start at 0; vllm/v1/spec_decode/metrics.py)."""
    lines = []
    for line in path.read_text().splitlines():
        if line.startswith("vllm:spec_decode_") and "_total" in line:
            line = line.rsplit(" ", 1)[0] + " 0.0"
        lines.append(line)
    return "\n".join(lines) + "\n"


class Scrapes:
    """A metrics source answering the given exposition texts in turn (the last one again)."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    def snapshot(self) -> Any:
        text = self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]
        return parse_exposition(text)


def opts_for(tmp_path: Path, args: list[str] | None = None, **overrides: Any) -> ProbeOptions:
    profile = load_profile(ROOT / "profiles" / "cpu-lab.yml")
    if args is not None:
        data = profile.model.model_dump(by_alias=True, exclude_unset=True)
        data["launch"]["args"] = list(data["launch"]["args"]) + args
        profile = load_profile(_write(tmp_path / "p.yml", data))
    out = tmp_path / "run" / "probes" / "quality"
    out.mkdir(parents=True)
    return ProbeOptions(kind="quality", base_url="http://127.0.0.1:9/v1", model="tiny-agent", out_dir=out,
                        profile=profile, overrides=overrides)


def _write(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def run_check(opts: ProbeOptions, monkeypatch: pytest.MonkeyPatch, *texts: str, sent: list[int] | None = None):
    scrapes = Scrapes(*texts)
    monkeypatch.setattr(spec_decode, "metrics_source_of", lambda _opts: scrapes)
    monkeypatch.setattr(spec_decode, "_send_seeded", lambda _o, _s, n, _e: (sent if sent is not None else []).append(n))
    store = EvidenceStore(opts.out_dir.parent.parent, "probes/quality")
    before = spec_decode.CHECK.before(opts, store)
    return spec_decode.CHECK.after(opts, before, None, store)


# --- what the counters say ------------------------------------------------------------------------


def test_counts_of_the_lab_ngram_server() -> None:
    counts = SpecCounts.of(snap(NGRAM))
    assert counts is not None
    assert (counts.drafts, counts.draft_tokens, counts.accepted, counts.per_pos) == (128, 360, 320, (120, 104, 96))
    acc = Acceptance.of_counts(counts, "lab")
    assert acc.mean_length == pytest.approx(3.5)
    assert acc.rates == pytest.approx((0.9375, 0.8125, 0.75))


def test_a_server_without_speculative_config_exports_no_counters() -> None:
    assert SpecCounts.of(snap(NO_SPEC)) is None


def test_real_dspark_log_lines_read_as_vllm_computes_them() -> None:
    acc = parse_log_lines((SPEC / "vllm-ascend-13640-dspark-dsv4-flash.log").read_text(), "log")
    assert acc is not None and acc.drafts == pytest.approx(78)      # 161/7 + 385/7 drafts
    assert acc.mean_length == pytest.approx(1 + 150 / 78)
    assert len(acc.rates) == 7 and acc.rates[0] == pytest.approx((0.739 * 23 + 0.691 * 55) / 78)
    assert judge_acceptance(acc, FLOOR)[0] == "pass"
    assert parse_log_lines("INFO Engine 000: Avg prompt throughput: 1.0 tokens/s", "log") is None


# --- the rule ---------------------------------------------------------------------------------------


def test_healthy_lab_ngram_passes_and_the_mismatched_draft_fails() -> None:
    healthy = Acceptance.of_counts(SpecCounts.of(snap(NGRAM)), "lab")  # type: ignore[arg-type]
    faulty = Acceptance.of_counts(SpecCounts.of(snap(MISMATCHED)), "lab")  # type: ignore[arg-type]
    assert judge_acceptance(healthy, FLOOR) == ("pass", [])
    status, reasons = judge_acceptance(faulty, FLOOR)
    assert status == "fail" and "mean acceptance length 1.00 < 1.5" in reasons[0]


def test_a_collapse_after_the_first_position_fails_even_above_the_length_floor() -> None:
    # generated shape (vllm#51009: near-normal at position 0, ~25 % continuation after it)
    acc = Acceptance(drafts=200, mean_length=2.2, rates=(0.9, 0.22, 0.06, 0.02), source="generated")
    status, reasons = judge_acceptance(acc, FLOOR)
    assert status == "fail" and "collapses at position 1" in reasons[0]
    assert continuation(acc.rates)[0] == pytest.approx(0.22 / 0.9)


def test_a_late_position_with_few_accepted_drafts_is_not_called_a_collapse() -> None:
    # position 3 continues at 0.2, but position 2 holds 0.06 x 200 = 12 accepted drafts (< 20): noise
    acc = Acceptance(drafts=200, mean_length=2.5, rates=(0.9, 0.5, 0.06, 0.012), source="generated")
    assert judge_acceptance(acc, FLOOR)[0] == "fail"   # 0.06 / 0.5 = 0.12 at position 2 is judged (100 drafts)
    acc = Acceptance(drafts=200, mean_length=2.5, rates=(0.9, 0.8, 0.7, 0.06, 0.012), source="generated")
    assert judge_acceptance(acc, FLOOR) == ("fail", [
        "acceptance collapses at position 3: 0.060 of drafts against 0.700 at position 2 (continuation 0.09 < 0.4)"])
    acc = Acceptance(drafts=200, mean_length=2.5, rates=(0.9, 0.8, 0.7, 0.6, 0.05), source="generated")
    assert judge_acceptance(acc, FLOOR)[0] == "fail"
    acc = Acceptance(drafts=200, mean_length=2.5, rates=(0.9, 0.8, 0.7, 0.6, 0.5, 0.09, 0.01), source="generated")
    assert judge_acceptance(acc, FLOOR)[0] == "fail"
    acc = Acceptance(drafts=200, mean_length=2.5, rates=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.09, 0.01),
                     source="generated")
    assert judge_acceptance(acc, FLOOR)[0] == "fail"   # 0.09 / 0.4 at position 6
    acc = Acceptance(drafts=200, mean_length=2.5, rates=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.05),
                     source="generated")
    assert judge_acceptance(acc, FLOOR)[0] == "fail"   # 0.3 x 200 = 60 accepted at position 6: judged
    acc = Acceptance(drafts=200, mean_length=2.5, rates=(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.05, 0.005),
                     source="generated")
    status, reasons = judge_acceptance(acc, FLOOR)
    assert status == "fail" and "position 6" in reasons[0]   # 0.05 x 200 = 10 at position 6: position 7 not judged


def test_too_few_drafts_is_inconclusive_with_the_count_never_pass() -> None:
    acc = Acceptance(drafts=12, mean_length=3.9, rates=(1.0, 1.0, 0.9), source="generated")
    status, reasons = judge_acceptance(acc, FLOOR)
    assert status == "inconclusive" and reasons == ["12 drafts counted, 30 needed to judge acceptance"]
    assert judge_acceptance(Acceptance(0, None, (), "x"), FLOOR)[0] == "inconclusive"


# --- the path check ---------------------------------------------------------------------------------


def test_applies_only_where_the_launch_has_a_speculative_config(tmp_path: Path) -> None:
    assert not spec_decode.CHECK.applies(opts_for(tmp_path / "a"))
    opts = opts_for(tmp_path / "b", SPEC_ARGS)
    assert spec_decode.CHECK.applies(opts)
    config, source = spec_decode.speculative_config(opts)
    assert config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert source == "the profile's launch.args"


def test_the_served_argv_wins_over_the_profile(tmp_path: Path) -> None:
    opts = opts_for(tmp_path)   # the profile has no speculative config; the running server has one
    served = opts.out_dir.parent.parent / "evidence" / "serve" / "process-args.json"
    served.parent.mkdir(parents=True)
    served.write_text(json.dumps(["python", "-m", "vllm.entrypoints.openai.api_server", *SPEC_ARGS]))
    assert spec_decode.CHECK.applies(opts)
    assert spec_decode.speculative_config(opts)[1].startswith("evidence/serve/process-args.json")


def test_check_passes_on_the_healthy_lab_scrapes_and_fails_on_the_mismatched_draft(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    healthy = run_check(opts_for(tmp_path / "h", SPEC_ARGS), monkeypatch, zero_of(NGRAM), NGRAM.read_text())
    assert [f.status for f in healthy] == [Status.PASS, Status.NOT_APPLICABLE]
    assert healthy[0].observed["mean_acceptance_length"] == 3.5
    record = json.loads((tmp_path / "h" / "run" / "probes" / "quality" / "spec-acceptance.json").read_text())
    assert record["counts"]["drafts"] == 128 and record["status"] == "pass"
    faulty = run_check(opts_for(tmp_path / "f", SPEC_ARGS), monkeypatch, zero_of(MISMATCHED), MISMATCHED.read_text())
    assert faulty[0].status == Status.FAIL and "1.00 < 1.5" in faulty[0].reason


def test_too_few_drafts_after_the_seeded_requests_is_inconclusive(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    text = NGRAM.read_text()
    findings = run_check(opts_for(tmp_path, SPEC_ARGS), monkeypatch, text, text, text, sent=sent)
    assert sent == [8]    # the check sent its own requests before judging
    assert findings[0].status == Status.INCONCLUSIVE and "0 drafts counted, 30 needed" in findings[0].reason


def test_a_speculative_config_without_spec_series_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = NO_SPEC.read_text()
    findings = run_check(opts_for(tmp_path, SPEC_ARGS), monkeypatch, text, text)
    assert findings[0].status == Status.MISSING and "exports none of" in findings[0].reason


def test_the_floor_comes_from_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = opts_for(tmp_path, SPEC_ARGS, **{"quality.spec_decode.min_acceptance_length": 3.6})
    findings = run_check(opts, monkeypatch, zero_of(NGRAM), NGRAM.read_text())
    assert findings[0].status == Status.FAIL and "3.50 < 3.6" in findings[0].reason


# --- throughput with and without it -------------------------------------------------------------------


def row(tps: float | None, ok: int = 16, count: int = 16, saturated: list[str] | None = None) -> dict[str, Any]:
    return {"count": count, "ok": ok, "usage_missing": 0, "output_tokens_per_s": tps,
            "client_saturated": saturated or []}


def test_throughput_rule() -> None:
    assert spec_decode.judge_throughput(row(300.0), row(310.0), 0.05)[0] == "pass"
    status, reason, observed = spec_decode.judge_throughput(row(216.0), row(311.0), 0.05)
    assert status == "fail" and observed["ratio"] == pytest.approx(216 / 311, abs=1e-4)
    assert spec_decode.judge_throughput(row(300.0, ok=15), row(310.0), 0.05)[0] == "inconclusive"
    assert spec_decode.judge_throughput(row(300.0), row(310.0, saturated=["cpu"]), 0.05)[0] == "inconclusive"
    assert spec_decode.judge_throughput(row(None), row(310.0), 0.05)[0] == "inconclusive"


def test_throughput_without_a_reference_is_not_applicable(tmp_path: Path) -> None:
    opts = opts_for(tmp_path, SPEC_ARGS)
    finding = spec_decode.judge_spec_throughput(opts, EvidenceStore(tmp_path, "q"))
    assert finding.status == Status.NOT_APPLICABLE and "quality_reference_url" in finding.reason
    opts.kind = "agent"
    opts.reference_url = "http://127.0.0.1:9/v1"   # the agent probe's reference is another endpoint: not used
    assert spec_decode.reference_of(opts) is None


def test_throughput_is_measured_warm_and_in_abba_halves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each side warmed first (unmeasured), then the halves path, reference, reference, path: a drift of the shared
    machine over the measurement weighs on both sides (the rehearsal's 16-request, <1 s measurement once read a warm
    reference against a fresh path as 0.83x, then 1.04x on the next run). The halves add up per side."""
    calls: list[tuple[str, str, int]] = []
    tps = {"path-1": 100.0, "reference-1": 120.0, "reference-2": 80.0, "path-2": 100.0}

    def fake(opts, store, label, url, model, key, specs, concurrency):
        calls.append((label, url, len(specs)))
        rate = tps.get(label, 1.0)
        tokens = 16 * len(specs)
        return {"count": len(specs), "recorded": len(specs), "ok": len(specs), "errors": 0, "timeouts": 0,
                "usage_missing": 0, "output_tokens": tokens, "duration_s": tokens / rate, "output_tokens_per_s": rate,
                "client_saturated": []}

    monkeypatch.setattr(spec_decode, "_measure", fake)
    opts = opts_for(tmp_path, SPEC_ARGS, **{"quality.spec_decode.throughput_requests": 8})
    opts.reference_url = "http://ref.invalid/v1"
    opts.kind = "quality"
    finding = spec_decode.judge_spec_throughput(opts, EvidenceStore(tmp_path, "q"))
    labels = [label for label, _, _ in calls]
    assert labels == ["warm-path", "warm-reference", "path-1", "reference-1", "reference-2", "path-2"], labels
    assert [n for _, _, n in calls[2:]] == [4, 4, 4, 4]
    # reference: 128 tokens in 128/120 s + 128 tokens in 128/80 s -> 96 tokens/s; path 100: ratio 1.04, a pass
    assert finding.status == Status.PASS, finding.reason
    assert finding.observed["reference_output_tokens_per_s"] == pytest.approx(96.0)
    assert finding.observed["ratio"] == pytest.approx(100 / 96, abs=1e-4)


def test_combined_halves_without_a_duration_are_no_figure() -> None:
    whole = {"count": 4, "ok": 4, "output_tokens": 64, "duration_s": 0.5, "output_tokens_per_s": 128.0}
    assert spec_decode.combine([whole, whole])["output_tokens_per_s"] == pytest.approx(128.0)
    broken = {**whole, "duration_s": None, "output_tokens_per_s": None}
    assert spec_decode.combine([whole, broken])["output_tokens_per_s"] is None
    status, _, _ = spec_decode.judge_throughput(spec_decode.combine([whole, broken]), row(100.0, ok=8, count=8), 0.05)
    assert status == "inconclusive"
