"""The metrics probe as a unit of the probe registry (probes/registry.py): its settings (the series the
generated monitoring reads, monitoring/series.py) and its run: one read of the server's metrics, kept as
evidence, judged by rules.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ...monitoring.series import DASHBOARD_SERIES, OLDER_NAMES, RULE_SERIES
from ...runtime.client import OpenAIClient
from ...runtime.metrics import MetricsError, MetricsSource
from ..options import ProbeOptions, metrics_source_of
from ..registry import register
from .rules import judge_series, unreadable


@dataclass(frozen=True)
class MetricsProbeConfig:
    rule_series: tuple[str, ...] = RULE_SERIES
    dashboard_series: tuple[str, ...] = DASHBOARD_SERIES
    older_names: dict[str, str] = field(default_factory=lambda: dict(OLDER_NAMES))


def config(opts: ProbeOptions, scenario: dict[str, Any]) -> MetricsProbeConfig:
    """The series come from the monitoring this product generates, not from the profile."""
    return MetricsProbeConfig()


def run_metrics_probe(source: MetricsSource, cfg: MetricsProbeConfig,
                      store: EvidenceStore) -> tuple[list[Finding], dict[str, Any]]:
    """Read the metrics once, keep what was read, judge it."""
    try:
        snap = source.snapshot()
    except MetricsError as exc:
        return [unreadable(str(exc))], {"source": source.description, "error": str(exc)}
    if snap.raw:
        evidence = store.write_text("metrics.prom", snap.raw)
    else:   # read through Prometheus: the series it holds for the target
        evidence = store.write_text("series.json", json.dumps(sorted(snap.families()), indent=1) + "\n")
    finding = judge_series(snap, cfg.rule_series, cfg.dashboard_series, cfg.older_names,
                           source=source.description, evidence=[evidence])
    return [finding], {"source": source.description, "series_read": len(snap.families()),
                       "missing_rule_series": finding.observed["missing_rule_series"],
                       "missing_dashboard_series": finding.observed["missing_dashboard_series"]}


def run(opts: ProbeOptions, client: OpenAIClient, store: EvidenceStore,
        scenario: dict[str, Any]) -> tuple[list[Finding], dict[str, Any]]:
    return run_metrics_probe(metrics_source_of(opts), config(opts, scenario), store)


PROBE = register("metrics", config_type=MetricsProbeConfig, config=config, run=run)
