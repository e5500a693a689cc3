"""An inventory's YAML files read as YAML before Ansible reads them (issue 30, 2; issue 43, 1): Ansible warns and
goes on without a host file that does not parse, and a broken group_vars file stops it without a file name. The
gate (gate.py) and `vllm-acceptance run` (api.py) refuse such a file naming the file, line and column."""

from __future__ import annotations

from pathlib import Path

import yaml

from .profile import ConfigError

# Files of an inventory that Ansible reads as YAML: its host files, group_vars/ and host_vars/ (files or folders).
YAML_SUFFIXES = (".yml", ".yaml", ".json")


def inventory_yaml_files(inventory: Path) -> list[Path]:
    base = inventory if inventory.is_dir() else inventory.parent
    files = [inventory] if inventory.is_file() and inventory.suffix in YAML_SUFFIXES else []
    if inventory.is_dir():
        files += sorted(p for p in inventory.iterdir() if p.is_file() and p.suffix in YAML_SUFFIXES)
    for vars_dir in (base / "group_vars", base / "host_vars"):
        if vars_dir.is_dir():
            files += sorted(p for p in vars_dir.rglob("*") if p.is_file() and not p.name.startswith(".")
                            and (p.suffix in YAML_SUFFIXES or not p.suffix))
    return files


def check_inventory_yaml(inventory: Path) -> None:
    """Refuse an inventory whose YAML does not parse, naming the file, line and column. Tags Ansible knows
    (!unsafe, !vault) are accepted as they are."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    for path in inventory_yaml_files(inventory):
        try:
            yaml.load(path.read_text(errors="replace"), Loader=Loader)  # noqa: S506 - SafeLoader, tags ignored
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            what = ": ".join(str(x) for x in (exc.context, exc.problem) if x)
            raise ConfigError(f"inventory {path}{where}: YAML error: {what}; fix the YAML there "
                              "(nothing was run, no node was touched)") from exc
