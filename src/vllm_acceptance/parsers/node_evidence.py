"""One node's preflight evidence as the role saved it on the controller.

Layout (written by roles/preflight through vllm_acceptance.preflight.stage.save_node_streams):
`<run_dir>/evidence/preflight/<host>/<name>.txt` holds the raw stdout of one stock command, byte for
byte, `<name>.json` its meta: {"cmd", "rc", "stderr", "missing", "timed_out"} where `missing` is true
when the binary was absent (rc 127) and `timed_out` when the node's `timeout` stopped it. `inputs` is
the role's own record of what it was asked to check (image reference, pinned digest, planned launch
args/env); `stream.json` says whether the node's answer arrived whole. A host directory exists only
for a node that answered.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.rundir import RunDir

EVIDENCE_SUBDIR = Path("evidence") / "preflight"

# name -> what it is: the commands of roles/preflight/templates/commands.yml.j2. A node check that is one file
# (rules/node/) brings its own commands; their records are read on demand (NodeEvidence.get) and shown by their argv.
COMMANDS = {
    "date_u": "date -u",
    "hostname": "hostname",
    "uname_a": "uname -a",
    "env": "env (by allow-list: values only of the variables a check reads, others by name; core/redact.py)",
    "lsmod": "lsmod",
    "nvidia_smi": "nvidia-smi",
    "nvidia_smi_query": "nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id "
                        "--format=csv,noheader",
    "nvidia_smi_xml": "nvidia-smi -q -x",
    "driver_version": "cat /proc/driver/nvidia/version",
    "fabricmanager_active": "systemctl is-active nvidia-fabricmanager",
    "fabricmanager_version": "nv-fabricmanager --version",
    "runtime_version": "docker|podman version --format '{{json .}}' (no docker/podman: crictl version)",
    "runtime_info": "docker|podman info --format '{{json .}}' (no docker/podman: crictl info)",
    "image_inspect": "docker|podman image inspect IMAGE (no docker/podman: crictl inspecti -o json IMAGE)",
    "image_probe": "docker|podman run --rm --gpus all --entrypoint python3 IMAGE -c PROBE (lab: python -c PROBE; "
                   "attached on a node without docker/podman: crictl exec CONTAINER python3 -c PROBE in the "
                   "running server's container)",
    "ibv_devinfo": "ibv_devinfo",
    "rdma_link": "rdma link",
    "nccl_allreduce": "all_reduce_perf -b 8M -e 8G -f 2 -g N",
    "nccl_allreduce_image": "docker|podman run --rm --gpus all --network host --entrypoint python3 IMAGE -c "
                            "<allreduce.py> (torch.distributed all-reduce across every node, where all_reduce_perf "
                            "is absent)",
    "image_pull": "docker|podman pull IMAGE (only when preflight_pull_image is set)",
    "launch_args_check": "docker|podman run --rm --gpus all --entrypoint python3 IMAGE -c <vllm_argcheck.py> JSON "
                         "(the head node only: vLLM's own checks of every node's command; lab: python -c)",
    "inputs": "the role's inputs (JSON)",
    "live_process": "ss -ltnpH; /proc/PID/cmdline, /proc/PID/environ and /proc/PID/cgroup of the process serving "
                    "the port, its container's image (docker/podman inspect --type container; crictl inspect for "
                    "containerd/CRI-O) (JSON, secrets "
                    "redacted: parsers/live.py)",
}


@dataclass
class CommandRecord:
    name: str
    present: bool = False            # the evidence file exists
    stdout: str = ""
    rc: int | None = None
    stderr: str = ""
    missing_tool: bool = False
    timed_out: bool = False
    cmd: Any = None
    paths: list[str] = field(default_factory=list)   # relative to the run dir, existing files only
    meta_error: str | None = None

    @property
    def ok(self) -> bool:
        """Ran, exited 0, produced the evidence file."""
        return self.present and self.rc == 0 and not self.missing_tool

    @property
    def shown(self) -> str:
        """The command as a person reads it: its description, else the argv the node ran, else its name."""
        if self.name in COMMANDS:
            return COMMANDS[self.name]
        if isinstance(self.cmd, list) and self.cmd:
            return " ".join(str(a) for a in self.cmd)
        return self.name

    def why_not(self) -> str:
        """One line for a `missing` finding: what is wrong with this piece of evidence."""
        if not self.present:
            return f"no evidence file for `{self.shown}`"
        if self.missing_tool:
            return f"`{self.shown}`: command not found on the node"
        if self.meta_error:
            return f"`{self.name}`: {self.meta_error}"
        if self.timed_out:
            return f"`{self.shown}` timed out on the node (rc {self.rc})"
        detail = (self.stderr or self.stdout).strip().splitlines()
        return f"`{self.shown}` exited {self.rc}" + (f": {detail[-1][:200]}" if detail else "")


@dataclass
class NodeEvidence:
    host: str
    run_dir: Path
    dir_exists: bool
    records: dict[str, CommandRecord] = field(default_factory=dict)

    def get(self, name: str) -> CommandRecord:
        """The record of command `name`; one outside COMMANDS (a rules/node/ check's own) is read on first use."""
        if name not in self.records and self.dir_exists:
            self.records[name] = _read_record(self.run_dir, host_dir(self.run_dir, self.host), name)
        return self.records.get(name) or CommandRecord(name=name)

    @property
    def inputs(self) -> dict[str, Any]:
        record = self.get("inputs")
        if not record.present:
            return {}
        try:
            data = json.loads(record.stdout)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}


def host_dir(run_dir: Path, host: str) -> Path:
    return RunDir(Path(run_dir)).at(EVIDENCE_SUBDIR, host)


def _read_record(run_dir: Path, base: Path, name: str) -> CommandRecord:
    record = CommandRecord(name=name)
    text_path, meta_path = base / f"{name}.txt", base / f"{name}.json"
    if text_path.is_file():
        record.present = True
        record.stdout = text_path.read_text(errors="replace")
        record.paths.append(str(text_path.relative_to(run_dir)))
    if meta_path.is_file():
        record.paths.append(str(meta_path.relative_to(run_dir)))
        try:
            meta = json.loads(meta_path.read_text(errors="replace"))
        except ValueError as exc:
            meta = {}
            record.meta_error = f"unreadable meta file: {exc}"
        if isinstance(meta, dict):
            rc = meta.get("rc")
            record.rc = rc if isinstance(rc, int) and not isinstance(rc, bool) else None
            record.stderr = str(meta.get("stderr") or "")
            record.missing_tool = bool(meta.get("missing"))
            record.timed_out = bool(meta.get("timed_out"))
            record.cmd = meta.get("cmd")
        if not record.present and record.missing_tool:
            record.present = True     # the absence of the tool is itself the recorded evidence
    elif record.present:
        record.meta_error = "no meta file (exit status unknown)"
    return record


def load_node_evidence(run_dir: Path, host: str) -> NodeEvidence:
    """Read every known command's evidence for one host; absent files give absent records."""
    run_dir = Path(run_dir)
    base = host_dir(run_dir, host)
    evidence = NodeEvidence(host=host, run_dir=run_dir, dir_exists=base.is_dir())
    if evidence.dir_exists:
        for name in COMMANDS:
            evidence.records[name] = _read_record(run_dir, base, name)
    return evidence
