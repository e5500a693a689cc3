"""interconnect.allreduce_path: the all-reduce path vLLM and NCCL chose, read from the server's startup log, against
the launch's interconnect (docs/checks.md; docs/sources.md#known-defects, #nccl-fabric-lines).

vLLM 0.32's FlashInfer all-reduce takes its `mnnvl` backend for every multi-node process group on Blackwell
(flashinfer_all_reduce.py `_resolve_fi_ar_backend`) and logs `Initialized FlashInfer Allreduce norm [quantization ]
fusion workspace with backend=mnnvl`, or `Failed to initialize FlashInfer All Reduce workspace: ...`; on nodes
joined by InfiniBand only, that workspace hangs and leaks GPU memory (vllm-project/vllm#51986). NCCL's INFO lines
(with NCCL_DEBUG=INFO) say whether its channels cross over NET/IB, NET/Socket or P2P/MNNVL.
"""

from __future__ import annotations

import re

from ..core.findings import Finding, Status
from ..core.profile import Profile
from ..parsers.nccl_tests import detect_fabric
from . import registry
from .launched import LaunchedPlan, mnnvl_hardware

_FI_BACKEND = re.compile(r"Initialized FlashInfer Allreduce norm (?:quantization )?fusion workspace with backend=(\w+)")
_FI_FAILED = re.compile(r"Failed to initialize FlashInfer All Reduce workspace: ([^\n]{0,160})")


def check_allreduce_path(log: str | None, profile: Profile, host: str | None, evidence: list[str],
                         plan: LaunchedPlan) -> Finding:
    check = registry.get("interconnect.allreduce_path")
    if not profile.has_gpus or str(profile.model.hardware.collective_backend) != "nccl":
        return check.not_applicable(host, "no NCCL collective (the profile's collective backend is "
                                          f"{profile.model.hardware.collective_backend})")
    per_node = int(profile.model.hardware.gpus_per_node or 1)
    if plan.tensor <= per_node:
        return check.not_applicable(host, f"the tensor-parallel group ({plan.tensor} GPUs) stays inside one node "
                                          f"({per_node} GPUs): its all-reduce crosses no inter-node path")
    if log is None:
        return check.missing(host, "no startup log of the server", evidence=evidence)
    nvl = mnnvl_hardware(profile) and plan.interconnect in ("nvl", None)
    backends = sorted(set(_FI_BACKEND.findall(log)))
    failed = _FI_FAILED.findall(log)
    path = detect_fabric(log)
    observed = {"flashinfer_allreduce_backends": backends, "flashinfer_workspace_failures": len(failed),
                "nccl_fabric": path.fabric, "launch_interconnect": plan.interconnect, "mnnvl_hardware": nvl}
    expected = {"mnnvl": "only inside one multi-node NVLink domain", "nccl": "NET/IB over rdma, P2P/MNNVL over nvl"}
    problems = []
    if not nvl and ("mnnvl" in backends or failed):
        problems.append("vLLM's FlashInfer all-reduce took the MNNVL backend across nodes that share no NVLink "
                        "domain" + (f" ({len(failed)} workspace failure(s): {failed[0].strip()})" if failed else "")
                        + ": it hangs and leaks GPU memory there (vllm-project/vllm#51986)")
    if nvl and path.fabric in ("infiniband", "socket", "net"):
        problems.append(f"NCCL's channels crossed {path.fabric}, not the NVLink fabric the launch uses")
    if plan.interconnect == "rdma" and path.fabric == "socket":
        problems.append("NCCL's channels crossed NET/Socket (TCP), not RDMA")
    if problems:
        return check.result(Status.FAIL, host, observed=observed, expected=expected, evidence=evidence,
                            reason="; ".join(problems),
                            action="keep the all-reduce on the launch's interconnect: on nodes without a shared "
                                   "NVLink domain turn vLLM's FlashInfer all-reduce off for this launch (unset "
                                   "VLLM_ALLREDUCE_USE_FLASHINFER, compilation pass fuse_allreduce_rms off) and check "
                                   "NCCL_IB_HCA / NCCL_SOCKET_IFNAME for the NET transport, then launch again")
    if not backends and path.fabric is None:
        return check.result(Status.WARN, host, observed=observed, expected=expected, evidence=evidence,
                            reason="the startup log names no all-reduce path (no FlashInfer workspace line, no NCCL "
                                   "INFO channel lines): nothing to compare with the launch's interconnect",
                            action="launch with NCCL_DEBUG=INFO to record NCCL's transport")
    return check.result(Status.PASS, host, observed=observed, expected=expected, evidence=evidence,
                        reason=f"FlashInfer {backends or 'not used'}, NCCL {path.fabric or 'no INFO lines'} on a "
                               f"{plan.interconnect} launch")
