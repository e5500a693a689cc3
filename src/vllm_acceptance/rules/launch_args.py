"""compat.launch_args: every node's `vllm serve` command judged by the image's own vLLM on the head node
(docs/checks.md; roles/preflight runs serve/vllm_argcheck.py inside the image as `launch_args_check`, with the
commands serve/vllm_check.py preflight_request planned; the same checks `plan` and validation ran with the
controller's vLLM, now with the version that will run).

Where the check ran and why it did not is in every node's `inputs` record (`launch_check`: {state, host, why}): a node
that answered tells the judge which host was asked; evidence whose inputs carry no `launch_check` (collected by a
role before this check, or a node re-checked alone) is not applicable, said so. A refusal is the launch's configuration
(`rebuild_environment`); an answer that could not be had is never a pass."""

from __future__ import annotations

from typing import Any

from ..core.findings import Finding
from ..parsers.vllm_argcheck import parse_answer
from . import registry
from .context import NodeContext, why_missing

CHECK = "compat.launch_args"
COMMAND = "launch_args_check"


def _asked(contexts: list[NodeContext]) -> dict[str, Any] | None:
    """The `launch_check` entry of the role's inputs, from the first node that answered."""
    for ctx in contexts:
        entry = ctx.evidence.inputs.get("launch_check") if ctx.evidence.dir_exists else None
        if isinstance(entry, dict):
            return entry
    return None


def _describe(node: dict[str, Any], version: str | None) -> str:
    who = f"{node.get('host')} ({node.get('role')})"
    if node.get("accepted") is False:
        where = f" [{node['where']}]" if node.get("where") else ""
        return f"{who}: vLLM {version} refuses it at {node.get('stage')}: {node.get('message')}{where}"
    if node.get("accepted") is None:
        return f"{who}: not judged ({'; '.join(node.get('not_judged') or []) or node.get('stage') or 'no answer'})"
    return f"{who}: accepted ({node.get('mode')})"


def check_launch_args(contexts: list[NodeContext]) -> Finding:
    check = registry.get(CHECK)
    asked = _asked(contexts)
    if asked is None and not any(ctx.evidence.dir_exists for ctx in contexts):
        return check.missing(None, "no GPU node answered preflight: where vLLM's own argument checks were to run "
                                   "is unknown")
    if asked is None:
        return check.not_applicable(None, "this preflight did not plan vLLM's launch check (the nodes' inputs carry "
                                          "no launch_check: evidence of a role before compat.launch_args, or a node "
                                          "re-checked on its own)")
    host = str(asked.get("host") or "")
    if asked.get("state") == "unplannable":
        return check.inconclusive(None, reason=str(asked.get("why")), expected="vLLM accepts every node's command",
                                  action="fix the launch inputs (`vllm-acceptance plan -i INVENTORY` says what is "
                                         "wrong), then re-run preflight")
    if not host:
        return check.not_applicable(None, str(asked.get("why") or "no launch to judge"))
    ctx = next((c for c in contexts if c.host == host), None)
    if ctx is None or not ctx.evidence.dir_exists:
        return check.missing(host, f"the head node {host} gave no preflight evidence (unreachable, or outside "
                                   "gpu_nodes): the image's own vLLM never judged the launch")
    record = ctx.rec(COMMAND)
    evidence = ctx.paths(COMMAND)
    if not record.present:
        return check.missing(host, why_missing(ctx, COMMAND), evidence=evidence)
    answer, why = parse_answer(record.stdout)
    if answer is None or answer.get("error"):
        detail = answer.get("error") if answer else f"{why}; exit {record.rc}: {(record.stderr or '')[-400:]}"
        return check.inconclusive(host, evidence=evidence, reason=f"vLLM's argument checks could not run in the "
                                  f"image: {detail}", action="make `python3 -c 'import vllm'` work in the image (the "
                                  "official image's own vLLM), then re-run preflight")
    version = answer.get("vllm_version")
    nodes = [n for n in (answer.get("deployments") or {}).get("launch") or [] if isinstance(n, dict)]
    observed = {"vllm_version": version, "platform": answer.get("platform"), "nodes": nodes,
                "not_run": answer.get("not_run"), "wall_s": answer.get("wall_s")}
    expected = "vLLM accepts every node's command"
    if not nodes:
        return check.inconclusive(host, observed=observed, expected=expected, evidence=evidence,
                                  reason="the answer judges no node", action="re-run preflight")
    refused = [n for n in nodes if n.get("accepted") is False]
    if refused:
        return check.fail(host, observed=observed, expected=expected, evidence=evidence,
                          reason="; ".join(_describe(n, version) for n in refused),
                          action="a configuration error: change the launch (the profile's launch.args, the "
                                 "inventory's vllm_serve_extra_args / vllm_parallel) until the image's vLLM accepts "
                                 "every node's command; `vllm-acceptance validate` judges it before booking")
    unjudged = [n for n in nodes if n.get("accepted") is not True]
    if unjudged:
        return check.inconclusive(host, observed=observed, expected=expected, evidence=evidence,
                                  reason="; ".join(_describe(n, version) for n in unjudged),
                                  action="give the image every file the command names, then re-run preflight")
    return check.passed(host, observed=observed, expected=expected, evidence=evidence,
                        reason=f"vLLM {version} accepts every node's command: "
                               + "; ".join(_describe(n, version) for n in nodes))
