"""The probe registry: each probe folder (`probes/<name>/`) registers one `Probe` -- its kind (declared in
core/probes.py), its typed settings and how it runs -- and `probes/run.py` dispatches through it
(docs/architecture.md "Adding a probe")."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.evidence import EvidenceStore
from ..core.findings import Finding
from ..core.probes import ProbeKind, probe_kind, probe_names
from ..runtime.client import OpenAIClient
from .options import ProbeOptions

ProbeRun = Callable[[ProbeOptions, OpenAIClient, EvidenceStore, dict[str, Any]], tuple[list[Finding], dict[str, Any]]]


@dataclass(frozen=True)
class Probe:
    kind: ProbeKind
    config_type: type                                    # its typed settings (a dataclass)
    config: Callable[[ProbeOptions, dict[str, Any]], Any]  # (options, scenario pack) -> config_type
    run: ProbeRun                                        # (options, client, evidence store, scenario pack)

    @property
    def name(self) -> str:
        return self.kind.name


_PROBES: dict[str, Probe] = {}


def register(name: str, *, config_type: type, config: Callable[[ProbeOptions, dict[str, Any]], Any],
             run: ProbeRun) -> Probe:
    """Register the probe `name` (it must be declared in core/probes.py PROBE_KINDS)."""
    probe = Probe(kind=probe_kind(name), config_type=config_type, config=config, run=run)
    _PROBES[name] = probe
    return probe


def get(name: str) -> Probe:
    """The registered probe `name`, its folder imported on first use; KeyError naming the known ones."""
    kind = probe_kind(name)
    if kind.name not in _PROBES:
        try:
            importlib.import_module(f"{__package__}.{kind.name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{kind.name}":
                raise
            raise KeyError(f"probe {name!r} is declared in core/probes.py but has no folder probes/{name}/") from exc
    if kind.name not in _PROBES:
        raise KeyError(f"probe {name!r} is declared in core/probes.py but probes/{name}/ registers nothing")
    return _PROBES[kind.name]


def all_probes() -> tuple[Probe, ...]:
    """Every probe, in run order."""
    return tuple(get(name) for name in probe_names())
