"""Testinfra verifier of the scheduler_hook scenario: what the scheduler says about each node after the role.

`host` is a live ssh connection to the admin host; its scontrol, squeue and kubectl are the scenario's scheduler
stand-in (files/scheduler_standin.py), which keeps the scheduler's state and logs every call in
/usr/local/bin/.state/scheduler-calls.log.
"""

from __future__ import annotations

import json

REASON = "vllm-acceptance driver change"


def _calls(host) -> list[dict]:
    text = host.file("/usr/local/bin/.state/scheduler-calls.log").content_string
    return [json.loads(line) for line in text.splitlines()]


def test_a_drained_slurm_node_stays_drained_with_the_reason(host) -> None:
    shown = host.check_output("scontrol show node gpu-a01")
    assert "State=IDLE+DRAIN" in shown and f"Reason={REASON} [" in shown
    assert host.check_output("squeue --noheader --nodelist gpu-a01 --format %i") == ""


def test_the_drain_waited_until_the_running_job_ended(host) -> None:
    calls = [c for c in _calls(host) if "gpu-a01" in " ".join(c["args"])]
    drain = next(i for i, c in enumerate(calls) if c["tool"] == "scontrol" and "state=drain" in c["args"])
    polls = [c for c in calls[drain + 1:] if c["tool"] == "squeue"]
    # polled after the drain, until the node had no job (the job 4242 ended after the first poll)
    assert len(polls) >= 2 and all(c["args"][:4] == ["--noheader", "--nodelist", "gpu-a01", "--format"]
                                   for c in polls)


def test_a_resumed_slurm_node_takes_jobs_again(host) -> None:
    shown = host.check_output("scontrol show node gpu-a02")
    assert "State=IDLE" in shown and "DRAIN" not in shown and "Reason=" not in shown


def test_a_drained_kubernetes_node_is_cordoned_and_keeps_only_its_daemonset_pod(host) -> None:
    assert host.check_output("kubectl get node gpu-k01 -o jsonpath={.spec.unschedulable}") == "true"
    pods = host.check_output("kubectl get pods --all-namespaces --field-selector spec.nodeName=gpu-k01 -o name")
    assert pods.split() == ["pod/nvidia-device-plugin-x7k2p"]


def test_an_uncordoned_kubernetes_node_is_schedulable_and_its_pods_were_evicted(host) -> None:
    assert host.check_output("kubectl get node gpu-k02 -o jsonpath={.spec.unschedulable}") == ""
    assert host.check_output("kubectl get pods --field-selector spec.nodeName=gpu-k02 -o name") == ""


def test_no_scheduler_command_for_a_node_without_scheduler(host) -> None:
    assert not [c for c in _calls(host) if "gpu-n01" in " ".join(c["args"])]
