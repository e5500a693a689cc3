"""Build a preflight evidence directory from a recorded node case, the way the role lays it out."""

from __future__ import annotations

import json
from pathlib import Path

NODES = Path(__file__).resolve().parent.parent / "fixtures" / "generated-nodes"
CASES = sorted(p.name for p in NODES.iterdir() if (p / "case.json").is_file())

# evidence name -> (fixture file, rc when the file exists, tool that produces it)
MAP = {
    "nvidia_smi": ("nvidia-smi.txt", "nvidia-smi"),
    "nvidia_smi_query": ("nvidia-smi-query.csv", "nvidia-smi"),
    "nvidia_smi_xml": ("nvidia-smi-q.xml", "nvidia-smi"),
    "lsmod": ("lsmod.txt", "lsmod"),
    "fabricmanager_version": ("nv-fabricmanager-version.txt", "nv-fabricmanager"),
    "runtime_version": ("docker-version.json", "docker"),
    "runtime_info": ("docker-info.json", "docker"),
    "image_inspect": ("docker-image-inspect.json", "docker"),
    "ibv_devinfo": ("ibv_devinfo.txt", "ibv_devinfo"),
    "rdma_link": ("rdma-link.txt", "rdma"),
    "nccl_allreduce": ("all_reduce_perf.txt", "all_reduce_perf"),
}


def _write(base: Path, name: str, stdout: str, rc: int, stderr: str = "", missing: bool = False) -> None:
    (base / f"{name}.txt").write_text(stdout)
    (base / f"{name}.json").write_text(json.dumps({"cmd": name, "rc": rc, "stderr": stderr, "missing": missing}))


def build_evidence(case: str, run_dir: Path, host: str = "gb300-n01", image: str = "vllm/vllm-openai:kimi-k3",
                   image_digest: str | None = None, launch: dict | None = None) -> Path:
    src = NODES / case
    base = run_dir / "evidence" / "preflight" / host
    base.mkdir(parents=True, exist_ok=True)
    # run.open_run copies the judged profile into every run; the recipe record points at it.
    profile = NODES.parents[2] / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml"   # the node fixtures' 8-GPU model
    (run_dir / "evidence" / "profile.yml").write_text(profile.read_text())
    for name, stdout in (("date_u", "Fri Aug 28 09:14:01 UTC 2026\n"), ("hostname", f"{host}\n"),
                         ("uname_a", f"Linux {host} 6.8.0-1031-nvidia-64k #33-Ubuntu SMP PREEMPT_DYNAMIC "
                                     "aarch64 aarch64 aarch64 GNU/Linux\n"),
                         ("env", "HOME=/root\nHF_TOKEN=***REDACTED***\nPATH=/usr/bin\n")):
        _write(base, name, stdout, 0)
    for name, (filename, tool) in MAP.items():
        path = src / filename
        if path.is_file():
            _write(base, name, path.read_text(), 0)
        else:
            _write(base, name, "", 2, f"[Errno 2] No such file or directory: b'{tool}'", missing=True)
    version_file = src / "proc-driver-nvidia-version"
    if version_file.is_file():
        _write(base, "driver_version", version_file.read_text(), 0)
    else:
        _write(base, "driver_version", "", 1, "cat: /proc/driver/nvidia/version: No such file or directory")
    fm = src / "systemctl-is-active-nvidia-fabricmanager.txt"
    if fm.is_file():
        state = fm.read_text()
        _write(base, "fabricmanager_active", state, 0 if state.strip() == "active" else 3)
    else:
        _write(base, "fabricmanager_active", "inactive\n", 3)
    probe = src / "probe.json"
    if probe.is_file():
        _write(base, "image_probe", probe.read_text(), 0)
    else:
        _write(base, "image_probe", "", 125, (src / "docker-run.stderr").read_text())
    inputs = {"image": image, "image_digest": image_digest, "runtime": "docker"}
    inputs.update(launch or {})
    _write(base, "inputs", json.dumps(inputs), 0)
    return base
