"""The rebuild record, <run_dir>/rebuild.json: the plan, which step ran or failed on which node, and where a
roll stopped."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.evidence import atomic_write
from ...core.redact import redact_obj
from ...core.rundir import RunDir

LEDGER_NAME = "rebuild.json"


class Ledger:
    """<run_dir>/rebuild.json: the plan, every node's steps and where a roll stopped. Written
    atomically after each step, so a roll that stops mid-way still says what happened."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunDir(Path(run_dir)).report_file(LEDGER_NAME)

    def load(self) -> dict[str, Any]:
        if self.path.is_file():
            return json.loads(self.path.read_text())
        return {"kind": None, "hosts": [], "nodes": {}, "failed": None, "status": "planned"}

    def save(self, data: dict[str, Any]) -> None:
        nodes = data.get("nodes", {})
        data["untouched"] = [h for h in data.get("hosts", []) if not nodes.get(h, {}).get("steps")]
        for node in nodes.values():
            node.update(_node_summary(node.get("steps", []), str(data.get("kind"))))
        atomic_write(self.path, json.dumps(redact_obj(data), indent=2, default=str) + "\n")

    def start(self, kind: str, hosts: list[str], plan: Mapping[str, Any]) -> dict[str, Any]:
        data = {"kind": kind, "hosts": list(hosts), "plan": dict(plan), "nodes": {}, "failed": None,
                "status": "running", "started": _now()}
        self.save(data)
        return data

    def record(self, host: str, step: str, status: str, detail: Any = None) -> dict[str, Any]:
        data = self.load()
        node = data.setdefault("nodes", {}).setdefault(host, {"steps": [], "result": "running"})
        node["steps"].append({"step": step, "status": status, "at": _now(), "detail": detail})
        if status == "failed":
            node["result"] = "failed"
            data["failed"] = {"host": host, "step": step, "detail": detail}
            data["status"] = "stopped"
        elif step == "planned":
            node["result"] = "planned"
            data["status"] = "planned (check mode: nothing changed)"
        elif step == "done":
            node["result"] = "done"
            if all(data["nodes"].get(h, {}).get("result") == "done" for h in data.get("hosts", [])):
                data["status"] = "completed"
        self.save(data)
        return data


VERIFY_STEPS = ("preflight", "smoke", "workload")


def _node_summary(steps: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """Per node, what was restored (or installed) and what was verified, read from its steps: the
    install step's packages and reboot; each verification step's status and its checks."""
    install = next((s for s in reversed(steps) if s.get("step") == "install"), None)
    verified: dict[str, Any] = {}
    for step in steps:
        name = step.get("step")
        if name in VERIFY_STEPS:
            detail = step.get("detail") if isinstance(step.get("detail"), Mapping) else {}
            verified[name] = {"status": step.get("status"),
                              **({"checks": detail["checks"]} if "checks" in detail else {})}
    failed = next((s for s in steps if s.get("status") == "failed"), None)
    if failed is not None and failed.get("step") in VERIFY_STEPS:
        verified[failed["step"]] = {"status": "failed", "problems": (failed.get("detail") or {}).get("problems")}
    return {"restored" if kind == "rollback" else "installed": (install or {}).get("detail"), "verified": verified}


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
