"""The quality probe's comparison and rules on recorded outputs (docs/checks.md quality.parity, quality.reference,
quality.path_checks), and the gateway's corrupt_after_tokens mode on the same recordings.

The answers are real: the lab vLLM 0.32 (CPU) answering the probe's own prompts with return_token_ids and logprobs,
non-streamed and streamed (tests/fixtures/quality/README.md). The live pass runs in
tests/integration/test_quality_lab.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.lab.gateway import Corruptor, main
from vllm_acceptance.probes.options import ProbeOptions
from vllm_acceptance.probes.quality import rules
from vllm_acceptance.probes.quality.parity import Answer, answer_of, answer_of_stream, compare, measure
from vllm_acceptance.probes.quality.parity_pass import PassResult, Sent
from vllm_acceptance.probes.quality.probe import arithmetic_paths, config, reference_of, run_quality_probe
from vllm_acceptance.probes.run import resolve_profile

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "quality"


def recorded(name: str) -> dict[str, Any]:
    return json.loads((FIX / f"vllm-0.32-cpu-lab-{name}.json").read_text())["response"]


def chunks(name: str) -> list[dict[str, Any]]:
    out = []
    for line in (FIX / f"vllm-0.32-cpu-lab-{name}-stream.sse").read_text().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            out.append(json.loads(line[5:]))
    return out


def corrupted_body(name: str, n: int) -> dict[str, Any]:
    return Corruptor("corrupt_after_tokens", after_tokens=n).rewrite_body(recorded(name))


def corrupted_stream(name: str, n: int) -> list[dict[str, Any]]:
    rewriter = Corruptor("corrupt_after_tokens", after_tokens=n).stream()
    return [rewriter.rewrite(c) for c in chunks(name)]


# --- reading an answer -----------------------------------------------------------------------------------------

def test_a_recorded_answer_reads_as_vllm_token_ids_streamed_or_not() -> None:
    plain = answer_of(recorded("short-1"))
    streamed = answer_of_stream(chunks("short-1"))
    assert plain is not None and streamed is not None
    assert plain.unit == "token_id" and plain.tokens[:3] == (2928, 14, 2192)
    # the end-of-sequence token is in the tokens, not in the content
    assert "".join(plain.texts) == recorded("short-1")["choices"][0]["message"]["content"] + "<|im_end|>"
    assert streamed.tokens == plain.tokens and compare(plain, streamed).identical


def test_without_token_ids_the_logprobs_tokens_then_the_text_are_compared() -> None:
    body = recorded("short-1")
    del body["choices"][0]["token_ids"]
    assert answer_of(body).unit == "token_text"
    body["choices"][0]["logprobs"] = None
    by_text = answer_of(body)
    assert by_text.unit == "char" and "".join(by_text.tokens) == body["choices"][0]["message"]["content"]
    # a reference in another unit is compared as text
    assert compare(answer_of(recorded("short-1")), by_text).identical


def test_a_tool_call_answer_carries_its_tokens() -> None:
    answer = answer_of(recorded("tool-call-1-complete"))
    assert answer.unit == "token_id" and len(answer.tokens) == 59 and answer.finish_reason == "tool_calls"


# --- the gateway's corrupt_after_tokens, both wire shapes -------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3, 7])
def test_corrupt_after_tokens_diverges_at_the_nth_token_streamed_and_not(n: int) -> None:
    ref = answer_of(recorded("short-1"))
    plain = answer_of(corrupted_body("short-1", n))
    streamed = answer_of_stream(corrupted_stream("short-1", n))
    for got in (plain, streamed):
        d = compare(ref, got)
        assert not d.identical and d.position == n, (n, d)
        assert got.tokens[:n] == ref.tokens[:n]
    assert plain.tokens == streamed.tokens
    # the text moves with the tokens (content rebuilt from the tokens' texts)
    body = corrupted_body("short-1", n)
    assert body["choices"][0]["message"]["content"] == "".join(plain.texts)
    assert "".join(streamed.texts) == "".join(plain.texts)


def test_corrupt_after_tokens_past_the_answer_changes_nothing() -> None:
    ref = recorded("short-1")
    assert corrupted_body("short-1", len(ref["choices"][0]["token_ids"])) == ref
    assert compare(answer_of(ref), answer_of_stream(corrupted_stream("short-1", 50))).identical


def test_corrupt_after_tokens_garbles_a_tool_calls_arguments() -> None:
    ref = recorded("tool-call-1-complete")
    body = corrupted_body("tool-call-1-complete", 10)
    args = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert args != ref["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] and args.endswith("!")
    assert compare(answer_of(ref), answer_of(body)).position == 10
    streamed = answer_of_stream(corrupted_stream("tool-call-1-complete", 10))
    assert compare(answer_of_stream(chunks("tool-call-1-complete")), streamed).position == 10


@pytest.mark.parametrize("n", ["0", "-1"])
def test_the_gateway_refuses_a_token_count_below_one(n: str) -> None:
    with pytest.raises(SystemExit):
        main(["--upstream", "http://127.0.0.1:1/v1", "--port", "1", "--mode", "corrupt_after_tokens",
              "--after-tokens", n])


# --- the rules on recorded passes ---------------------------------------------------------------------------

PROMPTS = ["short-1", "tool-call-1", "tool-call-1-complete"]


def answers(transform=None) -> dict[str, Answer]:
    out = {}
    for name in PROMPTS:
        body = recorded(name)
        out[name] = answer_of(transform(name, body) if transform else body)
    return out


def passed(name: str, got: dict[str, Answer | None]) -> PassResult:
    return PassResult(name, "http://x/v1", [Sent(p, a, None if a else "HTTP 503") for p, a in got.items()])


def judge(test: dict[str, Answer | None], floor: dict[str, Answer | None] | None = None, margin: float = 0.1):
    ref = answers()
    return rules.judge_parity(PROMPTS, passed("reference", ref), passed("floor", floor or ref),
                              passed("test", test), margin=margin, label="pd_vs_aggregated", evidence=["e"])


def test_a_healthy_path_identical_to_a_batch_invariant_reference_passes() -> None:
    finding = judge(answers())
    assert finding.status == Status.PASS and finding.observed["batch_invariant"] is True


def test_a_corrupted_path_fails_naming_the_first_divergent_token() -> None:
    finding = judge(answers(lambda n, b: Corruptor("corrupt_after_tokens", after_tokens=3).rewrite_body(b)))
    assert finding.status == Status.FAIL
    first = finding.observed["first_divergence"]
    assert first["prompt"] == "short-1" and first["first_divergence"] == 3
    assert first["reference_token"] == {"token": 1168, "text": " am"}
    assert first["test_token"] == {"token": 2192, "text": " I"}
    assert "prompt short-1" in finding.reason and "position 3" in finding.reason and "' am'" in finding.reason
    assert "[ am]" in first["reference_window"] and "[ I]" in first["test_window"]


def test_a_path_that_stops_early_diverges_where_it_stopped() -> None:
    def cut(name: str, body: dict) -> dict:
        body = copy.deepcopy(body)
        body["choices"][0]["token_ids"] = body["choices"][0]["token_ids"][:5]
        body["choices"][0]["logprobs"]["content"] = body["choices"][0]["logprobs"]["content"][:5]
        return body
    finding = judge(answers(cut))
    assert finding.status == Status.FAIL and finding.observed["first_divergence"]["first_divergence"] == 5
    assert finding.observed["first_divergence"]["test_token"] is None   # the path's answer ended there


def test_a_prompt_the_path_did_not_answer_is_inconclusive_never_a_pass() -> None:
    test = {**answers(), "tool-call-1": None}
    finding = judge(test)
    assert finding.status == Status.INCONCLUSIVE and "tool-call-1" in finding.reason


def _noisy_floor() -> dict[str, Answer]:
    """The reference batched diverging from itself late on one prompt (a serving that is not batch-invariant)."""
    ref = answers()
    a = ref["tool-call-1-complete"]
    return {**ref, "tool-call-1-complete": Answer(a.tokens[:50] + (7,) * 9, a.texts[:50] + ("x",) * 9, a.unit)}


def test_not_batch_invariant_a_path_within_the_floor_passes() -> None:
    finding = judge(_noisy_floor(), floor=_noisy_floor())
    assert finding.status == Status.PASS and finding.observed["batch_invariant"] is False
    assert finding.observed["floor"]["identical"] == 2


def test_not_batch_invariant_a_corrupted_path_below_the_floor_fails() -> None:
    test = answers(lambda n, b: Corruptor("corrupt_after_tokens", after_tokens=3).rewrite_body(b))
    finding = judge(test, floor=_noisy_floor())
    assert finding.status == Status.FAIL and "floor" in finding.reason
    assert finding.observed["first_divergence"]["prompt"] == "short-1"   # one the reference reproduced


def test_measure_counts_identical_prompts_and_prefix_agreement() -> None:
    ref, got = answers(), answers(lambda n, b: Corruptor("corrupt_after_tokens", after_tokens=5).rewrite_body(b))
    m = measure([compare(ref[p], got[p]) for p in PROMPTS])
    assert m.identical == 0 and m.prompts == 3 and 0 < m.agreement < 0.6


def test_the_reference_check_needs_every_prompt_answered_on_both_passes() -> None:
    ref = answers()
    ok = rules.judge_reference(PROMPTS, passed("reference", ref), passed("floor", ref), label="x", evidence=[])
    assert ok.status == Status.PASS
    short = rules.judge_reference(PROMPTS, passed("reference", ref), passed("floor", {**ref, "short-1": None}),
                                  label="x", evidence=[])
    assert short.status == Status.INCONCLUSIVE and "short-1" in short.reason


def test_no_reference_is_missing_where_the_deployment_has_a_path_and_not_applicable_otherwise() -> None:
    with_path = rules.no_reference(["P/D pools decode, prefill"], "pd_vs_aggregated")
    assert {f.check: f.status for f in with_path} == {"quality.reference": Status.MISSING,
                                                      "quality.parity": Status.MISSING}
    without = rules.no_reference([], "reference")
    assert {f.status for f in without} == {Status.NOT_APPLICABLE}


def test_an_unreachable_reference_is_inconclusive() -> None:
    found = rules.unreachable("http://ref:8000/v1", "connection refused", "spec_on_vs_off")
    assert {f.check: f.status for f in found} == {"quality.reference": Status.INCONCLUSIVE,
                                                  "quality.parity": Status.INCONCLUSIVE}


# --- the probe's settings, its reference and the path checks ------------------------------------------------

def opts(tmp_path: Path, **kw: Any) -> ProbeOptions:
    return ProbeOptions(kind="quality", base_url="http://127.0.0.1:1/v1", model="tiny-agent", out_dir=tmp_path,
                        profile=resolve_profile(None), **kw)


def test_the_paths_that_change_the_arithmetic_are_read_from_the_deployment(tmp_path: Path) -> None:
    o = opts(tmp_path)
    assert arithmetic_paths(o, config(o, {})) == []
    o = opts(tmp_path, overrides={"launch.args": ["--kv-cache-dtype=fp8_e4m3", "-dcp", "2",
                                                  "--speculative-config", '{"method": "ngram"}']})
    found = arithmetic_paths(o, config(o, {}))
    assert [p.split(" ")[0] for p in found] == ["speculative", "fp8", "decode"]
    o = opts(tmp_path, overrides={"launch.args": ["--kv-cache-dtype", "auto", "--decode-context-parallel-size=1"]})
    assert arithmetic_paths(o, config(o, {})) == []
    pools = {"prefill": [{"base_url": "http://p0:8000/v1"}], "decode": [{"base_url": "http://d0:8000/v1"}]}
    o = opts(tmp_path, pools=pools)
    assert arithmetic_paths(o, config(o, {})) == ["P/D pools decode, prefill"]
    assert reference_of(o) == ("http://p0:8000/v1", "a prefill instance called directly (the aggregated path)")
    assert reference_of(opts(tmp_path, pools=pools, reference_url="http://ref/v1"))[0] == "http://ref/v1"


def test_the_long_prompt_stays_within_the_contract(tmp_path: Path) -> None:
    o = opts(tmp_path)
    cfg = config(o, {})
    assert cfg.long_prompt_tokens == 1984 - cfg.max_tokens   # profiles/cpu-lab.yml contract.context_tokens
    o = opts(tmp_path, overrides={"quality.long_prompt_tokens": 100000})
    assert config(o, {}).long_prompt_tokens == 1984 - cfg.max_tokens


class FakeCheck:
    def __init__(self, name: str, applies: bool = True, fail_in: str = "") -> None:
        self.name, self._applies, self.fail_in, self.calls = name, applies, fail_in, []

    def applies(self, opts: ProbeOptions) -> bool:
        return self._applies

    def before(self, opts: ProbeOptions, store: EvidenceStore) -> dict[str, Any]:
        self.calls.append("before")
        if self.fail_in == "before":
            raise RuntimeError("counters unreadable")
        return {"snap": 1}

    def after(self, opts, before, parity, store):
        self.calls.append(("after", before, parity))
        if self.fail_in == "after":
            raise RuntimeError("boom")
        return [rules.registry.get("quality.path_checks").passed(reason="fake", observed={}, expected="x")]


def test_path_checks_run_around_the_pass_and_one_that_stops_is_missing(tmp_path: Path) -> None:
    store = EvidenceStore(tmp_path)
    ok, off, broken = FakeCheck("ok"), FakeCheck("off", applies=False), FakeCheck("broken", fail_in="after")
    findings, details = run_quality_probe(opts(tmp_path), None, store, {}, checks=[ok, off, broken])
    assert ok.calls == ["before", ("after", {"snap": 1}, None)] and off.calls == []
    by = [(f.check, f.status) for f in findings]
    assert ("quality.parity", Status.NOT_APPLICABLE) in by     # no reference, no path: nothing sent
    assert ("quality.path_checks", Status.MISSING) in by and (tmp_path / "path-check-broken.txt").is_file()


def test_without_path_checks_that_apply_the_check_is_not_applicable(tmp_path: Path) -> None:
    findings, _ = run_quality_probe(opts(tmp_path), None, EvidenceStore(tmp_path), {},
                                    checks=[FakeCheck("off", applies=False)])
    assert {f.check: f.status for f in findings}["quality.path_checks"] == Status.NOT_APPLICABLE
    findings, _ = run_quality_probe(opts(tmp_path, pools={"decode": [{"base_url": "http://d/v1"}]}), None,
                                    EvidenceStore(tmp_path), {}, checks=[])
    assert {f.check: f.status for f in findings}["quality.parity"] == Status.MISSING


def test_the_plan_counts_three_sends_of_the_prompt_set(tmp_path: Path) -> None:
    from vllm_acceptance.probes.quality.plan import quality_plan
    from vllm_acceptance.scenarios import load_scenario

    o = opts(tmp_path, overrides={"quality.concurrency": 4})
    bound = quality_plan(o, load_scenario("ops-agent"))
    # 6 short + long + tool call + multi-turn; one at a time, then twice in waves of 4
    assert bound.name == "quality" and bound.requests == 27
    assert "9 prompts one at a time + 2 x 3 waves" in bound.basis and bound.bound_s > 0


def test_a_reference_that_is_the_path_under_test_proves_nothing(tmp_path: Path) -> None:
    o = opts(tmp_path, reference_url="http://127.0.0.1:1/v1/")
    findings, _ = run_quality_probe(o, None, EvidenceStore(tmp_path), {}, checks=[])
    assert {f.check: f.status for f in findings if f.check != "quality.path_checks"} == {
        "quality.reference": Status.INCONCLUSIVE, "quality.parity": Status.INCONCLUSIVE}


def test_a_reference_that_does_not_answer_is_inconclusive_never_a_pass(tmp_path: Path) -> None:
    o = opts(tmp_path, reference_url="http://127.0.0.1:9/v1")   # nothing listens on the discard port here
    findings, details = run_quality_probe(o, None, EvidenceStore(tmp_path), {}, checks=[])
    by = {f.check: f for f in findings}
    assert by["quality.reference"].status == Status.INCONCLUSIVE and "does not answer" in by["quality.reference"].reason
    assert by["quality.parity"].status == Status.INCONCLUSIVE and details["reference"] == "http://127.0.0.1:9/v1"
