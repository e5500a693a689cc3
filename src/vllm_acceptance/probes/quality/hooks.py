"""The checks that prove a path, run around the quality probe's parity pass (docs/checks.md `quality.`).

The quality probe (probes/quality/probe.py) sends its seeded prompt set to the path under test and to the
reference path. Each path check named in `PATH_CHECKS` reads what proves its own path -- a P/D deployment's
pool counters (probes/quality/pd_path.py), speculative decoding's acceptance per position
(probes/quality/spec_decode.py) -- before and after that pass, and judges it. A module listed here exposes
`CHECK`, an object of the `PathCheck` shape.
"""

from __future__ import annotations

from typing import Any, Protocol

from ...core.evidence import EvidenceStore
from ...core.findings import Finding
from ..options import ProbeOptions

# Modules that expose CHECK: PathCheck, in run order.
PATH_CHECKS = ("vllm_acceptance.probes.quality.pd_path", "vllm_acceptance.probes.quality.spec_decode")


class PathCheck(Protocol):
    name: str

    def applies(self, opts: ProbeOptions) -> bool:
        """Whether the deployment under test has this path (pools present, a speculative config served...)."""
        ...

    def before(self, opts: ProbeOptions, store: EvidenceStore) -> dict[str, Any]:
        """What to read before the parity pass (counter snapshots, written as evidence as they are read)."""
        ...

    def after(self, opts: ProbeOptions, before: dict[str, Any], parity: dict[str, Any] | None,
              store: EvidenceStore) -> list[Finding]:
        """Read again after the parity pass and judge. `parity` is the pass's summary (requests sent, per-prompt
        outcome) or None when it did not run; missing or unreadable evidence is `missing`/`inconclusive`, never
        `pass`."""
        ...
