"""The metrics probe (docs/checks.md capacity.alert_series), the worked example of docs/architecture.md
"Adding a probe": unit.py reads the server's metrics once and registers the probe (probes/registry.py);
rules.py judges what it read."""

from __future__ import annotations

from . import unit
from .rules import judge_series
from .unit import MetricsProbeConfig, run_metrics_probe

__all__ = ["MetricsProbeConfig", "judge_series", "run_metrics_probe", "unit"]
