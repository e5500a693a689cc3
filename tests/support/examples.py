"""The example inventories' placeholders filled in, as a site fills them (issue 43: the gate, gate.py, refuses the
placeholder digest and, across nodes, an unset interface): a test that copies inventories/example-*/group_vars
fills them, unless the placeholders are what it tests."""

from __future__ import annotations

from pathlib import Path

PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
SITE_DIGEST = "sha256:" + "5" * 64
SITE_INTERFACE = "vllm_serve_multinode_env: {GLOO_SOCKET_IFNAME: enP5p9s0, NCCL_SOCKET_IFNAME: enP5p9s0}\n"


def fill_placeholders(group_vars: Path) -> Path:
    """group_vars/all.yml of a copied example with the site's digest and interface (a stand-in interface name)."""
    text = group_vars.read_text().replace(PLACEHOLDER_DIGEST, SITE_DIGEST)
    if "\nvllm_serve_multinode_env:" not in text:
        text += SITE_INTERFACE
    group_vars.write_text(text)
    return group_vars
