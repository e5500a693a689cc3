"""Compatibility-chain rules: one function per check id, judged from a node's saved evidence.

Every failure here means `rebuild_environment` (the environment is out of the official profile;
adding GPUs fixes nothing), except the NCCL bandwidth test (`expand_capacity`). Evidence that
is absent or unreadable gives `missing`/`inconclusive`, never `pass`. The CUDA runtime of an
image is judged from inside the image, never from nvidia-smi's "CUDA Version" line (that line
only states what the driver can support).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.findings import Consequence, Finding, Status, missing, not_applicable
from ..core.profile import Profile
from ..core.rundir import PROFILE_EVIDENCE  # the profile copy every run holds (run.record_profile)
from ..parsers.base import version_at_least
from ..parsers.causal import causal_line
from ..parsers.container import ImageInspect, Probe, parse_image_inspect, parse_probe, parse_runtime_info
from ..parsers.driver import branch_of, parse_fabricmanager_version, parse_proc_version
from ..parsers.env import comm_env
from ..parsers.lsmod import Lsmod, parse_lsmod
from ..parsers.nccl_tests import parse_all_reduce_perf
from ..parsers.node_evidence import CommandRecord, NodeEvidence
from ..parsers.nvidia_smi import GpuList, parse_query_csv, parse_table, parse_xml
from ..parsers.rdma import parse_ibv_devinfo, parse_rdma_link
from ..parsers.startup_log import StartupScan
from .launched import LaunchedPlan, launched_plan

# The rebuild routes of SPEC "Remediation playbooks" (source 001), named in every action.
ROUTE_DRIVER = ("upgrade the host driver (rolling, one node out of the scheduler at a time, state saved, "
                "recorded rollback plan; playbooks/rebuild.yml, back with playbooks/rollback.yml)")
ROUTE_IMAGE = ("use the official image of the profile (another image: set vllm_image_digest to the official "
               "digest and re-run accept.yml)")
ROUTE_SELF_BUILT = ("a self-built image for this host's CUDA as an experimental profile only, with owner, "
                    "exit date and full lineage (playbooks/build_image.yml)")
ROUTE_ISOLATED = ("an isolated compatible environment when the shared cluster cannot change (owner, review "
                  "date, criteria to move back: isolated_env_* inventory variables, then accept.yml on that inventory)")


@dataclass
class NodeContext:
    """What the rules for one node need: its evidence, the profile, and the cluster shape."""

    evidence: NodeEvidence
    profile: Profile
    n_hosts: int = 1
    startup_scan: StartupScan | None = None
    plan: LaunchedPlan | None = None          # what is launched (profile + inventory); None: the profile's
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return self.evidence.host

    @property
    def multinode(self) -> bool:
        return self.n_hosts > 1 or int(self.profile.get("hardware.min_nodes", 1) or 1) > 1

    @property
    def runtime(self) -> str:
        return str(self.evidence.inputs.get("runtime") or self.profile.get("launch.runtime", "process"))

    @property
    def containerised(self) -> bool:
        return self.runtime in ("docker", "podman")

    @property
    def image_ref(self) -> str | None:
        return self.evidence.inputs.get("image") or self.profile.get("image.reference")

    def rec(self, name: str) -> CommandRecord:
        return self.evidence.get(name)

    def parsed(self, name: str, parser: Callable[[str], Any]) -> Any:
        """Parse a record once per context; None when the command did not succeed."""
        if name not in self._cache:
            record = self.rec(name)
            self._cache[name] = parser(record.stdout) if record.ok else None
        return self._cache[name]

    def probe(self) -> Probe | None:
        return self.parsed("image_probe", parse_probe)

    def inspect(self) -> ImageInspect | None:
        return self.parsed("image_inspect", parse_image_inspect)

    def gpus(self) -> GpuList | None:
        """Host GPU list: query CSV first, the -q -x XML when the CSV is absent or unreadable."""
        query = self.parsed("nvidia_smi_query", parse_query_csv)
        if query is not None and query.ok and query.gpus:
            return query
        xml = self.parsed("nvidia_smi_xml", parse_xml)
        if xml is not None and xml.gpus:
            return xml
        return query or xml

    def lsmod(self) -> Lsmod | None:
        return self.parsed("lsmod", parse_lsmod)

    def paths(self, *names: str) -> list[str]:
        return [p for name in names for p in self.rec(name).paths]


def _why_missing(ctx: NodeContext, *names: str) -> str:
    if not ctx.evidence.dir_exists:
        return "no preflight evidence from this host (unreachable, or the play stopped before saving)"
    return "; ".join(ctx.rec(n).why_not() for n in names)


def _finding(check: str, status: Status, ctx_host: str | None, **kw: Any) -> Finding:
    return Finding(check=check, status=status, host=ctx_host, **kw)


def _gpu_profile_na(check: str, ctx: NodeContext) -> Finding | None:
    if not ctx.profile.has_gpus:
        return not_applicable(check, ctx.host, "profile hardware.accelerator is none (no GPU on this "
                                               "deployment); the host environment is in compat.state_snapshot")
    return None


# --- compat.recipe_record -------------------------------------------------------------------



def check_recipe_record(profile: Profile, today: dt.date | None = None) -> Finding:
    """The recipe's source, status and check date are recorded; a pre-release recipe not re-checked
    within review.period_days is flagged (the recipe moves; a change reopens acceptance)."""
    today = today or dt.datetime.now(dt.UTC).date()
    recipe = profile.get("recipe", {}) or {}
    observed = {"source": recipe.get("source"), "status": recipe.get("status"),
                "checked": recipe.get("checked"), "notes": recipe.get("notes", [])}
    rule = "recipe source, status and check date recorded; a pre-release recipe re-checked within review.period_days"
    if not all(observed[k] for k in ("source", "status", "checked")):
        return missing("compat.recipe_record", None, "profile lacks recipe.source/status/checked")
    try:
        age = (today - dt.date.fromisoformat(str(recipe["checked"]))).days
    except ValueError:
        return missing("compat.recipe_record", None, f"recipe.checked {recipe['checked']!r} is not a date")
    observed["age_days"] = age
    period = int(profile.get("review.period_days", 30) or 30)
    expected = {"recorded": True, "max_age_days_if_pre_release": period}
    if recipe["status"] in ("pre-release", "experimental") and age > period:
        return Finding(check="compat.recipe_record", status=Status.WARN, host=None, observed=observed,
                       expected=expected, rule=rule, consequence=Consequence.LIMIT, evidence=[PROFILE_EVIDENCE],
                       reason=f"{recipe['status']} recipe last checked {age} days ago (> {period})",
                       action=f"re-check {recipe['source']} and update profiles/{profile.name}.yml "
                              "(a changed recipe reopens acceptance)")
    return Finding(check="compat.recipe_record", status=Status.PASS, host=None, observed=observed,
                   expected=expected, rule=rule, action="none", evidence=[PROFILE_EVIDENCE])


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


def nvml_broken(ctx: NodeContext) -> str | None:
    """nvidia-smi's own words when NVML refuses the loaded module (version mismatch): the causal line."""
    for name in ("nvidia_smi", "nvidia_smi_query", "nvidia_smi_xml"):
        rec = ctx.rec(name)
        text = f"{rec.stdout}\n{rec.stderr}"
        if rec.present and not rec.ok and "version mismatch" in text.lower():
            return causal_line(text)
    return None


def host_driver_version(ctx: NodeContext) -> str | None:
    sources = _driver_sources(ctx)
    return sources.get("/proc/driver/nvidia/version") or next(iter(sources.values()), None)


def check_driver_branch(ctx: NodeContext) -> Finding:
    check = "compat.driver_branch"
    if (na := _gpu_profile_na(check, ctx)) is not None:
        return na
    min_branch, min_version = ctx.profile.get("driver.min_branch"), ctx.profile.get("driver.min_version")
    if min_branch is None and min_version is None:
        return not_applicable(check, ctx.host, "profile sets no driver minimum")
    names = ("driver_version", "nvidia_smi_xml", "nvidia_smi_query")
    sources = _driver_sources(ctx)
    evidence = ctx.paths(*names, "image_probe")
    if not sources:
        return missing(check, ctx.host, _why_missing(ctx, *names), evidence=evidence)
    nvml = nvml_broken(ctx)
    if nvml is not None:
        return _finding(check, Status.FAIL, ctx.host, observed={"sources": sources, "nvidia-smi": nvml},
                        expected="every driver source answers with one version", evidence=evidence,
                        rule="kernel module, NVML (nvidia-smi) and the container see one driver version",
                        reason=f"nvidia-smi cannot talk to the loaded driver: {nvml}",
                        action="the kernel module and the user-space libraries differ (a driver upgrade without "
                               "reboot): reboot the node or reload the nvidia kernel module, then re-run preflight")
    silent = [n for n in ("nvidia_smi_xml", "nvidia_smi_query") if ctx.rec(n).present and not ctx.rec(n).ok]
    if len(silent) == 2:
        return missing(check, ctx.host, "NVML (nvidia-smi) did not answer, so the driver seen by the host's "
                       "libraries is unknown: " + _why_missing(ctx, *silent), evidence=evidence)
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
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="driver versions differ between sources "
                        "(kernel module vs user-space library, or the container sees another driver)",
                        action="reboot or reload the nvidia kernel module so that module and libraries "
                               "match, then re-run preflight")
    too_low_branch = min_branch is not None and (branch is None or branch < int(min_branch))
    too_low_version = min_version is not None and version_at_least(version, str(min_version)) is not True
    if too_low_branch or too_low_version:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, action=action,
                        reason=f"driver {version} (R{branch}) is below R{min_branch} / {min_version}")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
                    evidence=evidence, action="none")


# --- compat.driver_module -------------------------------------------------------------------

def check_driver_module(ctx: NodeContext) -> Finding:
    check = "compat.driver_module"
    if (na := _gpu_profile_na(check, ctx)) is not None:
        return na
    lsmod = ctx.lsmod()
    evidence = ctx.paths("lsmod")
    if lsmod is None or not lsmod.modules:
        return missing(check, ctx.host, _why_missing(ctx, "lsmod"), evidence=evidence)
    observed = {"nvidia_modules": lsmod.nvidia_modules()}
    rule = "kernel module `nvidia` loaded"
    if not lsmod.loaded("nvidia"):
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=["nvidia"], rule=rule,
                        evidence=evidence, reason="nvidia kernel module not loaded",
                        action=f"install/load the NVIDIA driver (modprobe nvidia; check dmesg); {ROUTE_DRIVER}")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=["nvidia"], rule=rule,
                    evidence=evidence, action="none")


# --- compat.container_cuda ------------------------------------------------------------------

def check_container_cuda(ctx: NodeContext) -> Finding:
    check = "compat.container_cuda"
    expected_major = ctx.profile.get("image.cuda_major")
    if expected_major is None:
        return not_applicable(check, ctx.host, "profile image.cuda_major is null (no CUDA runtime to check: "
                                               f"{ctx.runtime} runtime, accelerator "
                                               f"{ctx.profile.get('hardware.accelerator')})")
    probe, inspect = ctx.probe(), ctx.inspect() if ctx.containerised else None
    evidence = ctx.paths("image_probe", "image_inspect")
    rule = (f"CUDA major of the runtime inside the actual image == {expected_major} (torch.version.cuda, "
            "/usr/local/cuda/version.json, libcudart soname; never nvidia-smi's 'CUDA Version')")
    observed: dict[str, Any] = {}
    if probe is not None:
        observed["in_image"] = probe.cuda_majors()
        observed["torch"] = probe.torch_version
        observed["libcudart"] = probe.libcudart
        observed["loaded_libs"] = probe.loaded_libs
    if inspect is not None:
        observed["image_env_cuda"] = inspect.cuda_version
    wrong = {src: major for src, major in (observed.get("in_image") or {}).items() if major != expected_major}
    if inspect is not None and inspect.cuda_major is not None and inspect.cuda_major != expected_major:
        wrong["image env CUDA_VERSION"] = inspect.cuda_major
    action = (f"{ROUTE_IMAGE} (built for CUDA {expected_major}); or, when this host cannot run it, "
              f"{ROUTE_SELF_BUILT}")
    if wrong:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected_major, rule=rule,
                        evidence=evidence, action=action,
                        reason=f"image built for another CUDA major: {wrong}")
    if probe is None:
        if inspect is not None and inspect.cuda_major == expected_major:
            return _finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected_major,
                            rule=rule, evidence=evidence, action="fix what stopped the probe, re-run preflight",
                            reason="image metadata says CUDA "
                                   f"{inspect.cuda_version}, but the probe inside the image did not run: "
                                   + _why_missing(ctx, "image_probe"))
        return missing(check, ctx.host, _why_missing(ctx, "image_probe"), evidence=evidence)
    if not observed.get("in_image"):
        return _finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected_major,
                        rule=rule, evidence=evidence, action="check the probe output; re-run preflight",
                        reason="the probe ran but reported no CUDA runtime (CPU-only torch?)")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=expected_major, rule=rule,
                    evidence=evidence, action="none")


# --- compat.image_identity ------------------------------------------------------------------

def _repo_of(reference: str) -> str:
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


def check_image_identity(ctx: NodeContext) -> Finding:
    check = "compat.image_identity"
    if not ctx.containerised:
        return not_applicable(check, ctx.host, f"{ctx.runtime} runtime: no container image; vLLM identity "
                                               "and install source are in compat.vllm_version")
    reference = ctx.image_ref
    evidence = ctx.paths("image_inspect", "inputs")
    inspect = ctx.inspect()
    if inspect is None or not inspect.id:
        return missing(check, ctx.host, _why_missing(ctx, "image_inspect"), evidence=evidence)
    pinned = ctx.evidence.inputs.get("image_digest") or ctx.profile.get("image.digest")
    if ctx.profile.experimental:
        pinned = pinned or ctx.profile.get("lineage.image_digest")
    forbidden = list(ctx.profile.get("image.forbidden_tag_suffixes", []) or [])
    observed = {"reference": reference, "id": inspect.id, "repo_tags": inspect.repo_tags,
                "repo_digests": inspect.repo_digests, "created": inspect.created,
                "pulled": inspect.last_tag_time, "architecture": inspect.architecture,
                "labels": inspect.labels, "pinned_digest": pinned}
    expected = {"reference": ctx.profile.get("image.reference"), "digest": pinned or "recorded",
                "forbidden_tag_suffixes": forbidden}
    rule = ("full reference and registry digest recorded; no forbidden tag suffix; the local tag was pulled "
            "from its own repository; digest == the pinned digest when one is pinned")
    problems: list[str] = []
    tags = ([reference] if reference else []) + inspect.repo_tags
    bad_tags = sorted({t for t in tags for s in forbidden if s and _tag(t).endswith(s)})
    if bad_tags:
        problems.append(f"forbidden tag suffix in {bad_tags}")
    if not inspect.repo_digests:
        problems.append("no registry digest (RepoDigests empty: built or loaded locally, never pulled)")
    elif reference and "@" not in reference and \
            _repo_of(reference) not in {_repo_of(d) for d in inspect.repo_digests}:
        problems.append(f"{reference} was not pulled from {_repo_of(reference)} (no RepoDigest for it): "
                        "a retagged or locally built image")
    if pinned and pinned not in inspect.digests:
        problems.append(f"digest {inspect.digests} != pinned {pinned}")
    if problems:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="; ".join(problems),
                        action=f"{ROUTE_IMAGE}: pull {ctx.profile.get('image.reference')} by digest and pin it "
                               f"(inventory vllm_image_digest); a self-built image only as {ROUTE_SELF_BUILT}")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
                    evidence=evidence, action="none" if pinned else
                    "pin the recorded digest in the inventory (vllm_image_digest) so a re-tag is caught")


def _tag(reference: str) -> str:
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


# --- compat.vllm_version --------------------------------------------------------------------

def check_vllm_version(ctx: NodeContext) -> Finding:
    check = "compat.vllm_version"
    minimum = str(ctx.profile.get("vllm.min_version"))
    probe = ctx.probe()
    evidence = ctx.paths("image_probe")
    if probe is None or not probe.vllm_version:
        why = _why_missing(ctx, "image_probe") if probe is None else "the probe could not import vllm: " + \
            "; ".join(probe.errors)
        return missing(check, ctx.host, why, evidence=evidence)
    observed = {"vllm": probe.vllm_version, "distribution": probe.vllm_dist, "torch": probe.torch_version,
                "install_source": ctx.profile.get("vllm.install_source"),
                "where": "image" if ctx.containerised else "runtime interpreter"}
    rule = f"vLLM in the actual runtime >= {minimum}"
    ok = version_at_least(probe.vllm_version, minimum)
    if ok is None:
        return _finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=f">= {minimum}",
                        rule=rule, evidence=evidence, reason="unreadable vLLM version",
                        action="check the probe output")
    if not ok:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=f">= {minimum}", rule=rule,
                        evidence=evidence, reason=f"vLLM {probe.vllm_version} < {minimum}",
                        action=f"{ROUTE_IMAGE} with vLLM >= {minimum}")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=f">= {minimum}", rule=rule,
                    evidence=evidence, action="none")


# --- compat.gpu_visibility / compat.topology ------------------------------------------------

def world_size(profile: Profile, plan: LaunchedPlan | None = None) -> int:
    """GPUs of the launched layout (tensor x pipeline x data): the plan's, else the profile's."""
    return (plan or launched_plan(profile)).world


def gpus_required_per_node(profile: Profile, n_hosts: int, plan: LaunchedPlan | None = None) -> int:
    """Every node of the layout must show its share: the profile's per-node count, or the
    tensor x pipeline x data world spread over the nodes, whichever is larger."""
    per_node = int(profile.get("hardware.gpus_per_node", 0) or 0)
    return max(per_node, math.ceil(world_size(profile, plan) / max(n_hosts, 1)))


def check_gpu_visibility(ctx: NodeContext) -> Finding:
    check = "compat.gpu_visibility"
    if (na := _gpu_profile_na(check, ctx)) is not None:
        return na
    required = gpus_required_per_node(ctx.profile, ctx.n_hosts, ctx.plan)
    gpu_class = ctx.profile.get("hardware.gpu_class")
    host_gpus, probe = ctx.gpus(), ctx.probe()
    evidence = ctx.paths("nvidia_smi_query", "nvidia_smi_xml", "image_probe")
    if host_gpus is None or not host_gpus.gpus:
        return missing(check, ctx.host, _why_missing(ctx, "nvidia_smi_query", "nvidia_smi_xml"), evidence=evidence)
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
    action = ("restore the missing GPUs (nvidia-smi -q: Xid errors, fallen off the bus, MIG, "
              "NVIDIA_VISIBLE_DEVICES/--gpus) or change the parallel layout in a new profile; "
              "adding GPUs elsewhere does not fix a node that hides one")
    if problems:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="; ".join(problems), action=action)
    if probe is None or probe.device_count is None:
        return _finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, action="fix the in-image probe, re-run preflight",
                        reason="host GPUs fine, but what the runtime sees is unknown: "
                               + (_why_missing(ctx, "image_probe") if probe is None else "no device_count"))
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
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
                "interconnect": profile.get("hardware.interconnect"),
                "nvswitch": profile.get("hardware.nvswitch", False)}
    needed = max(int(profile.get("hardware.min_gpus", 0) or 0), world_size(profile, plan))
    expected = {"min_nodes": profile.get("hardware.min_nodes", 1), "min_gpus": needed,
                "layout": (plan or launched_plan(profile)).layout()}
    evidence = [p for ctx in contexts for p in ctx.paths("nvidia_smi_query")]
    rule = "nodes >= hardware.min_nodes and total GPUs >= max(hardware.min_gpus, tensor x pipeline x data)"
    unknown = [h for h, c in counts.items() if c is None]
    if unknown:
        return missing(check, None, f"no GPU list from {unknown}", evidence=evidence)
    total = sum(c or 0 for c in counts.values())
    observed["total_gpus"] = total
    if len(contexts) < int(expected["min_nodes"] or 1) or total < needed:
        return Finding(check=check, status=Status.FAIL, host=None, observed=observed, expected=expected,
                       rule=rule, evidence=evidence, consequence=Consequence.REBUILD,
                       reason=f"{len(contexts)} nodes / {total} GPUs for a layout needing "
                              f"{expected['min_nodes']} / {needed}",
                       action="add the nodes the profile's layout needs to the inventory, or use a profile "
                              "whose parallel layout fits this cluster")
    return Finding(check=check, status=Status.PASS, host=None, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


def check_image_uniform(contexts: list[NodeContext]) -> Finding:
    """Cluster level: every GPU node holds the same image. Each node can pass compat.image_identity
    on its own with a moving tag while one of them pulled it on another day; one run would then judge
    several images under one name."""
    check = "compat.image_uniform"
    containerised = [ctx for ctx in contexts if ctx.containerised]
    if len(containerised) < 2:
        return not_applicable(check, None, "fewer than two containerised GPU nodes: nothing to compare")
    evidence = [p for ctx in containerised for p in ctx.paths("image_inspect")]
    ids: dict[str, str | None] = {}
    for ctx in containerised:
        inspect = ctx.inspect()
        ids[ctx.host] = inspect.id if inspect is not None else None
    unknown = [h for h, i in ids.items() if not i]
    if unknown:
        return missing(check, None, f"no image inspect from {unknown}", evidence=evidence)
    groups: dict[str, list[str]] = {}
    for host, image_id in ids.items():
        groups.setdefault(str(image_id), []).append(host)
    rule = "one image ID on every GPU node of the run"
    expected = "1 image ID"
    if len(groups) == 1:
        return Finding(check=check, status=Status.PASS, host=None, observed=groups, expected=expected, rule=rule,
                       evidence=evidence, consequence=Consequence.REBUILD, action="none")
    odd = sorted((hosts for hosts in groups.values()), key=len)[:-1]
    return Finding(check=check, status=Status.FAIL, host=None, observed=groups, expected=expected, rule=rule,
                   evidence=evidence, consequence=Consequence.REBUILD,
                   reason=f"{len(groups)} different images under one reference; the odd nodes: "
                          + ", ".join(h for hosts in odd for h in hosts),
                   action=f"{ROUTE_IMAGE}: pull the pinned digest on every node (inventory vllm_image_digest) "
                          "and re-run accept.yml")


# --- compat.fabric_manager ------------------------------------------------------------------

def check_fabric_manager(ctx: NodeContext) -> Finding:
    check = "compat.fabric_manager"
    if (na := _gpu_profile_na(check, ctx)) is not None:
        return na
    if not ctx.profile.get("hardware.nvswitch", False):
        return not_applicable(check, ctx.host, "profile hardware.nvswitch is false")
    active, version_rec = ctx.rec("fabricmanager_active"), ctx.rec("fabricmanager_version")
    evidence = ctx.paths("fabricmanager_active", "fabricmanager_version", "driver_version", "nvidia_smi_xml")
    # `systemctl is-active` exits 3 for inactive: its stdout is the evidence, not its rc.
    if not active.present or active.missing_tool or not active.stdout.strip():
        return missing(check, ctx.host, _why_missing(ctx, "fabricmanager_active"), evidence=evidence)
    state = active.stdout.strip().splitlines()[0]
    fm_version = parse_fabricmanager_version(version_rec.stdout).version if version_rec.ok else None
    driver = host_driver_version(ctx)
    xml = ctx.parsed("nvidia_smi_xml", parse_xml)
    if state == "active" and (xml is None or not xml.gpus):
        # The service runs, but whether the GPUs joined the fabric is read from nvidia-smi -q -x only.
        return missing(check, ctx.host, "Fabric Manager is active, but the GPUs' fabric state is unknown: "
                       + _why_missing(ctx, "nvidia_smi_xml"), evidence=evidence)
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
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="; ".join(problems),
                        action="install nvidia-fabricmanager of exactly the driver's version and "
                               "`systemctl enable --now nvidia-fabricmanager` (journalctl -u nvidia-fabricmanager "
                               f"for the cause); with a driver change: {ROUTE_DRIVER}")
    if fm_version is None or driver is None:
        return missing(check, ctx.host, "Fabric Manager or driver version unreadable: "
                       + _why_missing(ctx, "fabricmanager_version", "driver_version"), evidence=evidence)
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
                    evidence=evidence, action="none")


# --- compat.peermem / interconnect.rdma ------------------------------------------------------

def check_peermem(ctx: NodeContext) -> Finding:
    check = "compat.peermem"
    if (na := _gpu_profile_na(check, ctx)) is not None:
        return na
    if not ctx.multinode:
        return not_applicable(check, ctx.host, "single node: no GPUDirect RDMA between nodes")
    lsmod = ctx.lsmod()
    evidence = ctx.paths("lsmod")
    if lsmod is None or not lsmod.modules:
        return missing(check, ctx.host, _why_missing(ctx, "lsmod"), evidence=evidence)
    loaded = [m for m in ("nvidia_peermem", "nv_peer_mem") if lsmod.loaded(m)]
    observed = {"peer_memory_modules": loaded, "nvidia_modules": lsmod.nvidia_modules()}
    rule = "nvidia_peermem (or the older nv_peer_mem) loaded on multi-node deployments"
    if not loaded:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=["nvidia_peermem"], rule=rule,
                        evidence=evidence, reason="no peer-memory module: GPUDirect RDMA only via DMA-BUF, and "
                                                  "the NCCL_DMABUF_ENABLE=0 workaround would have no path",
                        action="modprobe nvidia_peermem (and persist it in /etc/modules-load.d)")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=["nvidia_peermem"], rule=rule,
                    evidence=evidence, action="none")


def check_rdma(ctx: NodeContext) -> Finding:
    check = "interconnect.rdma"
    if (na := _gpu_profile_na(check, ctx)) is not None:
        return na
    if not ctx.multinode:
        return not_applicable(check, ctx.host, "single node: no inter-node transport")
    interconnect = ctx.profile.get("hardware.interconnect")
    if interconnect != "rdma":
        return not_applicable(check, ctx.host, f"profile interconnect is {interconnect!r}, not rdma")
    evidence = ctx.paths("ibv_devinfo", "rdma_link")
    ibv = ctx.parsed("ibv_devinfo", parse_ibv_devinfo)
    link = ctx.parsed("rdma_link", parse_rdma_link)
    sources = [s for s in (ibv, link) if s is not None and s.ports]
    if not sources:
        if ibv is not None or link is not None:
            return _finding(check, Status.FAIL, ctx.host, observed={"devices": []}, expected=">= 1 active port",
                            rule="at least one RDMA port ACTIVE", evidence=evidence,
                            reason="no RDMA devices", action="install/enable the RDMA NICs and OFED/rdma-core")
        return missing(check, ctx.host, _why_missing(ctx, "ibv_devinfo", "rdma_link"), evidence=evidence)
    ports = sources[0].ports
    active = [f"{p.device}/{p.port}" for p in ports if p.active]
    observed = {"devices": sources[0].devices, "active_ports": active,
                "link_layers": sorted({p.link_layer for p in ports if p.link_layer})}
    if not active:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=">= 1 active port",
                        rule="at least one RDMA port ACTIVE", evidence=evidence, reason="no RDMA port is ACTIVE",
                        action="bring the RDMA links up (cabling, subnet manager, ibstat)")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=">= 1 active port",
                    rule="at least one RDMA port ACTIVE", evidence=evidence, action="none")


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
    multinode = profile.get("launch.multinode", {}) or {}
    interconnect = interconnect or profile.get("hardware.interconnect")
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
    workaround = (profile.get("launch.multinode.dmabuf_workaround_env", {}) or {"NCCL_DMABUF_ENABLE": "0"})
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
    args = [str(a) for a in profile.get("launch.args", []) or []]
    env = {k: str(v) for k, v in (profile.get("launch.env", {}) or {}).items()}
    if multinode:
        extra_args, extra_env = expected_comm_settings(profile, plan.interconnect)
        args += [a for a in extra_args if a not in args]
        env.update(extra_env)
        if plan.dmabuf_workaround:
            env.update({str(k): str(v) for k, v in (profile.get("launch.multinode.dmabuf_workaround_env", {})
                                                    or {"NCCL_DMABUF_ENABLE": "0"}).items()})
        env.update(plan.env)
    return args, env


def check_nccl_env_node(ctx: NodeContext) -> Finding:
    """Judged on the launch the role was told about (inventory overrides), else the planned one."""
    if not ctx.evidence.dir_exists and ctx.profile.has_gpus and ctx.multinode:
        return missing("interconnect.nccl_env", ctx.host, _why_missing(ctx))
    inputs = ctx.evidence.inputs
    default_args, default_env = planned_launch(ctx.profile, ctx.multinode, ctx.plan)
    env = {k: str(v) for k, v in (inputs.get("launch_env") or default_env).items()}
    args = [str(a) for a in (inputs.get("launch_args") or default_args)]
    return check_nccl_env(env, args, ctx.profile, ctx.host, ctx.paths("inputs", "env"), ctx.multinode,
                          ctx.startup_scan, interconnect=(ctx.plan or launched_plan(ctx.profile)).interconnect)


# --- interconnect.nccl_bandwidth ------------------------------------------------------------

def check_nccl_bandwidth(ctx: NodeContext) -> Finding:
    check = "interconnect.nccl_bandwidth"
    if (na := _gpu_profile_na(check, ctx)) is not None:
        return na
    record = ctx.rec("nccl_allreduce")
    evidence = ctx.paths("nccl_allreduce")
    threshold = ctx.profile.get("thresholds.nccl_busbw_gbps")
    if not record.ok:
        if ctx.multinode:
            return missing(check, ctx.host, _why_missing(ctx, "nccl_allreduce"), Consequence.EXPAND, evidence)
        return not_applicable(check, ctx.host, "single node and no nccl-tests output: the inter-node "
                                               "bandwidth test is required for multi-node layouts only")
    perf = parse_all_reduce_perf(record.stdout)
    observed = {"max_busbw_gbps": perf.max_busbw, "avg_busbw_gbps": perf.avg_busbw, "ranks": perf.ranks,
                "hosts": perf.hosts, "wrong": perf.wrong_results, "cmd": record.cmd}
    rule = f"all_reduce_perf bus bandwidth >= {threshold} GB/s, no wrong results" + \
        (", ranks spanning >= 2 nodes" if ctx.multinode else "")
    if not perf.ok or perf.max_busbw is None:
        return _finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND, reason="; ".join(perf.errors),
                        action="check the nccl-tests output")
    if perf.wrong_results or perf.out_of_bounds:
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.REBUILD,
                        reason="nccl-tests reported wrong results (data corruption on the path)",
                        action="inspect NVLink/NIC health (nvidia-smi nvlink -e, ibstat) before any load test")
    if threshold is None:
        return _finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=None, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND,
                        reason="profile sets no thresholds.nccl_busbw_gbps", action="set the threshold")
    if ctx.multinode and len(perf.hosts) < 2:
        return _finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND,
                        reason="the test ran on one node only; the inter-node path is unmeasured",
                        action="set preflight_nccl_test_argv to an mpirun/srun line spanning the nodes")
    if perf.max_busbw < float(threshold):
        return _finding(check, Status.FAIL, ctx.host, observed=observed, expected=threshold, rule=rule,
                        evidence=evidence, consequence=Consequence.EXPAND,
                        reason=f"bus bandwidth {perf.max_busbw} GB/s < {threshold} GB/s",
                        action="check the interconnect (NVLink/NVSwitch, NIC rails, NCCL topology); change the "
                               "topology or the interconnect rather than adding GPUs")
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=threshold, rule=rule,
                    evidence=evidence, consequence=Consequence.EXPAND, action="none")


# --- compat.state_snapshot ------------------------------------------------------------------

def snapshot_commands(profile: Profile, runtime: str) -> list[str]:
    """Source 001's state snapshot, the parts that apply to this deployment."""
    names = ["date_u", "hostname", "uname_a", "env"]
    if profile.has_gpus:
        names += ["nvidia_smi", "nvidia_smi_query", "lsmod"]
    if runtime in ("docker", "podman"):
        names += ["runtime_version", "runtime_info", "image_inspect"]
    return names


def check_state_snapshot(ctx: NodeContext) -> Finding:
    check = "compat.state_snapshot"
    names = snapshot_commands(ctx.profile, ctx.runtime)
    evidence = ctx.paths(*names)
    failed = [n for n in names if not ctx.rec(n).ok]
    optional = [n for n in ("nvidia_smi", "lsmod", "runtime_version") if n not in names and ctx.rec(n).present]
    observed = {"captured": [n for n in names if n not in failed], "also_recorded": optional}
    rule = "every snapshot command of source 001 that applies was captured before any change"
    if failed:
        return missing(check, ctx.host, _why_missing(ctx, *failed), evidence=evidence)
    info = ctx.parsed("runtime_info", parse_runtime_info) if ctx.containerised else None
    if info is not None:
        observed["runtime"] = {"server": info.server_version, "runtimes": info.runtimes,
                               "default": info.default_runtime, "gpu_capable": info.gpu_capable}
    return _finding(check, Status.PASS, ctx.host, observed=observed, expected=names, rule=rule,
                    evidence=evidence, action="none")


# --- compat.startup_log (called by the serve stage) -----------------------------------------

_LAYOUT_ARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local")


def _profile_arg_values(profile: Profile) -> dict[str, Any]:
    """--name=value -> {name_with_underscores: value}; --flag -> True; --no-flag -> {flag: False}."""
    out: dict[str, Any] = {}
    for arg in profile.get("launch.args", []) or []:
        name, sep, value = str(arg).lstrip("-").partition("=")
        key = name.replace("-", "_")
        if sep:
            out[key] = value
        elif key.startswith("no_"):
            out[key[3:]] = False
        else:
            out[key] = True
    return out


def _same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, bool) or isinstance(actual, bool):
        return str(expected).lower() == str(actual).lower()
    if isinstance(actual, (dict, list)):
        return True   # structured values (e.g. --attention-config JSON) are compared by the serve stage
    return str(expected) == str(actual)


def check_startup_log(scan: StartupScan | None, profile: Profile, host: str | None,
                      evidence: list[str], plan: LaunchedPlan | None = None) -> Finding:
    """The startup log against the recipe: version, options, device and backend initialisation,
    parallel layout, no backend fallback, no NCCL error, KV cache initialised; warnings listed."""
    check = "compat.startup_log"
    if scan is None or scan.lines == 0:
        return missing(check, host, "no startup log captured (save it from the container's first line)",
                       evidence=evidence)
    observed = scan.summary()
    minimum = str(profile.get("vllm.min_version"))
    plan = plan or launched_plan(profile)
    expected = {"vllm": f">= {minimum}", "world_size": plan.engine_world, "layout": plan.layout(), "fallbacks": 0,
                "nccl_errors": 0, "kv_cache": "initialised"}
    rule = ("version >= profile minimum, recipe options in effect, no backend fallback, no NCCL/CUDA-driver/"
            "kernel-image error, no OOM, KV cache size and maximum concurrency read out")
    problems: list[str] = []
    consequence = Consequence.REBUILD
    actions: list[str] = []
    if scan.driver_incompatible or scan.no_kernel_image:
        problems.append("CUDA/driver incompatibility before the model loads: "
                        + (scan.driver_incompatible or scan.no_kernel_image)[0].text[:200])
        actions.append(f"environment, not flags: {ROUTE_DRIVER}; or {ROUTE_ISOLATED}; or {ROUTE_SELF_BUILT}")
    if scan.dmabuf_errors:
        workaround = profile.get("launch.multinode.dmabuf_workaround_env", {}) or {"NCCL_DMABUF_ENABLE": "0"}
        problems.append(f"mlx5dv_reg_dmabuf_mr error (errno {scan.dmabuf_errno})")
        actions.append(f"set {workaround} (falls back to nvidia_peermem; check compat.peermem), restart")
    if scan.nccl_errors:
        problems.append(f"NCCL error: {scan.nccl_errors[0].text[:200]}")
        actions.append("check topology, RDMA, peer memory, network backend and NCCL/UCX env (not the driver)")
    if scan.backend_fallbacks:
        problems.append(f"backend fallback: {scan.backend_fallbacks[0].text[:200]}")
        actions.append("make the recipe's backend available (image, flags); a fallback changes what is measured")
    if scan.version is not None and version_at_least(scan.version, minimum) is False:
        problems.append(f"vLLM {scan.version} < {minimum}")
        actions.append(ROUTE_IMAGE)
    wanted = {k: v for k, v in _profile_arg_values(profile).items() if k not in _LAYOUT_ARGS}
    wanted.update({"tensor_parallel_size": plan.tensor, "pipeline_parallel_size": plan.pipeline})
    mismatched = {k: (v, scan.non_default_args[k]) for k, v in wanted.items()
                  if scan.non_default_args and k in scan.non_default_args and not _same(v, scan.non_default_args[k])}
    if mismatched:
        problems.append(f"launch options differ from the profile (expected, actual): {mismatched}")
        actions.append("launch with the profile's args and the launched layout")
    if scan.world_size is not None and scan.world_size != plan.engine_world:
        problems.append(f"world size {scan.world_size} != launched layout tensor {plan.tensor} x pipeline "
                        f"{plan.pipeline} = {plan.engine_world} ({plan.source})")
        actions.append("launch with the planned parallel layout (vllm_parallel, else the profile's)")
    if scan.oom:
        if not problems:
            consequence = Consequence.EXPAND
        problems.append(f"OOM ({'after' if scan.model_load_s is not None else 'before/during'} model load): "
                        f"{scan.oom[0].text[:200]}")
        actions.append("capacity: check weight distribution and the parallel layout, then limits, then topology")
    if not problems and scan.failure_class() == "other":
        problems.append("startup failed (traceback) without an environment signature")
        actions.append("CUDA initialised: check model name, weight access and authorisation, GPU count, "
                       "tensor parallel settings, inter-node exchange, kernel/extension loading; a driver "
                       "upgrade is justified only when log and config prove a version incompatibility")
    if problems:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, consequence=consequence, reason="; ".join(problems),
                       action="; ".join(actions))
    if not scan.ready or not scan.kv_cache_initialised or scan.version is None:
        lacking = [name for name, ok in (("ready line", scan.ready), ("KV cache size line", scan.kv_cache_initialised),
                                         ("version line", scan.version is not None)) if not ok]
        return Finding(check=check, status=Status.INCONCLUSIVE, host=host, observed=observed, expected=expected,
                       rule=rule, evidence=evidence, reason="log lacks: " + ", ".join(lacking),
                       action="capture the whole log from the first line to ready")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


# --- compat.actual_config (called by the serve stage) ---------------------------------------

def _truthy(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value is None:
        return None
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", "none", ""):
        return False
    return None


def process_flags(process_args: list[str]) -> dict[str, Any]:
    """argv of the running server -> {flag_with_underscores: value}; the last occurrence wins
    (argparse semantics); --no-x sets x False."""
    flags: dict[str, Any] = {}
    index = 0
    while index < len(process_args):
        arg = process_args[index]
        index += 1
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        key = name.replace("-", "_")
        if not sep and index < len(process_args) and not process_args[index].startswith("--"):
            value, sep = process_args[index], "="
            index += 1
        if sep:
            flags[key] = value
        elif key.startswith("no_"):
            flags[key[3:]] = False
        else:
            flags[key] = True
    return flags


def check_actual_config(cache_config_info: dict[str, Any] | None, process_args: list[str] | None,
                        models: dict[str, Any] | None, profile: Profile, host: str | None,
                        evidence: list[str]) -> list[Finding]:
    """What the running server actually does: prefix caching per vllm:cache_config_info, required
    flags and parsers from the process's argv, max_model_len from /v1/models."""
    return [_actual_prefix_caching(cache_config_info, profile, host, evidence),
            _actual_flags(cache_config_info, process_args, profile, host, evidence),
            _actual_max_model_len(models, profile, host, evidence)]


def _expected_prefix_caching(profile: Profile) -> bool:
    values = _profile_arg_values(profile)
    if "enable_prefix_caching" in values:
        return bool(_truthy(values["enable_prefix_caching"]))
    return "enable_prefix_caching" in (profile.get("launch.required_flags", []) or [])


def _actual_prefix_caching(info: dict[str, Any] | None, profile: Profile, host: str | None,
                           evidence: list[str]) -> Finding:
    check = "compat.actual_config.prefix_caching"
    expected = _expected_prefix_caching(profile)
    rule = f"vllm:cache_config_info enable_prefix_caching == {expected}"
    if not info or "enable_prefix_caching" not in info:
        return missing(check, host, "no vllm:cache_config_info with enable_prefix_caching from /metrics",
                       evidence=evidence)
    actual = _truthy(info.get("enable_prefix_caching"))
    observed = {k: info.get(k) for k in ("enable_prefix_caching", "block_size", "cache_dtype",
                                         "gpu_memory_utilization", "num_gpu_blocks", "prefix_caching_hash_algo")
                if k in info}
    if actual is not expected:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, reason=f"prefix caching is {actual} on the running server",
                       action="fix the launch configuration (the flag did not reach the process), re-run")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


def _actual_flags(info: dict[str, Any] | None, process_args: list[str] | None, profile: Profile,
                  host: str | None, evidence: list[str]) -> Finding:
    check = "compat.actual_config.flags"
    if process_args is None:
        return missing(check, host, "no argv of the running server", evidence=evidence)
    flags = process_flags(process_args)
    required = list(profile.get("launch.required_flags", []) or [])
    expected: dict[str, Any] = {flag: True for flag in required}
    for key, field_name in (("tool_call_parser", "model.tool_call_parser"),
                            ("reasoning_parser", "model.reasoning_parser")):
        if profile.get(field_name):
            expected[key] = profile.get(field_name)
    observed: dict[str, Any] = {}
    problems = []
    for key, want in expected.items():
        have = flags.get(key)
        if key == "enable_prefix_caching" and info and "enable_prefix_caching" in info and have is None:
            have = _truthy(info["enable_prefix_caching"])     # on by default: the config is the truth
        observed[key] = have
        if want is True and _truthy(have) is not True:
            problems.append(f"--{key.replace('_', '-')} not in effect")
        elif want is not True and str(have) != str(want):
            problems.append(f"--{key.replace('_', '-')}={have!r}, profile {want!r}")
    rule = "required flags and the profile's parsers in effect on the running process"
    if problems:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, reason="; ".join(problems),
                       action="launch with the profile's args (the running process differs from the plan)")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


def _actual_max_model_len(models: dict[str, Any] | None, profile: Profile, host: str | None,
                          evidence: list[str]) -> Finding:
    check = "compat.actual_config.max_model_len"
    expected = profile.get("model.max_model_len")
    entries = models.get("data") if isinstance(models, dict) else None
    if not isinstance(entries, list) or not entries:
        return missing(check, host, "no /v1/models answer with models", evidence=evidence)
    served = profile.get("model.served_name") or profile.get("model.name")
    entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == served), None)
    if entry is None and len(entries) == 1 and isinstance(entries[0], dict):
        entry = entries[0]
    observed = {"models": [e.get("id") for e in entries if isinstance(e, dict)],
                "max_model_len": entry.get("max_model_len") if entry else None}
    rule = f"/v1/models {served} max_model_len == {expected}"
    if entry is None or entry.get("max_model_len") is None:
        return missing(check, host, f"/v1/models has no {served!r} with max_model_len", evidence=evidence)
    if entry.get("max_model_len") != expected:
        return Finding(check=check, status=Status.FAIL, host=host, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, reason=f"max_model_len {entry.get('max_model_len')} != {expected}",
                       action="launch with --max-model-len of the profile, or record a lowered contract limit")
    return Finding(check=check, status=Status.PASS, host=host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, action="none")


NODE_RULES: tuple[Callable[[NodeContext], Finding], ...] = (
    check_state_snapshot, check_driver_branch, check_driver_module, check_container_cuda, check_image_identity,
    check_vllm_version, check_gpu_visibility, check_fabric_manager, check_peermem, check_rdma,
    check_nccl_env_node, check_nccl_bandwidth,
)

__all__ = ["NODE_RULES", "NodeContext", "check_actual_config", "check_nccl_env", "check_recipe_record",
           "check_image_uniform", "check_startup_log", "check_topology"]
