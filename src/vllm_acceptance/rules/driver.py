"""The host driver chain: branch and version in every source, the kernel module, Fabric Manager and peer
memory (docs/checks.md, compat.driver_*, compat.fabric_manager, compat.peermem)."""

from __future__ import annotations

from ..core.findings import Finding, Status
from ..hardware import fabric_manager_of
from ..parsers.base import version_at_least
from ..parsers.causal import causal_line
from ..parsers.driver import branch_of, parse_fabricmanager_version, parse_proc_version
from ..parsers.nvidia_smi import SmiFailure, parse_query_csv, parse_smi_failure, parse_table, parse_xml
from .context import ROUTE_DRIVER, ROUTE_ISOLATED, ROUTE_SELF_BUILT, NodeContext, finding, gpu_profile_na, why_missing
from .registry import missing, not_applicable

# --- compat.driver_branch -------------------------------------------------------------------

def _driver_sources(ctx: NodeContext) -> dict[str, str]:
    sources: dict[str, str] = {}
    proc = ctx.parsed("driver_version", parse_proc_version)
    if proc is not None and proc.version:
        sources["/proc/driver/nvidia/version"] = proc.version
    xml = ctx.parsed("nvidia_smi_xml", parse_xml)
    if xml is not None and xml.driver_version:
        sources["nvidia-smi -q -x"] = xml.driver_version
    query = ctx.parsed("nvidia_smi_query", parse_query_csv)
    if query is not None and query.driver_version:
        sources["nvidia-smi --query-gpu"] = query.driver_version
    probe = ctx.probe()
    if probe is not None and probe.driver_proc:
        in_image = parse_proc_version(probe.driver_proc).version
        if in_image:
            sources["inside the container"] = in_image
    return sources


def host_driver_version(ctx: NodeContext) -> str | None:
    sources = _driver_sources(ctx)
    return sources.get("/proc/driver/nvidia/version") or next(iter(sources.values()), None)


def smi_failure(ctx: NodeContext) -> SmiFailure | None:
    """nvidia-smi answered with a driver failure (e.g. "Driver/library version mismatch"): the node is
    broken, which is a finding of its own, not a source to skip."""
    for name in ("nvidia_smi", "nvidia_smi_query", "nvidia_smi_xml"):
        record = ctx.rec(name)
        if record.present and not record.ok and (failure := parse_smi_failure(record.stdout + "\n" + record.stderr)):
            return failure
    return None


SMI_FAILURE_ACTIONS = {
    "driver_library_mismatch": "reboot the node (or unload and reload the nvidia kernel modules) so that the kernel "
                               "module and the user-space libraries are the same version, then re-run preflight",
    "no_driver": "load the NVIDIA kernel module (modprobe nvidia; dmesg says why it fails) or install the driver for "
                 f"this kernel ({ROUTE_DRIVER}), then re-run preflight",
    "nvml_init_failed": "read dmesg and nvidia-bug-report for the GPU or driver fault (a GPU fallen off the bus needs "
                        "a reset or a reboot), then re-run preflight",
}


def check_driver_branch(ctx: NodeContext) -> Finding:
    check = "compat.driver_branch"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    min_branch, min_version = ctx.profile.model.driver.min_branch, ctx.profile.model.driver.min_version
    if min_branch is None and min_version is None:
        return not_applicable(check, ctx.host, "profile sets no driver minimum")
    names = ("driver_version", "nvidia_smi_xml", "nvidia_smi_query")
    sources = _driver_sources(ctx)
    evidence = ctx.paths(*names, "nvidia_smi", "image_probe")
    if (failure := smi_failure(ctx)) is not None:
        return finding(check, Status.FAIL, ctx.host, observed={"nvidia_smi": failure.line, "failure": failure.kind,
                                                                 "nvml_library_version": failure.nvml_library_version,
                                                                 "sources": sources},
                       expected={"min_branch": min_branch, "min_version": min_version},
                       rule="nvidia-smi answers from the loaded driver", evidence=evidence,
                       reason=f"nvidia-smi: {failure.line} ({failure.why})",
                       action=SMI_FAILURE_ACTIONS.get(failure.kind, SMI_FAILURE_ACTIONS["nvml_init_failed"]))
    if not sources:
        return missing(check, ctx.host, why_missing(ctx, *names), evidence=evidence)
    silent = [n for n in ("nvidia_smi_xml", "nvidia_smi_query") if ctx.rec(n).present and not ctx.rec(n).ok]
    if len(silent) == 2:
        return missing(check, ctx.host, "NVML (nvidia-smi) did not answer, so the driver seen by the host's "
                       "libraries is unknown: " + why_missing(ctx, *silent), evidence=evidence)
    version = host_driver_version(ctx)
    branch = branch_of(version)
    smi = ctx.parsed("nvidia_smi_xml", parse_xml) or ctx.parsed("nvidia_smi", parse_table)
    observed = {"version": version, "branch": branch, "sources": sources,
                "driver_supports_cuda": smi.cuda_version if smi else None}
    expected = {"min_branch": min_branch, "min_version": min_version}
    rule = f"driver branch >= {min_branch} and version >= {min_version} on every source (host and container)"
    probe_stderr = ctx.rec("image_probe").stderr
    if "unsatisfied condition: cuda" in probe_stderr:
        observed["container_runtime_refused"] = causal_line(probe_stderr)
    action = (f"{ROUTE_DRIVER} to R{min_branch} >= {min_version}; where the shared cluster cannot change: "
              f"{ROUTE_ISOLATED}; where no upgrade is possible: {ROUTE_SELF_BUILT}. No launch flag "
              "(--max-model-len, batch sizes, cache settings) turns one CUDA major into another.")
    if len(set(sources.values())) > 1:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="driver versions differ between sources "
                        "(kernel module vs user-space library, or the container sees another driver)",
                        action="reboot or reload the nvidia kernel module so that module and libraries "
                               "match, then re-run preflight")
    too_low_branch = min_branch is not None and (branch is None or branch < int(min_branch))
    too_low_version = min_version is not None and version_at_least(version, str(min_version)) is not True
    if too_low_branch or too_low_version:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, action=action,
                        reason=f"driver {version} (R{branch}) is below R{min_branch} / {min_version}")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
                    evidence=evidence, action="none")


# --- compat.driver_module -------------------------------------------------------------------

def check_driver_module(ctx: NodeContext) -> Finding:
    check = "compat.driver_module"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    lsmod = ctx.lsmod()
    evidence = ctx.paths("lsmod")
    if lsmod is None or not lsmod.modules:
        return missing(check, ctx.host, why_missing(ctx, "lsmod"), evidence=evidence)
    observed = {"nvidia_modules": lsmod.nvidia_modules()}
    rule = "kernel module `nvidia` loaded"
    if not lsmod.loaded("nvidia"):
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=["nvidia"], rule=rule,
                        evidence=evidence, reason="nvidia kernel module not loaded",
                        action=f"install/load the NVIDIA driver (modprobe nvidia; check dmesg); {ROUTE_DRIVER}")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=["nvidia"], rule=rule,
                    evidence=evidence, action="none")


# --- compat.fabric_manager ------------------------------------------------------------------

def check_fabric_manager(ctx: NodeContext) -> Finding:
    check = "compat.fabric_manager"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    place = fabric_manager_of(ctx.profile)
    if place == "switch_tray":
        # NVL72 trays: the switch trays' NMX-Controller runs the fabric; the GPUs' fabric state is the
        # proof (interconnect.fabric_state; docs/checks.md, docs/sources.md#nvlink-domain).
        return not_applicable(check, ctx.host, "Fabric Manager runs on the NVLink switch trays (hardware."
                                               "fabric_manager switch_tray): the GPUs' fabric state is judged by "
                                               "interconnect.fabric_state")
    if place != "node":
        return not_applicable(check, ctx.host, "profile hardware.nvswitch is false (no Fabric Manager on the node)")
    active, version_rec = ctx.rec("fabricmanager_active"), ctx.rec("fabricmanager_version")
    evidence = ctx.paths("fabricmanager_active", "fabricmanager_version", "driver_version", "nvidia_smi_xml")
    # `systemctl is-active` exits 3 for inactive: its stdout is the evidence, not its rc.
    if not active.present or active.missing_tool or not active.stdout.strip():
        return missing(check, ctx.host, why_missing(ctx, "fabricmanager_active"), evidence=evidence)
    state = active.stdout.strip().splitlines()[0]
    fm_version = parse_fabricmanager_version(version_rec.stdout).version if version_rec.ok else None
    driver = host_driver_version(ctx)
    xml = ctx.parsed("nvidia_smi_xml", parse_xml)
    if state == "active" and (xml is None or not xml.gpus):
        # The service runs, but whether the GPUs joined the fabric is read from nvidia-smi -q -x only.
        return missing(check, ctx.host, "Fabric Manager is active, but the GPUs' fabric state is unknown: "
                       + why_missing(ctx, "nvidia_smi_xml"), evidence=evidence)
    fabric = sorted({f"{g.fabric_state}/{g.fabric_status}" for g in (xml.gpus if xml else []) if g.fabric_state})
    observed = {"service": state, "fm_version": fm_version, "driver_version": driver, "gpu_fabric": fabric}
    rule = "nvidia-fabricmanager active, its version == the driver version, GPU fabric state Completed/Success"
    expected = {"service": "active", "fm_version": driver}
    problems = []
    if state != "active":
        problems.append(f"nvidia-fabricmanager is {state}")
    if fabric and any(not f.startswith("Completed/Success") for f in fabric):
        problems.append(f"GPU fabric state {fabric}")
    if fm_version is not None and driver is not None and fm_version != driver:
        problems.append(f"Fabric Manager {fm_version} != driver {driver}")
    if problems:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="; ".join(problems),
                        action="install nvidia-fabricmanager of exactly the driver's version and "
                               "`systemctl enable --now nvidia-fabricmanager` (journalctl -u nvidia-fabricmanager "
                               f"for the cause); with a driver change: {ROUTE_DRIVER}")
    if fm_version is None or driver is None:
        return missing(check, ctx.host, "Fabric Manager or driver version unreadable: "
                       + why_missing(ctx, "fabricmanager_version", "driver_version"), evidence=evidence)
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
                    evidence=evidence, action="none")
