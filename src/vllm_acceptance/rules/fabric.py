"""The multi-node NVLink domain of NVL72 trays (docs/checks.md: interconnect.fabric_state,
interconnect.nvlink_domain, interconnect.fabric_path; docs/sources.md#nvlink-domain). interconnect.imex is
one file with its commands and parser: rules/node/imex.py.

A GB200/GB300 NVL72 compute tray is one node of 4 GPUs; a TP8 group spans two trays joined by the
rack's NVLink switch trays. That only works when every GPU joined the fabric (nvidia-smi -q: State
Completed, Status Success, a ClusterUUID), the trays are in one NVLink domain and partition (the same
ClusterUUID and CliqueId), and the IMEX service maps GPU memory between them (nvidia-imex-ctl -N: the
domain UP, every node READY). A fault here is the environment's: `rebuild_environment`, naming the tray.
"""

from __future__ import annotations

from collections import defaultdict

from ..core.findings import Finding, Status
from ..core.profile import Profile
from ..hardware import nvlink_domain_of
from ..parsers.nccl_tests import detect_fabric
from ..parsers.nvidia_smi import Gpu, parse_xml
from .context import NodeContext, finding, gpu_profile_na, why_missing
from .registry import missing, not_applicable

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def mnnvl_na(check: str, profile: Profile, host: str | None) -> Finding | None:
    """not_applicable unless the profile's hardware is one multi-node NVLink domain (shared with rules/node/)."""
    if not profile.has_gpus:
        return not_applicable(check, host, "profile hardware.accelerator is none")
    domain = nvlink_domain_of(profile)
    if domain != "mnnvl":
        return not_applicable(check, host, f"NVLink domain is {domain!r} (hardware.nvlink_domain / the hardware "
                                           "table's class): no multi-node NVLink fabric to check")
    return None


def _uuid_valid(uuid: str | None) -> bool:
    return bool(uuid) and uuid != _ZERO_UUID


def _gpu_problems(gpu: Gpu) -> tuple[list[str], list[str]]:
    """(faults, unknowns) of one GPU's <fabric> element."""
    faults, unknowns = [], []
    name = f"GPU {gpu.index}"
    for label, value, want in (("state", gpu.fabric_state, "Completed"), ("status", gpu.fabric_status, "Success"),
                               ("bandwidth", gpu.fabric_bandwidth, "Full")):
        if value is None:
            unknowns.append(f"{name}: fabric {label} not reported")
        elif value != want:
            faults.append(f"{name}: fabric {label} {value} (not {want})")
    if gpu.fabric_cluster_uuid is None or gpu.fabric_cluster_uuid == _ZERO_UUID:
        faults.append(f"{name}: ClusterUUID {gpu.fabric_cluster_uuid or 'N/A'} (the fabric never initialised)")
    faults += _health_faults(gpu)
    return faults, unknowns


def _health_faults(gpu: Gpu) -> list[str]:
    """The fabric health summary and its conditions (nvidia-smi -q 'Fabric / Health'): Summary Unhealthy or
    Limited Capacity, a route unhealthy or in recovery, an access-timeout recovery, an incorrect configuration
    (no_partition, insufficient_nvlinks, ...). A field the driver does not report (N/A) is no fault: the
    state, status and bandwidth above already decide whether the health is known."""
    name, faults = f"GPU {gpu.index}", []
    if gpu.fabric_health is not None and gpu.fabric_health != "Healthy":
        faults.append(f"{name}: fabric health Summary {gpu.fabric_health}")
    for label, value in (("Route Unhealthy", gpu.fabric_route_unhealthy),
                         ("Route Recovery in progress", gpu.fabric_route_recovery),
                         ("Access Timeout Recovery", gpu.fabric_access_timeout_recovery)):
        if value is not None and value.lower() == "true":
            faults.append(f"{name}: {label} True")
    config = gpu.fabric_incorrect_configuration
    if config is not None and config.lower() not in ("none", "false"):
        faults.append(f"{name}: Incorrect Configuration {config}")
    return faults


def check_fabric_state(ctx: NodeContext) -> Finding:
    check = "interconnect.fabric_state"
    if (na := gpu_profile_na(check, ctx) or mnnvl_na(check, ctx.profile, ctx.host)) is not None:
        return na
    evidence = ctx.paths("nvidia_smi_xml")
    xml = ctx.parsed("nvidia_smi_xml", parse_xml)
    if xml is None or not xml.gpus:
        return missing(check, ctx.host, why_missing(ctx, "nvidia_smi_xml"), evidence=evidence)
    faults, unknowns = [], []
    for gpu in xml.gpus:
        gpu_faults, gpu_unknowns = _gpu_problems(gpu)
        faults += gpu_faults
        unknowns += gpu_unknowns
    observed = {"gpus": [{"index": g.index, "state": g.fabric_state, "status": g.fabric_status,
                          "bandwidth": g.fabric_bandwidth, "cluster_uuid": g.fabric_cluster_uuid,
                          "clique_id": g.fabric_clique_id, "health": g.fabric_health,
                          "route_unhealthy": g.fabric_route_unhealthy,
                          "incorrect_configuration": g.fabric_incorrect_configuration} for g in xml.gpus]}
    expected = {"state": "Completed", "status": "Success", "bandwidth": "Full", "cluster_uuid": "not all zeros",
                "health": "Summary Healthy (or not reported), no route/timeout fault, Incorrect Configuration None"}
    if faults:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, evidence=evidence,
                       reason=f"tray {ctx.host}: " + "; ".join(faults),
                       action=f"tray {ctx.host} is not in the NVLink fabric: check the tray's NVLink cabling and "
                              "the switch trays' NMX-Controller / Fabric Manager partition for it (nvidia-smi -q "
                              "Fabric section, dmesg Xid), then re-run preflight; adding GPUs fixes nothing")
    if unknowns:
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected,
                       evidence=evidence, reason="; ".join(unknowns),
                       action="a driver whose nvidia-smi -q -x reports the fabric health (R560 on), re-run preflight")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, evidence=evidence,
                   reason=f"{len(xml.gpus)} GPUs Completed/Success/Full in ClusterUUID "
                          f"{xml.gpus[0].fabric_cluster_uuid}")


# --- interconnect.nvlink_domain (cluster) ----------------------------------------------------

def _tray_ids(ctx: NodeContext) -> set[tuple[str | None, str | None]] | None:
    xml = ctx.parsed("nvidia_smi_xml", parse_xml)
    if xml is None or not xml.gpus:
        return None
    return {(g.fabric_cluster_uuid, g.fabric_clique_id) for g in xml.gpus}


def check_nvlink_domain(contexts: list[NodeContext], profile: Profile) -> Finding:
    check = "interconnect.nvlink_domain"
    if (na := mnnvl_na(check, profile, None)) is not None:
        return na
    if not contexts:
        return missing(check, None, "no GPU node to judge (the inventory's gpu_nodes group is empty)")
    evidence = [p for ctx in contexts for p in ctx.paths("nvidia_smi_xml")]
    ids = {ctx.host: _tray_ids(ctx) for ctx in contexts}
    unknown = sorted(h for h, v in ids.items() if v is None)
    if unknown:
        return missing(check, None, "no nvidia-smi -q -x from tray(s) " + ", ".join(unknown), evidence=evidence)
    observed = {h: sorted(f"{u}/{c}" for u, c in v or ()) for h, v in ids.items()}
    split = sorted(h for h, v in ids.items() if v is not None and len(v) > 1)
    invalid = sorted(h for h, v in ids.items() if v and any(not _uuid_valid(u) or c is None for u, c in v))
    groups: dict[tuple[str | None, str | None], list[str]] = defaultdict(list)
    for host, value in ids.items():
        if value and len(value) == 1 and host not in invalid:
            groups[next(iter(value))].append(host)
    ranked = sorted(groups.items(), key=lambda item: -len(item[1]))
    problems = [f"tray {h}: its GPUs report different ClusterUUID/CliqueId {observed[h]}" for h in split]
    problems += [f"tray {h}: ClusterUUID/CliqueId {observed[h]} (no NVLink domain)" for h in invalid if h not in split]
    if len(ranked) > 1:
        tie = len(ranked[0][1]) == len(ranked[1][1])
        outside = ranked if tie else ranked[1:]
        problems += [f"tray {h} is in ClusterUUID {u} / CliqueId {c}" + ("" if tie else
                     f", not the group's {ranked[0][0][0]} / {ranked[0][0][1]} (another rack or partition)")
                     for (u, c), hosts in outside for h in hosts]
    expected = "one ClusterUUID and one CliqueId on every GPU of every tray"
    if problems:
        return finding(check, Status.FAIL, None, observed=observed, expected=expected, evidence=evidence,
                       reason="; ".join(problems),
                       action="put the group's trays in one NVLink domain and partition (same rack, same NVLink "
                              "partition), or take the named tray out of the inventory's group; adding GPUs "
                              "fixes nothing")
    return finding(check, Status.PASS, None, observed=observed, expected=expected, evidence=evidence,
                   reason=f"{len(contexts)} tray(s) in ClusterUUID {ranked[0][0][0]}, CliqueId {ranked[0][0][1]}")


# --- interconnect.fabric_path (node) ---------------------------------------------------------

def _all_reduce_log(ctx: NodeContext) -> tuple[str, list[str]] | None:
    for name in ("nccl_allreduce", "nccl_allreduce_image"):
        record = ctx.rec(name)
        if record.present and not record.missing_tool and (record.stdout.strip() or record.stderr.strip()):
            return record.stdout + "\n" + record.stderr, ctx.paths(name)
    return None


def check_fabric_path(ctx: NodeContext) -> Finding:
    check = "interconnect.fabric_path"
    if (na := gpu_profile_na(check, ctx) or mnnvl_na(check, ctx.profile, ctx.host)) is not None:
        return na
    if not ctx.multinode:
        return not_applicable(check, ctx.host, "one tray: the all-reduce never leaves the node")
    if (backend := str(ctx.profile.model.hardware.collective_backend)) != "nccl":
        return not_applicable(check, ctx.host, f"the profile's collective backend is {backend} (the CPU lab's "
                                               "image): no NCCL transport to read")
    source = _all_reduce_log(ctx)
    if source is None:
        return missing(check, ctx.host, why_missing(ctx, "nccl_allreduce", "nccl_allreduce_image"),
                       evidence=ctx.paths("nccl_allreduce", "nccl_allreduce_image"))
    text, evidence = source
    path = detect_fabric(text)
    observed = {"fabric": path.fabric, "mnnvl": path.mnnvl, "mnnvl_channels": path.mnnvl_channels,
                "net_channels": path.net_channels, "nets": sorted(path.nets), "nvls": path.nvls,
                "mnnvl_env": path.mnnvl_env}
    expected = {"fabric": "mnnvl", "net_channels": 0}
    if path.fabric is None:
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected,
                       evidence=evidence, reason="no NCCL INFO lines (MNNVL, channel set-up) in the all-reduce output",
                       action="run the all-reduce with NCCL_DEBUG=INFO (preflight sets it on MNNVL profiles)")
    if path.fabric != "mnnvl":
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, evidence=evidence,
                       reason=f"tray {ctx.host}: the all-reduce inside the NVLink domain ran over {path.fabric} "
                              f"(MNNVL {path.mnnvl}, {path.net_channels} NET channel(s)"
                              + (f", NCCL_MNNVL_ENABLE={path.mnnvl_env}" if path.mnnvl_env is not None else "") + ")",
                       action="MNNVL was not used: check NCCL_MNNVL_ENABLE in the launch, the IMEX channel "
                              "(/dev/nvidia-caps-imex-channels) in the container and interconnect.imex / "
                              "interconnect.fabric_state, then re-run preflight")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, evidence=evidence,
                   reason=f"{path.mnnvl_channels} channel(s) via P2P/MNNVL, none via NET")
