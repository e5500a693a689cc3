"""The P/D path checks (probes/quality/pd_path.py, pd_stop.py) on recorded /metrics (tests/fixtures/pd_path/README.md):
the lab's healthy ExampleConnector pair, the lab's decode on another storage path, a real GPU NIXL deployment's failed
transfers (vllm#58038), an old vLLM without the by-source family, and recorded stop records of the lab pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.probes.options import ProbeOptions
from vllm_acceptance.probes.quality import pd_path, pd_stop
from vllm_acceptance.runtime.metrics import MetricsError, PoolCounters, parse_exposition

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "pd_path"
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real" / "metrics"
SENT = 4   # the capture's pass: tests/support/pd_lab.py PROMPTS


def counters(name: str, base: Path = FIX) -> PoolCounters:
    return PoolCounters.of(parse_exposition((base / name).read_text()))


def gain(pool: str, before: str, after: str, prefix: str = "lab-example-connector-healthy") -> pd_path.Gain:
    first, last = counters(f"{prefix}-{before}-{pool}.prom"), counters(f"{prefix}-{after}-{pool}.prom")
    return pd_path.Gain(f"{pool}[0]", last.since(first))


# --- runtime/metrics PoolCounters on the real captures -------------------------------------------------------------

def test_pool_counters_read_the_decode_split_of_a_real_lab_capture() -> None:
    c = counters("lab-example-connector-healthy-after-decode.prom")
    assert (c.requests, c.errors, c.block_size) == (5.0, 0.0, 128)
    assert c.computed is not None and c.external is not None and c.local_hit is not None
    assert c.computed + c.external + c.local_hit == c.prompt_tokens   # vLLM's PromptTokenStats invariant
    assert c.failed_transfers is None and c.transfers is None         # the ExampleConnector has no NIXL counters


def test_pool_counters_read_nixl_failures_and_leave_absent_families_none() -> None:
    c = counters("nixl-gpu-vllm58038-failed-transfers.prom")
    assert c.failed_transfers == 17960 and c.requests is None and c.computed is None


def test_a_gain_is_none_where_either_side_lacks_the_family() -> None:
    old = counters("vllm-0.7-router-v1-gpu-cache-usage.prom", REAL)
    new = counters("lab-example-connector-healthy-after-decode.prom")
    assert new.since(old).computed is None and new.since(old).block_size == 128


# --- quality.pd_prefill_served ------------------------------------------------------------------------------------

def test_prefill_served_passes_on_the_healthy_pair() -> None:
    f = pd_path.judge_prefill([gain("prefill", "before", "after")], SENT)
    assert f.status == Status.PASS and f.observed["served_per_prefill"]["prefill[0]"] == SENT


def test_a_prefill_that_served_nothing_fails() -> None:
    idle = gain("prefill", "before", "before")           # a real prefill's counters, unchanged over the pass
    f = pd_path.judge_prefill([idle], SENT)
    assert f.status == Status.FAIL and "reached the decode without a prefill" in f.reason


def test_one_idle_prefill_beside_a_busy_one_fails_by_name() -> None:
    busy, idle = gain("prefill", "before", "after"), gain("prefill", "after", "after")
    idle.name = "prefill[1]"
    f = pd_path.judge_prefill([busy, idle], SENT)
    assert f.status == Status.FAIL and "prefill[1]" in f.reason and "modelplane#175" in f.reason


def test_answers_are_not_prefill_requests() -> None:
    """The decode's real counters over the pass: 4 answers (max_tokens 8), as the reference passes sent to a prefill
    instance directly would be; none is a prefill request (max_tokens 1), so they do not stand for the prefill."""
    answered = gain("decode", "before", "after")
    assert answered.gained is not None and answered.gained.requests == SENT and answered.gained.prefill_side == 0
    assert pd_path.judge_prefill([answered], SENT).status == Status.FAIL


def test_requests_sent_counts_the_test_pass_not_the_reference_passes() -> None:
    summary = {"requests": 18, "prompts": ["a", "b", "c", "d", "e", "f"],
               "per_prompt": {p: {"answered": True} for p in "abcdef"}}   # probes/quality/probe.py's summary
    assert pd_path.requests_sent(summary) == 6
    assert pd_path.requests_sent({"requests_sent": 4, "requests": 12}) == 4
    assert pd_path.requests_sent(None) is None and pd_path.requests_sent({"requests": 3}) is None


def test_prefill_unreadable_or_no_pass_is_never_a_pass() -> None:
    assert pd_path.judge_prefill([pd_path.Gain("prefill[0]", None, "HTTP 503")], SENT).status == Status.MISSING
    assert pd_path.judge_prefill([gain("prefill", "before", "after")], None).status == Status.INCONCLUSIVE
    assert pd_path.judge_prefill([], SENT).status == Status.MISSING


# --- quality.pd_decode_loaded -------------------------------------------------------------------------------------

def test_decode_loaded_passes_on_the_healthy_pair() -> None:
    f = pd_path.judge_decode([gain("decode", "before", "after")], SENT)
    assert f.status == Status.PASS, f.reason
    assert f.observed["per_decode"]["decode[0]"]["external"] > 0


def test_a_decode_on_another_storage_path_recomputed_and_fails() -> None:
    f = pd_path.judge_decode([gain("decode", "before", "after", "lab-example-connector-misconfigured")], SENT)
    assert f.status == Status.FAIL and "computed" in f.reason


def test_decode_without_the_by_source_family_is_missing() -> None:
    old = counters("vllm-0.7-router-v1-gpu-cache-usage.prom", REAL)
    f = pd_path.judge_decode([pd_path.Gain("decode[0]", old.since(old))], SENT)
    assert f.status == Status.MISSING


def test_prompts_within_the_tail_are_inconclusive() -> None:
    before = counters("lab-example-connector-healthy-before-decode.prom")
    short = PoolCounters(**{**before.to_dict(), "requests": 1.0, "computed": 20.0, "external": 0.0,
                            "local_hit": 0.0, "prompt_tokens": 20.0})
    f = pd_path.judge_decode([pd_path.Gain("decode[0]", short)], 1)
    assert f.status == Status.INCONCLUSIVE


# --- quality.pd_transfer_failures ---------------------------------------------------------------------------------

def nixl_gain() -> pd_path.Gain:
    """vllm#58038's decode: the counter a new process starts at 0 (vLLM creates its counters at 0), then 17960."""
    return pd_path.Gain("decode[0]", counters("nixl-gpu-vllm58038-failed-transfers.prom").since(
        PoolCounters(failed_transfers=0.0)))


def test_transfer_failures_pass_on_the_healthy_pair_under_fail() -> None:
    f = pd_path.judge_failures([gain("prefill", "before", "after")], [gain("decode", "before", "after")], "fail")
    assert f.status == Status.PASS


def test_nixl_failed_transfers_fail_under_fail_and_warn_under_recompute() -> None:
    errors = PoolCounters(errors=0.0)
    decode = nixl_gain()
    decode.gained = PoolCounters(**{**decode.gained.to_dict(), "errors": errors.errors})
    assert pd_path.judge_failures([], [decode], "fail").status == Status.FAIL
    warn = pd_path.judge_failures([], [decode], "recompute")
    assert warn.status == Status.WARN and "recompute" in warn.reason


def test_a_decode_request_ended_in_error_fails_and_missing_errors_are_missing() -> None:
    healthy = gain("decode", "before", "after")
    erred = pd_path.Gain("decode[0]", PoolCounters(**{**healthy.gained.to_dict(), "errors": 2.0}))
    assert pd_path.judge_failures([], [erred], "fail").status == Status.FAIL
    assert pd_path.judge_failures([], [nixl_gain()], "fail").status == Status.MISSING   # no request_success


def test_no_failure_counter_under_recompute_is_inconclusive() -> None:
    f = pd_path.judge_failures([], [gain("decode", "before", "after")], "recompute")
    assert f.status == Status.INCONCLUSIVE


def test_the_policy_comes_from_the_setting_else_the_instances_else_vllms_default(tmp_path: Path) -> None:
    opts = ProbeOptions(kind="quality", base_url="http://x/v1", model="m", out_dir=tmp_path,
                        pools={"decode": [{"base_url": "http://d/v1", "kv_load_failure_policy": "recompute"}]})
    assert pd_path.failure_policy(opts) == "recompute"
    opts.overrides[pd_path.POLICY_KEY] = "fail"
    assert pd_path.failure_policy(opts) == "fail"
    opts.overrides[pd_path.POLICY_KEY] = "retry"
    with pytest.raises(ValueError, match="kv_load_failure_policy"):
        pd_path.failure_policy(opts)
    opts.overrides.clear()
    opts.pools["decode"][0].pop("kv_load_failure_policy")
    assert pd_path.failure_policy(opts) == "fail"


# --- the whole check around a pass, with unreadable metrics ----------------------------------------------------------

def test_unreachable_pools_are_missing_never_pass(tmp_path: Path) -> None:
    opts = ProbeOptions(kind="quality", base_url="http://127.0.0.1:9/v1", model="m", out_dir=tmp_path,
                        pools={"prefill": [{"base_url": "http://127.0.0.1:9/v1"}],
                               "decode": [{"base_url": "http://127.0.0.1:9/v1"}]})
    store = EvidenceStore(tmp_path)
    assert pd_path.CHECK.applies(opts)
    before = pd_path.CHECK.before(opts, store)
    statuses = {f.check: f.status for f in pd_path.CHECK.after(opts, before, {"requests_sent": 4}, store)}
    assert statuses == {"quality.pd_prefill_served": Status.MISSING, "quality.pd_decode_loaded": Status.MISSING,
                        "quality.pd_transfer_failures": Status.MISSING,
                        "quality.pd_prefill_stopped": Status.NOT_APPLICABLE}


def test_an_instance_restarted_during_the_pass_is_missing_not_judged() -> None:
    def row(name: str) -> dict[str, Any]:
        return {"name": "decode[0]", "counters": counters(name).to_dict()}
    # the healthy decode's counters "after", then those of the freshly started misconfigured decode: they fell
    rows = pd_path.gains({"decode": [row("lab-example-connector-healthy-after-decode.prom")]},
                         {"decode": [row("lab-example-connector-misconfigured-before-decode.prom")]}, "decode")
    assert rows[0].gained is None and "restarted" in rows[0].problem
    assert pd_path.judge_decode(rows, SENT).status == Status.MISSING


def test_one_engine_has_no_pd_path(tmp_path: Path) -> None:
    assert not pd_path.CHECK.applies(ProbeOptions(kind="quality", base_url="http://x/v1", model="m", out_dir=tmp_path))


def test_metrics_error_is_what_an_unreadable_exposition_raises() -> None:
    with pytest.raises(MetricsError):
        parse_exposition("this is { not metrics")


# --- quality.pd_prefill_stopped -----------------------------------------------------------------------------------

def stop_record(name: str) -> dict[str, Any]:
    return json.loads((FIX / name).read_text())


def test_the_lab_pairs_stopped_prefill_record_passes() -> None:
    f = pd_stop.judge_stop(stop_record("lab-stop-prefill-router-502.json"), [])
    assert f.status == Status.PASS


def test_a_decode_answering_without_its_prefill_fails() -> None:
    record = stop_record("lab-stop-prefill-decode-alone.json")   # the decode answered text with the prefill down
    f = pd_stop.judge_stop(record, [])
    assert f.status == Status.FAIL and "text" in f.reason


def test_a_decode_that_died_with_its_prefill_fails() -> None:
    record = stop_record("lab-stop-prefill-router-502.json")
    record["decode_health_during"] = {k: False for k in record["decode_health_during"]}
    assert pd_stop.judge_stop(record, []).status == Status.FAIL


def test_a_prefill_that_did_not_come_back_is_inconclusive() -> None:
    record = stop_record("lab-stop-prefill-router-502.json")
    record.update(restored=False, after=None, decode_health_after=None)
    assert pd_stop.judge_stop(record, []).status == Status.INCONCLUSIVE


@pytest.mark.parametrize(("status", "body", "error", "timed_out", "outcome"), [
    (502, {"error": {"message": "prefill unavailable"}}, None, False, "loud"),
    (200, {"error": {"message": "x"}}, None, False, "loud"),
    (0, None, "ConnectError: refused", False, "loud"),
    (0, None, "timed out", True, "hang"),
    (200, {"choices": [{"message": {"content": "Red, blue"}}]}, None, False, "text"),
    (200, {"choices": [{"message": {"content": ""}}]}, None, False, "empty"),
])
def test_outcomes_are_classified(status: int, body: Any, error: str | None, timed_out: bool, outcome: str) -> None:
    assert pd_stop.classify(status, body, error, timed_out) == outcome


def test_the_stop_check_runs_only_when_asked_or_launched(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    attached = ProbeOptions(kind="quality", base_url="http://x/v1", model="m", out_dir=tmp_path,
                            pools={"prefill": [{"base_url": "http://p/v1"}], "decode": [{"base_url": "http://d/v1"}]})
    assert pd_stop.stop_prefill_findings(attached, store, None).status == Status.NOT_APPLICABLE
    assert pd_stop.stop_prefill_findings(attached, store, False).status == Status.NOT_APPLICABLE
    assert pd_stop.stop_prefill_findings(attached, store, True).status == Status.MISSING


def test_a_stop_command_that_fails_is_inconclusive(tmp_path: Path) -> None:
    opts = ProbeOptions(kind="quality", base_url="http://127.0.0.1:9/v1", model="m", out_dir=tmp_path,
                        pools={"prefill": [{"base_url": "http://127.0.0.1:9/v1", "stop_command": "exit 3",
                                            "start_command": "true"}],
                               "decode": [{"base_url": "http://127.0.0.1:9/v1"}]})
    f = pd_stop.stop_prefill_findings(opts, EvidenceStore(tmp_path), True)
    assert f.status == Status.INCONCLUSIVE and f.observed["stop_exit"] == 3


def test_a_restarted_prefill_is_waited_for_while_the_router_answers_503(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-router answers 503 "No available workers" until its health check readmits a restarted worker: that
    window is waited out (bounded); a 503 past it, or any other error, is judged as it is."""
    from types import SimpleNamespace

    from vllm_acceptance.probes.quality import pd_stop

    monkeypatch.setattr(pd_stop.time, "sleep", lambda s: None)
    ok = {"choices": [{"message": {"content": "red, green, blue"}}]}

    class Client:
        def __init__(self, statuses: list[int]) -> None:
            self.statuses = statuses

        def chat(self, body: dict) -> SimpleNamespace:
            status = self.statuses.pop(0)
            return SimpleNamespace(status=status, body=ok if status == 200 else None, error=None, timed_out=False)

    answer, _ = pd_stop.send_readmitted(Client([503, 503, 200]), "m")
    assert answer["status"] == 200 and answer["outcome"] == "text"
    answer, _ = pd_stop.send_readmitted(Client([500, 200]), "m")          # not a readmission: judged as it is
    assert answer["status"] == 500
    answer, _ = pd_stop.send_readmitted(Client([503, 503, 200]), "m", limit_s=0)   # past the window: judged
    assert answer["status"] == 503
