"""A `crictl` stand-in for rehearsal nodes: the containers of the Kubernetes pods a scenario placed on the node.

There is no kubelet or containerd here. A scenario that attaches to a server in a pod (rehearsal.py, attach-pod)
starts the real lab vLLM in a real cgroup named as containerd's CRI plugin names a pod container
(`kubepods.slice/.../cri-containerd-<id>.scope`) and writes that container's `crictl inspect -o json` answer to
STATE/cri/<id>.json, built from a real capture (tests/fixtures/real/container-inspect/
crictl-inspect-containerd-1.7.json: the id, image, image ref and pid replaced). This script answers
`crictl inspect [-o json] ID` from it, and NotFound in crictl's words for any other id; every call is recorded
in STATE/crictl-calls.jsonl. Stdlib only (run by the node's /usr/bin/python3).

    crictl_standin.py --state DIR [--] CRICTL-ARGS...
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--state":
        sys.stderr.write("usage: crictl_standin.py --state DIR [--] CRICTL-ARGS...\n")
        return 2
    state, args = Path(argv[1]), [a for a in argv[2:] if a != "--"]
    state.mkdir(parents=True, exist_ok=True)
    with (state / "crictl-calls.jsonl").open("a") as calls:
        calls.write(json.dumps({"t": time.time(), "argv": ["crictl", *args]}) + "\n")
    if not args or args[0] != "inspect":
        sys.stderr.write(f"crictl stand-in: only `inspect` is answered here, not {args[:1]}\n")
        return 1
    ids = [a for a in args[1:] if not a.startswith("-") and a not in ("json", "yaml", "table")]
    if len(ids) != 1:
        sys.stderr.write("FATA[0000] ID cannot be empty\n")
        return 1
    target = ids[0]
    found = [p for p in sorted((state / "cri").glob("*.json")) if p.stem.startswith(target)] \
        if (state / "cri").is_dir() else []
    if len(found) != 1:
        sys.stderr.write(f'FATA[0000] getting the status of the container "{target}": rpc error: code = NotFound '
                         f'desc = an error occurred when try to find container "{target}": not found\n')
        return 1
    sys.stdout.write(found[0].read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
