"""Preflight judge: the compatibility chain of every GPU node, from evidence saved by the role.

The role (roles/preflight) runs every stock command of a node in one `raw` call and hands the
framed answers of all nodes to `save_node_streams` (module acceptance_preflight, action unpack),
which writes the evidence layout of parsers/node_evidence.py. The judge only reads those files.
Usable without Ansible:

    from vllm_acceptance.preflight.stage import judge
    findings = judge(Path("reports/site/run"), load_profile("profiles/kimi-k3.yml"), ["gpu-01", "gpu-02"])
"""

from __future__ import annotations

import datetime as dt
import json
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.evidence import atomic_write
from ..core.findings import Finding
from ..core.profile import ConfigError, Profile
from ..core.redact import redact_env, redact_env_list, redact_env_text, redact_obj, redact_text
from ..core.rundir import RunDir, record_profile
from ..parsers.live import local_netns
from ..parsers.node_evidence import host_dir, load_node_evidence
from ..parsers.startup_log import StartupScan, scan_startup_log
from ..rules.compat import (
    CLUSTER_FABRIC_RULES,
    NODE_RULES,
    NodeContext,
    check_image_uniform,
    check_recipe_record,
    check_topology,
    host_driver_version,
)
from ..rules.launch_args import check_launch_args
from ..rules.launched import LaunchedPlan, plan_of_run, run_inventory_vars
from ..rules.live_server import check_server_location
from ..rules.registry import get as catalog_get

# Evidence and host directory names: no path separators, no hidden or parent entries.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]*")


def node_contexts(run_dir: Path, profile: Profile, hosts: list[str],
                  startup_scans: dict[str, StartupScan] | None = None,
                  plan: LaunchedPlan | None = None, n_hosts: int | None = None) -> list[NodeContext]:
    startup_scans = startup_scans or {}
    plan = plan or plan_of_run(Path(run_dir), profile)
    justification = dmabuf_justification(plan)
    return [NodeContext(evidence=load_node_evidence(Path(run_dir), host), profile=profile,
                        n_hosts=n_hosts or len(hosts),
                        startup_scan=startup_scans.get(host) or justification, plan=plan) for host in hosts]


def dmabuf_justification(plan: LaunchedPlan) -> StartupScan | None:
    """The startup log that justified NCCL_DMABUF_ENABLE=0 (vllm_nccl_dmabuf_evidence): the run that
    showed mlx5dv_reg_dmabuf_mr is an earlier one, the run with the workaround no longer shows it."""
    if not plan.dmabuf_evidence:
        return None
    try:
        return scan_startup_log(Path(plan.dmabuf_evidence).read_text(errors="replace"))
    except OSError:
        return None


def judge(run_dir: Path, profile: Profile, hosts: list[str], *, today: dt.date | None = None,
          startup_scans: dict[str, StartupScan] | None = None, cluster: list[str] | None = None,
          reference_run_dir: Path | None = None) -> list[Finding]:
    """Every compatibility finding of the run: the recipe record once, each rule per host, the
    cluster topology and image uniformity once. A host without evidence gets `missing` for each required check.

    cluster / reference_run_dir: judge `hosts` (fresh evidence in run_dir) as members of `cluster`, with
    the cluster's expectations (multi-node: peer memory, RDMA); the topology and image uniformity
    take the other members' evidence from reference_run_dir (a node re-checked after its change,
    playbooks/tasks/rebuild_node.yml)."""
    hosts = list(dict.fromkeys(hosts))          # keep order, drop repeats
    if cluster:
        return _judge_in_cluster(run_dir, profile, hosts, list(dict.fromkeys(cluster)), reference_run_dir,
                                 today=today, startup_scans=startup_scans)
    record_profile(run_dir, profile)            # also when preflight.yml runs on its own
    findings = [check_recipe_record(profile, today)]
    if profile.has_gpus and not hosts:
        findings.append(catalog_get("compat.gpu_nodes").missing(
            None, f"profile {profile.name} needs GPUs, but the inventory's gpu_nodes group is empty or absent "
                  "(misspelled?): no driver, container CUDA, GPU visibility, topology or Fabric Manager evidence; "
                  "list every GPU node under gpu_nodes"))
    plan = plan_of_run(Path(run_dir), profile)
    contexts = node_contexts(run_dir, profile, hosts, startup_scans, plan)
    for ctx in contexts:
        findings.extend(rule(ctx) for rule in NODE_RULES)
    if contexts:
        findings.append(check_topology(contexts, profile, plan))
        findings.extend(rule(contexts, profile) for rule in CLUSTER_FABRIC_RULES)
        findings.append(check_image_uniform(contexts))
        findings.append(check_server_location(contexts, run_inventory_vars(Path(run_dir)),
                                              read_url_resolution(run_dir)))
        findings.append(check_launch_args(contexts))
    return findings


def _judge_in_cluster(run_dir: Path, profile: Profile, hosts: list[str], cluster: list[str],
                      reference_run_dir: Path | None, *, today: dt.date | None,
                      startup_scans: dict[str, StartupScan] | None) -> list[Finding]:
    record_profile(run_dir, profile)
    findings = [check_recipe_record(profile, today)]
    plan = plan_of_run(Path(run_dir), profile)
    size = len(set(cluster) | set(hosts))
    contexts = node_contexts(run_dir, profile, hosts, startup_scans, plan, n_hosts=size)
    for ctx in contexts:
        findings.extend(rule(ctx) for rule in NODE_RULES)
    others = [h for h in cluster if h not in hosts]
    if reference_run_dir is not None and others:
        contexts = contexts + node_contexts(Path(reference_run_dir), profile, others, startup_scans, plan,
                                            n_hosts=size)
    findings.append(check_topology(contexts, profile, plan))
    findings.extend(rule(contexts, profile) for rule in CLUSTER_FABRIC_RULES)
    findings.append(check_image_uniform(contexts))
    return findings


def node_facts(run_dir: Path, profile: Profile, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """The versions a sign-off names: driver, GPUs, CUDA runtime in the image, torch, vLLM, image."""
    facts: dict[str, dict[str, Any]] = {}
    for ctx in node_contexts(run_dir, profile, hosts):
        if not ctx.evidence.dir_exists:
            facts[ctx.host] = {"reachable": False}
            continue
        gpus, probe, inspect = ctx.gpus(), ctx.probe(), ctx.inspect()
        names = sorted({g.name for g in gpus.gpus if g.name}) if gpus else []
        facts[ctx.host] = {
            "driver_version": host_driver_version(ctx),
            "gpu_count": len(gpus.gpus) if gpus else None,
            "gpu_name": ", ".join(names) or None,
            "cuda_runtime": (probe.cuda_json_version or probe.torch_cuda) if probe else None,
            "torch_version": probe.torch_version if probe else None,
            "vllm_version": probe.vllm_version if probe else None,
            "image": ctx.image_ref if ctx.containerised else None,
            "image_digest": (inspect.repo_digests[0] if inspect and inspect.repo_digests else None),
        }
    return facts


def stage_details(run_dir: Path, profile: Profile, hosts: list[str]) -> dict[str, Any]:
    """stages/preflight.json: the per-node facts the report and the sign-off show (read once, here)."""
    return {"hosts": node_facts(run_dir, profile, list(dict.fromkeys(hosts)))}


FRAME_VERSION = "v1"


@dataclass
class NodeStream:
    """What one node answered to the role's single `raw` call: the framed stdout of the script
    (roles/preflight/templates/node_script.sh.j2), the exit status and stderr of the script itself.
    `inputs` is used when the answer carries no `inputs` section of its own."""

    stdout: str
    marker: str
    rc: int | None = None
    stderr: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class StreamRecord:
    """One command's section of the stream, in the meta layout of parsers/node_evidence.py."""

    name: str
    cmd: Any
    stdout: str = ""
    rc: int | None = None
    stderr: str = ""
    missing: bool = False
    timed_out: bool = False
    complete: bool = False      # the script reached the end of this command's section


def _frame_line(stream: str, start: int) -> tuple[str, int]:
    """The line starting at `start` (without its newline) and the index after it."""
    end = stream.find("\n", start)
    end = len(stream) if end < 0 else end
    return stream[start:end], end + 1


def split_stream(stream: str, marker: str) -> tuple[list[StreamRecord], bool]:
    """Split the script's framed stdout into one record per command.

    Frame per command (`M` = the per-run marker, unknowable to the node's commands):
        M begin NAME CMD_JSON\\n  STDOUT  \\nM end NAME RC [missing|timeout]\\n  STDERR\\nM done NAME\\n
    and `M fin` after the last command. The newline before `M end`/`M done` is the script's own, so
    STDOUT/STDERR are byte-exact. Returns the records and whether the script reached `fin`. A
    section cut short (ssh dropped, the task timed out) keeps what arrived, with rc None."""
    if len(marker) < 16:
        raise ValueError("the stream marker must be at least 16 characters (unguessable by the node)")
    records: list[StreamRecord] = []
    begin = f"{marker} begin "
    pos = stream.find(begin)
    while pos >= 0:
        header, body = _frame_line(stream, pos + len(begin))
        name, _, cmd_json = header.partition(" ")
        try:
            cmd = json.loads(cmd_json) if cmd_json else None
        except ValueError:
            cmd = cmd_json
        record = StreamRecord(name=name, cmd=cmd)
        records.append(record)
        end_tag = f"\n{marker} end {name} "
        end = stream.find(end_tag, body)
        if end < 0:
            record.stdout = stream[body:].split(f"\n{marker} ", 1)[0]
            record.stderr = "the node's answer ended inside this command (connection lost or task timeout)"
            break
        record.stdout = stream[body:end]
        status, after = _frame_line(stream, end + len(end_tag))
        fields = status.split()
        record.rc = int(fields[0]) if fields and fields[0].lstrip("-").isdigit() else None
        record.missing = "missing" in fields[1:]
        record.timed_out = "timeout" in fields[1:]
        done = stream.find(f"\n{marker} done {name}\n", after)
        if done < 0:
            record.stderr = stream[after:].split(f"\n{marker} ", 1)[0]
            break
        record.stderr = stream[after:done] if done >= after else ""
        record.complete = True
        pos = stream.find(begin, done + 1)
    return records, f"\n{marker} fin\n" in f"\n{stream}"


def _inputs_from(record: StreamRecord) -> Any:
    try:
        return json.loads(record.stdout)
    except ValueError:
        return {"unreadable_inputs": record.stdout[:2000]}


def _evidence_stdout(record: StreamRecord, secrets: list[str], read: set[str] | None = None) -> str:
    """Every output redacted; an environment by allow-list (core/redact.py redact_env: a value is kept only for a
    variable a check reads, `read` naming the node's launch environment): the env dump (sorted, stable diffs
    between runs), the serving process's environment, an image's Env."""
    text, read = record.stdout, read or set()
    if record.name == "env":
        return redact_env_text(text, read, secrets)
    if record.name == "live_process":   # the serving process's argv and environment (roles/preflight/files)
        try:
            data = json.loads(text)
        except ValueError:
            return redact_text(text, secrets)
        if isinstance(data, dict) and isinstance(data.get("env"), dict):
            data["env"] = redact_env(data["env"], read, secrets)
        return json.dumps(redact_obj(data, secrets), indent=1, sort_keys=True) + "\n"
    if record.name == "image_inspect":
        return _image_inspect_evidence(text, read, secrets)
    return redact_text(text, secrets)


def _image_inspect_evidence(text: str, read: set[str], secrets: list[str]) -> str:
    """An image's inspect JSON with every `Env` list by allow-list (`docker|podman image inspect`: Config.Env,
    ContainerConfig.Env; `crictl inspecti`: info.imageSpec.config.Env); the rest as it is, redacted. Text that is
    not JSON (an error) is redacted text."""
    try:
        data = json.loads(text)
    except ValueError:
        return redact_text(text, secrets)
    return json.dumps(redact_obj(_env_lists_allowed(data, read, secrets), secrets), indent=4) + "\n"


def _env_lists_allowed(data: Any, read: set[str], secrets: list[str]) -> Any:
    if isinstance(data, dict):
        return {k: redact_env_list(v, read, secrets) if k == "Env" and isinstance(v, list)
                else _env_lists_allowed(v, read, secrets) for k, v in data.items()}
    if isinstance(data, list):
        return [_env_lists_allowed(v, read, secrets) for v in data]
    return data


def _launch_env_names(records: list[StreamRecord], inputs: Any) -> set[str]:
    """The variables the node's launch sets (its inputs' `launch_env`: the profile's and the inventory's): their
    values are read by the checks (interconnect.nccl_env, the live-launch comparison), so evidence keeps them."""
    for record in records:
        if record.name == "inputs" and record.complete:
            inputs = _inputs_from(record)
    env = inputs.get("launch_env") if isinstance(inputs, dict) else None
    return {str(k) for k in env} if isinstance(env, dict) else set()


@dataclass
class SavedNode:
    written: list[str]          # evidence names, `inputs` last
    incomplete: list[str]       # commands whose section the answer did not finish
    finished: bool              # the script reached its end marker


def save_node_stream(host_directory: Path, node: NodeStream, secrets: list[str] | None = None,
                     read: set[str] | None = None) -> SavedNode:
    """Write one answered node's evidence: `<name>.txt` (stdout) and `<name>.json` (meta: cmd, rc,
    stderr, missing, timed_out) per command, `inputs.*`, and `stream.json` (how the answer ended).
    Creating the directory is what marks the node as reached (see `unreachable`)."""
    secrets = [s for s in (secrets or []) if s]
    base = Path(host_directory)
    records, finished = split_stream(node.stdout, node.marker)
    written = []
    inputs: Any = node.inputs
    read = _launch_env_names(records, inputs) | (read or set())
    for record in records:
        if not _NAME.fullmatch(record.name):
            raise ValueError(f"bad evidence name {record.name!r} in the node's answer")
        if record.name == "inputs":      # the role's own record, echoed by the node's script
            inputs = _inputs_from(record) if record.complete else inputs
            continue
        meta = {"cmd": record.cmd, "rc": record.rc, "stderr": redact_text(record.stderr.rstrip("\n"), secrets),
                "missing": record.missing, "timed_out": record.timed_out}
        atomic_write(base / f"{record.name}.txt", _evidence_stdout(record, secrets, read))
        atomic_write(base / f"{record.name}.json", json.dumps(meta, indent=2) + "\n")
        written.append(record.name)
    atomic_write(base / "inputs.txt", json.dumps(redact_obj(inputs, secrets), indent=2, default=str) + "\n")
    atomic_write(base / "inputs.json",
                 json.dumps({"cmd": "roles/preflight inputs", "rc": 0, "stderr": "", "missing": False}) + "\n")
    transport = {"frame": FRAME_VERSION, "finished": finished, "script_rc": node.rc,
                 "script_stderr": redact_text(node.stderr or "", secrets)[-4000:], "records": written,
                 "incomplete": [r.name for r in records if not r.complete]}
    atomic_write(base / "stream.json", json.dumps(transport, indent=2) + "\n")
    return SavedNode(written=written + ["inputs"], incomplete=transport["incomplete"], finished=finished)


def save_node_streams(run_dir: Path, nodes: dict[str, NodeStream],
                      secrets: list[str] | None = None) -> dict[str, SavedNode]:
    """`save_node_stream` for every node that answered; a host not given here gets no directory,
    so the judge reports it unreachable. The run's profile names the launch variables evidence keeps."""
    out = {}
    read = run_profile_env_names(Path(run_dir))
    for host, node in nodes.items():
        if not _NAME.fullmatch(host):
            raise ValueError(f"bad host name {host!r} for an evidence directory")
        out[host] = save_node_stream(host_dir(Path(run_dir), host), node, secrets, read)
    return out


def profile_env_names(profile: Profile) -> set[str]:
    """Every variable the profile's launch names (launch.env, site_env, each interconnect's multi-node env, the
    DMA-BUF workaround): the checks read their values (interconnect.nccl_env on the plan or the running server)."""
    launch = profile.model.launch
    multinode = launch.multinode
    return {str(name) for env in (launch.env, launch.site_env, multinode.rdma.env, multinode.nvlink.env,
                                  multinode.nvl_env, multinode.dmabuf_workaround_env) for name in env}


def run_profile_env_names(run_dir: Path) -> set[str]:
    """profile_env_names of the run's frozen profile; none when the run has no readable one (a bare evidence
    directory): the allow-list's own names still apply (core/redact.py)."""
    try:
        return profile_env_names(RunDir(run_dir).profile())
    except (ConfigError, OSError, ValueError):
        return set()


def unreachable(run_dir: Path, hosts: list[str]) -> list[str]:
    """Hosts that left no evidence directory at all: the role creates a host's directory only
    after the node answered (save_node_streams), so these are the nodes that never did."""
    return [h for h in hosts if not host_dir(Path(run_dir), h).is_dir()]


# Where the connection errors of the nodes that never answered are kept
# (docs/acceptance.md "Unreachable nodes and refused inputs").
UNREACHABLE_EVIDENCE = "evidence/preflight-unreachable.json"
# An SSH error is a few lines; anything longer is cut (the start names the cause: refused, timed out, denied).
_ERROR_CHARS = 2000


def save_unreachable(run_dir: Path, errors: dict[str, str], secrets: list[str] | None = None) -> dict[str, str]:
    """Record each node that could not be reached with its connection error, redacted (core/redact.py):
    Ansible's own message, e.g. `Failed to connect to the host via ssh: ssh: connect to host 10.0.0.7 port 22:
    Connection refused`. Merged with earlier records of the run; returns what the file now holds."""
    path = RunDir(Path(run_dir)).at(UNREACHABLE_EVIDENCE)
    kept = read_unreachable(run_dir)
    for host, error in errors.items():
        if not _NAME.fullmatch(host):
            raise ValueError(f"bad host name {host!r} for an unreachable record")
        text = redact_text(str(error or "no error message").strip(), [s for s in (secrets or []) if s])
        kept[host] = text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + " ..."
    if errors:
        atomic_write(path, json.dumps(kept, indent=2, sort_keys=True) + "\n")
    return kept


def read_unreachable(run_dir: Path) -> dict[str, str]:
    """Host -> connection error of the nodes preflight could not reach (empty when all answered)."""
    path = RunDir(Path(run_dir)).at(UNREACHABLE_EVIDENCE)
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


# The controller's resolution of the attached server's URL host (rules/live_server.py binds the URL to a node by it).
URL_EVIDENCE = "evidence/preflight-url.json"


def resolve_url_host(url: str, resolve: Any = socket.getaddrinfo) -> dict[str, Any]:
    """The URL's host and the addresses this controller reaches it at (getaddrinfo, as the probes' connections
    resolve it), with the controller's network namespace (a loopback address is a node only where that node shares
    it); `error` where the name does not resolve."""
    try:
        host = urlsplit(url).hostname
    except ValueError as exc:
        return {"host": None, "addresses": [], "error": f"unreadable URL: {exc}"}
    out: dict[str, Any] = {"host": host, "addresses": [], "controller_netns": local_netns()}
    if not host:
        return {**out, "error": "the URL names no host"}
    try:
        answers = resolve(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        return {**out, "error": f"{host} does not resolve here: {exc}"}
    out["addresses"] = sorted({str(a[4][0]).split("%", 1)[0] for a in answers})
    return out


def save_url_resolution(run_dir: Path) -> dict[str, Any] | None:
    """Attach mode: record where the controller reaches vllm_base_url (URL_EVIDENCE); None outside attach mode."""
    variables = run_inventory_vars(Path(run_dir))
    if variables.get("vllm_serve_mode") != "attach" or not variables.get("vllm_base_url"):
        return None
    resolved = resolve_url_host(str(variables["vllm_base_url"]))
    atomic_write(RunDir(Path(run_dir)).at(URL_EVIDENCE), json.dumps(resolved, indent=2, sort_keys=True) + "\n")
    return resolved


def read_url_resolution(run_dir: Path) -> dict[str, Any] | None:
    """What save_url_resolution recorded; None when nothing was (or it is unreadable)."""
    path = RunDir(Path(run_dir)).at(URL_EVIDENCE)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
