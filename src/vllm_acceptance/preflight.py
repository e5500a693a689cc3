"""Preflight judge: the compatibility chain of every GPU node, from evidence saved by the role.

The role (roles/preflight) runs stock commands on the nodes and saves raw output on the
controller; this module only reads those files. Usable without Ansible:

    from vllm_acceptance.preflight import judge
    findings = judge(Path("reports/site/run"), load_profile("profiles/kimi-k3.yml"), ["gpu-01", "gpu-02"])
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from .findings import Finding
from .parsers.node_evidence import host_dir, load_node_evidence
from .parsers.startup_log import StartupScan
from .profile import Profile
from .rules.compat import NODE_RULES, NodeContext, check_recipe_record, check_topology

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
    findings = [check_recipe_record(profile, today)]
    contexts = node_contexts(run_dir, profile, hosts, startup_scans)
    for ctx in contexts:
        findings.extend(rule(ctx) for rule in NODE_RULES)
    if contexts:
        findings.append(check_topology(contexts, profile))
    return findings


def unreachable(run_dir: Path, hosts: list[str]) -> list[str]:
    """Hosts that left no evidence directory at all."""
    return [h for h in hosts if not host_dir(Path(run_dir), h).is_dir()]
