"""Testinfra verifier: each namespace node left evidence, and it is what the node says now.

Runs on the controller once per molecule instance (`host` is a live ssh connection to it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RUN_DIR = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "run"
QUERY = "nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id --format=csv,noheader"
# What converge must have judged per platform (molecule.yml fixture_case).
EXPECTED_DRIVER_BRANCH = {"node-good": "pass", "node-driver-575": "fail"}


def _name(host) -> str:
    return host.backend.get_hostname()


def _evidence(host) -> Path:
    return RUN_DIR / "evidence" / "preflight" / _name(host)


def test_evidence_files_were_written(host) -> None:
    evidence = _evidence(host)
    for name in ("nvidia_smi_query", "nvidia_smi_xml", "driver_version", "lsmod", "image_inspect"):
        assert (evidence / f"{name}.txt").stat().st_size > 0, name
        meta = json.loads((evidence / f"{name}.json").read_text())
        assert meta["rc"] == 0 and meta["missing"] is False, (name, meta)


def test_evidence_is_what_the_node_answers(host) -> None:
    live = host.run(QUERY)
    assert live.rc == 0
    assert (_evidence(host) / "nvidia_smi_query.txt").read_text().strip() == live.stdout.strip()
    assert (_evidence(host) / "hostname.txt").read_text().strip() == host.check_output("hostname")


def test_judged_per_node(host) -> None:
    findings = json.loads((RUN_DIR / "findings" / "preflight.json").read_text())
    findings = findings["findings"] if isinstance(findings, dict) else findings
    mine = {f["check"]: f for f in findings if f["host"] == _name(host)}
    assert mine["compat.driver_branch"]["status"] == EXPECTED_DRIVER_BRANCH[_name(host)]
    assert all((RUN_DIR / path).exists() for f in mine.values() for path in f["evidence"])
