"""Issue 30 (1-3): unreachable nodes are evidence; inputs refused before any node; the project the user is in.

Unit level: the evidence record of an unreachable node, the verdict on a partly unreachable cluster, the refusals
(no gpu_nodes group, attach without a URL, a YAML error with its file, line and column) and where `run` finds its
project. tests/integration/test_unreachable_run.py runs the whole pipeline against nodes that are down.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_acceptance.api import _inventory_yaml_files, check_inventory_yaml, default_project_dir
from vllm_acceptance.core.findings import Finding, Status
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.core.rundir import require_gpu_nodes, validate_inventory_vars
from vllm_acceptance.preflight.stage import UNREACHABLE_EVIDENCE, read_unreachable, save_unreachable
from vllm_acceptance.verdict import decide

REPO = Path(__file__).resolve().parents[2]
# Ansible's message for a node with no sshd on its port (the integration test's 127.0.0.77:2 gives exactly this).
REFUSED = "Failed to connect to the host via ssh: ssh: connect to host 127.0.0.77 port 2: Connection refused"


def test_an_unreachable_node_is_saved_with_its_error_and_secrets_redacted(tmp_path: Path) -> None:
    assert read_unreachable(tmp_path) == {}
    save_unreachable(tmp_path, {"gpu-01": REFUSED}, [])
    kept = save_unreachable(tmp_path, {"gpu-02": "Permission denied for token s3cr3t-t0ken-value"},
                            ["s3cr3t-t0ken-value"])
    assert kept == read_unreachable(tmp_path)
    assert kept["gpu-01"] == REFUSED                                   # merged, as Ansible wrote it
    assert "s3cr3t-t0ken-value" not in (tmp_path / UNREACHABLE_EVIDENCE).read_text()
    assert kept["gpu-02"].startswith("Permission denied for token ")
    with pytest.raises(ValueError, match="bad host name"):
        save_unreachable(tmp_path, {"../etc": REFUSED})


def _passing(hosts: list[str]) -> list[Finding]:
    node = [Finding(check="compat.driver_branch", status=Status.PASS, host=h) for h in hosts]
    return node + [Finding(check="cache.reuse", status=Status.PASS), Finding(check="capacity.load", status=Status.PASS)]


def test_one_node_of_two_unreachable_is_incomplete_naming_it_and_its_error() -> None:
    healthy = decide(_passing(["gpu-01"]))
    assert healthy.verdict == "release"                                # the same findings, every node answered
    down = decide(_passing(["gpu-01"]), unreachable_hosts=["gpu-02"], unreachable_errors={"gpu-02": REFUSED})
    assert down.verdict == "incomplete" and "gpu-02" in down.missing
    named = [r for r in down.reasons if r.startswith("gpu-02 unreachable")]
    assert named and REFUSED in named[0] and "none of its preflight checks ran" in named[0]


def test_a_gpu_profile_without_gpu_nodes_is_refused_naming_the_group() -> None:
    kimi = load_profile(REPO / "profiles" / "kimi-k3.yml")
    with pytest.raises(ConfigError, match=r"group `gpu_nodes` is missing or empty.*all\.children\.gpu_nodes\.hosts"):
        require_gpu_nodes(kimi, [], "inventory site")
    require_gpu_nodes(kimi, ["gb300-a01"], "inventory site")
    require_gpu_nodes(load_profile(REPO / "profiles" / "cpu-lab.yml"), [], "inventory lab")   # no GPUs to check


def test_attach_without_a_base_url_is_refused_with_the_reason() -> None:
    base = {"acceptance_profile": "kimi-k3", "acceptance_owner": "team", "vllm_serve_mode": "attach"}
    with pytest.raises(ConfigError) as refused:
        validate_inventory_vars(base, "inventory site", REPO)
    assert "vllm_base_url is required because vllm_serve_mode is attach" in str(refused.value)
    assert "is a required property" not in str(refused.value)
    validate_inventory_vars({**base, "vllm_base_url": "http://head-01:8000/v1"}, "inventory site", REPO)


def test_a_yaml_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    inventory = tmp_path / "site"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n")
    (inventory / "group_vars" / "all.yml").write_text(
        "acceptance_profile: kimi-k3\nsecret: !unsafe '{{ x }}'\nacceptance_owner: [team\nvllm_serve_mode: launch\n")
    with pytest.raises(ConfigError) as refused:
        check_inventory_yaml(inventory)
    message = str(refused.value)
    assert f"inventory {inventory / 'group_vars' / 'all.yml'}, line 4, column 16: YAML error" in message, message
    (inventory / "group_vars" / "all.yml").write_text("acceptance_profile: kimi-k3\nsecret: !unsafe '{{ x }}'\n")
    check_inventory_yaml(inventory)                                    # Ansible's tags are YAML too


@pytest.mark.parametrize("name", ["lab", "example-gb300"])
def test_the_shipped_inventories_parse(name: str) -> None:
    inventory = REPO / "inventories" / name
    assert len(_inventory_yaml_files(inventory)) >= 2
    check_inventory_yaml(inventory)


def _project(root: Path) -> Path:
    (root / "playbooks").mkdir(parents=True)
    (root / "accept.yml").write_text("---\n")
    (root / "playbooks" / "validate.yml").write_text("---\n")
    return root


def test_run_uses_the_project_the_user_is_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", str(tmp_path / "collections"))
    site = _project(tmp_path / "site-checkout")
    (site / "inventories" / "prod").mkdir(parents=True)
    monkeypatch.chdir(site / "inventories" / "prod")
    assert default_project_dir() == site                               # the nearest directory above holding accept.yml
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert default_project_dir(site / "inventories" / "prod") == site  # else the inventory's project
    with pytest.raises(ConfigError, match="pass --project DIR"):
        default_project_dir(elsewhere)                                 # never the checkout the package came from
    installed = _project(tmp_path / "collections" / "ansible_collections" / "vllm" / "acceptance")
    assert default_project_dir(elsewhere) == installed


def test_run_json_errors_reach_the_report(tmp_path: Path) -> None:
    """report/build.py: the reasons and the unproven list name each node with its recorded error."""
    from vllm_acceptance.report.build import build_report
    from vllm_acceptance.report.views import unproven

    (tmp_path / "findings").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"inventory": "site", "run_id": "r1", "hosts": ["gpu-01"],
                                                   "unreachable_hosts": ["gpu-01"],
                                                   "unreachable_errors": {"gpu-01": REFUSED}}))
    report = build_report(tmp_path, load_profile(REPO / "profiles" / "kimi-k3.yml"))
    assert report["verdict"] == "incomplete" and report["unreachable_errors"] == {"gpu-01": REFUSED}
    assert any(r.startswith("gpu-01 unreachable") and REFUSED in r for r in report["verdict_reasons"])
    assert any(row["id"] == "gpu-01" and REFUSED in row["reason"] for row in unproven(report))
    serve = [f for f in report["findings"] if f["check"] == "compat.serve"][0]
    assert serve["status"] == "missing" and "node(s) gpu-01 could not be reached at preflight" in serve["reason"]
