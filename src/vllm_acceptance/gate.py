"""One gate for every entry point (issue 43, 1; docs/acceptance.md "Unreachable nodes and refused inputs").

`vllm-acceptance validate -i`, `plan`, `run`, `run --check` and `ansible-playbook accept.yml` (playbooks/validate.yml,
its module acceptance_run) all call `check` on the same inputs, so they refuse the same inputs with the same message
(the CLI exits 2; the validate play fails), before any node is touched. In order:

1. the inventory's YAML: its hosts file, group_vars/ and host_vars/ files, the file, line and column of an error
   (core/inventory_yaml.py);
2. every product variable's name (did-you-mean, also for a misspelt prefix such as `acceptence_owner`) and type,
   the controller's and each host's (core/variables.py);
3. the profile `acceptance_profile` names, and what the validate play refuses against it: the inventory's shape
   (`gpu_nodes` for a GPU profile, a launched head among them) and the contract served (core/rundir.py);
4. placeholders left in from the example inventories: the placeholder digest `sha256:000...0`, and a launch across
   nodes whose network interface (the profile's `launch.site_env`, e.g. NCCL_SOCKET_IFNAME) is still unset;
5. the plan: whatever `plan` refuses (plan.py build_plan: a layout that does not fit the nodes, an attached server
   without a URL, a launch vLLM itself refuses, ...) is refused here, by plan's own code.

The inputs are read either by Ansible's `ansible-inventory` (`read_inputs`, the CLI; `-e` variables outrank every
host's, as ansible-playbook's do) or handed over by the validate play as Ansible resolved them (`Inputs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core.inventory_yaml import check_inventory_yaml
from .core.profile import ConfigError, Profile, load_profile
from .core.redact import redact_text
from .core.rundir import require_contract_served, validate_inventory_vars
from .core.variables import is_product_variable
from .hardware import vllm_batched_tokens_default
from .plan import Inventory, Plan, build_plan, render_text
from .validate import (
    Validated,
    product_vars,
    project_dir_for,
    read_inventory,
    require_serve_groups,
    resolve_profile,
)
from .validate import validate as validate_profile

PLACEHOLDER_DIGEST = "sha256:" + "0" * 64
# What the example inventories and the recipe leave for the site to fill in (inventories/example-*, the profile's
# launch.site_env `$IFACE_NAME`).
_PLACEHOLDER_VALUES = ("<", "$")


@dataclass
class Inputs:
    """An inventory as Ansible resolved it: the controller's variables (localhost's, `-e` included), each host's,
    each group's hosts (children included)."""

    source: str                                      # the inventory as messages name it
    site: dict[str, Any]
    hostvars: dict[str, dict[str, Any]]
    groups: dict[str, list[str]]


class GateRefused(ConfigError):
    """An input the gate refuses: the message names the file or field and the fix (secrets redacted)."""


@dataclass
class Gated:
    """What passed the gate: the profile loaded and the plan made from these inputs."""

    profile: Profile
    plan: Plan
    variables_checked: int = 0
    templated: list[str] = field(default_factory=list)    # values only Ansible renders: not judged by the CLI


def read_inputs(inventory: Path, overrides: Mapping[str, Any] | None = None) -> Inputs:
    """The inventory through ansible-inventory (no host is contacted), its YAML checked first (file, line);
    `overrides` (-e) outrank every host's variables and the controller's."""
    path = Path(inventory)
    if not path.exists():
        raise ConfigError(f"inventory {inventory}: no such file or directory (pass -i inventories/<site>)")
    check_inventory_yaml(path.resolve())
    site, hosts, groups = read_inventory(path)
    extra = dict(overrides or {})
    return Inputs(source=f"inventory {path.resolve()}", site={**site, **extra},
                  hostvars={h: {**v, **extra} for h, v in hosts.items()}, groups=groups)


def _names_and_product(variables: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The product's variables with their values, every other name with none (only its name is judged: a
    misspelt prefix), and the templated ones left to Ansible's rendering."""
    ours, templated = product_vars(dict(variables))
    others = {str(k): None for k in variables if not is_product_variable(str(k))}
    return {**others, **ours}, templated


def check(inputs: Inputs, project: Path | None = None, profile: str | None = None,
          vllm_python: str | None = None) -> Gated:
    """Raise GateRefused naming the file or field and the fix, or return the profile and the plan (module
    docstring). `profile` outranks the inventory's acceptance_profile (`--profile`); `vllm_python` the inventory's
    acceptance_vllm_check_python (the Python whose vLLM judges every node's command; `none` skips it). The message
    is redacted (core/redact.py): a URL's credentials never reach a terminal or a play's output."""
    try:
        return _check(inputs, project, profile, vllm_python)
    except GateRefused:
        raise
    except ConfigError as exc:
        raise GateRefused(redact_text(str(exc))) from exc


def _check(inputs: Inputs, project: Path | None, profile: str | None, vllm_python: str | None) -> Gated:
    project_dir = project_dir_for(project)
    source = inputs.source
    if "all" in inputs.groups and not inputs.groups["all"]:
        raise ConfigError(f"{source} holds no host: it lists none (or Ansible could not read it: see its warnings); "
                          "list the GPU nodes under all.children.gpu_nodes.hosts, then run again")
    variables, templated = _names_and_product(inputs.site)
    host_variables = {h: _names_and_product(v)[0] for h, v in inputs.hostvars.items()}
    validate_inventory_vars({"acceptance_inventory_dir": source.removeprefix("inventory "), **variables},
                            f"{source} (group_vars)", project_dir, host_variables)
    product = {k: v for k, v in variables.items() if is_product_variable(k)}
    product_hosts = {h: {k: x for k, x in v.items() if is_product_variable(k)} for h, v in host_variables.items()}
    name = profile or inputs.site.get("acceptance_profile")
    if not name:
        raise ConfigError(f"{source}: field `acceptance_profile` is not set: set it in group_vars/all.yml to a "
                          "profiles/<name>.yml name or a path, or give --profile")
    field_name = "--profile" if profile else "inventory field `acceptance_profile`"
    loaded = load_profile(resolve_profile(str(name), project_dir, field_name))
    require_contract_served(loaded, product, product_hosts, f"{source} ({loaded.name})",
                            vllm_batched_tokens_default(loaded, product.get("vllm_serve_extra_args"))[0])
    require_serve_groups(loaded, inputs.groups, product, product_hosts, source)
    require_no_placeholders(loaded, inputs, source)
    try:        # whatever `plan` refuses (plan.py, serve/launch.py layout, vLLM's own checks) is refused here
        planned = build_plan(_plan_inventory(inputs), str(loaded.source), project_dir, None, vllm_python)
    except ConfigError as exc:
        said = str(exc).removeprefix(f"{source}: ")
        raise ConfigError(f"{source}: the plan refuses it: {said}") from exc
    return Gated(profile=loaded, plan=planned, variables_checked=len(product), templated=templated)


def _plan_inventory(inputs: Inputs) -> Inventory:
    """The inputs as plan.py reads an inventory (the controller's variables as localhost's)."""
    hostvars = {h: dict(v) for h, v in inputs.hostvars.items()}
    hostvars["localhost"] = {**hostvars.get("localhost", {}), **inputs.site}
    return Inventory(source=inputs.source.removeprefix("inventory "), groups=dict(inputs.groups),
                     hostvars=hostvars)


def _head(inputs: Inputs) -> tuple[str | None, dict[str, Any]]:
    heads = inputs.groups.get("vllm_head") or []
    head = heads[0] if heads else None
    return head, {**inputs.site, **(inputs.hostvars.get(head) or {})} if head else dict(inputs.site)


def require_no_placeholders(profile: Profile, inputs: Inputs, source: str) -> None:
    """The example inventories' placeholders, still in: the all-zero image digest (it pins no image: preflight
    would judge, and a launch pull, an image that does not exist), and, on a launch across nodes, the network
    interface the recipe leaves to the site (the profile's launch.site_env, `$IFACE_NAME`) unset or still a
    placeholder in vllm_serve_multinode_env (docs/inventory.md)."""
    lines: list[str] = []
    head, head_vars = _head(inputs)
    where = "group_vars" if inputs.site.get("vllm_image_digest") == head_vars.get("vllm_image_digest") else \
        f"host_vars of {head}"
    digest = head_vars.get("vllm_image_digest") or profile.model.image.digest
    if str(digest or "").strip() == PLACEHOLDER_DIGEST:
        origin = f"field `vllm_image_digest` ({where})" if head_vars.get("vllm_image_digest") else \
            f"profile {profile.name} image.digest"
        lines.append(f"{source}: {origin} is the example's placeholder {PLACEHOLDER_DIGEST[:15]}...0: set it to "
                     "the digest of the image you accept (e.g. `docker buildx imagetools inspect "
                     f"{profile.model.image.reference or 'IMAGE'}` prints it)")
    workers = inputs.groups.get("vllm_workers") or []
    site_env = dict(profile.model.launch.site_env or {})
    if workers and site_env and str(head_vars.get("vllm_serve_mode") or "launch") == "launch":
        given = head_vars.get("vllm_serve_multinode_env")
        given = given if isinstance(given, Mapping) else {}
        missing = [k for k in sorted(site_env) if not str(given.get(k) or "").strip()
                   or str(given.get(k)).strip().startswith(_PLACEHOLDER_VALUES)]
        if missing:
            example = ", ".join(f"{k}: <interface>" for k in missing).replace("<interface>", "enP5p9s0")
            lines.append(f"{source}: field `vllm_serve_multinode_env`: the launch across {1 + len(workers)} nodes "
                         f"needs {', '.join(missing)} (profile {profile.name} launch.site_env: the interface the "
                         "recipe leaves to the site, for NCCL/Gloo bootstrap traffic), unset or still a "
                         "placeholder: set them in group_vars to the nodes' interface (`ip -br addr` on a node), "
                         f"e.g. vllm_serve_multinode_env: {{{example}}}")
    if lines:
        raise ConfigError("invalid inventory:\n  " + "\n  ".join(lines))


def check_inventory(inventory: Path, project: Path | None = None, profile: str | None = None,
                    overrides: Mapping[str, Any] | None = None, vllm_python: str | None = None) -> Gated:
    """The CLI's gate: read the inventory (read_inputs), then check."""
    try:
        inputs = read_inputs(inventory, overrides)
    except ConfigError as exc:
        raise GateRefused(redact_text(str(exc))) from exc
    return check(inputs, project, profile, vllm_python)


def validate(profile: str | None, inventory: Path | None, project: Path | None = None,
             vllm_python: str | None = None) -> Validated:
    """`vllm-acceptance validate`: with -i the whole gate (check_inventory); a profile alone as validate.py judges
    it (its own layout's launch)."""
    if inventory is None:
        return validate_profile(profile, None, project, vllm_python)
    gated = check_inventory(inventory, project, profile, None, vllm_python)
    planned = gated.plan
    return Validated(profile=gated.profile.name, profile_path=str(gated.profile.source), inventory=str(inventory),
                     variables_checked=gated.variables_checked, templated=gated.templated,
                     vllm_check=planned.vllm_check, vllm_check_lines=planned.vllm_check_lines)


def print_plan(args: Any) -> int:
    """`vllm-acceptance plan`: the gate, then the plan it made (plan.py render_text); exit 0, or 2 refused."""
    import json

    try:
        overrides = json.loads(args.vars)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--vars is not JSON ({exc})") from exc
    if not isinstance(overrides, dict):
        raise ConfigError(f"--vars {args.vars!r}: a JSON object of variables is expected")
    gated = check_inventory(args.inventory, args.project_dir, args.profile, overrides, args.vllm_python)
    print(json.dumps(gated.plan.to_dict(), indent=1) if args.json else render_text(gated.plan))
    return 0
