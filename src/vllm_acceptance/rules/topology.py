"""GPUs against the launched layout: per-node visibility and the cluster total (docs/checks.md,
compat.gpu_visibility, compat.topology)."""

from __future__ import annotations

import math

from ..core.findings import Consequence, Finding, Status
from ..core.profile import Profile
from ..hardware import nvlink_domain_of, profile_class
from .context import NodeContext, finding, gpu_profile_na, why_missing
from .launched import LaunchedPlan, launched_plan
from .registry import missing, not_applicable

# --- compat.gpu_visibility / compat.topology ------------------------------------------------

def world_size(profile: Profile, plan: LaunchedPlan | None = None) -> int:
    """GPUs of the launched layout (tensor x pipeline x data): the plan's, else the profile's."""
    return (plan or launched_plan(profile)).world


def gpus_required_per_node(profile: Profile, n_hosts: int, plan: LaunchedPlan | None = None) -> int:
    """Every node of the layout must show its share. With `hardware.class`: the hardware table's GPUs
    per node (a GB300 tray has 4: TP8 is two trays, compat.topology counts them). Without: the profile's
    per-node count, or the tensor x pipeline x data world spread over the nodes, whichever is larger."""
    row = profile_class(profile)
    if row is not None:
        return row.gpus_per_node
    per_node = int(profile.model.hardware.gpus_per_node or 0)
    return max(per_node, math.ceil(world_size(profile, plan) / max(n_hosts, 1)))


def gpu_class_of(profile: Profile) -> str | None:
    """The name nvidia-smi must show: the profile's gpu_class, else the hardware table's."""
    row = profile_class(profile)
    return profile.model.hardware.gpu_class or (row.gpu_name if row is not None else None)


_ARCHES = {"aarch64": "aarch64", "arm64": "aarch64", "x86_64": "x86_64", "ppc64le": "ppc64le", "s390x": "s390x"}


def _arch_problem(ctx: NodeContext, observed: dict[str, object]) -> str | None:
    """The node's CPU architecture (uname -a) against the hardware table's class: a GB300 tray is aarch64,
    an HGX B300 x86_64 (their GPU names overlap: 'B300' is in 'NVIDIA GB300'). None without a class or uname."""
    row = profile_class(ctx.profile)
    uname = ctx.rec("uname_a")
    if row is None or not uname.ok:
        return None
    arch = next((_ARCHES[t] for t in reversed(uname.stdout.split()) if t in _ARCHES), None)
    observed["cpu_arch"] = arch
    if arch is not None and arch != row.cpu_arch:
        return f"CPU architecture {arch}: hardware class {row.key} ({row.platform}) is {row.cpu_arch}"
    return None


def check_gpu_visibility(ctx: NodeContext) -> Finding:
    check = "compat.gpu_visibility"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    required = gpus_required_per_node(ctx.profile, ctx.n_hosts, ctx.plan)
    gpu_class = gpu_class_of(ctx.profile)
    host_gpus, probe = ctx.gpus(), ctx.probe()
    evidence = ctx.paths("nvidia_smi_query", "nvidia_smi_xml", "image_probe")
    if host_gpus is None or not host_gpus.gpus:
        return missing(check, ctx.host, why_missing(ctx, "nvidia_smi_query", "nvidia_smi_xml"), evidence=evidence)
    observed = {"host_count": host_gpus.count, "names": sorted(set(host_gpus.names)),
                "runtime_count": probe.device_count if probe else None,
                "runtime_names": sorted(set(probe.devices)) if probe else None}
    expected = {"per_node": required, "gpu_class": gpu_class,
                "layout": (ctx.plan or launched_plan(ctx.profile)).layout()}
    rule = f"host and runtime each see >= {required} GPUs whose name contains {gpu_class!r}"
    problems = []
    if host_gpus.count < required:
        problems.append(f"host sees {host_gpus.count} GPUs, the layout needs {required}")
    if gpu_class and any(gpu_class.lower() not in n.lower() for n in host_gpus.names):
        problems.append(f"GPU model {sorted(set(host_gpus.names))} is not {gpu_class}")
    if probe is not None and probe.device_count is not None and probe.device_count < required:
        problems.append(f"the runtime (container) sees {probe.device_count} GPUs, the layout needs {required}")
    if (arch := _arch_problem(ctx, observed)) is not None:
        problems.append(arch)
    action = ("restore the missing GPUs (nvidia-smi -q: Xid errors, fallen off the bus, MIG, "
              "NVIDIA_VISIBLE_DEVICES/--gpus) or change the parallel layout in a new profile; "
              "adding GPUs elsewhere does not fix a node that hides one")
    if problems:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="; ".join(problems), action=action)
    if probe is None or probe.device_count is None:
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, action="fix the in-image probe, re-run preflight",
                        reason="host GPUs fine, but what the runtime sees is unknown: "
                               + (why_missing(ctx, "image_probe") if probe is None else "no device_count"))
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
                    evidence=evidence, action="none")


def check_topology(contexts: list[NodeContext], profile: Profile, plan: LaunchedPlan | None = None) -> Finding:
    """Cluster level: node count, total GPUs against the layout, interconnect type recorded."""
    check = "compat.topology"
    if not profile.has_gpus:
        return not_applicable(check, None, "profile hardware.accelerator is none")
    counts: dict[str, int | None] = {}
    for ctx in contexts:
        gpus = ctx.gpus()
        counts[ctx.host] = gpus.count if gpus is not None and gpus.gpus else None
    observed = {"nodes": len(contexts), "gpus_per_node": counts,
                "interconnect": profile.model.hardware.interconnect,
                "nvswitch": profile.model.hardware.nvswitch}
    needed = max(int(profile.model.hardware.min_gpus or 0), world_size(profile, plan))
    expected = {"min_nodes": profile.model.hardware.min_nodes, "min_gpus": needed,
                "layout": (plan or launched_plan(profile)).layout()}
    evidence = [p for ctx in contexts for p in ctx.paths("nvidia_smi_query")]
    rule = "nodes >= hardware.min_nodes and total GPUs >= max(hardware.min_gpus, tensor x pipeline x data)"
    unknown = [h for h, c in counts.items() if c is None]
    if unknown:
        return missing(check, None, f"no GPU list from {unknown}", evidence=evidence)
    total = sum(c or 0 for c in counts.values())
    observed["total_gpus"] = total
    if (shape := _shape_problems(profile, plan, len(contexts), observed, expected)):
        return Finding(check=check, status=Status.FAIL, host=None, observed=observed, expected=expected,
                       rule=rule + "; with hardware.class: the node shape of the hardware table", evidence=evidence,
                       consequence=Consequence.REBUILD, reason="; ".join(shape),
                       action="run the layout on the node count and NVLink domain the hardware table gives "
                              "(src/vllm_acceptance/data/hardware.yml), or use a profile whose layout fits them")
    if len(contexts) < int(expected["min_nodes"] or 1) or total < needed:
        return Finding(check=check, status=Status.FAIL, host=None, observed=observed, expected=expected,
                       rule=rule, evidence=evidence, consequence=Consequence.REBUILD,
                       reason=f"{len(contexts)} nodes / {total} GPUs for a layout needing "
                              f"{expected['min_nodes']} / {needed}",
                       action="add the nodes the profile's layout needs to the inventory, or use a profile "
                              "whose parallel layout fits this cluster")
    return Finding(check=check, status=Status.PASS, host=None, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


def _shape_problems(profile: Profile, plan: LaunchedPlan | None, n_nodes: int, observed: dict[str, object],
                    expected: dict[str, object]) -> list[str]:
    """The launched layout against the hardware table's node shape (docs/checks.md, compat.topology):
    nodes >= world / GPUs per node; a tensor-parallel group wider than a node needs a multi-node NVLink
    domain wide enough to hold it. No class: no shape to judge (today's rules only)."""
    row = profile_class(profile)
    if row is None:
        return []
    plan = plan or launched_plan(profile)
    domain = nvlink_domain_of(profile)
    tensor = plan.tensor
    nodes_needed = math.ceil(world_size(profile, plan) / row.gpus_per_node)
    observed.update({"class": row.key, "nvlink_domain": domain, "tp_spans_nodes": tensor > row.gpus_per_node})
    expected.update({"nodes_for_layout": nodes_needed, "gpus_per_node": row.gpus_per_node,
                     "gpus_per_nvlink_domain": row.gpus_per_nvlink_domain})
    problems = []
    if n_nodes < nodes_needed:
        problems.append(f"{n_nodes} node(s) of {row.gpus_per_node} {row.gpu_name} GPUs for a layout of "
                        f"{world_size(profile, plan)} GPUs: {nodes_needed} needed")
    if tensor > row.gpus_per_node and domain == "mnnvl" and tensor > row.gpus_per_nvlink_domain:
        problems.append(f"tensor parallel {tensor} is wider than the NVLink domain of {row.gpus_per_nvlink_domain}")
    return problems
