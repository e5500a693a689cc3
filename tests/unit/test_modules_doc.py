"""Every module documents exactly the options its argument_spec takes, and its docs parse."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

MODULES = sorted((Path(__file__).resolve().parents[2] / "plugins" / "modules").glob("*.py"))


def module_strings(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}


def argument_spec_keys(path: Path) -> set[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "argument_spec" and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError(f"{path.name}: no literal argument_spec")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_documentation_matches_argument_spec(path: Path) -> None:
    strings = module_strings(path)
    for name in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
        assert name in strings, f"{path.name} lacks {name}"
        yaml.safe_load(strings[name])
    documented = set(yaml.safe_load(strings["DOCUMENTATION"]).get("options", {}))
    assert documented == argument_spec_keys(path)
    assert "supports_check_mode=True" in path.read_text()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_ansible_doc_reads_it(path: Path) -> None:
    doc = Path(sys.executable).parent / "ansible-doc"
    proc = subprocess.run([str(doc), "-M", str(path.parent), path.stem], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ERROR" not in proc.stderr, proc.stderr
