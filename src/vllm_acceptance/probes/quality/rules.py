"""Judging the quality probe (docs/checks.md `quality.`): does the path under test answer like the reference path
of the same weights?

- `quality.reference`: the reference path was given, answered every prompt twice (alone, then batched): what the
  comparison stands on. Not given where the deployment has a path that changes the arithmetic: missing; given but
  unreachable or answering too few: inconclusive; neither a path nor a reference: not_applicable.
- `quality.parity`: token by token against the reference's answers alone. Where the reference reproduced itself
  batched on every prompt (batch-invariant serving), any divergence fails; else the path under test may fall below
  the reference's own floor by at most `quality.margin` on the share identical and the mean prefix agreement
  (probes/quality/parity.py). A fail names the first divergent token: the prompt, the position, both tokens and
  a window of text on each side.
- `quality.path_checks`: every path check of the deployment (probes/quality/hooks.py PATH_CHECKS) ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.findings import Finding
from ...rules import registry
from .parity import Divergence, compare, measure
from .parity_pass import PassResult

REFERENCE = "quality.reference"
PARITY = "quality.parity"
PATH_CHECKS = "quality.path_checks"
EXPECTED_PARITY = ("every prompt's greedy tokens identical to the reference's where the reference reproduces "
                   "itself batched; else the share identical and the mean prefix agreement within quality.margin "
                   "of the reference's own floor")
EXPECTED_REFERENCE = "a reference path of the same weights answered every prompt, alone and batched"
ACTION = ("compare the path under test with the reference on the named prompt: a P/D or KV-transfer fault, a "
          "speculative-decoding verifier, a KV dtype or kernel that changes the arithmetic, or an image that "
          "differs; do not route traffic to it until it answers like the reference")


def no_reference(paths: Sequence[str], label: str) -> list[Finding]:
    """No reference path: missing where the deployment has a path that changes the arithmetic (never a pass),
    not_applicable where it has none."""
    if paths:
        why = (f"the deployment has a path that changes the arithmetic ({'; '.join(paths)}) and no reference path "
               "was given: set quality_reference_url to the same weights served the accepted way")
        return [registry.missing(REFERENCE, None, why), registry.missing(PARITY, None, why)]
    why = "no path that changes the arithmetic and no quality_reference_url: nothing to compare"
    return [registry.not_applicable(REFERENCE, None, why), registry.not_applicable(PARITY, None, why)]


def unreachable(url_shown: str, error: str, label: str) -> list[Finding]:
    """The reference does not answer: both checks inconclusive, never a pass."""
    why = f"the reference path {url_shown} does not answer: {error}"
    check_ref, check_par = registry.get(REFERENCE), registry.get(PARITY)
    return [check_ref.inconclusive(observed={"reference": url_shown, "error": error, "path": label},
                                   expected=EXPECTED_REFERENCE, reason=why),
            check_par.inconclusive(observed={"path": label}, expected=EXPECTED_PARITY,
                                   reason=f"nothing compared: {why}")]


def same_path(url_shown: str, label: str) -> list[Finding]:
    """The reference is the path under test itself: comparing it with itself proves nothing (inconclusive)."""
    why = (f"the reference path {url_shown} is the path under test (--base-url): give quality_reference_url the "
           "same weights served the accepted way, another endpoint")
    return [registry.get(REFERENCE).inconclusive(observed={"reference": url_shown, "path": label},
                                                 expected=EXPECTED_REFERENCE, reason=why),
            registry.get(PARITY).inconclusive(observed={"path": label}, expected=EXPECTED_PARITY,
                                              reason=f"nothing compared: {why}")]


def judge_reference(prompts: Sequence[str], reference: PassResult, floor: PassResult, *, label: str,
                    evidence: list[str]) -> Finding:
    """quality.reference: the reference answered every prompt on both of its passes."""
    check = registry.get(REFERENCE)
    unanswered = {p: s.error for run in (reference, floor) for p, s in run.by_prompt().items() if s.answer is None}
    absent = [p for p in prompts if p not in reference.by_prompt() or p not in floor.by_prompt()]
    observed = {"path": label, "prompts": len(prompts), "unanswered": unanswered, "not_sent": absent}
    if unanswered or absent:
        return check.inconclusive(observed=observed, expected=EXPECTED_REFERENCE, evidence=evidence,
                                  reason=f"the reference did not answer {len(unanswered) + len(absent)} prompt(s): "
                                         + ", ".join(f"{p} ({e})" for p, e in unanswered.items()) + ", ".join(absent))
    return check.passed(observed=observed, expected=EXPECTED_REFERENCE, evidence=evidence,
                        reason=f"the reference answered all {len(prompts)} prompts alone and batched")


def _divergences(prompts: Sequence[str], base: PassResult, other: PassResult) -> dict[str, Divergence]:
    a, b = base.by_prompt(), other.by_prompt()
    return {p: compare(a[p].answer, b[p].answer) for p in prompts  # type: ignore[arg-type]
            if p in a and p in b and a[p].answer is not None and b[p].answer is not None}


def _named(prompt: str, d: Divergence) -> str:
    ref, got = d.reference_token or {}, d.test_token or {}
    return (f"prompt {prompt}: first divergent token at position {d.position}: reference "
            f"{ref.get('token')!r} ({ref.get('text', 'end')!r}) vs path under test {got.get('token')!r} "
            f"({got.get('text', 'end')!r}); reference ...{d.reference_window}... / path under test "
            f"...{d.test_window}...") if ref or got else f"prompt {prompt}: diverges at position {d.position}"


def judge_parity(prompts: Sequence[str], reference: PassResult, floor: PassResult, test: PassResult, *,
                 margin: float, label: str, evidence: list[str]) -> Finding:
    """quality.parity on the three passes (parity_pass.py)."""
    check = registry.get(PARITY)
    floor_div = _divergences(prompts, reference, floor)
    test_div = _divergences(prompts, reference, test)
    test_errors = {s.prompt: s.error for s in test.sent if s.answer is None}
    floor_m, test_m = measure(list(floor_div.values())), measure(list(test_div.values()))
    invariant = bool(floor_div) and len(floor_div) == len(prompts) and floor_m.identical == floor_m.prompts
    divergent = [(p, d) for p, d in test_div.items() if not d.identical]
    # the reference reproduced these itself: a divergence there is the path's, not the serving's noise
    own = [(p, d) for p, d in divergent if p in floor_div and floor_div[p].identical]
    first = (own or sorted(divergent, key=lambda x: x[1].position or 0) or [None])[0]
    observed: dict[str, Any] = {
        "path": label, "unit": sorted({s.answer.unit for s in test.sent if s.answer}),
        "batch_invariant": invariant, "floor": floor_m.as_dict(), "test": test_m.as_dict(), "margin": margin,
        "unanswered_by_path": test_errors,
        "prompts": {p: d.as_dict() for p, d in test_div.items()},
        "first_divergence": ({"prompt": first[0], **first[1].as_dict()} if first else None)}
    kw = {"observed": observed, "expected": EXPECTED_PARITY, "evidence": evidence}
    if invariant and divergent:
        return check.fail(**kw, action=ACTION, reason=(
            f"{len(divergent)} of {len(test_div)} prompts diverge from the reference, which reproduced itself "
            f"batched on every prompt (batch-invariant): {_named(*first)}"))
    if not invariant and floor_div and own and (
            test_m.identical_share < floor_m.identical_share - margin or test_m.agreement < floor_m.agreement - margin):
        return check.fail(**kw, action=ACTION, reason=(
            f"{len(divergent)} of {len(test_div)} prompts diverge: share identical {test_m.identical_share:.2f} "
            f"and prefix agreement {test_m.agreement:.2f} against the reference's own floor "
            f"{floor_m.identical_share:.2f} / {floor_m.agreement:.2f} (margin {margin:g}); {_named(*first)}"))
    missing_prompts = [p for p in prompts if p not in test_div]
    if missing_prompts or len(floor_div) < len(prompts):
        return check.inconclusive(**kw, reason=(
            f"{len(missing_prompts)} prompt(s) not compared (path under test: "
            + (", ".join(f"{p}: {e}" for p, e in test_errors.items()) or "answered") + "; the reference answered "
            f"{len(floor_div)} of {len(prompts)} on both passes)"))
    if invariant:
        return check.passed(**kw, reason=f"all {len(prompts)} prompts identical to the reference token by token "
                                         "(the reference reproduced itself batched: batch-invariant)")
    if not own and divergent and test_m.identical_share < floor_m.identical_share - margin:
        return check.inconclusive(**kw, reason=(
            "the path under test diverges only on prompts where the reference diverged from itself: the serving "
            f"is too noisy to judge (floor share identical {floor_m.identical_share:.2f})"))
    return check.passed(**kw, reason=(
        f"share identical {test_m.identical_share:.2f} and prefix agreement {test_m.agreement:.2f} within "
        f"{margin:g} of the reference's own floor {floor_m.identical_share:.2f} / {floor_m.agreement:.2f} "
        "(not batch-invariant)"))


def path_check_missing(name: str, error: str, evidence: list[str]) -> Finding:
    """A path check (hooks.py) that raised: its path is unproven, never a pass."""
    return registry.missing(PATH_CHECKS, None, f"the path check {name} stopped: {error}", evidence=evidence)


def path_checks_ran(ran: Sequence[str], skipped: Sequence[str]) -> Finding:
    """Every path check that applies ran (its own findings judge the path); none applies: not_applicable."""
    if not ran:
        return registry.not_applicable(PATH_CHECKS, None, "no path check applies to this deployment"
                                       + (f" ({', '.join(skipped)} do not)" if skipped else ""))
    return registry.get(PATH_CHECKS).passed(observed={"ran": list(ran), "not_applicable": list(skipped)},
                                            expected="every path check that applies runs to its end",
                                            reason=f"ran: {', '.join(ran)}")
