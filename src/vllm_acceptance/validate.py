"""`vllm-acceptance validate`: the inputs checked as accept.yml's validate stage checks them, before any node is
touched (playbooks/validate.yml, core/rundir.py).

The profile is taken as the inventory takes `acceptance_profile`: a name (`kimi-k3` -> profiles/kimi-k3.yml of
the project) or a path. With `-i INVENTORY`, the inventory's variables are read through Ansible's own
`ansible-inventory` (group_vars, host_vars; no host is contacted) and every product variable is validated
(core/variables.py), the profile coming from `acceptance_profile` unless `--profile` is given.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.profile import ConfigError, Profile, load_profile
from .core.rundir import (
    require_contract_served,
    require_gpu_nodes,
    require_head_in_gpu_nodes,
    resolve_profile_path,
    validate_inventory_vars,
)
from .core.variables import PREFIXES
from .hardware import vllm_batched_tokens_default
from .serve import launch, vllm_check

CHECKOUT = Path(__file__).resolve().parents[2]


@dataclass
class Validated:
    profile: str
    profile_path: str
    inventory: str | None = None
    variables_checked: int = 0
    templated: list[str] = field(default_factory=list)   # values only Ansible can render: not judged here
    vllm_check: dict[str, Any] | None = None              # vLLM's own checks of every node's command
    vllm_check_lines: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"valid": True, "profile": self.profile, "profile_path": self.profile_path,
                "inventory": self.inventory, "variables_checked": self.variables_checked,
                "templated_not_checked": self.templated, "vllm_check": self.vllm_check,
                "vllm_check_summary": self.vllm_check_lines}


def project_dir_for(given: Path | None, start: Path | None = None) -> Path:
    """The project whose profiles/ names resolve: --project, else the current directory or the nearest above it
    holding profiles/, else this package's checkout."""
    if given is not None:
        if not (given / "profiles").is_dir():
            raise ConfigError(f"--project {given}: no profiles/ directory there (give the checkout or the installed "
                              "collection's directory)")
        return given
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "profiles").is_dir() and (candidate / "accept.yml").is_file():
            return candidate
    return CHECKOUT


def resolve_profile(name_or_path: str, project: Path, field_name: str) -> Path:
    """A profile name or path, as `acceptance_profile` takes it; an unknown name says which ones exist."""
    given = Path(name_or_path)
    if given.suffix in (".yml", ".yaml") and given.is_file():
        return given
    try:
        return resolve_profile_path(name_or_path, project)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("inventory field `acceptance_profile`", field_name, 1)) from exc


def ansible_inventory_command() -> str:
    """The ansible-inventory of this environment (beside the running Python first), for reading an inventory
    without contacting any host."""
    beside = Path(sys.executable).parent / "ansible-inventory"
    found = str(beside) if beside.is_file() else shutil.which("ansible-inventory")
    if not found:
        raise ConfigError("ansible-inventory not found: install ansible-core in this environment (make venv)")
    return found


def _inventory_json(inventory: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run([ansible_inventory_command(), "-i", str(inventory), *args], capture_output=True, text=True,
                          check=False, timeout=120)
    if proc.returncode != 0:
        raise ConfigError(f"inventory {inventory}: ansible-inventory failed: {proc.stderr.strip()[-800:]}")
    data = json.loads(proc.stdout)
    return data if isinstance(data, dict) else {}


def product_vars(variables: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The product's variables (core/variables.py PREFIXES); templated values are left to Ansible's rendering."""
    ours = {k: v for k, v in variables.items() if k.startswith(PREFIXES)}
    templated = sorted(k for k, v in ours.items() if isinstance(v, str) and "{{" in v)
    return {k: v for k, v in ours.items() if k not in templated}, templated


def read_inventory_vars(inventory: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The variables the controller's plays see (localhost's, group_vars/all included) and each host's own."""
    site, hostvars, _groups = read_inventory(inventory)
    return site, hostvars


def read_inventory(inventory: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, list[str]]]:
    """(localhost's variables, each host's, each group's hosts with its children's) as Ansible resolves them."""
    if not inventory.exists():
        raise ConfigError(f"-i {inventory}: no such inventory file or directory (give inventories/<site>)")
    site = _inventory_json(inventory, "--host", "localhost")
    listed = _inventory_json(inventory, "--list")
    hostvars = listed.get("_meta", {}).get("hostvars", {})
    return site, {str(h): dict(v) for h, v in hostvars.items() if isinstance(v, dict)}, group_hosts(listed)


def group_hosts(data: dict[str, Any], group: str = "all") -> dict[str, list[str]]:
    """Every group's hosts, children included (ansible-inventory --list nests groups)."""
    out: dict[str, list[str]] = {}

    def walk(name: str) -> list[str]:
        if name in out:
            return out[name]
        out[name] = []      # a group that names itself among its children ends here
        node = data.get(name) if isinstance(data.get(name), dict) else {}
        hosts = [str(h) for h in node.get("hosts") or []]
        for child in node.get("children") or []:
            hosts += [h for h in walk(str(child)) if h not in hosts]
        out[name] = hosts
        return hosts

    walk(group)
    return out


def require_serve_groups(profile: Any, groups: dict[str, list[str]], variables: dict[str, Any],
                         host_variables: dict[str, dict[str, Any]], source: str) -> None:
    """The inventory's shape as the validate play refuses it (core/rundir.py): a GPU profile needs `gpu_nodes`, and a
    launch runs only on hosts of `gpu_nodes` (`vllm_head`, `vllm_workers`)."""
    require_gpu_nodes(profile, groups.get("gpu_nodes") or [], source)
    require_head_in_gpu_nodes(profile, groups, variables, host_variables, source)


def profile_facts(profile: Profile) -> dict[str, Any]:
    """The launch of the profile's own layout where no inventory gives one: hardware.min_nodes hosts named
    node-1.., the profile's runtime and image (a digest placeholder where it pins none; the multi-node launch
    needs one); what `validate --profile` alone and the tests of every generated profile judge."""
    nodes = max(1, int(profile.model.hardware.min_nodes))
    digest = profile.model.image.digest or "sha256:" + "0" * 64
    return {"head": "node-1", "workers": [f"node-{i}" for i in range(2, nodes + 1)], "mode": "launch",
            "runtime": profile.model.launch.runtime, "image_digest": digest}


def launch_check(profile: Profile, facts: dict[str, Any] | None, configured: Any, project: Path,
                 source: str) -> tuple[dict[str, Any] | None, list[str]]:
    """vLLM's own checks of every node's command (serve/vllm_check.py): ConfigError quoting vLLM where it refuses
    one; else (the check as a dict or None, the summary lines)."""
    if facts is not None and facts.get("mode") == "attach":
        return None, ["vLLM's own checks: attach, nothing is launched"]
    facts = facts if facts is not None else profile_facts(profile)
    try:
        check = vllm_check.check_launch(profile, facts, configured, project)
    except launch.LaunchRefused:
        raise
    except ConfigError as exc:      # an input the launch cannot plan: the serve stage (and `plan`) refuse it
        return None, [f"vLLM's own checks not run: the launch cannot be planned from these inputs ({exc})"]
    why_not = "" if check is not None else vllm_check.judge_python(configured, project)[1]
    refused = vllm_check.refusal(check, source) if check is not None and check.ran else None
    if refused:
        raise ConfigError(refused)
    return (check.to_dict() if check is not None else None), vllm_check.summary(check, why_not)


def validate(profile: str | None, inventory: Path | None, project: Path | None = None,
             vllm_python: str | None = None) -> Validated:
    """Raise ConfigError naming the field and the fix, or return what was checked. Every node's `vllm serve`
    command (the inventory's launch, else the profile's own layout) is judged by vLLM itself: `vllm_python`, else
    the inventory's acceptance_vllm_check_python, else the lab venv (serve/vllm_check.py)."""
    if profile is None and inventory is None:
        raise ConfigError("validate: give --profile NAME|PATH, -i INVENTORY, or both")
    project_dir = project_dir_for(project)
    field_name = "--profile" if profile is not None else "inventory field `acceptance_profile`"
    checked, templated, source, site, groups = 0, [], None, {}, {}
    if inventory is not None:
        site, hosts, groups = read_inventory(inventory)
        variables, templated = product_vars(site)
        host_variables = {h: product_vars(v)[0] for h, v in hosts.items()}
        source = f"inventory {inventory}"
        validate_inventory_vars({"acceptance_inventory_dir": str(inventory), **variables}, f"{source} (group_vars)",
                                project_dir, host_variables)
        checked = len(variables)
        if profile is None:
            if not site.get("acceptance_profile"):
                raise ConfigError(f"{source}: field `acceptance_profile` is not set: set it in group_vars/all.yml "
                                  "to a profiles/<name>.yml name or a path, or give --profile")
            profile = str(site["acceptance_profile"])
    loaded = load_profile(resolve_profile(str(profile), project_dir, field_name))
    facts = None
    if inventory is not None:      # what accept.yml's validate play refuses against this profile (core/rundir.py)
        require_contract_served(loaded, variables, host_variables, f"{source} ({loaded.name})",
                                vllm_batched_tokens_default(loaded, variables.get("vllm_serve_extra_args"))[0])
        require_serve_groups(loaded, groups, variables, host_variables, str(source))
        heads = groups.get("vllm_head") or []
        if heads:
            facts = launch.facts_from_hostvars(loaded, heads[0], groups.get("vllm_workers") or [], hosts)
    configured = vllm_python if vllm_python is not None else site.get(vllm_check.VARIABLE)
    checked_launch, lines = launch_check(loaded, facts, configured, project_dir,
                                         f"{source or 'profile'} ({loaded.name})")
    return Validated(profile=loaded.name, profile_path=str(loaded.source),
                     inventory=str(inventory) if inventory else None, variables_checked=checked, templated=templated,
                     vllm_check=checked_launch, vllm_check_lines=lines)
