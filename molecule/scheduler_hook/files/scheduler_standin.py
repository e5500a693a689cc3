#!/usr/bin/python3
"""A stateful stand-in of the scheduler commands roles/scheduler_hook runs (generated for this scenario, no capture):
`scontrol`, `squeue` (Slurm) and `kubectl` (Kubernetes), installed under those names in the admin host's bin dir.

Its cluster (STATE/scheduler.json, STATE = .state beside the command, made on first use from CLUSTER) holds the
nodes' scheduler state. What it does, as the real commands do it:
- `scontrol update nodename=N state=drain reason=R` marks N draining (running jobs go on); `state=resume` clears it;
  `scontrol show node N` prints N's State (IDLE/ALLOCATED, +DRAIN) and Reason; an unknown node fails (rc 1);
- `squeue --noheader --nodelist N --format %i` lists the ids of N's running jobs; a job ends after the number of
  polls it is given (the time it still runs, counted in the role's polls);
- `kubectl cordon|uncordon N` sets N's spec.unschedulable; `kubectl drain N ...` cordons it and evicts its pods
  (a DaemonSet's pod stays only with --ignore-daemonsets, else the drain fails as kubectl's does);
  `kubectl get node N -o jsonpath={.spec.unschedulable}`, `kubectl get pods --field-selector spec.nodeName=N -o name`.
Every call is appended to STATE/scheduler-calls.log (time, command, arguments).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# beside the command as the node sees it (its bin dir), not beside this file: the symlinks live in the bin dir
STATE = Path(sys.argv[0]).parent / ".state"
CLUSTER = {
    "slurm": {"gpu-a01": {"drain": False, "reason": "", "jobs": [{"id": "4242", "polls_left": 1}]},
              "gpu-a02": {"drain": False, "reason": "", "jobs": []}},
    "kubernetes": {"gpu-k01": {"unschedulable": False, "pods": [{"name": "default/llm-0", "daemonset": False},
                                                                {"name": "kube-system/nvidia-device-plugin-x7k2p",
                                                                 "daemonset": True}]},
                   "gpu-k02": {"unschedulable": False, "pods": [{"name": "default/llm-1", "daemonset": False}]}},
}


def load() -> dict:
    path = STATE / "scheduler.json"
    return json.loads(path.read_text()) if path.is_file() else json.loads(json.dumps(CLUSTER))


def save(cluster: dict) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / "scheduler.json").write_text(json.dumps(cluster, indent=2) + "\n")


def fail(message: str, rc: int = 1) -> int:
    sys.stderr.write(message + "\n")
    return rc


def options(args: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in args if "=" in a)


def scontrol(cluster: dict, args: list[str]) -> int:
    nodes = cluster["slurm"]
    if args[:1] == ["update"]:
        opts = {k.lower(): v for k, v in options(args[1:]).items()}
        node = nodes.get(opts.get("nodename", ""))
        if node is None:
            return fail("scontrol: error: Invalid node name specified")
        state = opts.get("state", "").lower()
        if state == "drain":
            if not opts.get("reason"):
                return fail("scontrol: error: You must specify a reason when DOWNING or DRAINING a node. "
                            "Request denied")
            node.update(drain=True, reason=opts["reason"])
        elif state == "resume":
            node.update(drain=False, reason="")
        else:
            return fail(f"scontrol: error: Invalid node state specified: {state}")
        save(cluster)
        return 0
    if args[:2] == ["show", "node"] and len(args) == 3:
        node = nodes.get(args[2])
        if node is None:
            return fail(f"Node {args[2]} not found")
        base = "ALLOCATED" if node["jobs"] else "IDLE"
        print(f"NodeName={args[2]} Arch=x86_64 CoresPerSocket=72\n   State={base}{'+DRAIN' if node['drain'] else ''}"
              + (f"\n   Reason={node['reason']} [root@{time.strftime('%Y-%m-%dT%H:%M:%S')}]" if node["drain"] else ""))
        return 0
    return fail(f"scontrol (stand-in): unsupported arguments: {args}")


def squeue(cluster: dict, args: list[str]) -> int:
    if "--nodelist" not in args:
        return fail(f"squeue (stand-in): unsupported arguments: {args}")
    node = cluster["slurm"].get(args[args.index("--nodelist") + 1])
    if node is None:
        return fail("squeue: error: Invalid node name specified")
    if "--noheader" not in args:
        print("JOBID")
    for job in node["jobs"]:
        print(job["id"])
        job["polls_left"] -= 1
    node["jobs"] = [j for j in node["jobs"] if j["polls_left"] > 0]
    save(cluster)
    return 0


def kubectl(cluster: dict, args: list[str]) -> int:
    nodes = cluster["kubernetes"]
    verb = args[0] if args else ""
    if verb in ("cordon", "uncordon", "drain"):
        name = args[1] if len(args) > 1 else ""
        node = nodes.get(name)
        if node is None:
            return fail(f'Error from server (NotFound): nodes "{name}" not found')
        if verb == "uncordon":
            node["unschedulable"] = False
            print(f"node/{name} uncordoned")
        else:
            node["unschedulable"] = True
            print(f"node/{name} cordoned")
        if verb == "drain":
            daemons = [p["name"] for p in node["pods"] if p["daemonset"]]
            if daemons and "--ignore-daemonsets" not in args:
                save(cluster)
                return fail(f"error: unable to drain node \"{name}\" due to error: cannot delete DaemonSet-managed "
                            f"Pods (use --ignore-daemonsets to ignore): {', '.join(daemons)}")
            for pod in [p for p in node["pods"] if not p["daemonset"]]:
                print(f"evicting pod {pod['name']}")
                print(f"pod/{pod['name'].split('/')[1]} evicted")
            node["pods"] = [p for p in node["pods"] if p["daemonset"]]
            print(f"node/{name} drained")
        save(cluster)
        return 0
    if args[:2] == ["get", "node"] and len(args) >= 3:
        node = nodes.get(args[2])
        if node is None:
            return fail(f'Error from server (NotFound): nodes "{args[2]}" not found')
        print("true" if node["unschedulable"] else "", end="")
        return 0
    if args[:2] == ["get", "pods"]:
        selector = next((a.split("=", 1)[1] for a in args if a.startswith("spec.nodeName=")), "")
        for pod in nodes.get(selector, {}).get("pods", []):
            print(f"pod/{pod['name'].split('/')[1]}")
        return 0
    return fail(f"kubectl (stand-in): unsupported arguments: {args}")


def main() -> int:
    tool, args = Path(sys.argv[0]).name, sys.argv[1:]
    cluster = load()
    STATE.mkdir(parents=True, exist_ok=True)
    with (STATE / "scheduler-calls.log").open("a") as log:
        log.write(json.dumps({"t": time.time(), "tool": tool, "args": args}) + "\n")
    commands = {"scontrol": scontrol, "squeue": squeue, "kubectl": kubectl}
    if tool not in commands:
        return fail(f"scheduler stand-in: called as {tool}; install it as scontrol, squeue or kubectl")
    return commands[tool](cluster, args)


if __name__ == "__main__":
    sys.exit(main())
