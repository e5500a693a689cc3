"""What a rollback changes: which nodes (by scope: the failed one and any mixed one, or every node not at its
recorded state) and, per node, what it restores (the recorded packages at their exact versions, a reboot)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ...core.profile import ConfigError

ROLLBACK_SCOPES = ("failed", "all")


def restore_specs(packages: Iterable[str], version: str | None = None) -> list[str]:
    """Package specs that reinstall exactly the recorded packages: dpkg `NAME VERSION` lines become
    apt's NAME=VERSION; a one-word line (rpm -qa NEVRA) is dnf's spec as it stands. With `version`,
    only the packages of that driver version (the ones a driver change replaces; nvidia-container-toolkit
    and other nvidia-* packages of their own versions stay as they are)."""
    specs = []
    for line in packages:
        parts = line.split()
        if version and version not in line:
            continue
        if len(parts) >= 2:
            specs.append(f"{parts[0]}={parts[1]}")
        elif parts:
            specs.append(parts[0])
    return specs


def rollback_targets(hosts: list[str], captures: Mapping[str, Mapping[str, Any]],
                     recorded: Mapping[str, Mapping[str, Any]], upgrade_record: Mapping[str, Any] | None,
                     scope: str = "failed") -> dict[str, str]:
    """Which nodes a rollback changes, each with why. `failed`: the node the upgrade stopped on and
    any node left in a mixed state (driver sources that disagree, NVML's version mismatch); `all`:
    also every node whose driver or packages differ from the state recorded before the upgrade."""
    if scope not in ROLLBACK_SCOPES:
        raise ConfigError(f"rollback_scope {scope!r}: choose failed (the failed node and any node in a mixed "
                          "state) or all (every node not at its recorded state)")
    failed = (upgrade_record or {}).get("failed") or {}
    targets: dict[str, str] = {}
    for host in hosts:
        now, before = captures.get(host) or {}, recorded.get(host) or {}
        if failed.get("host") == host:
            targets[host] = f"the upgrade stopped on it at step {failed.get('step')!r}"
        elif now.get("mixed"):
            targets[host] = f"mixed state: {_describe_sources(now)}"
        elif scope == "all" and _differs(now, before):
            targets[host] = (f"not at its recorded state (driver {now.get('driver_version')}, recorded "
                             f"{before.get('driver_version')})")
    return targets


def _describe_sources(capture: Mapping[str, Any]) -> str:
    tool = capture.get("gpu_tool") or {}
    parts = [", ".join(f"{k} {v}" for k, v in (capture.get("sources") or {}).items())]
    if tool and not tool.get("ok"):
        parts.append(f"nvidia-smi exit {tool.get('rc')}: {str(tool.get('output') or '').splitlines()[0][:120]}"
                     if tool.get("output") else f"nvidia-smi exit {tool.get('rc')}")
    return "; ".join(p for p in parts if p)


def _differs(now: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    return (now.get("driver_version") != before.get("driver_version")
            or sorted(now.get("packages") or []) != sorted(before.get("packages") or []))


def restore_plan(now: Mapping[str, Any], before: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """What a rollback restores on one node: the recorded packages (exact versions), and whether a
    reboot is needed even if no package changes (the loaded module is not the recorded one)."""
    version = before.get("driver_version")
    return {"version": version, "packages": restore_specs(before.get("packages") or [], version), "reason": reason,
            "from": now.get("sources") or {}, "gpu_tool": now.get("gpu_tool"),
            "reboot_required": (now.get("sources") or {}).get("kernel_module") != version}
