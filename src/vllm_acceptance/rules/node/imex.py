"""interconnect.imex as one unit (docs/checks.md interconnect.imex; docs/architecture.md "Adding a node check"):
the commands it needs on every tray, the parser of `nvidia-imex-ctl -N`, and the rule over every tray of the
group, registered together.

`nvidia-imex-ctl -N` prints the IMEX domain as one tray sees it (NVIDIA's IMEX guide; a real 18-node capture
in tests/fixtures/real/imex/): a legend, a timestamp, one line per node of the domain's nodes_config.cfg::

    Node #0   - 172.31.48.81    - READY                - Version: 570.172

(older daemons print no version), a connectivity matrix (`C` = connected) and the domain's state::

    Domain State: UP

Any other node state (e.g. UNAVAILABLE) or domain state (DEGRADED, DOWN) is read as printed; a text
without a node list or a domain state is an error, never an up domain. On trays of a multi-node NVLink
domain (hardware.nvlink_domain mnnvl) the service must be active and every tray of the group (the trays the
launch uses, by their preflight_imex_address) READY and connected to the others; a fault there is the
environment's (`rebuild_environment`), naming the tray. A node of the domain outside the group that is not
READY (another tray in maintenance) degrades the domain elsewhere: a warning naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...core.findings import Finding, Status
from ...core.profile import Profile
from ...parsers.base import Parsed
from ..context import NodeContext, finding, why_missing
from ..fabric import mnnvl_na
from ..registry import missing, not_applicable
from . import NodeCommand, register_node_check

# --- the evidence: what every tray runs (only on multi-node NVLink hardware) ----------------------------

COMMANDS = (NodeCommand("imex_active", ("systemctl", "is-active", "nvidia-imex"), needs=("gpu_checks", "mnnvl")),
            NodeCommand("imex_nodes", ("nvidia-imex-ctl", "-N"), needs=("gpu_checks", "mnnvl")))

# --- the parser ------------------------------------------------------------------------------------------

_NODE = re.compile(r"^Node #(\d+)\s+-\s+(\S+)\s+-\s+(\S+)(?:\s+-\s+Version:\s*(\S*))?\s*$")
_DOMAIN = re.compile(r"^Domain State:\s*(\S+)")
_MATRIX_ROW = re.compile(r"^\s+(\d+)\s{2,}((?:\S+\s*)+)$")


@dataclass
class ImexNode:
    index: int
    address: str
    state: str
    version: str | None = None


@dataclass
class ImexDomain(Parsed):
    nodes: list[ImexNode] = field(default_factory=list)
    domain_state: str | None = None
    links: dict[int, list[str]] = field(default_factory=dict)   # row node -> status to every node

    @property
    def up(self) -> bool:
        return self.ok and self.domain_state == "UP"

    @property
    def not_ready(self) -> list[ImexNode]:
        return [n for n in self.nodes if n.state != "READY"]

    @property
    def broken_links(self) -> list[str]:
        """'i->j: X' for every matrix cell that is not C (connected)."""
        return [f"{row}->{col}: {cell}" for row, cells in sorted(self.links.items())
                for col, cell in enumerate(cells) if cell != "C"]


def parse_imex_nodes(text: str) -> ImexDomain:
    result = ImexDomain()
    in_matrix = False
    for line in text.splitlines():
        if node := _NODE.match(line.strip()):
            result.nodes.append(ImexNode(int(node.group(1)), node.group(2), node.group(3), node.group(4) or None))
            continue
        if "Nodes From\\To" in line:
            in_matrix = True
            continue
        if domain := _DOMAIN.match(line.strip()):
            result.domain_state = domain.group(1)
            in_matrix = False
            continue
        if in_matrix and (row := _MATRIX_ROW.match(line)):
            result.links[int(row.group(1))] = row.group(2).split()
    if not result.nodes:
        result.errors.append("no 'Node #N - ADDRESS - STATE' lines: not nvidia-imex-ctl -N output")
    if result.domain_state is None:
        result.errors.append("no 'Domain State:' line")
    return result


# --- the rule ----------------------------------------------------------------------------------------------

def _imex_of(ctx: NodeContext) -> tuple[str | None, ImexDomain | None]:
    active = ctx.rec("imex_active")
    state = active.stdout.strip().splitlines()[0] if active.present and active.stdout.strip() else None
    nodes = ctx.rec("imex_nodes")
    domain = parse_imex_nodes(nodes.stdout) if nodes.present and nodes.stdout.strip() else None
    return state, domain


def _tray_imex_problems(host: str, state: str, domain: ImexDomain,
                        group: set[str] | None) -> tuple[list[str], list[str]]:
    """(faults, warnings) of one tray's view of the IMEX domain. `group`: the IMEX addresses of the trays the
    launch uses (every tray's preflight_imex_address), None when unknown. A node outside the group that is not
    READY, a link between two such nodes, or a domain not UP only because of them degrades the domain
    elsewhere: a warning naming that node, not a failure of the group's trays."""
    faults: list[str] = []
    warnings: list[str] = []
    if state != "active":
        faults.append(f"tray {host}: nvidia-imex is {state}")
    if not domain.ok:
        faults.append(f"tray {host}: nvidia-imex-ctl -N unreadable ({'; '.join(domain.errors)})")
        return faults, warnings
    ours = {n.index for n in domain.nodes if group is None or n.address in group}
    for node in domain.not_ready:
        line = f"IMEX node #{node.index} {node.address} is {node.state}"
        if node.index in ours:
            faults.append(f"tray {host}: {line}")
        else:
            warnings.append(f"tray {host} sees {line} (not a tray of this group)")
    inside = [link for link in domain.broken_links if _link_ends(link) <= ours]
    outside = [link for link in domain.broken_links if link not in inside]
    if inside:
        faults.append(f"tray {host}: IMEX links not connected between the group's trays {inside[:6]}")
    if outside:
        warnings.append(f"tray {host}: IMEX links not connected outside the group {outside[:6]}")
    if domain.domain_state != "UP":
        line = f"IMEX Domain State {domain.domain_state}"
        if faults or group is None or not (warnings or outside):
            faults.append(f"tray {host}: {line}")
        else:
            warnings.append(f"tray {host}: {line}, from nodes outside the group only")
    return faults, warnings


def _link_ends(link: str) -> set[int]:
    """'3->5: X' -> {3, 5}."""
    ends = link.split(":", 1)[0].split("->")
    return {int(e) for e in ends if e.strip().isdigit()}


def check_imex(contexts: list[NodeContext], profile: Profile) -> Finding:
    check = "interconnect.imex"
    if (na := mnnvl_na(check, profile, None)) is not None:
        return na
    if not contexts:
        return missing(check, None, "no GPU node to judge (the inventory's gpu_nodes group is empty)")
    if len(contexts) < 2 and int(profile.model.hardware.min_nodes) < 2:
        return not_applicable(check, None, "one tray: no GPU memory is shared across nodes")
    evidence = [p for ctx in contexts for p in ctx.paths("imex_active", "imex_nodes")]
    seen = {ctx.host: _imex_of(ctx) for ctx in contexts}
    unknown = [f"{ctx.host} ({why_missing(ctx, 'imex_active', 'imex_nodes')})" for ctx in contexts
               if seen[ctx.host][0] is None or seen[ctx.host][1] is None]
    observed = {h: {"service": s, "domain_state": d.domain_state if d else None,
                    "nodes": [f"{n.address} {n.state}" for n in d.nodes] if d else None} for h, (s, d) in seen.items()}
    addresses = {ctx.host: ctx.evidence.inputs.get("imex_address") for ctx in contexts}
    group = {str(a) for a in addresses.values()} if all(addresses.values()) else None
    problems: list[str] = []
    warnings: list[str] = []
    for host, (state, domain) in seen.items():
        if state is not None and domain is not None:
            tray_faults, tray_warnings = _tray_imex_problems(host, state, domain, group)
            problems += tray_faults
            warnings += tray_warnings
    lists = {h: {n.address for n in d.nodes} for h, (_, d) in seen.items() if d is not None and d.ok}
    if lists and group is not None:
        problems += [f"tray {other}'s address {addresses[other]} is not in tray {h}'s IMEX node list"
                     for h, nodes in lists.items() for other in addresses if addresses[other] not in nodes]
    elif len({frozenset(v) for v in lists.values()}) > 1:
        problems.append("the trays' IMEX node lists differ (different IMEX domains): "
                        + "; ".join(f"{h}: {sorted(v)}" for h, v in lists.items()))
    expected = {"service": "active", "domain_state": "UP",
                "nodes": "every tray of the group listed and READY, connected to each other (a node outside the "
                         "group not READY: a warning)"}
    if warnings:
        observed["outside_the_group"] = warnings
    if problems:
        return finding(check, Status.FAIL, None, observed=observed, expected=expected, evidence=evidence,
                       reason="; ".join(problems),
                       action="on the named tray: systemctl enable --now nvidia-imex, its nodes_config.cfg listing "
                              "every tray of the group (journalctl -u nvidia-imex for the cause), then re-run "
                              "preflight")
    if unknown:
        return missing(check, None, "no IMEX evidence from " + ", ".join(unknown), evidence=evidence)
    if lists and len(next(iter(lists.values()))) < len(contexts):
        return finding(check, Status.FAIL, None, observed=observed, expected=expected, evidence=evidence,
                       reason=f"the IMEX domain has {len(next(iter(lists.values())))} node(s) for {len(contexts)} "
                              "trays", action="list every tray of the group in nodes_config.cfg, restart nvidia-imex")
    if warnings:
        return finding(check, Status.WARN, None, observed=observed, expected=expected, evidence=evidence,
                       reason=f"the group's {len(contexts)} trays are READY and connected; the IMEX domain is "
                              "degraded elsewhere: " + "; ".join(dict.fromkeys(warnings)),
                       action="none for this deployment; the named node(s) outside the group need their "
                              "nvidia-imex (journalctl -u nvidia-imex there) before they join a deployment")
    return finding(check, Status.PASS, None, observed=observed, expected=expected, evidence=evidence,
                   reason=f"IMEX domain UP on {len(contexts)} trays, every node READY")


CHECK = register_node_check("interconnect.imex", COMMANDS, cluster_rule=check_imex)
