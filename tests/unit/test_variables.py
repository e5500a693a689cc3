"""Typo-proof inventory variables: every variable the product reads is declared; an undeclared one with a
product prefix stops validation with the closest declared name; type errors name the type and an example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from vllm_acceptance.core.profile import ConfigError
from vllm_acceptance.core.rundir import validate_inventory_vars
from vllm_acceptance.core.variables import PREFIXES, declared_variables

from support import modules as support_modules

REPO = Path(__file__).resolve().parents[2]
BASE = {"acceptance_profile": "cpu-lab", "acceptance_owner": "me", "vllm_serve_mode": "launch"}


def _error(extra: dict, host_vars: dict | None = None) -> str:
    with pytest.raises(ConfigError) as exc:
        validate_inventory_vars({**BASE, **extra}, "inventory lab", REPO, host_vars)
    return str(exc.value)


def test_a_misspelled_variable_stops_with_the_closest_name() -> None:
    message = _error({"vllm_serv_stop_at_end": True})
    assert "unknown variable `vllm_serv_stop_at_end`" in message
    assert "did you mean `vllm_serve_stop_at_end`?" in message
    # the correct spelling passes: the check is not a blanket refusal
    validate_inventory_vars({**BASE, "vllm_serve_stop_at_end": True}, "inventory lab", REPO)


@pytest.mark.parametrize(("typo", "meant"), [
    ("preflight_comand_timeout_s", "preflight_command_timeout_s"),      # a role option (argument_specs)
    ("rebuild_maintenance_windw", "rebuild_maintenance_window"),        # a playbook input (schema)
    ("acceptance_reviwer", "acceptance_reviewer"),
    ("loadgen_concurency", "loadgen_concurrency"),
])
def test_typos_in_every_family_name_the_declared_variable(typo: str, meant: str) -> None:
    assert f"did you mean `{meant}`?" in _error({typo: "x"})


def test_a_typo_in_host_vars_names_the_host() -> None:
    message = _error({}, {"gpu-01": {"preflight_path_prefx": "/opt/bin"}})
    assert "host gpu-01" in message and "did you mean `preflight_path_prefix`?" in message


def test_foreign_variables_sharing_a_prefix_can_be_listed_as_unchecked() -> None:
    assert "unknown variable `vllm_cluster_name`" in _error({"vllm_cluster_name": "east"})
    validate_inventory_vars({**BASE, "vllm_cluster_name": "east", "acceptance_unchecked_vars": ["vllm_cluster_name"]},
                            "inventory lab", REPO)


@pytest.mark.parametrize(("extra", "expected"), [
    ({"vllm_serve_stop_at_end": "maybe"}, "expected a boolean, e.g. true"),
    ({"acceptance_review_period_days": "monthly"}, "expected an integer 1..365 or a string matching ^[0-9]+$, e.g. 30"),
    ({"preflight_command_timeout_s": "ten"}, "expected an integer, e.g. preflight_command_timeout_s: 30"),
    ({"preflight_launch_args": {"a": 1}}, "expected a list, e.g. preflight_launch_args: [a, b]"),
    ({"vllm_serve_runtime": "kubernetes"}, "expected one of 'process', 'docker', 'podman'"),
    ({"loadgen_concurrency": "many"}, "expected an integer 1.. or a string matching ^[0-9]+$, e.g. 4"),
])
def test_type_errors_name_the_expected_type_and_an_example(extra: dict, expected: str) -> None:
    message = _error(extra)
    assert next(iter(extra)) in message and expected in message
    assert "anyOf" not in message


def test_values_ansible_would_convert_are_accepted() -> None:
    validate_inventory_vars({**BASE, "preflight_command_timeout_s": "120", "preflight_pull_image": "yes",
                             "vllm_serve_port": "8000", "vllm_serve_extra_args": ["--max-num-seqs", "8"]},
                            "inventory lab", REPO)


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
PATTERN = re.compile(r"\b(?:" + "|".join(p.rstrip("_") for p in PREFIXES) + r")_[a-z0-9_]+")
# Names with a product prefix that are not variables: modules, filters, roles, groups, the package, a task file.
NOT_VARIABLES = {"acceptance_run", "acceptance_preflight", "acceptance_serve", "acceptance_probe", "acceptance_process",
                 "acceptance_report", "acceptance_monitoring", "acceptance_loadmerge", "acceptance_remediation",
                 "acceptance_redact", "acceptance_redact_obj", "acceptance_with_flags", "acceptance_node_commands",
                 "vllm_acceptance", "vllm_check", "vllm_argcheck",   # the package, its modules serve/vllm_*check.py
                 "vllm_serve", "vllm_head", "vllm_workers", "rebuild_node", "rollback_image", "rollback_triggers",
                 "rollback_versions",
                 # the node_state filter, the group rollback.yml puts its targets in, a key of upgrade-entry.json
                 "node_state_records", "rollback_targets", "preflight_findings",
                 # acceptance_probe's arguments for the loadgen hosts' agents (keys of its argument dict)
                 "loadgen_hosts", "loadgen_agents", "loadgen_token",
                 "recheck_timer"}     # the role of playbooks/recheck_timer.yml


def _reads_and_definitions() -> tuple[set[str], set[str]]:
    reads, defined = set(), set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "vars" and isinstance(value, dict):
                    defined.update(value)
                if key in ("ansible.builtin.set_fact", "set_fact") and isinstance(value, dict):
                    defined.update(value)
                if key in ("register", "loop_var") and isinstance(value, str):
                    defined.add(value)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, str):
            reads.update(PATTERN.findall(node))

    for path in [REPO / "accept.yml", REPO / "recheck.yml", *REPO.glob("playbooks/**/*.yml"),
                 *REPO.glob("roles/*/tasks/*.yml")]:
        walk(yaml.load(path.read_text(), Loader=_Loader))  # noqa: S506 - SafeLoader subclass
    for path in REPO.glob("roles/*/templates/*"):
        reads.update(PATTERN.findall(path.read_text()))
    for path in [*REPO.glob("roles/*/defaults/*.yml"), *REPO.glob("roles/*/vars/*.yml")]:
        data = yaml.load(path.read_text(), Loader=_Loader) or {}  # noqa: S506
        defined.update(data)
        walk(data)
    return reads, defined


def test_every_variable_the_product_reads_is_declared() -> None:
    """Grep the playbooks, roles and templates: whatever they read with a product prefix and do not define
    themselves (vars, set_fact, register) is an input, and must be declared in the schema or a role's spec."""
    reads, defined = _reads_and_definitions()
    inputs = reads - defined - NOT_VARIABLES
    declared = set(declared_variables(REPO))
    assert inputs, "the scan found no inputs: it is broken"
    assert sorted(inputs - declared) == []
    # role defaults are inputs too: each is a declared option of its role
    for defaults in REPO.glob("roles/*/defaults/main.yml"):
        names = set(yaml.load(defaults.read_text(), Loader=_Loader) or {})  # noqa: S506
        assert sorted(n for n in names if n not in declared) == [], defaults


def test_validate_yml_passes_exactly_the_product_prefixes() -> None:
    play = yaml.safe_load((REPO / "playbooks" / "validate.yml").read_text())[0]
    assert play["vars"]["product_var_prefixes"] == [p.rstrip("_") for p in PREFIXES]


def test_the_collection_playbook_runs_the_same_stages_as_accept_yml() -> None:
    root = [i["ansible.builtin.import_playbook"] for i in yaml.safe_load((REPO / "accept.yml").read_text())]
    collection = [i["ansible.builtin.import_playbook"]
                  for i in yaml.safe_load((REPO / "playbooks" / "accept.yml").read_text())]
    assert [Path(p).name for p in root] == collection


# Secrets in refused inputs: the message names the field and the fix, never the credentials it quotes
# (core/variables.py module docstring; docs/acceptance.md "Contracts").
@pytest.mark.parametrize("field", ["vllm_base_url", "vllm_direct_url", "prometheus_url", "vllm_metrics_url"])
def test_a_url_refused_by_its_pattern_is_quoted_without_its_credentials(field: str) -> None:
    message = _error({field: "ftp://user:PLANTEDpw@head-01:8000/v1"})
    assert f"field `{field}`" in message and "expected a string matching ^https?://" in message
    assert "PLANTEDpw" not in message and "user:" not in message
    assert "ftp://***REDACTED***@head-01:8000/v1" in message     # what is wrong stays readable


def test_the_agent_reference_url_is_quoted_without_its_credentials() -> None:
    message = _error({"agent_reference_url": "ftp://user:PLANTEDpw@ref.example/v1",
                      "agent_reference_model": "m"})
    assert "field `agent_reference_url`" in message and "PLANTEDpw" not in message


def test_a_long_url_cut_in_a_type_error_is_redacted_before_the_cut() -> None:
    # describe() shortens a value to 60 characters: cut before the '@', the password would no longer look like one
    value = ["http://operator:PLANTEDpw" + "x" * 60 + "@head-01:8000/v1"]
    message = _error({"vllm_serve_url": value})
    assert "field `vllm_serve_url`" in message and "PLANTED" not in message


def test_secret_named_and_operator_listed_values_are_never_quoted() -> None:
    message = _error({"vllm_serve_api_key": ["sk-PLANTEDkey"], "preflight_secrets": ["PLANTEDsecret"],
                      "vllm_serve_extra_args": "--api-key sk-PLANTEDarg",   # a string, not a list
                      "vllm_serve_runtime": "PLANTEDsecret"})
    for field in ("vllm_serve_api_key", "vllm_serve_extra_args", "vllm_serve_runtime"):
        assert f"field `{field}`" in message
    assert "PLANTED" not in message, message


def test_a_host_line_is_redacted_with_the_groups_literal_secrets() -> None:
    message = _error({"preflight_secrets": ["PLANTEDsecret"]}, {"gpu-01": {"vllm_serve_runtime": "PLANTEDsecret"}})
    assert "host gpu-01" in message and "field `vllm_serve_runtime`" in message and "PLANTED" not in message


def test_the_run_module_fails_with_the_same_redacted_message(tmp_path: Path) -> None:
    # playbooks/validate.yml -> acceptance_run -> open_run -> validate_variables: the task's msg is what the
    # console shows (Ansible drops the invocation's arguments below -vvv)
    result, _ = support_modules.run_module("acceptance_run", {
        "project_dir": str(REPO), "reports_dir": str(tmp_path / "reports"), "inventory": "lab",
        "variables": {**BASE, "vllm_base_url": "ftp://user:PLANTEDpw@head-01:8000/v1"}}, tmp_path)
    assert result.get("failed") and "field `vllm_base_url`" in result["msg"]
    assert "ftp://***REDACTED***@head-01:8000/v1" in result["msg"] and "PLANTEDpw" not in result["msg"]
    assert not (tmp_path / "reports").exists()     # refused before any run directory is opened


def test_acceptance_fail_on_is_declared_and_its_verdicts_checked() -> None:
    """accept.yml's verdict gate (issue 43 item 2): a list of verdicts; a misspelt name or verdict is refused."""
    validate_inventory_vars({**BASE, "acceptance_fail_on": ["rebuild_environment", "incomplete"]}, "inventory lab",
                            REPO)
    validate_inventory_vars({**BASE, "acceptance_fail_on": []}, "inventory lab", REPO)
    assert "did you mean `acceptance_fail_on`?" in _error({"acceptance_fial_on": ["incomplete"]})
    assert "acceptance_fail_on" in _error({"acceptance_fail_on": ["incompete"]})
    assert "acceptance_fail_on" in _error({"acceptance_fail_on": "incomplete"})
