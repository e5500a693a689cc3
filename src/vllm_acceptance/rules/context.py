"""What every compatibility rule shares: the node context, the rebuild routes, and the finding helpers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.findings import Finding, Status
from ..core.profile import Profile
from ..parsers.container import ImageInspect, Probe, parse_image_inspect, parse_probe
from ..parsers.lsmod import Lsmod, parse_lsmod
from ..parsers.node_evidence import CommandRecord, NodeEvidence
from ..parsers.nvidia_smi import GpuList, parse_query_csv, parse_xml
from ..parsers.startup_log import StartupScan
from . import registry
from .launched import LaunchedPlan
from .registry import not_applicable

# The rebuild routes (docs/sources.md#a001, route selection; docs/remediation.md), named in every action.
ROUTE_DRIVER = ("upgrade the host driver (rolling, one node out of the scheduler at a time, state saved, "
                "recorded rollback plan; playbooks/rebuild.yml, back with playbooks/rollback.yml)")
ROUTE_IMAGE = ("use the official image of the profile (another image: set vllm_image_digest to the official "
               "digest and re-run accept.yml)")
ROUTE_SELF_BUILT = ("a self-built image for this host's CUDA as an experimental profile only, with owner, "
                    "exit date and full lineage (playbooks/build_image.yml)")
ROUTE_ISOLATED = ("an isolated compatible environment when the shared cluster cannot change (owner, review "
                  "date, criteria to move back: isolated_env_* inventory variables, then accept.yml on that inventory)")


@dataclass
class NodeContext:
    """What the rules for one node need: its evidence, the profile, and the cluster shape."""

    evidence: NodeEvidence
    profile: Profile
    n_hosts: int = 1
    startup_scan: StartupScan | None = None
    plan: LaunchedPlan | None = None          # what is launched (profile + inventory); None: the profile's
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return self.evidence.host

    @property
    def multinode(self) -> bool:
        return self.n_hosts > 1 or int(self.profile.model.hardware.min_nodes) > 1

    @property
    def runtime(self) -> str:
        return str(self.evidence.inputs.get("runtime") or self.profile.model.launch.runtime)

    @property
    def containerised(self) -> bool:
        return self.runtime in ("docker", "podman")

    @property
    def image_ref(self) -> str | None:
        return self.evidence.inputs.get("image") or self.profile.model.image.reference

    def rec(self, name: str) -> CommandRecord:
        return self.evidence.get(name)

    def parsed(self, name: str, parser: Callable[[str], Any]) -> Any:
        """Parse a record once per context; None when the command did not succeed."""
        if name not in self._cache:
            record = self.rec(name)
            self._cache[name] = parser(record.stdout) if record.ok else None
        return self._cache[name]

    def probe(self) -> Probe | None:
        return self.parsed("image_probe", parse_probe)

    def inspect(self) -> ImageInspect | None:
        return self.parsed("image_inspect", parse_image_inspect)

    def gpus(self) -> GpuList | None:
        """Host GPU list: query CSV first, the -q -x XML when the CSV is absent or unreadable."""
        query = self.parsed("nvidia_smi_query", parse_query_csv)
        if query is not None and query.ok and query.gpus:
            return query
        xml = self.parsed("nvidia_smi_xml", parse_xml)
        if xml is not None and xml.gpus:
            return xml
        return query or xml

    def lsmod(self) -> Lsmod | None:
        return self.parsed("lsmod", parse_lsmod)

    def paths(self, *names: str) -> list[str]:
        return [p for name in names for p in self.rec(name).paths]


def why_missing(ctx: NodeContext, *names: str) -> str:
    if not ctx.evidence.dir_exists:
        return "no preflight evidence from this host (unreachable, or the play stopped before saving)"
    return "; ".join(ctx.rec(n).why_not() for n in names)


def finding(check: str, status: Status, host: str | None, **kw: Any) -> Finding:
    """A finding of a catalogued check: title, rule and consequence from rules/catalog.py unless given."""
    return registry.get(check).result(status, host, **kw)


def gpu_profile_na(check: str, ctx: NodeContext) -> Finding | None:
    if not ctx.profile.has_gpus:
        return not_applicable(check, ctx.host, "profile hardware.accelerator is none (no GPU on this "
                                               "deployment); the host environment is in compat.state_snapshot")
    return None
