"""The check catalog: every check id the product can write, registered once (see docs/checks.md)."""

from __future__ import annotations

from .registry import register

# --- cluster path: the nodes, the launched plan, the tested contract -------------------------------

register("compat.gpu_nodes", stage="preflight", consequence="rebuild_environment",
         title="GPU nodes named in the inventory",
         rule="a GPU profile needs at least one host in the inventory's gpu_nodes group; without one no driver, "
              "CUDA, GPU visibility or Fabric Manager evidence exists",
         evidence="the inventory's gpu_nodes group (run.json hosts)",
         source="README 'Pointing it at a real cluster': gpu_nodes lists every GPU node")
