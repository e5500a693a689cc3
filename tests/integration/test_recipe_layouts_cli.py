"""The newcomer's path on their own nodes (issue 43 item 5), as a shell runs it: `vllm-acceptance plan` on a copy of
inventories/example-gb300 for 4 GB300 trays refuses the flagship's TP8 and offers the recipe's 16-GPU layouts; the
offered `profile from-recipe ... --nodes 4` command, run as printed from a checkout, writes a profile the plan then
books and launches on all 16 GPUs. No node is contacted (plan reads the inventory with ansible-inventory) and no
vLLM is started (`--vllm-python none`)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from support.examples import fill_placeholders

ROOT = Path(__file__).resolve().parents[2]


def cli(*words: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", *words], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_four_trays_refused_with_a_sixteen_gpu_layout_that_then_plans(tmp_path: Path) -> None:
    project = tmp_path / "checkout"
    for part in ("profiles", "recipes", "inventories"):
        shutil.copytree(ROOT / part, project / part)
    (project / "accept.yml").write_text((ROOT / "accept.yml").read_text())
    inventory = project / "inventories" / "four-trays"
    shutil.copytree(ROOT / "inventories" / "example-gb300", inventory)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    for tray in ("gb300-tray03", "gb300-tray04"):
        hosts["all"]["children"]["gpu_nodes"]["hosts"][tray] = {"ansible_host": f"10.40.1.{10 + int(tray[-1])}"}
        hosts["all"]["children"]["vllm_workers"]["hosts"][tray] = None
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    fill_placeholders(inventory / "group_vars" / "all.yml")   # the site's digest and interface (gate.py)

    refused = cli("plan", "-i", str(inventory), "--vllm-python", "none", cwd=project)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "must fill each node: 2 of 4 GPUs per node" in refused.stderr
    offered = [line.strip() for line in refused.stderr.splitlines() if "profile from-recipe" in line]
    assert offered and all("--nodes 4" in line for line in offered)
    assert "(all 16 GPUs)" in refused.stderr and "of 16 GPUs" not in refused.stderr

    dep16 = next(line for line in offered if "--strategy multi_node_dep" in line)
    words = shlex.split(dep16)
    written = cli(*words[1:], cwd=project)                              # as printed, from the checkout
    assert written.returncode == 0, written.stderr
    assert "multi_node_dep on 4 x gb300" in written.stdout and "16 GPUs" in written.stdout
    name = Path(words[words.index("--out") + 1]).stem
    planned = cli("plan", "-i", str(inventory), "--profile", name, "--vllm-python", "none", "--json", cwd=project)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["gpus"] == 16 and len(plan["nodes"]) == 4
    assert all("--data-parallel-size=16" in node["argv"] for node in plan["nodes"])
