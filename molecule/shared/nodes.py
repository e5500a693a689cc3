"""Each platform's node for the scenarios that share molecule/shared/create.yml and destroy.yml.

A platform (molecule.yml) names how its namespace host's /usr/local/bin is made, with the project's own
builders (nothing copied here):

- `node_tree: CASE`: a rehearsal node (vllm_acceptance.lab.rehearsal.node_tree): the recorded tools of
  tests/fixtures/generated-nodes/CASE, `docker` the container stand-in whose `run -d` starts the real lab
  vLLM (lab/container_standin.py), `nvidia-smi` the GPU memory stand-in (lab/gpu_memory_standin.py);
- `fakenode_driver: VERSION`: the stateful fake GPU node of the rebuild tests (tests/fixtures/rebuild/fakenode.py);
- `tools: {TOOL: PATH}` (with either): these tools replaced by PATH (relative to the project), e.g. a scenario's
  scheduler stand-in.

    python molecule/shared/nodes.py build --workdir DIR --platforms JSON   -> prints ["--host=NAME=BIN", ...]
    python molecule/shared/nodes.py clean --workdir DIR                     (what a node left running, stopped)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parents[2]
CONTAINER_MARK = "containers"


def build(workdir: Path, platforms: list[dict[str, Any]]) -> list[str]:
    from vllm_acceptance.lab.rehearsal import node_tree

    sys.path.insert(0, str(PROJECT / "tests" / "fixtures" / "rebuild"))
    import fakenode  # type: ignore[import-not-found]  # the rebuild tests' node builder

    hosts = []
    for platform in platforms:
        name, node_dir = platform["name"], workdir / platform["name"]
        if "node_tree" in platform:
            bin_dir = node_tree(str(platform["node_tree"]), node_dir)
        elif "fakenode_driver" in platform:
            bin_dir = fakenode.make_node(node_dir / "bin", str(platform["fakenode_driver"]))
        else:
            raise SystemExit(f"platform {name}: give node_tree (a generated-nodes case) or fakenode_driver")
        for tool, source in (platform.get("tools") or {}).items():
            link = bin_dir / tool
            link.unlink(missing_ok=True)
            link.symlink_to(PROJECT / source)
        hosts.append(f"--host={name}={bin_dir}")
    return hosts


def clean(workdir: Path) -> list[str]:
    """Stop what a rehearsal node's runtime still runs (the container stand-in's `rm -f`, its cgroup removed with it)
    and a GPU memory sampler the role left (its pid file names it; only an nvidia-smi or the role's cgroup sampler
    is signalled)."""
    from vllm_acceptance.lab.container_standin import docker_cgroup, remove_cgroup

    done = []
    for node_dir in sorted(p for p in workdir.glob("*") if p.is_dir()):
        state = node_dir / "state"
        for box in sorted((state / CONTAINER_MARK).glob("*")) if (state / CONTAINER_MARK).is_dir() else []:
            subprocess.run([str(node_dir / "bin" / "docker"), "rm", "-f", box.name], capture_output=True, timeout=120)
            done.append(f"{node_dir.name}: container {box.name} removed")
        for path in state.glob("removed-*-id") if state.is_dir() else []:
            remove_cgroup(docker_cgroup(path.read_text().strip()))
        for pid_file in Path("/tmp").glob(f"vllm-acceptance-gpu-memory-*-{node_dir.name}*.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"nvidia-smi" in cmdline or b"vllm-acceptance-cgroup-sampler" in cmdline:
                    os.kill(pid, signal.SIGTERM)
                    done.append(f"{node_dir.name}: sampler {pid} stopped")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("action", choices=["build", "clean"])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--platforms", default="[]", help="molecule.yml's platforms, as JSON")
    args = parser.parse_args(argv)
    if args.action == "build":
        args.workdir.mkdir(parents=True, exist_ok=True)
        print(json.dumps(build(args.workdir, json.loads(args.platforms))))
    else:
        print(json.dumps(clean(args.workdir) if args.workdir.is_dir() else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
