"""The K3 lab variant's rule compiler (plain Python; the weights are tested in test_lab_model)."""

from __future__ import annotations

import pytest

from vllm_acceptance.lab.k3_program import Case, Rule, compile_rules


def _matching(rules: list[Rule], case: Case, i: int) -> list[Rule]:
    return [r for r in rules
            if tuple(case.tokens[max(0, i - len(r.context) + 1): i + 1]) == r.context
            and r.tools in (None, case.tools) and r.result in (None, case.result)]


def test_every_step_is_decided_by_rules_that_agree_and_flags_only_where_needed() -> None:
    # Shared prefix 1 2 3, then the case flags choose; token 7 repeats with two successors.
    call = Case(True, False, (1, 2, 3, 7, 8, 7, 9, 0), start=1)
    reply = Case(False, False, (1, 2, 3, 5, 6, 0), start=1)
    rules = compile_rules([call, reply])
    for case in (call, reply):
        for i in range(case.start, len(case.tokens) - 1):
            hits = _matching(rules, case, i)
            assert hits and {r.target for r in hits} == {case.tokens[i + 1]}, (case, i, hits)
    flagged = [r for r in rules if r.tools is not None]
    assert [r.context[-1] for r in flagged] == [3, 3]  # only the branch point reads the flags
    assert all(len(r.context) >= 2 for r in rules)


def test_a_step_no_context_can_decide_is_refused() -> None:
    # Same flags, same five tokens, different successors: no rule can be consistent.
    a = Case(True, False, (1, 2, 3, 4, 5, 6), start=3)
    b = Case(True, False, (1, 2, 3, 4, 5, 7), start=3)
    with pytest.raises(ValueError, match="not decided"):
        compile_rules([a, b])
