"""Is the attached server on a GPU node the run judged? (docs/checks.md: compat.server_location; issue 28 item 3.)

In attach mode every node of `gpu_nodes` reports the process listening on the port of `vllm_base_url`
(roles/preflight/files/live_process.py: `ss -ltnpH`, then /proc/PID). The node evidence (driver, CUDA, image,
interconnect) speaks for the server only when the server runs on one of those nodes. A server found on none
of them is `inconclusive` (the run is `incomplete`, never `release`): what it runs on was not judged. A node
whose answer is missing leaves it `missing`. Launch mode: the run starts the server on its own head node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..core.findings import Finding
from ..parsers.live import Listener, parse_ss_listeners
from . import registry
from .context import NodeContext

CHECK = "compat.server_location"


def attached_port(inventory_vars: Mapping[str, Any]) -> int | None:
    """The port whose listener is looked for on the nodes: preflight_live_port, else vllm_base_url's port (its
    scheme's default when the URL names none); None outside attach mode or without a URL."""
    if inventory_vars.get("vllm_serve_mode") != "attach":
        return None
    explicit = inventory_vars.get("preflight_live_port")
    if explicit not in (None, "") and str(explicit).isdigit():
        return int(explicit)
    url = str(inventory_vars.get("vllm_base_url") or "")
    if not url:
        return None
    try:
        parts = urlsplit(url)
        return parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        return None


@dataclass(frozen=True)
class NodeListen:
    """One node's answer: `here` (a listener on the port), `absent` (ss answered, nobody listens) or
    `unknown` (no answer, or ss failed)."""

    host: str
    state: str
    listeners: tuple[Listener, ...] = ()
    pid: int | None = None
    why: str = ""
    evidence: tuple[str, ...] = ()


_LOOPBACK = ("127.", "::1", "[::1]", "localhost")


def _loopback(address: str) -> bool:
    return address.strip("[]").startswith(_LOOPBACK) or address.strip("[]") == "::1"


def reachable_from(listener: Listener, url_host: str | None) -> bool:
    """A socket bound to a loopback address answers only on its own machine: it serves a URL whose host is not a
    loopback name only when bound to a wildcard or another address (ss shows 0.0.0.0, *, [::] or the IP)."""
    return url_host is None or _loopback(url_host) or not _loopback(listener.address)


def node_listen(ctx: NodeContext, port: int, url_host: str | None = None) -> NodeListen:
    record = ctx.rec("live_process")
    evidence = tuple(ctx.paths("live_process"))
    if not ctx.evidence.dir_exists:
        return NodeListen(ctx.host, "unknown", why="no preflight evidence from this node (unreachable?)")
    if not record.present:
        return NodeListen(ctx.host, "unknown", why=record.why_not(), evidence=evidence)
    try:
        data = json.loads(record.stdout)
    except ValueError:
        return NodeListen(ctx.host, "unknown", why="the node's answer is not JSON", evidence=evidence)
    if not isinstance(data, dict):
        return NodeListen(ctx.host, "unknown", why="the node's answer is not a JSON object", evidence=evidence)
    lines = "\n".join(str(x) for x in data.get("listeners") or [])
    on_port = [x for x in parse_ss_listeners(lines) if x.port == port]
    found = tuple(x for x in on_port if reachable_from(x, url_host))
    reason = str(data.get("reason") or "")
    if on_port and not found:
        return NodeListen(ctx.host, "absent", evidence=evidence,
                          why=f"port {port} is bound to loopback only here ({', '.join(x.address for x in on_port)}): "
                              f"it cannot serve {url_host}")
    pid = data.get("pid") if isinstance(data.get("pid"), int) else None
    if found:
        return NodeListen(ctx.host, "here", found, pid or next((x.pid for x in found if x.pid), None), reason, evidence)
    if data.get("port") == port and reason.startswith("no process listens"):
        return NodeListen(ctx.host, "absent", why=reason, evidence=evidence)
    return NodeListen(ctx.host, "unknown", why=reason or "no listener lines in the node's answer", evidence=evidence)


def _describe(node: NodeListen) -> dict[str, Any]:
    return {"host": node.host, "pid": node.pid,
            "process": next((x.process for x in node.listeners if x.process), None),
            "addresses": sorted({f"{x.address}:{x.port}" for x in node.listeners}),
            **({"note": node.why} if node.why and node.pid is None else {})}


def check_server_location(contexts: list[NodeContext],
                          inventory_vars: Mapping[str, Any]) -> Finding:
    check = registry.get(CHECK)
    port = attached_port(inventory_vars)
    mode = inventory_vars.get("vllm_serve_mode")
    if mode != "attach":
        return check.not_applicable(None, f"vllm_serve_mode {mode or 'not recorded'}: not attached; a launch starts "
                                          "the server itself on the inventory's vllm_head (and its workers)")
    url = str(inventory_vars.get("vllm_base_url") or "")
    if port is None:
        return check.missing(None, f"no port to look for: vllm_base_url {url!r} names none and its scheme has no "
                                   "default; set preflight_live_port")
    if not contexts:     # preflight judges none (compat.gpu_nodes says so for a GPU profile)
        return check.missing(None, f"no GPU node judged (gpu_nodes is empty): where {url} runs is unknown")
    try:
        url_host = urlsplit(url).hostname
    except ValueError:
        url_host = None
    nodes = [node_listen(ctx, port, url_host) for ctx in contexts]
    evidence = [p for n in nodes for p in n.evidence]
    here = [n for n in nodes if n.state == "here"]
    observed = {"url": url, "port": port, "nodes": {n.host: n.state for n in nodes}}
    if here:
        observed["serving"] = [_describe(n) for n in here]
        names = ", ".join(f"{n.host} (pid {n.pid if n.pid is not None else 'not visible to this user'})"
                          for n in here)
        return check.passed(None, observed=observed, expected=f"a process listening on port {port} on a gpu_nodes "
                                                              "host", evidence=evidence,
                            reason=f"port {port} of {url} is served on {names}")
    unknown = [n for n in nodes if n.state == "unknown"]
    if unknown:
        return check.missing(None, f"no judged node shows a listener on port {port}, and "
                                   + "; ".join(f"{n.host}: {n.why}" for n in unknown)
                                   + ": the server may run there", evidence=evidence)
    return check.inconclusive(
        None, observed=observed, expected=f"a process listening on port {port} on a gpu_nodes host",
        evidence=evidence,
        reason=f"no GPU node judged ({', '.join(n.host for n in nodes)}) has a process listening on port {port} "
               f"that {url} can reach: it is served from elsewhere, and the driver, CUDA, image and interconnect "
               "evidence of these nodes says nothing about it"
               + "".join(f"; {n.host}: {n.why}" for n in nodes if n.why.startswith(f"port {port} is bound")),
        action="list the nodes that run the server under gpu_nodes (or point vllm_base_url at the server on them) "
               "and re-run; a server in a pod's own network namespace is not seen by the node's ss (run it with "
               "hostNetwork)")
