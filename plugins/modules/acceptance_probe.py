#!/usr/bin/python
"""Ansible module: run one probe (cache, agent, load, metrics) and file its findings in the run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: acceptance_probe
short_description: Run a cache, agent or load probe against a running vLLM server
description:
  - The same code as C(vllm-acceptance probe KIND). Writes its evidence under C(probes/KIND/) in the run
    directory, its findings to C(findings/KIND.json) and its details to C(stages/KIND.json), as every stage does.
  - A probe that finds a defect does not fail the task; the verdict is decided by the report stage. The task
    fails only on bad input or an unreachable server, with a message naming the URL or field.
  - In check mode nothing is sent (probes generate traffic).
options:
  kind:
    description:
      - Which probe, by the name its folder registers (C(vllm_acceptance/core/probes.py) declares them; today
        C(cache), C(agent), C(load) and the opt-in C(metrics)). Another name fails with the list of probes.
    type: str
    required: true
  base_url:
    description: OpenAI base URL (through the gateway, if any).
    type: str
    required: true
  model:
    description: Served model name.
    type: str
    required: true
  metrics_url:
    description: The server's C(/metrics) URL.
    type: str
  prometheus_url:
    description: Read metrics through this Prometheus instead.
    type: str
  prometheus_instance:
    description: The instance label of the scrape target.
    type: str
  prometheus_selector:
    description:
      - PromQL label matchers naming the server's one scrape target, e.g. C(job="vllm",instance="10.0.0.5:8000").
      - Default C(instance="<host:port of base_url>"). A query matching several targets is refused, never summed.
    type: str
  direct_url:
    description: The server's direct base URL when base_url is a gateway (agent probe).
    type: str
  api_key:
    description: API key; never written to evidence.
    type: str
  reference_url:
    description:
      - Agent - a reference endpoint's OpenAI base URL (the vendor's API, an accepted deployment); the case set is
        sent to it too and judged as C(agent.reference_agreement). Without it that check is C(not_applicable).
      - A malformed URL fails the task naming the field; credentials in it (C(https://user:token@host/v1)) are
        redacted in evidence and messages, and Ansible hides the value in its own output. Agent and quality only.
      - Quality - the reference path of the same weights (inventory C(quality_reference_url)); the seeded prompt set
        is compared with it token by token (C(quality.parity)).
    type: str
  reference_model:
    description: Agent, quality - the reference's model name (default O(model)).
    type: str
  reference_api_key:
    description: Agent, quality - the reference's API key (playbooks read it from the environment variable named by
      C(agent_reference_api_key_env) or C(quality_reference_api_key_env)); never written to evidence.
    type: str
  server_pid:
    description: Server pid; tells an exited server from a hung one; the lab RSS memory series (load).
    type: int
  server_log:
    description: Server log; its last lines (and OOM lines) are kept when the server dies mid-probe (cache, load).
    type: path
  overrides:
    description: Profile fields overridden for this probe (dotted keys).
    type: dict
    default: {}
  phase:
    description:
      - C(main) runs the probe. C(restart) (cache only) completes a cache stage after the server this run
        launched was restarted between two calls, with hot A of the last session again on the new process,
        judged as C(cache.restart).
      - C(limit) (load only) measures the next proposed limit of a load stage left waiting (O(relaunch)) on the
        server relaunched with that limit's flags; the first limit that holds is verified and the mixed stream
        and the soak run there, else the next limit is left waiting (RV(pending)).
    type: str
    choices: [main, restart, limit]
    default: main
  relaunch:
    description:
      - Load, phase C(main) - the caller relaunches the server (one this run launched) with each proposed limit's
        flags and calls phase C(limit) after each. When the contract does not hold, the stage stops after the
        ramp with C(relaunch_point) in C(stages/load.json) (the settings and their flags) and the limit, the
        mixed stream and the soak inconclusive until then. Without it a limit is verified by driving the client
        at it against the server as it runs.
    type: bool
    default: false
  loadgen_hosts:
    description:
      - Load - the loadgen hosts besides the controller; their agents (C(python -m vllm_acceptance.load.worker agent),
        started by playbooks/probes.yml) send the ramp, mixed stream and soak steps together, each step split over
        them. A host without an answering agent stops the probe naming it (the load stage is then missing).
    type: list
    elements: str
    default: []
  loadgen_agents:
    description: Load - the agents' endpoints, one C({host, address, port}) per started agent.
    type: list
    elements: dict
    default: []
  loadgen_token:
    description: Load - the run's token that the agents were started with; never written to evidence.
    type: str
  relaunch_error:
    description: Phase C(limit), why the relaunch with the limit's flags failed (the limit is then not tested).
    type: str
  relaunch_log:
    description: Phase C(limit), what the relaunch did, kept as evidence (C(probes/load/relaunch.jsonl)).
    type: str
  restart_error:
    description: Phase C(restart), why the restart failed (C(cache.restart) is then inconclusive with it).
    type: str
  restart_log:
    description: Phase C(restart), what the restart did, kept as evidence (C(probes/cache/restart.log)).
    type: str
extends_documentation_fragment:
  - vllm.acceptance.acceptance
  - vllm.acceptance.acceptance.profile
author: vllm-acceptance
"""

EXAMPLES = r"""
- name: Agent probe, with a reference endpoint for agent.reference_agreement (its key from the environment)
  acceptance_probe:
    kind: agent
    run_dir: "{{ acceptance_run_dir }}"
    base_url: http://127.0.0.1:8011/v1
    model: tiny-agent
    reference_url: https://api.example.com/v1
    reference_model: kimi-k2-0905-preview
    reference_api_key: "{{ lookup('ansible.builtin.env', 'VLLM_REFERENCE_API_KEY') }}"

- name: Prefix-cache probe
  acceptance_probe:
    kind: cache
    run_dir: "{{ acceptance_run_dir }}"
    base_url: http://127.0.0.1:8011/v1
    model: tiny-agent

- name: The cache probe's hot request after the launched server was restarted
  acceptance_probe:
    kind: cache
    phase: restart
    run_dir: "{{ acceptance_run_dir }}"
    base_url: http://127.0.0.1:8011/v1
    model: tiny-agent
    restart_log: "docker restart vllm-acceptance: ready after 52.1 s"

- name: The load stage's next proposed limit, after the server was relaunched with its flags
  acceptance_probe:
    kind: load
    phase: limit
    run_dir: "{{ acceptance_run_dir }}"
    base_url: http://127.0.0.1:8011/v1
    model: tiny-agent
    relaunch_log: "relaunched with --max-num-seqs 1: ready after 41.0 s"
"""

RETURN = r"""
status:
  description: pass, fail or inconclusive.
  returned: success
  type: str
statuses:
  description: Status per check id.
  returned: success
  type: dict
result:
  description: Path of the stage's details (C(stages/KIND.json)).
  returned: success
  type: str
pending:
  description: Load - a proposed limit is waiting for a relaunch with its flags (C(relaunch_point) in the stage).
  returned: success
  type: bool
"""

import traceback

from ansible_collections.vllm.acceptance.plugins.module_utils.acceptance_base import AcceptanceModule

try:
    from vllm_acceptance.core.probes import probe_names
    from vllm_acceptance.core.reference import check_reference_url
    from vllm_acceptance.probes.stage import run_cache_restart_stage, run_load_limit_stage, run_probe_stage
except ImportError:
    IMPORT_ERROR = traceback.format_exc()
    PROBE_NAMES = None   # the base fails with the import error before any option is used
else:
    IMPORT_ERROR = None
    PROBE_NAMES = list(probe_names())


def main() -> None:
    module = AcceptanceModule(
        argument_spec={
            "kind": {"type": "str", "choices": PROBE_NAMES, "required": True},
            "base_url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "metrics_url": {"type": "str"},
            "prometheus_url": {"type": "str"},
            "prometheus_instance": {"type": "str"},
            "prometheus_selector": {"type": "str"},
            "direct_url": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "reference_url": {"type": "str", "no_log": True},  # it may hold credentials (user:token@host)
            "reference_model": {"type": "str"},
            "reference_api_key": {"type": "str", "no_log": True},
            "server_pid": {"type": "int"},
            "server_log": {"type": "path"},
            "overrides": {"type": "dict", "default": {}},
            "phase": {"type": "str", "choices": ["main", "restart", "limit"], "default": "main"},
            "restart_error": {"type": "str"},
            "restart_log": {"type": "str"},
            "relaunch": {"type": "bool", "default": False},
            "relaunch_error": {"type": "str"},
            "relaunch_log": {"type": "str"},
            "loadgen_hosts": {"type": "list", "elements": "str", "default": []},
            "loadgen_agents": {"type": "list", "elements": "dict", "default": []},
            "loadgen_token": {"type": "str", "no_log": True},
        },
        profile=True, import_error=IMPORT_ERROR,
    )
    p = module.params
    reference = {k: p[k] for k in ("reference_url", "reference_model", "reference_api_key") if p[k]}
    if reference and p["kind"] not in ("agent", "quality"):
        module.fail_json(msg=f"reference_url, reference_model and reference_api_key are the agent and quality "
                             f"probes' only (kind is {p['kind']}): drop them for this probe")
    variable = f"{'quality' if p['kind'] == 'quality' else 'agent'}_reference_url"
    if reference and not p["reference_url"]:
        module.fail_json(msg=f"reference_model or reference_api_key given without reference_url: set reference_url "
                             f"(inventory {variable}) to the reference's OpenAI base URL, or drop them")
    module.guard(check_reference_url, p["reference_url"], f"reference_url (inventory {variable})",
                 p["reference_api_key"])
    if module.check_mode:
        module.exit_json(changed=False, status="skipped", msg=f"check mode: the {p['kind']} probe sends no traffic")
    run = module.run()
    agents = {"loadgen_hosts": p["loadgen_hosts"], "loadgen_agents": p["loadgen_agents"],
              "loadgen_token": p["loadgen_token"]} if p["loadgen_hosts"] else {}
    if p["phase"] == "restart":
        if p["kind"] != "cache":
            module.fail_json(msg=f"phase restart is the cache probe's only (kind is {p['kind']}): set kind: cache")
        status, statuses, result = module.guard(
            run_cache_restart_stage, run.path, profile_path=p["profile_path"] or str(run.profile_path),
            base_url=p["base_url"], model=p["model"], metrics_url=p["metrics_url"],
            prometheus_url=p["prometheus_url"], prometheus_instance=p["prometheus_instance"],
            prometheus_selector=p["prometheus_selector"], api_key=p["api_key"],
            server_pid=p["server_pid"], server_log=p["server_log"], overrides=p["overrides"],
            restart_error=p["restart_error"], restart_log=p["restart_log"])
        module.exit_json(changed=True, status=status, statuses=statuses, result=str(result))
    if p["phase"] == "limit":
        if p["kind"] != "load":
            module.fail_json(msg=f"phase limit is the load probe's only (kind is {p['kind']}): set kind: load")
        status, statuses, result, pending = module.guard(
            run_load_limit_stage, run.path, profile_path=p["profile_path"] or str(run.profile_path),
            base_url=p["base_url"], model=p["model"], metrics_url=p["metrics_url"],
            prometheus_url=p["prometheus_url"], prometheus_instance=p["prometheus_instance"],
            prometheus_selector=p["prometheus_selector"], api_key=p["api_key"],
            server_pid=p["server_pid"], server_log=p["server_log"], overrides=p["overrides"],
            relaunch_error=p["relaunch_error"], relaunch_log=p["relaunch_log"], **agents)
        module.exit_json(changed=True, status=status, statuses=statuses, result=str(result), pending=pending)
    if p["relaunch"] and p["kind"] != "load":
        module.fail_json(msg=f"relaunch is the load probe's only (kind is {p['kind']}): drop it for this probe")
    extra = {"relaunch": True} if p["relaunch"] else {}
    if p["loadgen_hosts"] and p["kind"] == "load":
        extra.update(agents)
    status, statuses, result = module.guard(
        run_probe_stage, run.path, p["kind"], profile_path=p["profile_path"] or str(run.profile_path),
        base_url=p["base_url"], model=p["model"], metrics_url=p["metrics_url"], prometheus_url=p["prometheus_url"],
        prometheus_instance=p["prometheus_instance"], prometheus_selector=p["prometheus_selector"],
        direct_url=p["direct_url"], api_key=p["api_key"],
        server_pid=p["server_pid"], server_log=p["server_log"], overrides=p["overrides"], **reference, **extra)
    module.exit_json(changed=True, status=status, statuses=statuses, result=str(result),
                     pending=bool((run.stage(p["kind"]) or {}).get("relaunch_point")))


if __name__ == "__main__":
    main()
