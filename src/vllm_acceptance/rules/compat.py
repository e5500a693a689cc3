"""The compatibility chain, per node: the rules every GPU node is judged by (docs/checks.md).

Every failure here means `rebuild_environment` (the environment is out of the official profile;
adding GPUs fixes nothing), except the NCCL bandwidth test (`expand_capacity`). Evidence that
is absent or unreadable gives `missing`/`inconclusive`, never `pass`. The CUDA runtime of an
image is judged from inside the image, never from nvidia-smi's "CUDA Version" line (that line
only states what the driver can support). The rules live by concern in rules/driver.py, image.py,
topology.py, interconnect.py, snapshot.py, recipe.py and, for the serve stage, serve.py; this module
is their index.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.findings import Finding
from .context import (
    ROUTE_DRIVER,
    ROUTE_IMAGE,
    ROUTE_ISOLATED,
    ROUTE_SELF_BUILT,
    NodeContext,
    finding,
    gpu_profile_na,
    why_missing,
)
from .defects import check_known_defects
from .driver import check_driver_branch, check_driver_module, check_fabric_manager, host_driver_version
from .fabric import check_fabric_path, check_fabric_state, check_nvlink_domain
from .image import check_container_cuda, check_image_identity, check_image_uniform, check_vllm_version
from .interconnect import (
    check_nccl_bandwidth,
    check_nccl_env,
    check_nccl_env_node,
    check_peermem,
    check_rdma,
    expected_comm_settings,
    planned_launch,
)
from .node import cluster_rules, node_rules
from .recipe import check_recipe_record
from .serve import ServerReports, check_actual_config, check_startup_log, flag_readings, process_flags
from .snapshot import check_state_snapshot, snapshot_commands
from .topology import check_gpu_visibility, check_topology, gpus_required_per_node, world_size

NODE_RULES: tuple[Callable[[NodeContext], Finding], ...] = (
    check_state_snapshot, check_driver_branch, check_driver_module, check_container_cuda, check_image_identity,
    check_vllm_version, check_gpu_visibility, check_fabric_manager, check_peermem, check_rdma,
    check_nccl_env_node, check_nccl_bandwidth, check_fabric_state, check_fabric_path, check_known_defects,
    *node_rules(),   # the node checks that are one file each (rules/node/)
)
# Judged once over every tray of the group (the NVLink domain of NVL72 trays: rules/fabric.py; rules/node/imex.py).
CLUSTER_FABRIC_RULES = (check_nvlink_domain, *cluster_rules())

__all__ = [
    "CLUSTER_FABRIC_RULES", "NODE_RULES", "NodeContext", "ROUTE_DRIVER", "ROUTE_IMAGE", "ROUTE_ISOLATED",
    "ROUTE_SELF_BUILT", "ServerReports",
    "flag_readings",
    "check_actual_config", "check_container_cuda", "check_driver_branch", "check_driver_module",
    "check_fabric_manager", "check_gpu_visibility", "check_image_identity", "check_image_uniform",
    "check_nccl_bandwidth", "check_nccl_env", "check_nccl_env_node", "check_peermem", "check_rdma",
    "check_recipe_record", "check_startup_log", "check_state_snapshot", "check_topology", "check_vllm_version",
    "expected_comm_settings", "finding", "gpu_profile_na", "gpus_required_per_node", "host_driver_version",
    "planned_launch", "process_flags", "snapshot_commands", "why_missing", "world_size",
]
