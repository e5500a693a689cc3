"""compat.state_snapshot: the state of docs/sources.md#a001 saved before any change (docs/checks.md)."""

from __future__ import annotations

from ..core.findings import Finding, Status
from ..core.profile import Profile
from ..parsers.container import parse_runtime_info
from .context import NodeContext, finding, why_missing
from .registry import missing

# --- compat.state_snapshot ------------------------------------------------------------------

def snapshot_commands(profile: Profile, runtime: str) -> list[str]:
    """The state snapshot of docs/sources.md#a001, the parts that apply to this deployment."""
    names = ["date_u", "hostname", "uname_a", "env"]
    if profile.has_gpus:
        names += ["nvidia_smi", "nvidia_smi_query", "lsmod"]
    if runtime in ("docker", "podman"):
        names += ["runtime_version", "runtime_info", "image_inspect"]
    return names


def check_state_snapshot(ctx: NodeContext) -> Finding:
    check = "compat.state_snapshot"
    names = snapshot_commands(ctx.profile, ctx.runtime)
    evidence = ctx.paths(*names)
    failed = [n for n in names if not ctx.rec(n).ok]
    optional = [n for n in ("nvidia_smi", "lsmod", "runtime_version") if n not in names and ctx.rec(n).present]
    observed = {"captured": [n for n in names if n not in failed], "also_recorded": optional}
    rule = "every snapshot command of source 001 that applies was captured before any change"
    if failed:
        return missing(check, ctx.host, why_missing(ctx, *failed), evidence=evidence)
    info = ctx.parsed("runtime_info", parse_runtime_info) if ctx.containerised else None
    if info is not None:
        observed["runtime"] = {"server": info.server_version, "runtimes": info.runtimes,
                               "default": info.default_runtime, "gpu_capable": info.gpu_capable}
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=names, rule=rule,
                    evidence=evidence, action="none")
