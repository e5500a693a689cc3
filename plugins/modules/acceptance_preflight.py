#!/usr/bin/python
"""Ansible module: judge the preflight evidence of every GPU node (thin wrapper over the package)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_preflight
short_description: Save and judge the compatibility chain of the GPU nodes (preflight)
description:
  - C(action=unpack) (run once by the C(preflight) role) splits each answered node's framed C(raw) output into
    C(<run_dir>/evidence/preflight/<host>/<name>.txt) and C(<name>.json) (cmd, rc, stderr, missing, timed_out),
    secrets redacted. Only nodes that answered get a directory; a node without one is unreachable.
  - C(action=judge) reads that evidence and writes the findings to C(<run_dir>/findings/preflight.json), and
    records the hosts that left no evidence as C(unreachable_hosts) in C(<run_dir>/run.json), which the report
    and the verdict read.
  - A host without evidence (unreachable) or with a missing tool gets C(missing) findings, never a pass.
  - Runs on the controller; needs the C(vllm_acceptance) package in the interpreter that runs it.
  - Check mode writes nothing for C(judge); C(unpack) saves read-only evidence in check mode too (the role
    sets C(check_mode=false) on it so that C(--check) runs show the real chain).
options:
  action:
    description: C(judge) the saved evidence, or C(unpack) the nodes' answers into evidence.
    type: str
    choices: [judge, unpack]
    default: judge
  hosts:
    description: Every GPU node of the inventory, reachable or not. Required for C(judge).
    type: list
    elements: str
  nodes:
    description:
      - C(unpack) only. Inventory host name -> that node's answer, the registered result of the role's C(raw) task
        (C(stdout), C(stderr), C(rc)) plus C(marker), the per-run frame marker its script printed (16+ characters),
        and C(inputs), the role's record of what it was asked to check.
      - Give only the nodes that answered; absent nodes get no evidence directory.
    type: dict
  unreachable:
    description:
      - C(unpack) only. Inventory host name -> the connection error of a node that could not be reached (the C(msg) of
        the role's C(raw) result when it is C(unreachable)). Saved redacted in
        C(<run_dir>/evidence/preflight-unreachable.json); the report names each node with its error.
    type: dict
    default: {}
  secrets:
    description: C(unpack) only. Literal secret values redacted besides the pattern-based redaction.
    type: list
    elements: str
    default: []
  reach_only:
    description:
      - C(judge) only. Hosts whose reachability was checked but that are not judged (no GPU evidence), such as a
        C(vllm_head) outside C(gpu_nodes) in attach mode (playbooks/preflight.yml). One recorded unreachable by
        C(unpack) is added to C(unreachable_hosts), so the later plays leave it out and the run still reaches its
        verdict (C(incomplete), the host named).
    type: list
    elements: str
    default: []
  findings_name:
    description: File name under C(<run_dir>/findings/).
    type: str
    default: preflight.json
  cluster:
    description:
      - C(judge) only. Every GPU node of the cluster when I(hosts) are some of its members re-checked after a
        change (playbooks/tasks/rebuild_node.yml) - they are judged with the cluster's expectations (multi-node,
        so peer memory and RDMA apply).
    type: list
    elements: str
  reference_run_dir:
    description: C(judge) with I(cluster) only. Run directory holding the other members' preflight evidence (topology,
      image uniformity).
    type: path
extends_documentation_fragment:
  - vllm.acceptance.acceptance
  - vllm.acceptance.acceptance.profile
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Save every answered node's evidence (what roles/preflight does)
  acceptance_preflight:
    action: unpack
    run_dir: "{{ acceptance_run_dir }}"
    nodes:
      gpu-01:
        stdout: "...framed answer..."
        stderr: ""
        rc: 0
        marker: "@@preflight-x1Yz..."
        inputs: {runtime: docker}
  delegate_to: localhost
  run_once: true

- name: Judge the compatibility chain
  acceptance_preflight:
    run_dir: "{{ acceptance_run_dir }}"
    hosts: "{{ groups['gpu_nodes'] }}"
  register: preflight_judgement
"""

RETURN = r"""
saved:
  description: C(unpack) only. Host -> evidence names written.
  type: dict
  returned: when action is unpack
incomplete:
  description: C(unpack) only. C(host:name) of every command whose section the node's answer did not finish.
  type: list
  elements: str
  returned: when action is unpack
unfinished:
  description: C(unpack) only. Hosts whose script did not reach its end (answer cut short).
  type: list
  elements: str
  returned: when action is unpack
down:
  description: C(unpack) only. Host -> redacted connection error of every node recorded unreachable in this run.
  type: dict
  returned: when action is unpack
findings_path:
  description: Where the findings were written (not written in check mode).
  type: str
  returned: when action is judge
counts:
  description: Number of findings per status.
  type: dict
  returned: when action is judge
  sample: {pass: 10, fail: 1, not_applicable: 3}
failed_checks:
  description: C(check@host) of every failed finding.
  type: list
  elements: str
  returned: when action is judge
missing_checks:
  description: C(check@host) of every missing or inconclusive finding.
  type: list
  elements: str
  returned: when action is judge
unreachable_hosts:
  description: Hosts that left no evidence directory (the node never answered); also written to run.json.
  type: list
  elements: str
  returned: when action is judge
unreachable_errors:
  description: Host -> its recorded connection error, for every unreachable host; also written to run.json.
  type: dict
  returned: when action is judge
findings:
  description: The findings as dicts (report shape).
  type: list
  elements: dict
  returned: when action is judge
"""

import traceback
from pathlib import Path

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.preflight.stage import (
        NodeStream,
        judge,
        read_unreachable,
        save_node_streams,
        save_unreachable,
        save_url_resolution,
        stage_details,
        unreachable,
    )
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
else:
    IMPORT_ERROR = None


def _label(finding) -> str:
    return f"{finding.check}@{finding.host}" if finding.host else finding.check


def _node(module: AcceptanceModule, host: str, answer) -> NodeStream:
    """One node's registered raw result + the role's marker and inputs, as a NodeStream."""
    marker = answer.get("marker") if isinstance(answer, dict) else None
    if not isinstance(marker, str) or len(marker) < 16:
        module.fail_json(msg=f"nodes.{host}: give the node's answer as a dict with stdout, rc, stderr, inputs and "
                             "the frame marker (16+ characters) its script printed, as roles/preflight does")
    rc = answer.get("rc")
    inputs = answer.get("inputs")
    return NodeStream(stdout=str(answer.get("stdout") or ""), marker=marker, stderr=str(answer.get("stderr") or ""),
                      rc=rc if isinstance(rc, int) else None, inputs=inputs if isinstance(inputs, dict) else {})


def _errors(run_dir: Path, down: list[str]) -> dict[str, str]:
    """Each unreachable host's recorded connection error (docs/acceptance.md "Unreachable nodes and refused inputs")."""
    recorded = read_unreachable(run_dir)
    return {host: recorded.get(host, "no answer recorded (the node was left out before its preflight ran)")
            for host in down}


def run_unpack(module: AcceptanceModule) -> None:
    params = module.params
    nodes = {host: _node(module, host, answer) for host, answer in (params["nodes"] or {}).items()}
    try:
        saved = save_node_streams(Path(params["run_dir"]), nodes, params["secrets"])
        save_url_resolution(Path(params["run_dir"]))    # attach: where the controller reaches vllm_base_url
        down = save_unreachable(Path(params["run_dir"]), {str(h): str(e) for h, e in params["unreachable"].items()},
                                params["secrets"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"cannot save the preflight evidence under {params['run_dir']}: {exc}; "
                             "check that the run directory is writable and the host names are plain names")
    incomplete = [f"{host}:{name}" for host, node in saved.items() for name in node.incomplete]
    unfinished = [host for host, node in saved.items() if not node.finished]
    # Not `unreachable` as a result key: a true `unreachable` in a module result marks localhost unreachable.
    module.exit_json(changed=bool(saved) or bool(params["unreachable"]),
                     saved={host: node.written for host, node in saved.items()},
                     incomplete=incomplete, unfinished=unfinished, down=down)


def run_judge(module: AcceptanceModule) -> None:
    params = module.params
    run, profile = module.run(), module.profile()
    hosts = params["hosts"]
    findings = module.guard(judge, run.path, profile, hosts, cluster=params["cluster"],
                            reference_run_dir=params["reference_run_dir"])
    recorded = read_unreachable(run.path)
    down = unreachable(run.path, hosts) + [h for h in params["reach_only"] if h in recorded and h not in hosts]
    stage = params["findings_name"].removesuffix(".json")
    path = run.findings_path(stage)
    if not module.check_mode:
        run.write_findings(stage, findings)
        run.write_stage(stage, stage_details(run.path, profile, hosts))
        # The report and the verdict read unreachable hosts from run.json (report/build.py). The result
        # key is not `unreachable`: a true `unreachable` in a module result makes Ansible mark localhost
        # itself unreachable.
        run.update(unreachable_hosts=down, unreachable_errors=_errors(run.path, down))
    counts: dict[str, int] = {}
    for finding in findings:
        counts[finding.status.value] = counts.get(finding.status.value, 0) + 1
    module.exit_json(
        changed=not module.check_mode, findings_path=str(path), counts=counts,
        failed_checks=[_label(f) for f in findings if f.status.value == "fail"],
        missing_checks=[_label(f) for f in findings if f.status.value in ("missing", "inconclusive")],
        unreachable_hosts=down, unreachable_errors=_errors(run.path, down), findings=[f.to_dict() for f in findings])


def main() -> None:
    module = AcceptanceModule(
        argument_spec={
            "action": {"type": "str", "choices": ["judge", "unpack"], "default": "judge"},
            "hosts": {"type": "list", "elements": "str"},
            "findings_name": {"type": "str", "default": "preflight.json"},
            "reach_only": {"type": "list", "elements": "str", "default": []},
            "cluster": {"type": "list", "elements": "str"},
            "reference_run_dir": {"type": "path"},
            "nodes": {"type": "dict"},
            "unreachable": {"type": "dict", "default": {}},
            "secrets": {"type": "list", "elements": "str", "default": [], "no_log": True},
        },
        required_if=[("action", "judge", ("hosts",)), ("action", "unpack", ("nodes",))],
        profile=True, import_error=IMPORT_ERROR,
    )
    if module.params["action"] == "unpack":
        run_unpack(module)
    else:
        run_judge(module)


if __name__ == "__main__":
    main()
