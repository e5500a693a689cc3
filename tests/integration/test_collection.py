"""The collection route: build the tarball offline, install it into a temporary collections path, read the
docs with ansible-doc, run the collection's accept playbook with --check, and run a site playbook of FQCN roles
and modules against the real lab vLLM through the Python entry point (vllm_acceptance.api.accept), nothing taken
from the checkout: its own ansible.cfg (short doc-fragment names, library paths) is out of reach (issue 30)."""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.api import EXIT_CODES, accept

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SITE = REPO / "tests" / "fixtures" / "collection" / "site.yml"
MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("*.py"))
ROLES = ["driver_upgrade", "gpu_memory_sampler", "node_state", "preflight", "scheduler_hook", "vllm_serve"]
# What the build must keep out (galaxy.yml build_ignore): development and run output at the top, tests anywhere.
NEVER_SHIPPED = (".venv", ".venv-lab", ".lab", ".collections", ".git", ".ci", ".hypothesis", ".pytest_cache",
                 "reports", "tests", "benchmarks", "molecule", "ansible.cfg", "Makefile")


def _filters() -> list[str]:
    """Every filter the collection's plugins register (FilterModule.filters()), so a new one must be documented."""
    names: list[str] = []
    for path in sorted((REPO / "plugins" / "filter").glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"_collection_filter_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        plugin = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plugin)
        names += plugin.FilterModule().filters()
    return sorted(names)


def _fragments(module: Path) -> list[str]:
    """The doc fragments a module's DOCUMENTATION extends."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            return list(yaml.safe_load(ast.literal_eval(node.value)).get("extends_documentation_fragment", []))
    raise AssertionError(f"{module} has no DOCUMENTATION")


def _kept_inventory(name: str) -> bool:
    """The inventories the collection ships: the lab and the examples (issue 30: a site's own never)."""
    parts = name.split("/")
    return len(parts) < 2 or parts[1] == "lab" or parts[1].startswith("example-")


def _shipped_by_mistake(names: set[str]) -> list[str]:
    """Tarball members that must not be there: site inventories, tests and test files, lab and run artefacts."""
    bad = []
    for name in sorted(names):
        parts = name.split("/")
        if (parts[0] in NEVER_SHIPPED or parts[0].startswith(".") or {"tests", "molecule", "__pycache__"} & set(parts)
                or (parts[0] == "inventories" and not _kept_inventory(name))
                or parts[-1] == "conftest.py" or fnmatch.fnmatch(parts[-1], "test_*.py")):
            bad.append(name)
    return bad


def _site_env(site: Path, collections: Path) -> dict[str, str]:
    """A site's environment: its own ansible.cfg (no library or roles path), the temporary collections path."""
    cfg = site / "ansible.cfg"
    cfg.write_text("[defaults]\nhost_key_checking = False\nretry_files_enabled = False\n")
    return {"ANSIBLE_CONFIG": str(cfg), "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(site), "TMPDIR": str(site), "ANSIBLE_NOCOLOR": "1"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(site dir, installed collection root): ansible-galaxy build and install, both offline."""
    site = tmp_path_factory.mktemp("site")
    dist, collections = site / "dist", site / "collections"
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), str(REPO)],
                           cwd=site, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    tarball = dist / "vllm-acceptance-0.1.0.tar.gz"
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    for must in ("MANIFEST.json", "meta/runtime.yml", "plugins/callback/progress.py",
                 "playbooks/accept.yml", "profiles/kimi-k3.yml", "pyproject.toml", "src/vllm_acceptance/api.py",
                 *(f"plugins/modules/{m}.py" for m in MODULES), *(f"roles/{r}/meta/argument_specs.yml" for r in ROLES)):
        assert must in names, f"{must} not in the collection"
    assert _shipped_by_mistake(names) == [], "galaxy.yml build_ignore lets these through"
    assert {n.split("/")[1] for n in names if n.startswith("inventories/") and n.count("/") == 1} >= \
        {"lab", "example-gb300"}, "the lab and example inventories must ship"
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(collections),
                              str(tarball)], cwd=site, env=_site_env(site, collections), capture_output=True,
                             text=True, timeout=120)
    assert install.returncode == 0, install.stdout + install.stderr
    root = collections / "ansible_collections" / "vllm" / "acceptance"
    assert (root / "MANIFEST.json").is_file()
    return site, root


def _doc_json(kind: str, names: list[str], site: Path, env: dict[str, str]) -> dict:
    """ansible-doc --json of several plugins in one process; a plugin it cannot document is absent (and named on
    stderr), so the caller compares the keys."""
    proc = subprocess.run([str(BIN / "ansible-doc"), "-t", kind, "--json", *(f"vllm.acceptance.{n}" for n in names)],
                          cwd=site, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "ERROR" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def test_ansible_doc_documents_every_module_filter_role_and_the_callback(installed: tuple[Path, Path]) -> None:
    """Outside the checkout, with a site's ansible.cfg: every module (doc fragments resolved by their
    fully-qualified names), every filter the plugins register, the callback and the roles."""
    site, root = installed
    env = _site_env(site, root.parents[2])
    modules = _doc_json("module", MODULES, site, env)
    assert sorted(modules) == [f"vllm.acceptance.{m}" for m in MODULES]
    for name, entry in modules.items():
        assert entry["doc"]["short_description"] and entry["examples"], name
        if "vllm.acceptance.acceptance" in _fragments(REPO / "plugins" / "modules" / f"{name.rsplit('.', 1)[1]}.py"):
            assert "run_dir" in entry["doc"]["options"], f"{name}: the shared fragment's options are missing"
    assert "host_variables" in modules["vllm.acceptance.acceptance_run"]["doc"]["options"]
    filters = _filters()
    assert len(filters) >= 4
    documented = _doc_json("filter", filters, site, env)
    assert sorted(documented) == [f"vllm.acceptance.{f}" for f in filters]
    for name, entry in documented.items():
        assert entry["doc"]["short_description"] and entry["examples"] and entry["return"]["_value"], name
        assert name in entry["examples"], f"{name}: its examples should call it by its FQCN"
    callback = _doc_json("callback", ["progress"], site, env)["vllm.acceptance.progress"]
    assert "waiting for /health" in " ".join(" ".join(callback["doc"]["description"]).split())
    roles = subprocess.run([str(BIN / "ansible-doc"), "-t", "role", "-l", "vllm.acceptance"], cwd=site, env=env,
                           capture_output=True, text=True, timeout=120)
    assert all(f"vllm.acceptance.{r}" in roles.stdout for r in ROLES), roles.stdout + roles.stderr


def test_the_collection_accept_playbook_runs_in_check_mode_from_outside_the_checkout(
        installed: tuple[Path, Path]) -> None:
    """`ansible-playbook -i <installed lab inventory> vllm.acceptance.accept --check` from a site directory: every
    stage resolves its roles, modules, filters, vars and profile inside the installed collection and the run ends
    without a failure. Check mode starts nothing; the interpreter only has to exist (a link, so that no path of
    the checkout appears in the output)."""
    site, root = installed
    python = site / "python"
    python.unlink(missing_ok=True)
    python.symlink_to(sys.executable)
    model = site / "models" / "tiny-agent"
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(root / "inventories" / "lab"),
                           "vllm.acceptance.accept", "--check", "-e", f"vllm_serve_python={python}",
                           "-e", f"preflight_runtime_python={python}", "-e", f"vllm_serve_model_path={model}"],
                          cwd=site, env=_site_env(site, root.parents[2]), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    recap = out.rsplit("PLAY RECAP", 1)[-1]
    assert "failed=0" in recap and "rescued=0" in recap and "unreachable=0" in recap, out[-4000:]
    assert "fatal:" not in out and "[ERROR]" not in out, out[-4000:]
    assert f"--model {model}" in out                      # the launch it would make, shown, not made
    assert str(root / "roles" / "vllm_serve") in out      # the installed collection's role ran
    # The controller's own venv may sit in the checkout (this suite's does); nothing else of it may appear.
    assert str(REPO) not in out.replace(sys.prefix, "<controller venv>"), "the run reached into the checkout"


def test_build_ignore_keeps_every_site_inventory_out_whatever_its_name(tmp_path: Path) -> None:
    """galaxy.yml's patterns on a small tree: inventories named like the kept ones but not them, loose files, tests
    and lab artefacts are left out; lab and every example-* (one added later, too) are kept."""
    tree = tmp_path / "tree"
    kept = ["inventories/lab/hosts.yml", "inventories/lab/group_vars/all.yml", "inventories/example-gb300/hosts.yml",
            "inventories/example-b300/group_vars/all.yml", "plugins/filter/redact.py", "roles/r/tasks/main.yml"]
    dropped = ["inventories/prod/hosts.yml", "inventories/labs/hosts.yml", "inventories/lab-old/hosts.yml",
               "inventories/example/hosts.yml", "inventories/examples/hosts.yml", "inventories/la/hosts.yml",
               "inventories/e2e/hosts.yml", "inventories/README.md", "inventories/site.yml",
               "tests/unit/test_x.py", "tests/conftest.py", "roles/r/tests/test.yml", "molecule/default/molecule.yml",
               "benchmarks/b.py", "reports/lab/latest/report.json", ".lab/models/m", ".venv-lab/bin/python",
               ".collections/x", "ansible.cfg", "src/pkg/__pycache__/m.cpython-312.pyc"]
    for rel in [*kept, *dropped, "meta/runtime.yml", "README.md"]:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text("---\n")
    shutil.copy(REPO / "galaxy.yml", tree / "galaxy.yml")
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path / "dist"),
                            str(tree)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stdout + build.stderr
    with tarfile.open(next((tmp_path / "dist").glob("*.tar.gz"))) as tar:
        names = set(tar.getnames())
    assert set(kept) <= names
    assert sorted(names & set(dropped)) == []
    assert _shipped_by_mistake(names) == []


def test_the_collection_carries_the_package_source_unchanged(installed: tuple[Path, Path]) -> None:
    """The modules' Python package installs from the tarball's own src/ and pyproject.toml (`pip install
    <collection root>`): every package file in FILES.json has the checksum of the checkout's file."""
    _, root = installed
    files = json.loads((root / "FILES.json").read_text())["files"]
    shipped = {f["name"]: f["chksum_sha256"] for f in files if f["ftype"] == "file"}
    package = sorted(p for p in (REPO / "src" / "vllm_acceptance").rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
    assert package and "pyproject.toml" in shipped
    for path in [*package, REPO / "pyproject.toml"]:
        rel = str(path.relative_to(REPO))
        assert shipped.get(rel) == hashlib.sha256(path.read_bytes()).hexdigest(), f"{rel} differs or is missing"


@pytest.mark.lab
def test_site_playbook_with_fqcn_roles_and_modules_against_the_lab(installed, lab_server) -> None:
    """A real run: the collection's validate playbook, preflight and vllm_serve roles (attach to the session's
    lab vLLM), the agent probe and the report modules, driven by api.accept with the progress callback.
    Cache and load are not run here, so the honest verdict is incomplete (exit 40), never release."""
    site, root = installed
    site_book = site / "site.yml"
    shutil.copy(SITE, site_book)
    inventory = site / "hosts.yml"
    inventory.write_text(json.dumps({"all": {
        "hosts": {"localhost": {"ansible_connection": "local",
                                "ansible_python_interpreter": "{{ ansible_playbook_python }}"}},
        "children": {"gpu_nodes": {"hosts": {"localhost": None}}, "vllm_head": {"hosts": {"localhost": None}}},
        "vars": {"acceptance_profile": "cpu-lab", "acceptance_owner": "site-team", "vllm_serve_mode": "attach",
                 "vllm_base_url": lab_server.base_url, "vllm_serve_pid": lab_server.pid,
                 "vllm_serve_startup_log": str(lab_server.log_path),
                 "preflight_runtime_python": str(REPO / ".venv-lab" / "bin" / "python")}}}))
    lines: list[str] = []
    events: list[dict] = []
    result = accept(inventory, playbook=site_book, project_dir=root, reports_dir=site / "reports",
                    env={**_site_env(site, root.parents[2]), "VLLM_API_KEY": ""}, on_line=lines.append,
                    on_event=events.append)
    text = "\n".join(lines)
    assert result.status == "successful", text[-4000:]
    report = json.loads((result.run_dir / "report.json").read_text())
    assert result.verdict == report["verdict"] == "incomplete"
    assert result.exit_code == EXIT_CODES["incomplete"] == 40
    statuses = {f["check"]: f["status"] for f in report["findings"] if f["host"] is None}
    assert statuses["agent.tool_schemas"] == "pass"
    assert statuses["cache.reuse"] == "missing" and statuses["capacity.load"] == "missing"
    # The progress callback of the collection streamed the stages, the findings as they landed, the verdict.
    for stage in ("validate", "preflight", "serve", "agent", "report"):
        assert any(f"] {stage}" in line and "started" in line for line in lines), (stage, text[-3000:])
    assert "findings:" in text and "verdict incomplete" in text and "FAILED - RETRYING" not in text
    kinds = [e["event"] for e in events]
    assert "findings" in kinds and kinds[-1] == "end"
    on_disk = [json.loads(x) for x in (result.run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in on_disk] == kinds           # the run directory holds every event, in order
