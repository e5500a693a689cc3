"""Is the attached server on a GPU node the run judged? (docs/checks.md: compat.server_location; issue 28 item 3.)

In attach mode every node of `gpu_nodes` reports the process listening on the port of `vllm_base_url`
(roles/preflight/files/live_process.py: `ss -ltnpH`, then /proc/PID). The node evidence (driver, CUDA, image,
interconnect) speaks for the server only when the server runs on one of those nodes. A server found on none
of them is `inconclusive` (the run is `incomplete`, never `release`): what it runs on was not judged. A node
whose answer is missing leaves it `missing`. Launch mode: the run starts the server on its own head node.

Bound, not only by port (issue 42 item 3): the URL's host, as the controller resolved it at preflight
(evidence/preflight-url.json, preflight/stage.py `save_url_resolution`), must be an address of the node that listens
(the node's own `addresses`); a loopback URL (127.0.0.0/8, ::1, localhost) only where the controller shares that
node's network namespace (`netns`: boot id and namespace inode, equal on both sides). A host that is no judged node's
address (a load balancer, another machine) cannot be bound: inconclusive. And the process must be seen: a listener
whose pid this user cannot see (`ss` prints no `users:(...)` for another user's process) is inconclusive, with how
to make it visible (become, or the container or pid named on the head).
"""

from __future__ import annotations

import ipaddress
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
# How a run sees a server that runs as another user (docs/checks.md compat.server_location).
MAKE_VISIBLE = ("make the server's process visible to the run: run with become (ansible_become: true), or name the "
                "server's container (vllm_serve_attach_container) or its pid (vllm_serve_pid) for the vllm_head "
                "host, and re-run")
CANNOT_BIND = ("a load balancer in front: name its backends as the nodes (gpu_nodes) and attach to each, or point "
               "vllm_base_url at a node's own address")


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
    addresses: tuple[str, ...] = ()     # the node's own addresses, as its script read them
    netns: str | None = None            # its network namespace (boot id:inode)


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
    own = (tuple(str(a) for a in data.get("addresses") or [] if isinstance(data.get("addresses"), list)),
           str(data["netns"]) if data.get("netns") else None)
    lines = "\n".join(str(x) for x in data.get("listeners") or [])
    on_port = [x for x in parse_ss_listeners(lines) if x.port == port]
    found = tuple(x for x in on_port if reachable_from(x, url_host))
    reason = str(data.get("reason") or "")
    if on_port and not found:
        return NodeListen(ctx.host, "absent", evidence=evidence,
                          why=f"port {port} is bound to loopback only here ({', '.join(x.address for x in on_port)}): "
                              f"it cannot serve {url_host}", addresses=own[0], netns=own[1])
    pid = data.get("pid") if isinstance(data.get("pid"), int) else None
    if found:
        return NodeListen(ctx.host, "here", found, pid or next((x.pid for x in found if x.pid), None), reason, evidence,
                          *own)
    if data.get("port") == port and reason.startswith("no process listens"):
        return NodeListen(ctx.host, "absent", why=reason, evidence=evidence, addresses=own[0], netns=own[1])
    return NodeListen(ctx.host, "unknown", why=reason or "no listener lines in the node's answer", evidence=evidence,
                      addresses=own[0], netns=own[1])


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return address == "localhost"


def _same_address(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.split("%", 1)[0]) == ipaddress.ip_address(b.split("%", 1)[0])
    except ValueError:
        return a == b


def url_node(node: NodeListen, resolved: Mapping[str, Any]) -> bool | None:
    """Whether the URL's host is this node: one of the addresses the controller resolved it to is the node's own
    (a loopback one only where the controller is in the node's network namespace). None where the node did not
    say its addresses (an older node script) or the host was not resolved."""
    addresses = [str(a) for a in resolved.get("addresses") or []]
    if not addresses:
        return None
    if any(_is_loopback(a) for a in addresses):
        controller = resolved.get("controller_netns")
        if node.netns and controller:
            return node.netns == controller
        return None
    if not node.addresses:
        return None
    return any(_same_address(a, b) for a in addresses for b in node.addresses)


def bound_nodes(nodes: list[NodeListen], resolved: Mapping[str, Any] | None) -> tuple[list[NodeListen], str | None]:
    """(the listening nodes the URL's host is, why the binding is unknown): a node listening on the port is the
    server only where the URL's host is that node (url_node)."""
    if not resolved or not resolved.get("addresses"):
        why = (resolved or {}).get("error") or "the controller recorded no resolution of the URL's host at preflight"
        return [], f"the URL's host is not resolved ({why})"
    here = [n for n in nodes if n.state == "here"]
    verdicts = {n.host: url_node(n, resolved) for n in here}
    bound = [n for n in here if verdicts[n.host]]
    unknown = [n.host for n in here if verdicts[n.host] is None]
    if not bound and unknown:
        return [], ("whether the URL's host is " + ", ".join(unknown) + " is unknown (the node's answer names no "
                    "addresses or network namespace)")
    return bound, None


def _describe(node: NodeListen) -> dict[str, Any]:
    return {"host": node.host, "pid": node.pid,
            "process": next((x.process for x in node.listeners if x.process), None),
            "addresses": sorted({f"{x.address}:{x.port}" for x in node.listeners}),
            **({"note": node.why} if node.why and node.pid is None else {})}


def check_server_location(contexts: list[NodeContext],
                          inventory_vars: Mapping[str, Any], resolved: Mapping[str, Any] | None = None) -> Finding:
    """`resolved`: the URL host's resolution the controller recorded at preflight (host, addresses,
    controller_netns, error); None where none was recorded (the binding is then unknown: never a pass)."""
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
    observed: dict[str, Any] = {"url": url, "port": port, "nodes": {n.host: n.state for n in nodes}}
    expected = f"a process this run sees listening on port {port} on the gpu_nodes host that {url_host} is"
    if here:
        observed["serving"] = [_describe(n) for n in here]
        return _bind(check, here, nodes, resolved, url, url_host, port, observed, expected, evidence)
    unknown = [n for n in nodes if n.state == "unknown"]
    if unknown:
        return check.missing(None, f"no judged node shows a listener on port {port}, and "
                                   + "; ".join(f"{n.host}: {n.why}" for n in unknown)
                                   + ": the server may run there", evidence=evidence)
    return check.inconclusive(
        None, observed=observed, expected=expected,
        evidence=evidence,
        reason=f"no GPU node judged ({', '.join(n.host for n in nodes)}) has a process listening on port {port} "
               f"that {url} can reach: it is served from elsewhere, and the driver, CUDA, image and interconnect "
               "evidence of these nodes says nothing about it"
               + "".join(f"; {n.host}: {n.why}" for n in nodes if n.why.startswith(f"port {port} is bound")),
        action="list the nodes that run the server under gpu_nodes (or point vllm_base_url at the server on them) "
               "and re-run; a server in a pod's own network namespace is not seen by the node's ss (run it with "
               "hostNetwork)")


def _bind(check: Any, here: list[NodeListen], nodes: list[NodeListen], resolved: Mapping[str, Any] | None, url: str,
          url_host: str | None, port: int, observed: dict[str, Any], expected: str, evidence: list[str]) -> Finding:
    """Nodes listen on the port: the server is one of them only where the URL's host is that node, and is judged
    only where its process is seen."""
    observed["url_host"] = {"host": url_host, "addresses": list((resolved or {}).get("addresses") or [])}
    bound, why = bound_nodes(nodes, resolved)
    listening = ", ".join(n.host for n in here)
    if why:
        return check.inconclusive(None, observed=observed, expected=expected, evidence=evidence,
                                  reason=f"port {port} is listened on by {listening}, but {why}: the server "
                                         f"behind {url} cannot be bound to a judged node",
                                  action="re-run preflight with this version (the controller resolves the URL's host "
                                         "and each node names its addresses)")
    if not bound:
        addresses = ", ".join(observed["url_host"]["addresses"])
        owners = [n.host for n in nodes if n.state != "here" and resolved and url_node(n, resolved)]
        if owners:
            return check.inconclusive(None, observed=observed, expected=expected, evidence=evidence,
                                      reason=f"{url_host} ({addresses}) is {', '.join(owners)}, where nothing "
                                             f"listens on port {port}; port {port} is listened on by {listening}, "
                                             f"which {url} does not name: the server cannot be bound",
                                      action="point vllm_base_url at the node that serves (its own address), or "
                                             "check the port")
        return check.inconclusive(None, observed=observed, expected=expected, evidence=evidence,
                                  reason=f"{url_host} ({addresses}) is no judged node's address: port {port} is "
                                         f"listened on by {listening}, but what answers {url} is another machine "
                                         "(a load balancer or another host); the run cannot bind it to the nodes "
                                         "it judged", action=CANNOT_BIND)
    unseen = [n for n in bound if n.pid is None]
    if unseen:
        return check.inconclusive(None, observed=observed, expected=expected, evidence=evidence,
                                  reason=f"port {port} of {url} is served on "
                                         + ", ".join(f"{n.host} ({n.why or 'no pid'})" for n in unseen)
                                         + ": the process is not visible to this user, so its argv, container and "
                                           "image are unread and nothing binds them to the evidence",
                                  action=MAKE_VISIBLE)
    names = ", ".join(f"{n.host} (pid {n.pid})" for n in bound)
    return check.passed(None, observed=observed, expected=expected, evidence=evidence,
                        reason=f"port {port} of {url} ({url_host} is this node) is served on {names}")
