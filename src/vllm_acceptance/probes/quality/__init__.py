"""The quality probe (docs/checks.md `quality.`; docs/acceptance.md "Output parity"): the seeded greedy prompt set
on the path under test against a reference path of the same weights. probe.py registers it (probes/registry.py)
and runs the path checks of hooks.py around the parity pass (parity_pass.py); parity.py compares, rules.py judges,
plan.py states its plan."""

from __future__ import annotations

from . import probe
from .probe import QualityProbeConfig, run_quality_probe

__all__ = ["QualityProbeConfig", "probe", "run_quality_probe"]
