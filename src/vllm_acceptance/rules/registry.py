"""The registry behind the check catalog: one :class:`Check` per id, and the result builder.

Every finding the product writes is the result of one registered check (``rules/catalog.py`` holds
the entries; ``docs/checks.md`` is generated from them). A rule builds its finding through the
check, so the id, title, pass rule and consequence are written once, here, not at every return::

    DRIVER = catalog.get("compat.driver_module")
    return DRIVER.fail(host, observed=..., expected=..., evidence=..., reason=..., action=...)

An id that is not registered is a programming error (:class:`UnknownCheck`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.findings import CHECK_PREFIXES, Consequence, Finding, Status, use_catalog
from ..core.probes import probe_names

FAMILIES = tuple(prefix.rstrip(".") for prefix in CHECK_PREFIXES)
# The day-N re-check's own family (recheck/judge.py): its drift findings live in recheck.json, never in an acceptance
# report.json, so it is no acceptance family (core/findings.py CHECK_PREFIXES) and no acceptance report renders it.
RECHECK_FAMILIES = ("drift",)
CATALOG_FAMILIES = FAMILIES + RECHECK_FAMILIES
# The stages a check is judged in: the node and server stages, each probe (core/probes.py), then the rest.
STAGES = ("preflight", "serve", "launch", *probe_names(), "loadgen", "report", "rebuild", "recheck")


class UnknownCheck(KeyError):
    """A finding was built for an id that no catalog entry registers."""


@dataclass(frozen=True)
class Check:
    """One catalogued check: what it proves, by which rule, from which evidence, and what a failure means."""

    id: str
    title: str
    rule: str
    consequence: Consequence
    evidence: str
    source: str
    stage: str
    notes: str = ""
    warn_blocks: bool = True      # False: a `warn` of this check is recorded and shown, but does not by itself
                                  # keep the run from `release` (verdict.py); the catalog says which

    @property
    def family(self) -> str:
        return self.id.split(".", 1)[0]

    def result(self, status: Status | str, host: str | None = None, *, observed: Any = None,
               expected: Any = None, evidence: Iterable[str] = (), reason: str = "",
               action: str | None = None, rule: str | None = None, layer: str | None = None,
               consequence: Consequence | None = None, configuration: dict[str, Any] | None = None) -> Finding:
        """A finding of this check; ``rule`` overrides the catalog text when the rule carries numbers."""
        status = Status(status)
        if action is None:
            action = "none" if status in (Status.PASS, Status.NOT_APPLICABLE) else ""
        return Finding(check=self.id, status=status, host=host, observed=observed, expected=expected,
                       evidence=list(evidence), rule=rule if rule is not None else self.rule,
                       action=action, consequence=consequence or self.consequence, layer=layer,
                       reason=reason, title=self.title, configuration=dict(configuration or {}))

    def passed(self, host: str | None = None, **kw: Any) -> Finding:
        return self.result(Status.PASS, host, **kw)

    def fail(self, host: str | None = None, **kw: Any) -> Finding:
        return self.result(Status.FAIL, host, **kw)

    def warn(self, host: str | None = None, **kw: Any) -> Finding:
        return self.result(Status.WARN, host, **kw)

    def inconclusive(self, host: str | None = None, **kw: Any) -> Finding:
        return self.result(Status.INCONCLUSIVE, host, **kw)

    def missing(self, host: str | None, why: str, *, evidence: Iterable[str] = (),
                consequence: Consequence | None = None) -> Finding:
        """Evidence that could not be had: never a pass."""
        return self.result(Status.MISSING, host, expected="evidence", reason=why, evidence=evidence,
                           consequence=consequence,
                           action="collect the missing evidence and re-run acceptance")

    def not_applicable(self, host: str | None, why: str) -> Finding:
        return self.result(Status.NOT_APPLICABLE, host, reason=why, action="none")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "family": self.family, "stage": self.stage, "title": self.title,
                "rule": self.rule, "consequence": self.consequence.value, "evidence": self.evidence,
                "source": self.source, "notes": self.notes, "warn_blocks": self.warn_blocks}


CHECKS: dict[str, Check] = {}


def register(check_id: str, *, title: str, rule: str, consequence: Consequence | str, evidence: str,
             source: str, stage: str, notes: str = "", warn_blocks: bool = True) -> Check:
    """Register one check id (once: a second registration of an id is a programming error)."""
    if check_id in CHECKS:
        raise ValueError(f"check {check_id!r} is registered twice")
    prefixes = CHECK_PREFIXES + tuple(f"{f}." for f in RECHECK_FAMILIES)
    if not check_id.startswith(prefixes):
        raise ValueError(f"check id {check_id!r} must start with one of {prefixes}")
    if stage not in STAGES:
        raise ValueError(f"check {check_id!r}: stage {stage!r} is not one of {STAGES}")
    check = Check(id=check_id, title=title, rule=rule, consequence=Consequence(consequence),
                  evidence=evidence, source=source, stage=stage, notes=notes, warn_blocks=warn_blocks)
    CHECKS[check_id] = check
    return check


def get(check_id: str) -> Check:
    """The catalogued check ``check_id``; :class:`UnknownCheck` names the fix when it is not registered."""
    try:
        return CHECKS[check_id]
    except KeyError:
        raise UnknownCheck(f"check id {check_id!r} is not in the catalog: register it in "
                           "src/vllm_acceptance/rules/catalog.py (and regenerate docs/checks.md)") from None


def warn_blocks(check_id: str) -> bool:
    """Does a `warn` of this check keep a run from `release`? True unless its catalog entry says otherwise (an
    id outside the catalog, read from an older run, blocks)."""
    return CHECKS[check_id].warn_blocks if known(check_id) else True


def known(check_id: str) -> bool:
    return check_id in CHECKS


def missing(check: str, host: str | None, why: str, consequence: Consequence | None = None,
            evidence: list[str] | None = None) -> Finding:
    """A required check whose evidence could not be had: never a pass (the catalog's consequence by default)."""
    return get(check).missing(host, why, evidence=evidence or [], consequence=consequence)


def not_applicable(check: str, host: str | None, why: str) -> Finding:
    return get(check).not_applicable(host, why)


use_catalog(get)
