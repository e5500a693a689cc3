"""The startup log the probes read as the server's (acceptance_probe `server_log`): a launch's own, or an attached
server's operator-named log only when compat.startup_log_identity passed (docs/checks.md). A rejected log (another
server's, kept as evidence/serve/startup-log-rejected.log) never reaches the probes: they run as without one.

A real ansible-playbook run on the controller (no vLLM, no node): the repository's own playbooks/vars/probes.yml
and the `server_log` expressions of playbooks/tasks/probe.yml and playbooks/tasks/limit.yml, read from those files,
templated against heads whose facts are what the serve role leaves (vllm_serve_log_copy, vllm_serve_judged)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
LOG = "/srv/vllm/startup.log"
# head -> (its inventory/facts, whether the probes get its log)
HEADS: dict[str, tuple[dict, bool]] = {
    "launched": ({"vllm_serve_log_copy": LOG}, True),     # a launch: its own log, no identity check
    "attach-pass": ({"vllm_serve_mode": "attach", "vllm_serve_log_copy": LOG,
                     "vllm_serve_judged": {"statuses": {"compat.startup_log_identity": "pass"}}}, True),
    # another server's log (a version, num_gpu_blocks or max_model_len of another server): startup-log-rejected.log
    "attach-inconclusive": ({"vllm_serve_mode": "attach", "vllm_serve_log_copy": LOG, "vllm_serve_judged": {
        "statuses": {"compat.startup_log_identity": "inconclusive"}}}, False),
    "attach-fail": ({"vllm_serve_mode": "attach", "vllm_serve_log_copy": LOG,
                     "vllm_serve_judged": {"statuses": {"compat.startup_log_identity": "fail"}}}, False),
    "attach-unjudged": ({"vllm_serve_mode": "attach", "vllm_serve_log_copy": LOG,       # check mode, or no judge
                         "vllm_serve_judged": {"statuses": {}}}, False),
    "attach-no-log": ({"vllm_serve_mode": "attach",
                       "vllm_serve_judged": {"statuses": {"compat.startup_log_identity": "pass"}}}, False),
}
OMITTED = "Hello world!"     # ansible.builtin.debug's msg when the argument is omitted (its documented default)


def _server_log_arg(tasks_file: str) -> str:
    """The `server_log` argument of the acceptance_probe call in a task file, as written there."""
    def walk(node: object) -> list[str]:
        if isinstance(node, dict):
            found = [node["acceptance_probe"]["server_log"]] if isinstance(node.get("acceptance_probe"), dict) else []
            return found + [s for v in node.values() for s in walk(v)]
        if isinstance(node, list):
            return [s for v in node for s in walk(v)]
        return []
    found = walk(yaml.safe_load((REPO / tasks_file).read_text()))
    assert len(found) == 1, found
    return found[0]


def _playbook() -> list[dict]:
    """Each head's `server_log` as each task file would pass it: the last result of each host (the tree callback
    keeps it): localhost's is a mapping head -> probe.yml's value, each head's is limit.yml's."""
    probe_arg, limit_arg = _server_log_arg("playbooks/tasks/probe.yml"), _server_log_arg("playbooks/tasks/limit.yml")
    vars_files = [str(REPO / "playbooks" / "vars" / "probes.yml")]
    probe_tasks = [{"name": f"probe {head}", "ansible.builtin.debug": {"msg": probe_arg},
                    "vars": {"probe_head": head}, "register": f"seen_{i}"} for i, head in enumerate(HEADS)]
    shown = "{{ {" + ", ".join(f"'{head}': seen_{i}.msg" for i, head in enumerate(HEADS)) + "} }}"
    return [
        {"name": "Probe plays (controller)", "hosts": "localhost", "gather_facts": False, "vars_files": vars_files,
         "tasks": [*probe_tasks, {"name": "What each head gave", "ansible.builtin.debug": {"msg": shown}}]},
        {"name": "Limit play (on the head)", "hosts": "heads", "gather_facts": False, "vars_files": vars_files,
         # the limit play runs on vllm_head, whose first host is probe_head (playbooks/probes.yml); task vars,
         # as vars_files outrank play vars
         "tasks": [{"name": "limit", "ansible.builtin.debug": {"msg": limit_arg},
                    "vars": {"probe_head": "{{ inventory_hostname }}"}}]},
    ]


def test_only_a_log_judged_the_servers_reaches_the_probes(tmp_path: Path) -> None:
    inventory = {"all": {"hosts": {"localhost": {"ansible_connection": "local"}}, "children": {
        "vllm_head": {"hosts": {"launched": None}},
        "heads": {"hosts": {h: {**facts, "ansible_connection": "local"} for h, (facts, _) in HEADS.items()}}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "book.yml").write_text(yaml.safe_dump(_playbook(), sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "default",
           "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree", "ANSIBLE_CALLBACK_TREE_DIR": str(tmp_path / "tree"),
           "ANSIBLE_LOCALHOST_WARNING": "0", "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.yml"),
                           "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "book.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    probes = json.loads((tmp_path / "tree" / "localhost").read_text())["msg"]
    for head, (_, passed) in HEADS.items():
        assert probes[head] == (LOG if passed else OMITTED), (head, probes[head])
        limit = json.loads((tmp_path / "tree" / head).read_text())["msg"]
        assert limit == (LOG if passed else OMITTED), (head, limit)
