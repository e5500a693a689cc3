"""The collection route: build the tarball offline, install it into a temporary collections path, read the
docs with ansible-doc, and run a site playbook of FQCN roles and modules against the real lab vLLM through
the Python entry point (vllm_acceptance.api.accept), nothing taken from the checkout."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from vllm_acceptance.api import EXIT_CODES, accept

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SITE = REPO / "tests" / "fixtures" / "collection" / "site.yml"
MODULES = ["acceptance_loadmerge", "acceptance_monitoring", "acceptance_preflight", "acceptance_probe",
           "acceptance_process", "acceptance_remediation", "acceptance_report", "acceptance_run", "acceptance_serve"]
ROLES = ["driver_upgrade", "gpu_memory_sampler", "node_state", "preflight", "scheduler_hook", "vllm_serve"]


def _site_env(site: Path, collections: Path) -> dict[str, str]:
    """A site's environment: its own ansible.cfg (no library or roles path), the temporary collections path."""
    cfg = site / "ansible.cfg"
    cfg.write_text("[defaults]\nhost_key_checking = False\nretry_files_enabled = False\n")
    return {"ANSIBLE_CONFIG": str(cfg), "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(site), "ANSIBLE_NOCOLOR": "1"}


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
    for never in (".venv", ".venv-lab", ".lab", "reports", "tests/unit", "tests/integration", "ansible.cfg"):
        assert not any(n == never or n.startswith(never + "/") for n in names), f"{never} shipped in the collection"
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--offline", "-p", str(collections),
                              str(tarball)], cwd=site, env=_site_env(site, collections), capture_output=True,
                             text=True, timeout=120)
    assert install.returncode == 0, install.stdout + install.stderr
    root = collections / "ansible_collections" / "vllm" / "acceptance"
    assert (root / "MANIFEST.json").is_file()
    return site, root


def test_ansible_doc_shows_the_fqcn_modules_roles_and_callback(installed: tuple[Path, Path]) -> None:
    site, root = installed
    env = _site_env(site, root.parents[2])
    listing = subprocess.run([str(BIN / "ansible-doc"), "-l", "vllm.acceptance"], cwd=site, env=env,
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    for module in MODULES:
        assert f"vllm.acceptance.{module}" in listing.stdout
    doc = subprocess.run([str(BIN / "ansible-doc"), "vllm.acceptance.acceptance_run"], cwd=site, env=env,
                         capture_output=True, text=True, timeout=120)
    assert doc.returncode == 0 and "host_variables" in doc.stdout, doc.stderr
    roles = subprocess.run([str(BIN / "ansible-doc"), "-t", "role", "-l", "vllm.acceptance"], cwd=site, env=env,
                           capture_output=True, text=True, timeout=120)
    assert all(f"vllm.acceptance.{r}" in roles.stdout for r in ROLES), roles.stdout + roles.stderr
    callback = subprocess.run([str(BIN / "ansible-doc"), "-t", "callback", "vllm.acceptance.progress"], cwd=site,
                              env=env, capture_output=True, text=True, timeout=120)
    assert callback.returncode == 0 and "waiting for /health" in " ".join(callback.stdout.split()), callback.stderr


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
