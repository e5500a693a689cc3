"""Run accept.yml on the lab inventory through ansible-runner, as the pipeline tests do."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ansible_runner

REPO = Path(__file__).resolve().parents[2]


def run_accept(workdir: Path, extravars: dict[str, Any], env: dict[str, str] | None = None,
               inventory: str = "lab") -> Path:
    """accept.yml with these extra vars, reports under workdir/reports; asserts the run reached its verdict
    (printing the playbook's tail if not) and returns the run directory `latest` points at."""
    reports = workdir / "reports"
    runner = workdir / "runner"
    runner.mkdir(parents=True, exist_ok=True)
    envvars = {"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
               **(env or {})}
    result = ansible_runner.run(
        private_data_dir=str(runner), project_dir=str(REPO), playbook=str(REPO / "accept.yml"),
        inventory=str(REPO / "inventories" / inventory), envvars=envvars, quiet=True,
        # these tests judge the verdict from the report: accept.yml's verdict gate (playbooks/verdict_gate.yml) is off,
        # as `vllm-acceptance run` turns it off, so that a run that reached any verdict is a successful playbook
        extravars={"acceptance_reports_dir": str(reports), "acceptance_fail_on": [], **extravars})
    assert result.status == "successful", "".join(e.get("stdout", "") for e in result.events)[-4000:]
    latest = reports / inventory / "latest"
    assert latest.is_symlink()
    return latest.resolve()
