"""Sign-off, reopen detection and the restore rehearsal end to end on the lab (real vLLM, real playbooks).

The story of one inventory: run A (the session's accept.yml run) is signed `release`; the contract
then changes (the context limit lowered to 1024, the recipe record re-checked) and run B is accepted again
with a short ramp: B names the two reopen triggers that fired, `diff A B` names the same; the restore
rehearsal relaunches A's exact server argv, smoke-tests it and records it in B; B's verdict is not
release (agent.multimodal fails: an image sent to the text-only model), so signing `release` is
refused until an override reason is given, which is recorded and shown in red. B's report is the lab
report the browser test reads (tests/integration/test_report_chromium.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.story import OVERRIDE_REASON, REHEARSAL_PORT, cli

pytestmark = pytest.mark.lab

def report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())


def contract_context(run_dir: Path) -> int:
    """The context limit that run judged against (its frozen profile), whatever cpu-lab.yml says today."""
    return int(yaml.safe_load((run_dir / "evidence" / "profile.yml").read_text())["contract"]["context_tokens"])


def test_sign_records_who_when_decision_and_the_hash(lab_signoff_story: dict[str, Any]) -> None:
    assert lab_signoff_story["signed_a"].returncode == 0, lab_signoff_story["signed_a"].stderr
    record = json.loads((lab_signoff_story["a"] / "signoff.json").read_text())
    assert record["report_sha256"] == hashlib.sha256((lab_signoff_story["a"] / "report.json").read_bytes()).hexdigest()
    assert (record["reviewer"], record["decision"], record["verdict"]) == ("P. Lead (SRE)", "release", "release")
    assert record["signed_at"] and record["override"] is False and record["deployment_engineer"] == "lab-operator"
    html = (lab_signoff_story["a"] / "report.html").read_text()
    assert "Signed:</strong> release by P. Lead (SRE)" in html and "64 rps per tenant" in html
    again = cli("sign", str(lab_signoff_story["a"]), "--reviewer", "Other", "--decision", "release")
    assert again.returncode == 2 and "already signed" in again.stderr


def test_run_b_names_the_reopen_triggers_that_fired(lab_signoff_story: dict[str, Any]) -> None:
    reopen = report(lab_signoff_story["b"])["reopen"]
    assert reopen["status"] == "reopened"
    assert reopen["baseline"]["run_id"] == lab_signoff_story["a"].name and reopen["baseline"]["report_intact"] is True
    assert {t["trigger"] for t in reopen["fired"]} == {"context_limit", "recipe"}
    context = next(t for t in reopen["fired"] if t["trigger"] == "context_limit")
    assert f"context_tokens: {contract_context(lab_signoff_story['a'])} -> 1024" in context["changed"]
    html = (lab_signoff_story["b"] / "report.html").read_text()
    first = html[html.index('id="first-screen"'):html.index('id="not-proven"')]
    assert "Acceptance reopened" in first
    assert 'data-trigger="context_limit"' in first and 'data-trigger="recipe"' in first


def test_diff_says_the_same(lab_signoff_story: dict[str, Any]) -> None:
    out = cli("diff", str(lab_signoff_story["a"]), str(lab_signoff_story["b"]))
    assert out.returncode == 0, out.stderr
    assert "reopen triggers fired: 2" in out.stdout
    before = contract_context(lab_signoff_story["a"])
    assert before != 1024 and f"context limit or concurrency: context_tokens: {before} -> 1024" in out.stdout
    assert "recipe record: checked: 2026-11-30 -> 2026-12-01" in out.stdout
    same = cli("diff", str(lab_signoff_story["a"]), str(lab_signoff_story["a"]))
    assert "reopen triggers fired: none" in same.stdout


def test_restore_rehearsal_relaunches_the_signed_launch_and_is_shown(lab_signoff_story: dict[str, Any]) -> None:
    assert lab_signoff_story["rehearsal"].status == "successful", lab_signoff_story["rehearsal_log"]
    data = json.loads((lab_signoff_story["b"] / "restore_rehearsal.json").read_text())
    assert data["status"] == "passed" and data["from_run"] == lab_signoff_story["a"].name
    assert data["port"] == REHEARSAL_PORT
    assert data["smoke"]["status"] == "ok" and "tiny-agent" in data["smoke"]["models"]
    assert "--enable-prefix-caching" in data["relaunched"]  # A's recorded argv, not the profile's
    html = (lab_signoff_story["b"] / "report.html").read_text()
    sign = html[html.index('id="signoff"'):]
    assert "passed: relaunched the accepted lab launch" in sign and lab_signoff_story["a"].name in sign


def test_a_decision_more_permissive_than_the_verdict_needs_an_override(lab_signoff_story: dict[str, Any]) -> None:
    run_b = lab_signoff_story["b"]
    verdict = report(run_b)["verdict"]
    assert verdict != "release"  # an image sent to the text-only lab model: agent.multimodal fails, for real
    assert next(f for f in report(run_b)["findings"] if f["check"] == "agent.multimodal")["status"] == "fail"
    refused = lab_signoff_story["refused_b"]
    assert refused.returncode == 2 and "--override-reason" in refused.stderr
    assert lab_signoff_story["signoff_after_refusal"] is False
    ok = lab_signoff_story["signed_b"]
    assert ok.returncode == 0 and "OVERRIDE" in ok.stdout, ok.stderr
    record = json.loads((run_b / "signoff.json").read_text())
    assert record["override"] is True and record["override_reason"] == OVERRIDE_REASON
    assert record["verdict"] == verdict and record["restore_rehearsal"].startswith("passed")
    html = (run_b / "report.html").read_text()
    assert f'<div class="override-reason" id="override">OVERRIDE of the verdict {verdict}: {OVERRIDE_REASON}</div>' \
        in html
    assert '<p class="override-reason">' in html  # repeated in the sign-off block
