"""The finding: one judged check, tied to evidence on disk.

Every stage (preflight, serve, probes) produces findings in this one shape; the verdict
and every report format read nothing else.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from .probes import probe_families
from .redact import redact_obj


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    INCONCLUSIVE = "inconclusive"
    NOT_APPLICABLE = "not_applicable"
    MISSING = "missing"


class Consequence(StrEnum):
    """What a failed finding of this check means for the decision."""

    REBUILD = "rebuild_environment"
    EXPAND = "expand_capacity"
    LIMIT = "limited_observation"
    BLOCK_AGENT = "block_agent_traffic"


VERDICTS = ("release", "limited_observation", "rebuild_environment", "expand_capacity", "incomplete")
LAYERS = ("model", "parser", "gateway", "client", "executor", "retry")
# The check families in the catalog's order; a probe's family (core/probes.py) not among them comes after.
_FAMILY_ORDER = ("compat.", "capacity.", "cache.", "agent.", "interconnect.")
CHECK_PREFIXES = _FAMILY_ORDER + tuple(f"{f}." for f in probe_families() if f"{f}." not in _FAMILY_ORDER)

# Findings read back from disk (an older run, a diff) are taken as they were written; findings built
# by the code must name a catalogued check (rules/catalog.py).
_READING = contextvars.ContextVar("reading_findings", default=False)
# The check catalog's lookup (rules/registry.py installs it): a finding of an id outside the catalog raises.
# core imports nothing above it, so the catalog is handed in rather than imported.
_CATALOG: Callable[[str], object] | None = None


def use_catalog(lookup: Callable[[str], object]) -> None:
    """Validate every finding's check id with `lookup` from now on (rules/registry.py calls it on import)."""
    global _CATALOG
    _CATALOG = lookup


@dataclass
class Finding:
    check: str
    status: Status
    observed: Any = None
    expected: Any = None
    host: str | None = None
    evidence: list[str] = field(default_factory=list)
    rule: str = ""
    action: str = ""
    consequence: Consequence = Consequence.REBUILD
    layer: str | None = None
    reason: str = ""
    title: str = ""
    configuration: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None
    recheck_date: str | None = None

    def __post_init__(self) -> None:
        self.status = Status(self.status)
        self.consequence = Consequence(self.consequence)
        if not self.check.startswith(CHECK_PREFIXES):
            raise ValueError(f"check id {self.check!r} must start with one of {CHECK_PREFIXES}")
        if self.layer is not None and self.layer not in LAYERS:
            raise ValueError(f"layer {self.layer!r} must be one of {LAYERS}")
        if not _READING.get() and _CATALOG is not None:
            _CATALOG(self.check)  # an id outside the catalog is a programming error

    @property
    def blocks(self) -> bool:
        """True when this finding's status stops a plain pass (fail, warn, missing, inconclusive)."""
        return self.status not in (Status.PASS, Status.NOT_APPLICABLE)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["consequence"] = self.consequence.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        known = {f for f in cls.__dataclass_fields__}
        token = _READING.set(True)
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        finally:
            _READING.reset(token)


def write_findings(path: Path, findings: list[Finding]) -> None:
    """Write a stage's findings atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    # a finding's observed values may quote logs, argv and environment: redacted like evidence
    tmp.write_text(json.dumps(redact_obj([f.to_dict() for f in findings]), indent=2, default=str) + "\n")
    tmp.replace(path)


def read_findings(path: Path) -> list[Finding]:
    return [Finding.from_dict(d) for d in json.loads(path.read_text())]
