"""Multi-node interconnect: RDMA ports, the launch's communication settings, NCCL bandwidth
(docs/checks.md, interconnect.*)."""

from __future__ import annotations

from ..core.findings import Consequence, Finding, Status
from ..core.profile import Profile
from ..hardware import FabricThreshold, load_size_curves, nvlink_domain_of, profile_class
from ..parsers.env import comm_env
from ..parsers.live import environment_unread, hidden_server, live_launch
from ..parsers.nccl_tests import NcclPerf, detect_fabric, parse_all_reduce_perf, parse_torch_allreduce
from ..parsers.rdma import parse_ibv_devinfo, parse_rdma_link
from ..parsers.startup_log import StartupScan
from .context import NodeContext, finding, gpu_profile_na, why_missing
from .fabric import _all_reduce_log
from .launched import LaunchedPlan, launched_plan
from .live_server import MAKE_VISIBLE
from .registry import missing, not_applicable


def check_rdma(ctx: NodeContext) -> Finding:
    check = "interconnect.rdma"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    if not ctx.multinode:
        return not_applicable(check, ctx.host, "single node: no inter-node transport")
    # The launch's interconnect (the inventory's vllm_interconnect over the profile's hardware.interconnect,
    # rules/launched.py): what the serve stage starts is what needs the RDMA ports.
    plan = ctx.plan or launched_plan(ctx.profile)
    interconnect = plan.interconnect
    if interconnect != "rdma":
        return not_applicable(check, ctx.host, f"the launch's interconnect is {interconnect!r} ({plan.source}), "
                                               "not rdma")
    evidence = ctx.paths("ibv_devinfo", "rdma_link")
    ibv = ctx.parsed("ibv_devinfo", parse_ibv_devinfo)
    link = ctx.parsed("rdma_link", parse_rdma_link)
    sources = [s for s in (ibv, link) if s is not None and s.ports]
    if not sources:
        if ibv is not None or link is not None:
            return finding(check, Status.FAIL, ctx.host, observed={"devices": []}, expected=">= 1 active port",
                            rule="at least one RDMA port ACTIVE", evidence=evidence,
                            reason="no RDMA devices", action="install/enable the RDMA NICs and OFED/rdma-core")
        return missing(check, ctx.host, why_missing(ctx, "ibv_devinfo", "rdma_link"), evidence=evidence)
    ports = sources[0].ports
    active = [f"{p.device}/{p.port}" for p in ports if p.active]
    observed = {"devices": sources[0].devices, "active_ports": active,
                "link_layers": sorted({p.link_layer for p in ports if p.link_layer}),
                "interconnect": f"{interconnect} ({plan.source})"}
    if not active:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=">= 1 active port",
                        rule="at least one RDMA port ACTIVE", evidence=evidence, reason="no RDMA port is ACTIVE",
                        action="bring the RDMA links up (cabling, subnet manager, ibstat)")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=">= 1 active port",
                    rule="at least one RDMA port ACTIVE", evidence=evidence, action="none")


# --- compat.peermem: GPUDirect RDMA's peer-memory module, on the path that needs it ----------------

def check_peermem(ctx: NodeContext) -> Finding:
    """nvidia_peermem carries GPUDirect RDMA only on the recipe's DMA-BUF fallback: NCCL registers GPU memory
    with the NIC through DMA-BUF by default and falls back to the peer-memory module with NCCL_DMABUF_ENABLE=0
    (recipes/vllm-project/Kimi-K3.yaml, the guide's mlx5 dmabuf note; docs/sources.md#a001). It is required
    where the launch crosses nodes over RDMA with that fallback set; over the multi-node NVLink fabric (MNNVL
    trays, interconnect nvl/nvlink) the TP group never crosses RDMA."""
    check = "compat.peermem"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    if not ctx.multinode:
        return not_applicable(check, ctx.host, "single node: no GPUDirect RDMA between nodes")
    plan = ctx.plan or launched_plan(ctx.profile)
    lsmod = ctx.lsmod()
    loaded = [m for m in ("nvidia_peermem", "nv_peer_mem") if lsmod is not None and lsmod.loaded(m)]
    if plan.interconnect != "rdma":
        return not_applicable(check, ctx.host, f"the launch's interconnect is {plan.interconnect!r} ({plan.source}): "
                                               "the collectives do not cross RDMA, no peer-memory module is used "
                                               f"(loaded: {', '.join(loaded) or 'none'})")
    args, env, source, launch_evidence = launch_settings(ctx)
    workaround = {str(k): str(v) for k, v in ctx.profile.model.launch.multinode.dmabuf_workaround_env.items()}
    fallback = bool(workaround) and all(env.get(k) == v for k, v in workaround.items())
    if not fallback:
        return not_applicable(check, ctx.host, f"GPUDirect RDMA through DMA-BUF: the launch ({source}) does not set "
                                               f"the recipe's fallback {workaround or {'NCCL_DMABUF_ENABLE': '0'}}, "
                                               "the only path that needs nvidia_peermem (loaded: "
                                               f"{', '.join(loaded) or 'none'})")
    evidence = ctx.paths("lsmod") + launch_evidence
    if lsmod is None or not lsmod.modules:
        return missing(check, ctx.host, why_missing(ctx, "lsmod"), evidence=evidence)
    observed = {"peer_memory_modules": loaded, "nvidia_modules": lsmod.nvidia_modules(),
                "interconnect": plan.interconnect, "dmabuf_fallback": workaround, "launch": source}
    rule = ("nvidia_peermem (or the older nv_peer_mem) loaded where the launch crosses nodes over RDMA with the "
            "recipe's DMA-BUF fallback (NCCL_DMABUF_ENABLE=0)")
    if not loaded:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=["nvidia_peermem"], rule=rule,
                       evidence=evidence, reason=f"the launch sets {workaround} (GPUDirect RDMA through the "
                                                 "peer-memory module), and no peer-memory module is loaded",
                       action="modprobe nvidia_peermem (and persist it in /etc/modules-load.d)")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=["nvidia_peermem"], rule=rule,
                   evidence=evidence, action="none")


# --- interconnect.nccl_env ------------------------------------------------------------------

def _args_to_map(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg.partition("=")
        if not sep and index + 1 < len(args) and not args[index + 1].startswith("--"):
            value = args[index + 1]
        out[name.replace("_", "-")] = value
    return out


def expected_comm_settings(profile: Profile, interconnect: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The recipe's multi-node args and env for the launched interconnect (else the profile's)."""
    multinode = profile.model.at("launch.multinode") or {}
    interconnect = interconnect or profile.model.hardware.interconnect
    args: list[str] = []
    env: dict[str, str] = {}
    if interconnect == "rdma":
        args += (multinode.get("rdma") or {}).get("args", [])
        env.update((multinode.get("rdma") or {}).get("env", {}))
    if interconnect in ("nvlink", "nvl"):
        args += (multinode.get("nvlink") or {}).get("args", [])
        env.update((multinode.get("nvlink") or {}).get("env", {}))
    if interconnect == "nvl":
        env.update(multinode.get("nvl_env", {}) or {})
    return args, env


def check_nccl_env(env: dict[str, str], args: list[str], profile: Profile, host: str | None,
                   evidence: list[str], multinode: bool, scan: StartupScan | None = None,
                   interconnect: str | None = None) -> Finding:
    """The planned (or actual) launch env/args carry the recipe's multi-node settings;
    NCCL_DMABUF_ENABLE=0 only when the startup log shows the mlx5dv_reg_dmabuf_mr error."""
    check = "interconnect.nccl_env"
    if not profile.has_gpus:
        return not_applicable(check, host, "profile hardware.accelerator is none")
    if not multinode:
        return not_applicable(check, host, "single node: the recipe's multi-node NCCL/UCX settings do not apply")
    want_args, want_env = expected_comm_settings(profile, interconnect)
    have_args = _args_to_map(args)
    workaround = profile.model.launch.multinode.dmabuf_workaround_env
    observed = {"env": comm_env(env), "all2all": have_args.get("--all2all-backend"),
                "dmabuf_error_in_log": bool(scan and scan.dmabuf_errors) if scan is not None else None}
    expected = {"args": want_args, "env": want_env}
    rule = ("recipe multi-node args/env present for the interconnect; NCCL_DMABUF_ENABLE=0 only when the log "
            "shows mlx5dv_reg_dmabuf_mr")
    problems = []
    for arg in want_args:
        name, _, value = arg.partition("=")
        if have_args.get(name.replace("_", "-")) != value:
            problems.append(f"{name}={have_args.get(name)!r}, recipe {value!r}")
    for name, value in want_env.items():
        if env.get(name) != value:
            problems.append(f"{name}={env.get(name)!r}, recipe {value!r}")
    workaround_set = all(env.get(k) == v for k, v in workaround.items())
    if scan is not None and scan.dmabuf_errors and not workaround_set:
        problems.append("log shows mlx5dv_reg_dmabuf_mr" + (f" errno {scan.dmabuf_errno}" if scan.dmabuf_errno
                                                            else "") + f": set {workaround} (falls back to "
                        "nvidia_peermem)")
    if problems:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, reason="; ".join(problems), consequence=Consequence.REBUILD,
                       action="set the recipe's multi-node launch settings in the inventory/profile "
                              "(one change at a time), then re-run acceptance")
    if workaround_set and not (scan is not None and scan.dmabuf_errors):
        return Finding(check=check, status=Status.WARN, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, consequence=Consequence.LIMIT,
                       reason=f"{workaround} set without the mlx5dv_reg_dmabuf_mr error in the startup log",
                       action="remove the workaround unless the log proves the error")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


def planned_launch(profile: Profile, multinode: bool,
                   plan: LaunchedPlan | None = None) -> tuple[list[str], dict[str, str]]:
    """What the serve stage launches (serve/launch.py): the profile's args and env, the recipe's
    multi-node settings for the launched interconnect, the inventory's extra environment and the
    DMA-BUF workaround when the inventory asks for it."""
    plan = plan or launched_plan(profile)
    args = [str(a) for a in profile.model.launch.args]
    env = {k: str(v) for k, v in profile.model.launch.env.items()}
    if multinode:
        extra_args, extra_env = expected_comm_settings(profile, plan.interconnect)
        args += [a for a in extra_args if a not in args]
        env.update(extra_env)
        if plan.dmabuf_workaround:
            env.update({str(k): str(v) for k, v in profile.model.launch.multinode.dmabuf_workaround_env.items()})
        env.update(plan.env)
    return args, env


def launch_settings(ctx: NodeContext) -> tuple[list[str], dict[str, str], str, list[str]]:
    """The launch's args and environment on this node, where they were read from, and the evidence: the running
    server's (attach: the live process), else the launch the role was told about (inventory overrides), else the
    planned one."""
    inputs = ctx.evidence.inputs
    default_args, default_env = planned_launch(ctx.profile, ctx.multinode, ctx.plan)
    env = {k: str(v) for k, v in (inputs.get("launch_env") or default_env).items()}
    args = [str(a) for a in (inputs.get("launch_args") or default_args)]
    evidence, source = ctx.paths("inputs", "env"), "the planned launch (no running server read on this node)"
    live = ctx.evidence.get("live_process")
    running = live_launch(live.stdout) if live.present else None
    if running is not None:   # what runs decides, not what was planned
        args, env, source = running
        evidence = ctx.paths("live_process")
    return args, env, source, evidence


def _live_unseen(ctx: NodeContext) -> Finding | None:
    """Attach: the server listens on this node but its process, or its environment, is not visible to this user
    (another user's: ss shows no pid, /proc/PID/environ is its owner's): what runs is unread, and the plan is never
    judged in its place (issue 42 item 3). None where it was read, or no server listens here."""
    if not (ctx.profile.has_gpus and ctx.multinode):
        return None
    live = ctx.evidence.get("live_process")
    if not live.present:
        return None
    hidden = hidden_server(live.stdout)
    why = f"the server listening here is not visible to this user ({hidden})" if hidden else None
    unread = environment_unread(live.stdout)
    if unread:
        why = f"the running server's environment is not readable ({unread})"
    if why is None:
        return None
    return Finding(check="interconnect.nccl_env", status=Status.INCONCLUSIVE, host=ctx.host,
                   observed={"source": "the running server (unread)"}, expected=dict(zip(
                       ("args", "env"), expected_comm_settings(ctx.profile, (ctx.plan or launched_plan(
                           ctx.profile)).interconnect), strict=True)),
                   rule="recipe multi-node args/env present on the running server", evidence=ctx.paths("live_process"),
                   consequence=Consequence.REBUILD,
                   reason=f"{why}: its NCCL/UCX settings are unknown, and the planned launch is not what runs",
                   action=MAKE_VISIBLE)


def check_nccl_env_node(ctx: NodeContext) -> Finding:
    """Judged on the launch the role was told about (inventory overrides), else the planned one."""
    if not ctx.evidence.dir_exists and ctx.profile.has_gpus and ctx.multinode:
        return missing("interconnect.nccl_env", ctx.host, why_missing(ctx))
    unseen = _live_unseen(ctx)
    if unseen is not None:
        return unseen
    args, env, source, evidence = launch_settings(ctx)
    finding = check_nccl_env(env, args, ctx.profile, ctx.host, evidence, ctx.multinode, ctx.startup_scan,
                             interconnect=(ctx.plan or launched_plan(ctx.profile)).interconnect)
    if finding.observed is not None:
        finding.observed["source"] = source
    return finding


# --- interconnect.nccl_bandwidth ------------------------------------------------------------

def _bandwidth_source(ctx: NodeContext) -> tuple[NcclPerf, list[str], object] | None:
    """nccl-tests where it ran; else the in-image all-reduce (run where all_reduce_perf is absent, or
    chosen with preflight_nccl_test_method: image); None when neither ran."""
    record = ctx.rec("nccl_allreduce")
    if record.ok:
        return parse_all_reduce_perf(record.stdout), ctx.paths("nccl_allreduce"), record.cmd
    image = ctx.rec("nccl_allreduce_image")
    if image.present and not image.missing_tool and image.stdout.strip():
        perf = parse_torch_allreduce(image.stdout)
        if image.rc != 0 and perf.ok:
            perf.errors.append(image.why_not())
        return perf, ctx.paths("nccl_allreduce", "nccl_allreduce_image"), image.cmd
    return None


def check_nccl_bandwidth(ctx: NodeContext) -> Finding:
    check = "interconnect.nccl_bandwidth"
    if (na := gpu_profile_na(check, ctx)) is not None:
        return na
    threshold = ctx.profile.model.thresholds.nccl_busbw_gbps
    source = _bandwidth_source(ctx)
    if source is None:
        evidence = ctx.paths("nccl_allreduce", "nccl_allreduce_image")
        if ctx.multinode:
            return missing(check, ctx.host, why_missing(ctx, "nccl_allreduce", "nccl_allreduce_image"),
                           Consequence.EXPAND, evidence)
        return not_applicable(check, ctx.host, "single node and no all-reduce output: the inter-node "
                                               "bandwidth test is required for multi-node layouts only")
    perf, evidence, cmd = source
    backend = str(ctx.profile.model.hardware.collective_backend)
    fabric, table = _fabric_threshold(ctx)
    if table is not None and table.fail is not None:
        return _judge_against_table(ctx, perf, evidence, cmd, fabric, table)
    observed = {"tool": perf.tool, "backend": perf.backend, "max_busbw_gbps": perf.max_busbw,
                "avg_busbw_gbps": perf.avg_busbw, "ranks": perf.ranks, "hosts": perf.hosts,
                "wrong": perf.wrong_results, "cmd": cmd, "fabric": fabric}
    rule = f"all-reduce bus bandwidth over {backend} >= {threshold} GB/s, no wrong results" + \
        (", ranks spanning >= 2 nodes" if ctx.multinode else "")
    if not perf.ok or perf.max_busbw is None:
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND, reason="; ".join(perf.errors),
                        action=f"check the {perf.tool} output")
    if perf.wrong_results or perf.out_of_bounds:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.REBUILD,
                        reason=f"{perf.tool} reported wrong results (data corruption on the path)",
                        action="inspect NVLink/NIC health (nvidia-smi nvlink -e, ibstat) before any load test")
    if perf.tool != "nccl-tests" and perf.backend != backend:   # nccl-tests is NCCL by construction
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND,
                        reason=f"the all-reduce ran over {perf.backend}, not {backend}: the image's torch saw no "
                               "CUDA device, so the GPU interconnect is unmeasured",
                        action="see compat.container_cuda and compat.gpu_visibility, then re-run preflight")
    if threshold is None:
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=None, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND,
                        reason="profile sets no thresholds.nccl_busbw_gbps", action="set the threshold")
    if ctx.multinode and len(perf.hosts) < 2:
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND,
                        reason="the test ran on one node only; the inter-node path is unmeasured",
                        action="set preflight_nccl_test_method: image (the image's all-reduce across the nodes), "
                               "or preflight_nccl_test_argv to an mpirun/srun line spanning the nodes")
    if perf.max_busbw < float(threshold):
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND,
                        reason=f"bus bandwidth {perf.max_busbw} GB/s < {threshold} GB/s ({perf.tool}, "
                               f"{perf.backend}, {len(perf.hosts)} node(s))",
                        action="check the interconnect (NVLink/NVSwitch, NIC rails, NCCL topology); change the "
                               "topology or the interconnect rather than adding GPUs")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=threshold, rule=rule,
                    evidence=evidence, consequence=Consequence.EXPAND, action="none",
                    reason=f"{perf.max_busbw} GB/s over {perf.backend} ({perf.tool}, {perf.ranks} ranks on "
                           f"{len(perf.hosts)} node(s))")


# --- the hardware table's thresholds for the fabric crossed (docs/sources.md#hardware-table) -----

def _fabric_threshold(ctx: NodeContext) -> tuple[str | None, FabricThreshold | None]:
    """The fabric the all-reduce crossed (NCCL's INFO lines), else the one the layout implies
    (MNNVL trays: mnnvl; several HGX nodes: infiniband; one node: nvswitch), and the hardware
    table's thresholds for it; (fabric, None) without `hardware.class` or a row for that fabric.
    A profile whose collective backend is not NCCL (the CPU lab's gloo, hardware.collective_backend)
    crosses no GPU fabric: (None, None), its own thresholds.nccl_busbw_gbps judges it."""
    if str(ctx.profile.model.hardware.collective_backend) != "nccl":
        return None, None
    row = profile_class(ctx.profile)
    log = _all_reduce_log(ctx)
    measured = detect_fabric(log[0]).fabric if log is not None else None
    if measured is None:
        domain = nvlink_domain_of(ctx.profile)
        measured = ("mnnvl" if domain == "mnnvl" else "infiniband") if ctx.multinode else domain
    return measured, (row.threshold(measured) if row is not None and measured else None)


def _gib(size: int | None) -> str:
    return "?" if size is None else (f"{size / (1 << 30):g} GB" if size >= 1 << 30 else f"{size / (1 << 20):g} MB")


def bounds_for_shape(table: FabricThreshold, fabric: str, ranks: int, largest: int | None
                     ) -> tuple[FabricThreshold, str, bool]:
    """The bounds for the shape measured (ranks, largest message size), how they were had, and whether a
    published figure stands behind them at that size. The table's figures are read at their published message
    size: a measurement that reached it is judged by them; a smaller one by them scaled with the fabric's
    published size curve (data/hardware.yml size_curves), named as scaled; with neither, the figures as they
    are, named as published for another shape (the caller judges those conservatively)."""
    shape = f"{table.ranks or '?'} GPUs, {_gib(table.bytes)} messages"
    same_ranks = table.ranks in (None, ranks)
    ranks_note = "" if same_ranks else f"; measured on {ranks} GPUs, no published figure for that GPU count"
    if table.bytes is None or (largest is not None and largest >= table.bytes):
        return table, f"published for {shape}{ranks_note}", table.bytes is not None and same_ranks
    curve = load_size_curves().get(fabric)
    factor = curve.ratio(largest, table.bytes) if curve is not None and largest is not None else None
    if factor is None:
        return table, (f"published for {shape}; no published figure at {_gib(largest)} and no size curve that "
                       f"reaches it{ranks_note}"), False
    if factor >= 1.0:     # the curve is flat from the size measured to the published one: the figures hold as they are
        return table, (f"published for {shape}; {_gib(largest)} is on the saturated part of the published size curve "
                       f"({curve.source.split(' ')[0]}){ranks_note}"), same_ranks
    return table.scaled(factor), (f"no published figure at {_gib(largest)}: the {shape} figures scaled by "
                                  f"x{factor:.3f}, the bus bandwidth ratio {_gib(largest)} / {_gib(table.bytes)} of "
                                  f"the published size curve ({curve.source.split(' ')[0]}){ranks_note}"), False


def _judge_against_table(ctx: NodeContext, perf: NcclPerf, evidence: list[str], cmd: object, fabric: str | None,
                         table: FabricThreshold) -> Finding:
    check = "interconnect.nccl_bandwidth"
    largest = max((r.size_bytes for r in perf.rows), default=None)
    bounds, basis, published = bounds_for_shape(table, fabric or "", perf.ranks, largest)
    observed = {"tool": perf.tool, "backend": perf.backend, "max_busbw_gbps": perf.max_busbw,
                "avg_busbw_gbps": perf.avg_busbw, "ranks": perf.ranks, "hosts": perf.hosts,
                "wrong": perf.wrong_results, "cmd": cmd, "fabric": fabric, "largest_message_bytes": largest}
    expected = {"fabric": fabric, "expected_gbps": bounds.expected, "warn_below": bounds.warn,
                "fail_below": bounds.fail, "basis": basis,
                "published": {"expected_gbps": table.expected, "warn_below": table.warn, "fail_below": table.fail,
                              "ranks": table.ranks, "bytes": table.bytes}}
    rule = (f"all-reduce bus bandwidth over {fabric} >= {bounds.fail} GB/s (warn below {bounds.warn}; ~"
            f"{bounds.expected} GB/s, {basis}; src/vllm_acceptance/data/hardware.yml), no wrong results")
    kw = {"observed": observed, "expected": expected, "rule": rule, "evidence": evidence,
          "consequence": Consequence.EXPAND}
    if not perf.ok or perf.max_busbw is None:
        return finding(check, Status.INCONCLUSIVE, ctx.host, reason="; ".join(perf.errors) or "no bandwidth rows",
                       action=f"check the {perf.tool} output", **kw)
    if perf.wrong_results or perf.out_of_bounds:
        return finding(check, Status.FAIL, ctx.host, **{**kw, "consequence": Consequence.REBUILD},
                       reason=f"{perf.tool} reported wrong results (data corruption on the path)",
                       action="inspect NVLink/NIC health (nvidia-smi nvlink -e, ibstat) before any load test")
    backend = str(ctx.profile.model.hardware.collective_backend)
    if perf.tool != "nccl-tests" and perf.backend != backend:   # nccl-tests is NCCL by construction
        return finding(check, Status.INCONCLUSIVE, ctx.host, action="see compat.container_cuda, re-run preflight",
                       reason=f"the all-reduce ran over {perf.backend}, not {backend}: the GPU fabric is unmeasured",
                       **kw)
    if ctx.multinode and len(perf.hosts) < 2:
        return finding(check, Status.INCONCLUSIVE, ctx.host, reason="the test ran on one node only; the inter-node "
                       "path is unmeasured", action="run the all-reduce across the nodes (preflight_nccl_test_argv "
                       "spanning them, or preflight_nccl_test_method: image)", **kw)
    where = f"tray {ctx.host}: {perf.max_busbw} GB/s over {fabric} ({perf.ranks} GPUs, up to {_gib(largest)})"
    measure_more = (f"measure at the published shape: all_reduce_perf up to {_gib(table.bytes)} across the nodes "
                    "(preflight_nccl_test_argv -e, or the in-image test's --max-bytes in preflight_allreduce_args)")
    if perf.max_busbw < (bounds.fail or 0):
        return finding(check, Status.FAIL, ctx.host,
                       reason=f"{where} < {bounds.fail} GB/s ({basis})",
                       action="bandwidth degraded on this fabric: check its links (nvidia-smi -q fabric health, "
                              "NVLink errors, NIC rails); change the topology or the interconnect rather than "
                              "adding GPUs", **kw)
    if bounds.warn is not None and perf.max_busbw < bounds.warn:
        if not published:   # no published figure for this shape: below the bound is not proof of a degraded link
            return finding(check, Status.INCONCLUSIVE, ctx.host,
                           reason=f"{where} < {bounds.warn} GB/s, above {bounds.fail}: {basis}, so this shape "
                                  "cannot tell a healthy link from a degraded one", action=measure_more, **kw)
        return finding(check, Status.WARN, ctx.host, reason=f"{where} < {bounds.warn} GB/s (warn threshold, {basis})",
                       action="watch the fabric: degraded links lower the bandwidth before they fail", **kw)
    return finding(check, Status.PASS, ctx.host, reason=f"{where} >= {bounds.warn or bounds.fail} GB/s ({basis})",
                   action="none", **kw)
