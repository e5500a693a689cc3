"""Preflight judge: the compatibility chain of every GPU node, from evidence saved by the role.

The role (roles/preflight) runs stock commands on the nodes and saves raw output on the
controller; this module only reads those files. Usable without Ansible:

    from vllm_acceptance.preflight import judge
    findings = judge(Path("reports/site/run"), load_profile("profiles/kimi-k3.yml"), ["gpu-01", "gpu-02"])
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

from .evidence import atomic_write
from .findings import Finding
from .parsers.node_evidence import host_dir, load_node_evidence
from .parsers.startup_log import StartupScan
from .profile import Profile
from .rules.compat import NODE_RULES, NodeContext, check_recipe_record, check_topology
from .run import record_profile

FINDINGS_NAME = "preflight.json"


def node_contexts(run_dir: Path, profile: Profile, hosts: list[str],
                  startup_scans: dict[str, StartupScan] | None = None) -> list[NodeContext]:
    startup_scans = startup_scans or {}
    return [NodeContext(evidence=load_node_evidence(Path(run_dir), host), profile=profile, n_hosts=len(hosts),
                        startup_scan=startup_scans.get(host)) for host in hosts]


def judge(run_dir: Path, profile: Profile, hosts: list[str], *, today: dt.date | None = None,
          startup_scans: dict[str, StartupScan] | None = None) -> list[Finding]:
    """Every compatibility finding of the run: the recipe record once, each rule per host, the
    cluster topology once. A host without evidence gets `missing` for each required check."""
    hosts = list(dict.fromkeys(hosts))          # keep order, drop repeats
    record_profile(run_dir, profile)            # also when preflight.yml runs on its own
    findings = [check_recipe_record(profile, today)]
    contexts = node_contexts(run_dir, profile, hosts, startup_scans)
    for ctx in contexts:
        findings.extend(rule(ctx) for rule in NODE_RULES)
    if contexts:
        findings.append(check_topology(contexts, profile))
    return findings


def unpack_bundle(host_directory: Path) -> list[str]:
    """Explode the role's bundle.json into `<name>.txt` (raw stdout) and `<name>.json` (meta) per
    command, atomically. Returns the names written. The bundle stays as the original record."""
    bundle = json.loads((Path(host_directory) / "bundle.json").read_text())
    written = []
    for record in bundle.get("records", []):
        name = str(record["name"])
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad evidence name {name!r}")
        meta = {k: record.get(k) for k in ("cmd", "rc", "stderr", "missing", "timed_out")}
        atomic_write(Path(host_directory) / f"{name}.txt", str(record.get("stdout") or ""))
        atomic_write(Path(host_directory) / f"{name}.json", json.dumps(meta, indent=2) + "\n")
        written.append(name)
    inputs = bundle.get("inputs") or {}
    atomic_write(Path(host_directory) / "inputs.txt", json.dumps(inputs, indent=2, default=str) + "\n")
    atomic_write(Path(host_directory) / "inputs.json",
                 json.dumps({"cmd": "roles/preflight inputs", "rc": 0, "stderr": "", "missing": False}) + "\n")
    return written + ["inputs"]


def main(argv: list[str] | None = None) -> int:
    """`python -m vllm_acceptance.preflight unpack HOST_DIR` (run by the role on the controller)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "unpack":
        print("usage: python -m vllm_acceptance.preflight unpack <run_dir>/evidence/preflight/<host>",
              file=sys.stderr)
        return 2
    try:
        names = unpack_bundle(Path(args[1]))
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot unpack {args[1]}/bundle.json: {exc}", file=sys.stderr)
        return 1
    print(f"{len(names)} evidence records in {args[1]}")
    return 0


def unreachable(run_dir: Path, hosts: list[str]) -> list[str]:
    """Hosts that left no evidence directory at all."""
    return [h for h in hosts if not host_dir(Path(run_dir), h).is_dir()]


if __name__ == "__main__":
    sys.exit(main())
