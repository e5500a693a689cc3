"""The rollback triggers, concrete for this run: the signal, the alert or log pattern, the action."""

from __future__ import annotations

from typing import Any

from ..core.profile import Profile
from ..parsers.startup_log import _NCCL_ERROR, _OOM
from ..verdict import ROLLBACK_TRIGGERS
from .alerts import HIT_RATIO_COLLAPSE_FACTOR
from .thresholds import Threshold, derive_thresholds


def rollback_triggers(report: dict[str, Any], profile: Profile,
                      thresholds: dict[str, Threshold] | None = None) -> list[dict[str, Any]]:
    """The rollback triggers of docs/acceptance.md, concrete for this run: signal, alert or log pattern, action."""
    t = thresholds if thresholds is not None else derive_thresholds(report, profile)
    signoff = report.get("signoff") or {}
    lineage = report.get("lineage") or {}
    target = signoff.get("rollback_rehearsed") or lineage.get("rollback_image") or "the previous image and config"
    action = f"pause the ramp-up and roll back ({target})"
    queue = t.get("queue_p95_slo_s")
    details = {
        ROLLBACK_TRIGGERS[0]: {
            "signal": "log", "alerts": ["VllmRestarted", "VllmTargetDown"],
            "log_pattern": _OOM.pattern,
            "condition": "more than one OOM (log pattern) or OOM-caused restart on the accepted profile; "
                         "vLLM exports no OOM metric, so the log (and the kernel's oom-kill line) decides"},
        ROLLBACK_TRIGGERS[1]: {
            "signal": "client/gateway", "alerts": ["AgentToolCallRetryRate"],
            "condition": "any invalid tool-call JSON reaching the executor, or schema-validation retries above "
                         f"{t['tool_retry_ratio'].value if 'tool_retry_ratio' in t else 'the profile threshold'}; "
                         "vLLM exports no retry or parse-failure metric (tool_call_parser_invocations counts "
                         "tool_call/no_tool_call only): the agent gateway must export retries"},
        ROLLBACK_TRIGGERS[2]: {
            "signal": "metric", "alerts": ["VllmQueueTimeP95AboveSlo"],
            "condition": f"queue time p95 above {queue.value:g} s ({queue.source}) for the alert's sustained period"
            if queue else "queue time above the SLO (no queue SLO in the profile: set contract.slo.queue_p95_s)"},
        ROLLBACK_TRIGGERS[3]: {
            "signal": "metric", "alerts": ["VllmPrefixCacheHitRatioCollapse", "VllmPrefixCacheHitRatioLow"],
            "condition": (f"hit ratio below {HIT_RATIO_COLLAPSE_FACTOR} x its value an hour earlier, or below "
                          f"{t['hit_ratio_min'].value:.3g} (accepted hot ratio {t['hit_ratio_accepted'].value:.3g}), "
                          "after a system-prompt or tool-schema change") if "hit_ratio_min" in t else
            "no accepted hit ratio in this run: the cache stage measured no reuse"},
        ROLLBACK_TRIGGERS[4]: {
            "signal": "log", "alerts": ["VllmRestarted", "VllmTargetDown"], "log_pattern": _NCCL_ERROR.pattern,
            "condition": "any NCCL / inter-node transfer error in the vLLM log; vLLM exports no NCCL metric"},
    }
    return [{"trigger": text, **details.get(text, {"signal": "unmapped", "alerts": [], "condition": text}),
             "action": action} for text in ROLLBACK_TRIGGERS]
