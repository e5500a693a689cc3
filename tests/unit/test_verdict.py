"""The decision table, case by case (docs/acceptance.md "The four verdicts")."""

from __future__ import annotations

import pytest

from vllm_acceptance.core.findings import Consequence, Finding, Status
from vllm_acceptance.verdict import decide, traffic_gates


def f(check: str, status: str, consequence: Consequence = Consequence.REBUILD, host: str | None = None) -> Finding:
    return Finding(check=check, status=Status(status), consequence=consequence, host=host)


GOOD = [f("compat.driver_branch", "pass", host="n1"), f("capacity.ramp", "pass", Consequence.EXPAND),
        f("cache.hot_reuse", "pass"), f("agent.tool_call", "pass", Consequence.BLOCK_AGENT)]


def test_all_pass_is_release_with_both_gates_open() -> None:
    d = decide(GOOD)
    assert d.verdict == "release"
    assert d.gates["text"]["open"] and d.gates["agent"]["open"]


@pytest.mark.parametrize(("extra", "verdict"), [
    ([f("compat.driver_branch", "fail", host="n2")], "rebuild_environment"),
    ([f("capacity.crash", "fail", Consequence.EXPAND)], "expand_capacity"),
    ([f("capacity.ramp", "fail", Consequence.LIMIT)], "limited_observation"),
    ([f("agent.tool_call", "warn", Consequence.BLOCK_AGENT)], "limited_observation"),
    ([f("cache.reuse", "missing")], "incomplete"),
    ([f("cache.prefill_gain", "inconclusive")], "incomplete"),
])
def test_one_defect_decides(extra: list[Finding], verdict: str) -> None:
    assert decide(GOOD + extra).verdict == verdict


def test_precedence_rebuild_over_everything() -> None:
    findings = GOOD + [f("capacity.crash", "fail", Consequence.EXPAND), f("capacity.ramp", "fail", Consequence.LIMIT),
                       f("compat.container_cuda", "fail", host="n1"), f("cache.reuse", "missing")]
    d = decide(findings)
    assert d.verdict == "rebuild_environment"
    assert any("unverified" in r for r in d.reasons)  # what is still missing is named


def test_precedence_expand_over_limited() -> None:
    d = decide(GOOD + [f("capacity.ramp", "fail", Consequence.LIMIT), f("capacity.crash", "fail", Consequence.EXPAND)])
    assert d.verdict == "expand_capacity"


def test_missing_beats_expand_and_limited() -> None:
    d = decide(GOOD + [f("capacity.crash", "fail", Consequence.EXPAND), f("compat.preflight", "missing", host="n3")])
    assert d.verdict == "incomplete"
    assert "compat.preflight@n3" in d.missing


def test_unreachable_host_is_incomplete() -> None:
    d = decide(GOOD, unreachable_hosts=["n9"])
    assert d.verdict == "incomplete" and "n9" in d.missing


def test_no_findings_is_never_release() -> None:
    assert decide([]).verdict == "incomplete"


def test_experimental_image_is_never_release_of_the_official_profile() -> None:
    d = decide(GOOD, experimental=True)
    assert d.verdict == "limited_observation"
    assert any("experimental" in r for r in d.reasons)


def test_agent_failure_closes_only_the_agent_gate() -> None:
    d = decide(GOOD + [f("agent.separation", "fail", Consequence.BLOCK_AGENT)])
    assert d.verdict == "limited_observation"
    assert d.gates["text"]["open"] is True
    assert d.gates["agent"]["open"] is False


def test_agent_gate_closed_without_agent_evidence() -> None:
    gates = traffic_gates("release", [f("compat.driver_branch", "pass")])
    assert gates["agent"]["open"] is False


def test_not_applicable_does_not_block() -> None:
    assert decide(GOOD + [f("compat.fabric_manager", "not_applicable", host="n1")]).verdict == "release"


def test_a_classified_launch_failure_decides_without_the_stages_it_prevented() -> None:
    capacity = [f("compat.driver_branch", "pass", host="n1"),
                f("capacity.launch_triage", "fail", Consequence.EXPAND, host="n1"),
                f("compat.actual_config.flags", "missing", host="n1"), f("cache.reuse", "missing"),
                f("agent.tool_call", "missing", Consequence.BLOCK_AGENT),
                f("capacity.load", "missing", Consequence.EXPAND)]
    d = decide(capacity)
    assert d.verdict == "expand_capacity"
    assert any("not reached" in r for r in d.reasons)
    # ...but a node without evidence still leaves the decision open.
    assert decide(capacity + [f("compat.driver_branch", "missing", host="n2")]).verdict == "incomplete"


# --- issue 43 item 6: complete verdict lines ------------------------------------------------------------------

def test_an_incomplete_verdict_names_the_failures_already_confirmed() -> None:
    """A soak's memory rise and a failed agent check are certain whatever the missing evidence shows: the incomplete
    verdict names them, as rebuild_environment names what is also unverified (before: only the missing evidence)."""
    d = decide(GOOD + [f("capacity.soak", "fail", Consequence.EXPAND), f("cache.reuse", "missing"),
                       f("agent.separation", "fail", Consequence.BLOCK_AGENT)])
    assert d.verdict == "incomplete"
    assert d.reasons[0] == "missing or inconclusive evidence: cache.reuse"
    assert "also failed: agent.separation, capacity.soak" in d.reasons
    clean = decide(GOOD + [f("cache.reuse", "missing")])       # nothing failed: nothing more is claimed
    assert not any(r.startswith("also failed") for r in clean.reasons)


# A real unreachable message of Ansible's ssh connection, as the packer plugin's issue quotes it
# (hashicorp/packer-plugin-ansible#53, docs/sources.md "Ansible's unreachable messages"): ssh's lines end in CR LF.
SSH_ERROR = ("Failed to connect to the host via ssh: Warning: Permanently added '[127.0.0.1]:38133' (RSA) to the list "
             "of known hosts.\r\nsign_and_send_pubkey: no mutual signature supported\r\nadmin@127.0.0.1: Permission "
             "denied (publickey).")


def test_an_unreachable_nodes_error_is_one_line_of_the_reasons() -> None:
    d = decide(GOOD, unreachable_hosts=["n9"], unreachable_errors={"n9": SSH_ERROR})
    line = next(r for r in d.reasons if r.startswith("n9 unreachable"))
    assert "\r" not in line and "\n" not in line and "\\r\\n" not in repr(d.reasons)
    assert "known hosts. sign_and_send_pubkey: no mutual signature supported admin@127.0.0.1: Permission denied" in line
