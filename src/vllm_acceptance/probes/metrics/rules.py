"""Judging the metrics probe: does the server under test export every series the generated monitoring reads
(docs/checks.md capacity.alert_series)? A rule's series missing: that alert or recording rule can never fire
(fail); a dashboard-only series missing: that panel stays empty (warn)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ...core.findings import Finding
from ...rules import registry
from ...runtime.metrics import Snapshot, missing_families

CHECK = "capacity.alert_series"
ACTION = ("make the server export the named series (vLLM started without --disable-log-stats, a vLLM version "
          "whose metric names the generated rules use), or scrape the Prometheus target that holds them; until "
          "then the named alerts cannot fire")
EXPECTED = "every series the generated alerts, recording rules and dashboard read is exported with samples"


def judge_series(snap: Snapshot, rule_series: Iterable[str], dashboard_series: Iterable[str],
                 older_names: Mapping[str, str], *, source: str, evidence: list[str]) -> Finding:
    """One finding from one read of the server's metrics."""
    check = registry.get(CHECK)
    rules_missing = missing_families(snap, rule_series)
    panels_missing = missing_families(snap, dashboard_series)
    older = {name: older_names[name] for name in rules_missing + panels_missing
             if name in older_names and not missing_families(snap, [older_names[name]])}
    observed = {"source": source, "series_read": len(snap.families()),
                "missing_rule_series": rules_missing, "missing_dashboard_series": panels_missing,
                "older_names_exported": older}
    if rules_missing:
        why = f"{len(rules_missing)} series the generated rules read are not exported: {', '.join(rules_missing)}"
        if older:
            why += "; the server exports older names instead (" + ", ".join(
                f"{old} for {new}" for new, old in older.items()) + ")"
        return check.fail(observed=observed, expected=EXPECTED, evidence=evidence, action=ACTION, reason=why)
    if panels_missing:
        return check.warn(observed=observed, expected=EXPECTED, evidence=evidence,
                          action="the named dashboard panels stay empty on this server",
                          reason=f"dashboard-only series not exported: {', '.join(panels_missing)}")
    return check.passed(observed=observed, expected=EXPECTED, evidence=evidence,
                        reason="every series the generated monitoring reads is exported")


def unreadable(reason: str, evidence: list[str] | None = None) -> Finding:
    """The metrics could not be read: missing, never a pass."""
    return registry.missing(CHECK, None, f"the server's metrics could not be read: {reason}", evidence=evidence)
