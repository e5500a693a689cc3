"""Testinfra verifier of the node_state scenario: the capture on the controller is what the node answers.

`host` is a live ssh connection to the node (the fake node of tests/fixtures/rebuild, its state under
/usr/local/bin/.state).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from vllm_acceptance.rebuild.remediation import load_capture

EPHEMERAL = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
STATE = "/usr/local/bin/.state"
# Records whose answer does not change between the capture and now (date_u does; the rest is the node's state).
STABLE = ("hostname", "nvidia_smi_query", "nvidia_smi_query_001", "driver_version", "fabricmanager_version", "lsmod",
          "boot_id", "packages", "containers", "gpu_binding", "ibv_devinfo", "rdma_link")


def _name(host) -> str:
    return host.backend.get_hostname()


def _dest(host) -> Path:
    return EPHEMERAL / "reports" / "node-state" / _name(host) / "before"


def _records(host) -> dict[str, dict]:
    bundle = json.loads((_dest(host) / "state.json").read_text())
    assert bundle["host"] == _name(host) and bundle["runtime"] == "docker"
    return {r["name"]: r for r in bundle["records"]}


def test_each_record_is_what_the_node_answers_now(host) -> None:
    records = _records(host)
    for name in STABLE:
        record = records[name]
        live = host.run(shlex.join(record["cmd"]))
        assert (record["rc"], record["stdout"].strip()) == (live.rc, live.stdout.strip()), name
        assert record["rc"] == 0 and not record["missing"] and not record["timed_out"], record


def test_the_driver_a_rollback_returns_to_is_the_nodes(host) -> None:
    capture = load_capture(_dest(host))
    installed = host.file(f"{STATE}/driver").content_string.strip()
    assert capture["missing"] == [] and capture["mixed"] is False
    assert capture["driver_version"] == installed == "580.95.05"
    assert capture["packages"] == host.check_output("pkg list").splitlines()


def test_a_secret_in_a_sites_check_is_never_saved(host) -> None:
    record = _records(host)["extra_site_health"]
    assert record["rc"] == 0 and record["stdout"].startswith("site check ok")
    assert "molecule-site-secret-4711" not in (_dest(host) / "state.json").read_text()


def test_the_capture_changed_nothing_on_the_node(host) -> None:
    calls = host.file(f"{STATE}/calls.log").content_string
    assert not [line for line in calls.splitlines() if " install " in line or " reboot" in line
                or "scontrol" in line or "kubectl" in line], calls
    assert host.file(f"{STATE}/driver").content_string.strip() == "580.95.05"
