"""Every module documents exactly the options its argument_spec takes, and its docs parse."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
MODULES = sorted((PLUGINS / "modules").glob("*.py"))
FRAGMENTS = PLUGINS / "doc_fragments"
COLLECTION = "vllm.acceptance."


def module_strings(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    return {t.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}


def fragment_options(name: str) -> dict[str, object]:
    """Options of a doc fragment `vllm.acceptance.file[.VARIABLE]` from plugins/doc_fragments (DOCUMENTATION by
    default). Only the fully-qualified name resolves in an installed collection (issue 30: a short name needs the
    checkout's ansible.cfg)."""
    assert name.startswith(COLLECTION), f"doc fragment {name!r}: write it fully qualified, {COLLECTION}{name}"
    module, _, variable = name.removeprefix(COLLECTION).partition(".")
    tree = ast.parse((FRAGMENTS / f"{module}.py").read_text())
    wanted = variable.upper() or "DOCUMENTATION"
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == wanted for t in node.targets):
            return yaml.safe_load(node.value.value)["options"]
    raise AssertionError(f"doc fragment {name} not found in {FRAGMENTS}")


def documented_options(doc: dict) -> set[str]:
    options = set(doc.get("options", {}))
    for fragment in doc.get("extends_documentation_fragment", []):
        options |= set(fragment_options(fragment))
    return options


def argument_spec_keys(path: Path) -> set[str]:
    """The options the module takes: its literal argument_spec plus what AcceptanceModule adds
    (run_dir unless run_dir=False, profile_path when profile=True)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AcceptanceModule"):
            continue
        kwargs = {k.arg: k.value for k in node.keywords}
        spec = kwargs.get("argument_spec")
        assert isinstance(spec, ast.Dict), f"{path.name}: no literal argument_spec"
        keys = {k.value for k in spec.keys if isinstance(k, ast.Constant)}
        run_dir = kwargs.get("run_dir")
        if not (isinstance(run_dir, ast.Constant) and run_dir.value is False):
            keys.add("run_dir")
        profile = kwargs.get("profile")
        if isinstance(profile, ast.Constant) and profile.value is True:
            keys.add("profile_path")
        return keys
    raise AssertionError(f"{path.name}: does not build its module with the shared AcceptanceModule base")


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_documentation_matches_argument_spec(path: Path) -> None:
    strings = module_strings(path)
    for name in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
        assert name in strings, f"{path.name} lacks {name}"
        yaml.safe_load(strings[name])
    documented = documented_options(yaml.safe_load(strings["DOCUMENTATION"]))
    assert documented == argument_spec_keys(path)
    assert "module_utils.acceptance_base import AcceptanceModule" in path.read_text()
    assert "AnsibleModule(" not in path.read_text(), "modules use the shared base (check mode on by default)"


@pytest.fixture(scope="module")
def ansible_doc() -> subprocess.CompletedProcess[str]:
    """One ansible-doc run over every module (about a second each when run one by one): it renders each module's
    page and fails, naming the module, on any it cannot read."""
    doc = Path(sys.executable).parent / "ansible-doc"
    return subprocess.run([str(doc), "-M", str(PLUGINS / "modules"), *(p.stem for p in MODULES)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_ansible_doc_reads_it(ansible_doc: subprocess.CompletedProcess[str], path: Path) -> None:
    assert ansible_doc.returncode == 0 and "ERROR" not in ansible_doc.stderr, ansible_doc.stderr
    assert f"({path})" in ansible_doc.stdout, f"ansible-doc printed no page for {path.stem}"


FILTER_DOCS = sorted((PLUGINS / "filter").glob("*.yml"))


@pytest.mark.parametrize("path", FILTER_DOCS, ids=lambda p: p.stem)
def test_filter_doc_files_parse_and_name_their_filter(path: Path) -> None:
    """ansible-doc -t filter reads plugins/filter/<filter>.yml (the way ansible.builtin documents its filters):
    the file's name is the filter's, and its examples are YAML (tests/integration/test_collection.py reads them
    installed)."""
    doc = yaml.safe_load(path.read_text())
    assert set(doc) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    assert doc["DOCUMENTATION"]["name"] == path.stem and doc["DOCUMENTATION"]["options"]["_input"]["required"]
    yaml.safe_load(doc["EXAMPLES"])
    assert "_value" in doc["RETURN"]


def test_callback_documentation_parses() -> None:
    doc = yaml.safe_load(module_strings(PLUGINS / "callback" / "progress.py")["DOCUMENTATION"])
    assert doc["name"] == "progress" and doc["type"] == "stdout" and doc["description"]
