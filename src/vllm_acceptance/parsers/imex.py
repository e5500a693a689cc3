"""`nvidia-imex-ctl -N`: the IMEX domain as one tray sees it (docs/checks.md, interconnect.imex).

The output (NVIDIA's IMEX guide; a real 18-node capture in tests/fixtures/real/imex/) is a legend,
a timestamp, one line per node of the domain's nodes_config.cfg::

    Node #0   - 172.31.48.81    - READY                - Version: 570.172

(older daemons print no version), a connectivity matrix (`C` = connected) and the domain's state::

    Domain State: UP

Any other node state (e.g. UNAVAILABLE) or domain state (DEGRADED, DOWN) is read as printed; a text
without a node list or a domain state is an error, never an up domain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .base import Parsed

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
