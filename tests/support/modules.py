"""Run one of the collection's modules as Ansible does (its args file, the collection on sys.path)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RUN_MODULE = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); "
              "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def run_module(name: str, args: dict[str, Any], tmp_path: Path) -> tuple[dict[str, Any], str]:
    """plugins/modules/<name>.py with these arguments: its JSON result and everything it printed."""
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, "-c", RUN_MODULE, str(REPO / ".collections"),
                           str(REPO / "plugins" / "modules" / f"{name}.py"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout), proc.stdout + proc.stderr
