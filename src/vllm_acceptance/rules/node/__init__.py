"""Node checks as units (kube-bench's style; docs/architecture.md "Adding a node check"): one file in this
folder holds a check's evidence commands, its parser and its rule, and registers them together.

The preflight role runs every registered command whose switches are on for the run (its template asks
`node_commands` through the `vllm.acceptance.acceptance_node_commands` filter), the evidence is saved
under its command's name like every other node command, and the check's rule is judged with the others
(`rules/compat.py` NODE_RULES and CLUSTER_FABRIC_RULES take the registered rules after the built-in ones).
Every module of this folder is imported on first use: adding a check is adding its file.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...core.findings import Finding
from ...core.profile import Profile
from ..context import NodeContext
from ..registry import get

# The run's switches a command may need (roles/preflight's template passes them): GPU checks at all,
# NVSwitch (Fabric Manager) hardware, a multi-node NVLink domain (NVL72 trays), a launch across nodes.
SWITCHES = ("gpu_checks", "nvswitch", "mnnvl", "multinode")


@dataclass(frozen=True)
class NodeCommand:
    """One stock, read-only command the node runs; its stdout is saved as `<name>.txt`."""

    name: str
    argv: tuple[str, ...]
    needs: tuple[str, ...] = ("gpu_checks",)   # every switch here must be on for the command to run
    timeout_s: int | None = None

    def __post_init__(self) -> None:
        unknown = [s for s in self.needs if s not in SWITCHES]
        if unknown:
            raise ValueError(f"node command {self.name}: unknown switch(es) {unknown} (one of {SWITCHES})")


@dataclass(frozen=True)
class NodeCheck:
    """A check id with the commands whose evidence it reads and its rule: per node, or over every node."""

    check_id: str
    commands: tuple[NodeCommand, ...]
    node_rule: Callable[[NodeContext], Finding] | None = None
    cluster_rule: Callable[[list[NodeContext], Profile], Finding] | None = None


_CHECKS: dict[str, NodeCheck] = {}
_LOADED = False


def register_node_check(check_id: str, commands: tuple[NodeCommand, ...], *,
                        node_rule: Callable[[NodeContext], Finding] | None = None,
                        cluster_rule: Callable[[list[NodeContext], Profile], Finding] | None = None) -> NodeCheck:
    """Register a node check: `check_id` must be in the catalog (rules/catalog.py); exactly one rule."""
    get(check_id)   # an id outside the catalog is refused here, at import, not when the rule first runs
    if (node_rule is None) == (cluster_rule is None):
        raise ValueError(f"node check {check_id}: give exactly one of node_rule (per node) or cluster_rule")
    names = {c.name for check in _CHECKS.values() if check.check_id != check_id for c in check.commands}
    clash = [c.name for c in commands if c.name in names]
    if clash:
        raise ValueError(f"node check {check_id}: command name(s) {clash} already registered by another check")
    check = NodeCheck(check_id, tuple(commands), node_rule, cluster_rule)
    _CHECKS[check_id] = check
    return check


def node_checks() -> tuple[NodeCheck, ...]:
    """Every registered node check, its modules imported once, in file-name order."""
    global _LOADED
    if not _LOADED:
        for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
            importlib.import_module(f"{__name__}.{module}")
        _LOADED = True
    return tuple(_CHECKS.values())


def node_rules() -> tuple[Callable[[NodeContext], Finding], ...]:
    return tuple(c.node_rule for c in node_checks() if c.node_rule is not None)


def cluster_rules() -> tuple[Callable[[list[NodeContext], Profile], Finding], ...]:
    return tuple(c.cluster_rule for c in node_checks() if c.cluster_rule is not None)


def node_commands(switches: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The registered commands to run with these switches on, as the preflight template lists commands:
    {"name", "argv"[, "timeout"]}."""
    on = {name for name in SWITCHES if bool(switches.get(name))}
    out = []
    for check in node_checks():
        for command in check.commands:
            if set(command.needs) <= on:
                out.append({"name": command.name, "argv": list(command.argv),
                            **({"timeout": command.timeout_s} if command.timeout_s else {})})
    return out


__all__ = ["SWITCHES", "NodeCheck", "NodeCommand", "cluster_rules", "node_checks", "node_commands", "node_rules",
           "register_node_check"]
