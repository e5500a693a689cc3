"""Checklist coverage: every checklist line of the four source articles, mapped to check ids.

The four source articles (docs/acceptance.md) each end in a checklist meant to be attached to a change request
(docs/sources.md#a000: "Сводная чек-лист-приёмка", #a001: "Чек-лист выбора маршрута", #a003: the
Chinese go-live table, #a004: the French list). The report shows, line by line, which check ids of this run answer
it and with what status, so a reviewer sees what the run proved and what it did not.

Lines are given in English; `checks` are glob patterns over check ids (so `compat.driver*`
covers `compat.driver_branch` and `compat.driver_module`), or `report:<name>` for lines the
report itself answers (owners, sign-off, rollback triggers). A line with no mapping is shown as
"not covered" with the reason in `note`: it is never silently counted as done.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Worst first: the aggregate status of a checklist line is the worst status among its findings,
# so one failing node makes the line fail, and missing evidence is never hidden behind a pass.
STATUS_ORDER = ("fail", "missing", "inconclusive", "to_confirm", "warn", "pass", "not_applicable")
NOT_COVERED = "not_covered"
NO_FINDING = "missing"


@dataclass(frozen=True)
class ChecklistItem:
    source: str          # seed id: 000, 001, 003, 004
    number: int          # position of the line in that source's checklist
    text: str            # the line, in English
    checks: tuple[str, ...] = ()
    note: str = ""

    @property
    def ref(self) -> str:
        return f"{self.source}#{self.number}"

    @property
    def label(self) -> str:
        """What a reader sees: the source article and the line in its checklist (docs/sources.md#a000, ...)."""
        return f"source {self.source}, item {self.number}"


def _items(source: str, rows: list[tuple[str, tuple[str, ...]] | tuple[str, tuple[str, ...], str]]
           ) -> list[ChecklistItem]:
    out = []
    for number, row in enumerate(rows, start=1):
        text, checks = row[0], row[1]
        note = row[2] if len(row) > 2 else ""  # type: ignore[misc]
        out.append(ChecklistItem(source, number, text, checks, note))
    return out


SOURCES = {
    "000": "Russian article, \"Summary acceptance checklist\" (Сводная чек-лист-приёмка)",
    "001": "Russian article, \"Route selection checklist\" (Чек-лист выбора маршрута)",
    # English only: CJK fonts are often absent on the reviewer's (air-gapped) machine.
    "003": "Chinese article, \"checkable go-live acceptance table\"",
    "004": "French article, acceptance checklist",
}

REMEDIATION = "a person confirms it at sign-off (vllm-acceptance sign --confirm FIELD=TEXT); also an entry " \
    "condition of playbooks/rebuild.yml"

CHECKLIST: list[ChecklistItem] = [
    *_items("000", [
        ("Status of the official recipe and the date it was last checked recorded", ("compat.recipe*",)),
        ("Docker image digest and the full launch command saved", ("compat.image*", "compat.serve")),
        ("CUDA 13 build confirmed inside the actual container", ("compat.container_cuda*",)),
        ("NVIDIA R580 or newer driver recorded on every node", ("compat.driver*",)),
        ("The runtime sees every declared GPU", ("compat.gpu_visibility*",)),
        ("Startup log has no fallback, NCCL errors or unexpected backend substitution",
         ("compat.startup_log*",)),
        ("Inter-node communication checked separately for the chosen topology", ("interconnect.*",)),
        ("Model-load test run with peak memory recorded", ("capacity.model_load*", "capacity.load")),
        ("Long-context test run with fixed parameters", ("capacity.long*", "capacity.context_contract*")),
        ("Concurrent-request test run with a queue and cache-usage chart",
         ("capacity.ramp*", "capacity.load")),
        ("The soak test caused no reproducible OOM or process restart", ("capacity.soak*", "capacity.crash*")),
        ("For an OOM, request parameters and the memory chart before the failure saved",
         ("capacity.crash*",)),
        ("Prefix caching on in the actual configuration, not only on the command line",
         ("cache.config*", "compat.actual_config*")),
        ("Cold, hot and control requests run", ("cache.cold*", "cache.hot*", "cache.control*", "cache.reuse*")),
        ("prefix_cache_queries, prefix_cache_hits and prefill latency compared",
         ("cache.hot*", "cache.prefill*", "cache.reuse*")),
        ("Tool calls, reasoning output and structured output checked",
         ("agent.tool_call*", "agent.separation*", "agent.structured*")),
        ("A schema-failure scenario ends in a safe retry or refusal",
         ("agent.executor_safety*",)),
        ("An owner and a re-check date assigned for every risk", ("report:owners",)),
        ("One of the decisions signed: release, observation, rebuild or expansion", ("report:signoff",)),
    ]),
    *_items("001", [
        ("The log confirms a CUDA 13 / R575 driver incompatibility, not a model or authorisation error",
         ("compat.startup_log*", "compat.driver*", "compat.launch_triage*", "capacity.launch_triage*"),
         "answered by the driver and startup-log findings: pass means there is no incompatibility to confirm"),
        ("A maintenance window agreed for the driver upgrade", ("confirm:maintenance_window",), REMEDIATION),
        ("A separate node available for the first test", ("confirm:spare_node",), REMEDIATION),
        ("Image, vLLM version, nvidia-smi output and full logs saved",
         ("compat.image*", "compat.state_snapshot*", "compat.preflight", "compat.launch_evidence*")),
        ("A way to roll back the driver or recreate the node recorded", ("confirm:rollback_plan",), REMEDIATION),
        ("At least one previous workload can be re-checked after the change", ("confirm:regression_workload",),
         REMEDIATION),
        ("An isolated compatible environment prepared if the shared cluster cannot change",
         ("confirm:isolated_environment",), REMEDIATION),
        ("If a cu129 build is chosen: a dependency owner and an exit date assigned", ("report:lineage",)),
        ("Repeatable requests with an identical prefix prepared for prefix caching", ("cache.hot*", "cache.reuse*")),
        ("Agent tests for tools, structured output and loop correctness defined",
         ("agent.tool_call*", "agent.structured*", "agent.multi_turn*")),
    ]),
    *_items("003", [
        ("Recipe access date, full image tag and vLLM support status recorded",
         ("compat.recipe*", "compat.image*")),
        ("CUDA 13 runtime in the container checked against the host R580+ driver",
         ("compat.container_cuda*", "compat.driver*")),
        ("Version information from container, host and startup log saved separately",
         ("compat.container_cuda*", "compat.driver*", "compat.vllm_version*", "compat.startup_log*")),
        ("GPU model, GPU count, node count and interconnect recorded",
         ("compat.gpu_visibility*", "compat.topology*", "interconnect.*")),
        ("GPU memory curve of the model-load stage captured", ("capacity.model_load*",)),
        ("Long-input test done with a fixed agent sample", ("capacity.long*",)),
        ("Queueing, preemption, KV cache and latency recorded at several concurrency levels",
         ("capacity.ramp*", "capacity.load")),
        ("OOM test saved request parameters, concurrency and memory curves before and after",
         ("capacity.crash*",)),
        ("Prefix caching explicitly enabled; cold, hot and changed-prefix control requests done",
         ("cache.config*", "cache.cold*", "cache.hot*", "cache.control*", "cache.reuse*")),
        ("prefix_cache_queries, prefix_cache_hits and prompt_tokens_cached deltas saved",
         ("cache.hot*", "cache.metrics*", "cache.reuse*")),
        ("Tool schema, multi-turn calls, structured output and failure retry tested",
         ("agent.tool_schema*", "agent.multi_turn*", "agent.structured*", "agent.tool_failure*")),
        ("Model, parser, gateway and caller failures recorded separately", ("agent.*",)),
        ("Post-release monitoring owner, rate-limit policy and rollback triggers designated",
         ("report:rollback_triggers", "report:monitoring_owner", "confirm:rate_limit_policy")),
        ("Every result has test conditions, time, log location and a reviewer",
         ("report:evidence", "report:signoff")),
    ]),
    *_items("004", [
        ("Image, digest and vLLM version archived", ("compat.image*", "compat.vllm_version*")),
        ("The CUDA 13 build identified in the image or in the build process", ("compat.container_cuda*",)),
        ("Host driver on the R580 branch or an officially compatible one", ("compat.driver*",)),
        ("Versions seen by the host and by the container compared", ("compat.container_cuda*", "compat.driver*")),
        ("Startup logs hold no unhandled load or compatibility error", ("compat.startup_log*",)),
        ("The reference agent scenario contains the expected tools and structured outputs",
         ("agent.tool_schema*", "agent.structured*")),
        ("Responses verified against the schema, not just displayed", ("agent.tool_call*",)),
        ("Cold-load test kept separate from the long-context test", ("capacity.model_load*", "capacity.long*")),
        ("Concurrency raised step by step with GPU curves kept", ("capacity.ramp*",
                                                                  "capacity.load")),
        ("Any OOM tied to a precise condition and a corrective decision", ("capacity.crash*",)),
        ("vllm:kv_cache_usage_perc, waiting requests and preemptions recorded",
         ("capacity.ramp*", "capacity.load")),
        ("Prefix-caching cold test and controlled hot test kept",
         ("cache.cold*", "cache.hot*", "cache.control*", "cache.reuse*")),
        ("Query, hit and cached-token counters are consistent",
         ("cache.hot*", "cache.prefill*", "cache.source*", "cache.reuse*")),
        ("Recovery after a tool error tested", ("agent.tool_failure*",
                                                "agent.executor_safety*")),
        ("The operator knows the context and concurrency limits and the rollback signal",
         ("report:rollback_triggers", "report:signoff")),
        ("A restore to the previous image rehearsed", ("report:rollback_rehearsed",),
         "playbooks/restore_rehearsal.yml records it beside the run; the sign-off shows it"),
    ]),
]


# --- lines the report itself answers, and lines a person confirms at sign-off ----------------------

TO_CONFIRM = "to_confirm"
# Lines answered by the sign-off (a person), not by a measurement of this run.
PERSON_CHECKS = ("report:signoff", "report:monitoring_owner", "report:rollback_rehearsed")
# A line about a failure that did not happen: no finding is right when the stages that would have
# met it ran (an OOM record needs an OOM).
CONDITIONAL = {
    "capacity.crash*": (("capacity.ramp*", "capacity.soak*", "capacity.concurren*"),
                        "no OOM or crash occurred in this run"),
}


def signed(report: dict[str, Any]) -> dict[str, Any]:
    record = report.get("signed")
    return record if isinstance(record, dict) else {}


def _report_owners(report: dict[str, Any]) -> tuple[str, str]:
    open_risks = [f for f in report.get("findings") or [] if f.get("status") not in ("pass", "not_applicable")]
    lacking = [f for f in open_risks if not f.get("owner") or not f.get("recheck_date")]
    if lacking:
        return "fail", f"{len(lacking)} of {len(open_risks)} open risks lack an owner or re-check date"
    return "pass", f"{len(open_risks)} open risks, each with owner and re-check date"


def _report_signoff(report: dict[str, Any]) -> tuple[str, str]:
    record = signed(report)
    if record:
        if record.get("report_intact") is False:
            return "fail", "signed, but report.json changed after signing: sign again"
        return "pass", f"signed: {record.get('decision')} by {record.get('reviewer')} at {record.get('signed_at')}"
    legacy = report.get("signoff") or {}
    if all(legacy.get(k) for k in ("reviewer", "decision", "date")):
        return "pass", f"signed: {legacy.get('decision')} by {legacy.get('reviewer')}"
    return TO_CONFIRM, "to be signed: vllm-acceptance sign RUN_DIR --reviewer NAME --decision DECISION"


def _report_rollback(report: dict[str, Any]) -> tuple[str, str]:
    triggers = report.get("rollback_triggers") or []
    return ("pass", f"{len(triggers)} rollback triggers stated") if triggers else ("missing", "none stated")


def _report_monitoring_owner(report: dict[str, Any]) -> tuple[str, str]:
    owner = signed(report).get("monitoring_owner") or (report.get("signoff") or {}).get("monitoring_owner")
    return ("pass", f"monitoring owner: {owner}") if owner else (TO_CONFIRM, "monitoring owner named at sign-off "
                                                                             "(sign --monitoring-owner)")


def _report_evidence(report: dict[str, Any]) -> tuple[str, str]:
    passed = [f for f in report.get("findings") or [] if f.get("status") == "pass"]
    bare = [f for f in passed if not f.get("evidence")]
    if bare:
        return "fail", f"{len(bare)} passing findings have no evidence file"
    return "pass", f"{len(passed)} passing findings, each with evidence"


def _report_lineage(report: dict[str, Any]) -> tuple[str, str]:
    if not report.get("experimental"):
        return "not_applicable", "official image: no self-built lineage"
    lineage = report.get("lineage") or {}
    if lineage.get("owner") and lineage.get("exit_date"):
        return "pass", f"owner {lineage['owner']}, exit date {lineage['exit_date']}"
    return "fail", "self-built image without owner or exit date"


def _report_rollback_rehearsed(report: dict[str, Any]) -> tuple[str, str]:
    rehearsal = report.get("restore_rehearsal")
    if isinstance(rehearsal, dict) and rehearsal.get("status"):
        status = "pass" if rehearsal.get("status") == "passed" else "fail"
        return status, f"restore rehearsal {rehearsal.get('status')}: relaunched {rehearsal.get('relaunched')} " \
                       f"(accepted in run {rehearsal.get('from_run')}) at {rehearsal.get('finished')}"
    value = (report.get("signoff") or {}).get("rollback_rehearsed")
    if value:
        return "pass", str(value)
    return TO_CONFIRM, "not rehearsed yet: ansible-playbook -i inventories/<site> playbooks/restore_rehearsal.yml"


def _confirmed(field_name: str, report: dict[str, Any]) -> tuple[str, str]:
    value = (signed(report).get("confirmations") or {}).get(field_name)
    if value:
        return "pass", f"confirmed at sign-off: {value}"
    return TO_CONFIRM, f"a person confirms at sign-off: --confirm {field_name}=..."


REPORT_CHECKS: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "report:owners": _report_owners,
    "report:signoff": _report_signoff,
    "report:rollback_triggers": _report_rollback,
    "report:monitoring_owner": _report_monitoring_owner,
    "report:evidence": _report_evidence,
    "report:lineage": _report_lineage,
    "report:rollback_rehearsed": _report_rollback_rehearsed,
}

CATEGORIES = {
    "run": "Checked by this run",
    "not_provable": "Not provable here",
    "person": "A person confirms at sign-off",
}


@dataclass
class Coverage:
    item: ChecklistItem
    status: str
    matched: list[str] = field(default_factory=list)   # finding ids (check@host) or report:* names
    detail: str = ""
    category: str = "run"   # run | not_provable | person (CATEGORIES)


def worst(statuses: list[str]) -> str:
    ranked = [s for s in STATUS_ORDER if s in statuses]
    return ranked[0] if ranked else NO_FINDING


def finding_id(finding: dict[str, Any]) -> str:
    host = finding.get("host")
    return f"{finding.get('check')}@{host}" if host else str(finding.get("check"))


def _answer(name: str, report: dict[str, Any]) -> tuple[str, str]:
    if name.startswith("confirm:"):
        return _confirmed(name.split(":", 1)[1], report)
    return REPORT_CHECKS[name](report)


def _absent_is_fine(pattern: str, findings: list[dict[str, Any]]) -> str | None:
    """Why no finding for this pattern is right in this run, or None when it is missing evidence."""
    if pattern not in CONDITIONAL:
        return None
    ran, why = CONDITIONAL[pattern]
    ran_ok = [f for f in findings if any(fnmatch.fnmatchcase(str(f.get("check", "")), p) for p in ran)
              and f.get("status") in ("pass", "warn", "fail")]
    return f"{why} (load stages ran: {', '.join(sorted({str(f['check']) for f in ran_ok}))})" if ran_ok else None


def cover(item: ChecklistItem, report: dict[str, Any]) -> Coverage:
    """Status of one checklist line in this run: the worst of its findings, or why it has none."""
    if not item.checks:
        return Coverage(item, NOT_COVERED, detail=item.note or "no check id maps to this line")
    statuses: list[str] = []
    matched: list[str] = []
    details: list[str] = []
    findings = list(report.get("findings") or [])
    patterns = [p for p in item.checks if ":" not in p]
    answered = [p for p in item.checks if ":" in p]
    for name in answered:
        status, detail = _answer(name, report)
        statuses.append(status)
        matched.append(name)
        details.append(detail)
    found_statuses: list[str] = []
    for finding in findings:
        check = str(finding.get("check", ""))
        if any(fnmatch.fnmatchcase(check, p) for p in patterns):
            found_statuses.append(str(finding.get("status")))
            matched.append(finding_id(finding))
    statuses += found_statuses
    if patterns and not found_statuses:
        fine = [_absent_is_fine(p, findings) for p in patterns]
        if all(fine):
            statuses.append("not_applicable")
            details.append("; ".join(sorted({x for x in fine if x})))
        else:
            # Mapped, but this run produced no such finding: that is missing evidence, not a pass.
            statuses.append(NO_FINDING)
            details.append("no finding for " + ", ".join(patterns) + " in this run")
    if item.note:
        details.insert(0, item.note)
    status = worst(statuses)
    if any(p.startswith("confirm:") or p in PERSON_CHECKS for p in answered):
        category = "person"
    elif status == "not_applicable" and found_statuses and set(found_statuses) == {"not_applicable"}:
        category = "not_provable"
        reasons = sorted({str(f.get("reason")) for f in findings if finding_id(f) in matched and f.get("reason")})
        details += reasons[:2]
    else:
        category = "run"
    return Coverage(item, status, matched, "; ".join(details), category)


def coverage(report: dict[str, Any]) -> list[Coverage]:
    return [cover(item, report) for item in CHECKLIST]


def coverage_summary(rows: list[Coverage]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    return counts


def coverage_groups(rows: list[Coverage]) -> list[dict[str, Any]]:
    """The three groups the sign-off needs apart, each with its rows and status counts."""
    groups = []
    for key, title in CATEGORIES.items():
        members = [r for r in rows if r.category == key]
        groups.append({"key": key, "title": title, "rows": members, "counts": coverage_summary(members)})
    return groups
