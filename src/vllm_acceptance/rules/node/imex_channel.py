"""interconnect.imex_channel as one unit (docs/checks.md interconnect.imex_channel; docs/sources.md#imex-channel):
the IMEX channel seen INSIDE the container on multi-node NVLink trays, with the host's own listing to name the fix.

The NVIDIA container toolkit injects an IMEX channel into a container only when asked: `NVIDIA_IMEX_CHANNELS=0`
in the container's environment (NVIDIA/libnvidia-container#242; the toolkit's `ImexChannelRequests`), a volume
mount request, or the channel's device node (`--device /dev/nvidia-caps-imex-channels/channel0`); a site may make
the toolkit ignore the first two (`features.ignore-imex-channel-requests`, NVIDIA/nvidia-container-toolkit#952).
Without a channel, CUDA's fabric memory handles (what NCCL and vLLM share GPU memory across trays with) fail inside
the container on a healthy rack. So the channel is judged where the workload runs: the in-image probe
(roles/preflight/files/probe.py) lists /dev/nvidia-caps-imex-channels inside the container it ran in, started
with the same request the launch makes (serve/launch.py imex_request); the env is never the proof.
"""

from __future__ import annotations

from ...core.findings import Finding, Status
from ..context import NodeContext, finding, gpu_profile_na, why_missing
from ..fabric import mnnvl_na
from ..registry import missing, not_applicable
from . import NodeCommand, register_node_check

CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"

# The host's channels (what the container could be given): `ls` of the directory, one name per line.
COMMANDS = (NodeCommand("imex_channels_host", ("ls", "-1", CHANNEL_DIR), needs=("gpu_checks", "mnnvl")),)

FIX_REQUEST = ("start the container with the IMEX channel requested: docker `-e NVIDIA_IMEX_CHANNELS=0` (the NVIDIA "
               "runtime injects /dev/nvidia-caps-imex-channels/channel0), podman or any runtime `--device "
               "/dev/nvidia-caps-imex-channels/channel0`; Kubernetes: the device plugin's imex.channelIDs [0] or a "
               "ComputeDomain. A site whose /etc/nvidia-container-runtime/config.toml sets "
               "features.ignore-imex-channel-requests drops the env request: pass the device node, or lift that "
               "setting for this workload")
FIX_HOST = ("no IMEX channel exists on the host: create /dev/nvidia-caps-imex-channels/channel0 (NVIDIA's IMEX guide, "
            "'IMEX Channels': mknod with the nvidia-caps-imex-channels major of /proc/devices, minor 0; channels do "
            "not persist through a reboot), with nvidia-imex running (interconnect.imex), then re-run preflight")


def _host_channels(ctx: NodeContext) -> list[str] | None:
    """Channels on the host (`ls -1`); [] when the directory is absent (ls says so), None when unknown."""
    record = ctx.rec("imex_channels_host")
    if not record.present or record.missing_tool:
        return None
    if record.rc == 0:
        return sorted(line.strip() for line in record.stdout.splitlines() if line.strip().startswith("channel"))
    return [] if "No such file" in record.stderr else None


def check_imex_channel(ctx: NodeContext) -> Finding:
    check = "interconnect.imex_channel"
    if (na := gpu_profile_na(check, ctx) or mnnvl_na(check, ctx.profile, ctx.host)) is not None:
        return na
    if not ctx.multinode:
        return not_applicable(check, ctx.host, "one tray: no GPU memory is shared across nodes")
    host = _host_channels(ctx)
    evidence = ctx.paths("image_probe", "imex_channels_host")
    if not ctx.containerised:
        if host is None:
            return missing(check, ctx.host, why_missing(ctx, "imex_channels_host"), evidence=evidence)
        observed = {"runtime": ctx.runtime, "host_channels": host}
        if host:
            return finding(check, Status.PASS, ctx.host, observed=observed, evidence=evidence,
                           reason=f"runtime {ctx.runtime} runs on the host, which has {', '.join(host)}")
        return finding(check, Status.FAIL, ctx.host, observed=observed, evidence=evidence,
                       reason=f"tray {ctx.host}: no IMEX channel in {CHANNEL_DIR} on the host", action=FIX_HOST)
    probe = ctx.probe()
    if probe is None:
        return missing(check, ctx.host, why_missing(ctx, "image_probe"), evidence=evidence)
    if "imex_channels" not in probe.raw:
        return finding(check, Status.INCONCLUSIVE, ctx.host, evidence=evidence,
                       observed={"probe_keys": sorted(probe.raw)[:30], "host_channels": host},
                       reason="the in-image probe did not list the IMEX channels (a probe of an older release, or "
                              + str(probe.raw.get("imex_channels_error") or "it could not read the directory") + ")",
                       action="re-run preflight with this release's roles/preflight (its probe lists "
                              f"{CHANNEL_DIR} inside the container)")
    inside = probe.raw.get("imex_channels") or []
    observed = {"inside_container": inside, "host_channels": host, "runtime": ctx.runtime}
    expected = {"inside_container": ">= 1 channel (channel0)"}
    if inside:
        return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, evidence=evidence,
                       reason=f"{', '.join(inside)} visible inside the container")
    if host == []:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, evidence=evidence,
                       reason=f"tray {ctx.host}: no IMEX channel inside the container, and none on the host",
                       action=FIX_HOST)
    on_host = f"the host has {', '.join(host)}" if host else "the host's channels are unknown"
    return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, evidence=evidence,
                   reason=f"tray {ctx.host}: no IMEX channel inside the container ({on_host}): multi-node NVLink "
                          "memory sharing fails there", action=FIX_REQUEST)


CHECK = register_node_check("interconnect.imex_channel", COMMANDS, node_rule=check_imex_channel)
