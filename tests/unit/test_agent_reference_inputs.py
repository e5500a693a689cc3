"""The agent probe's reference endpoint as inventory variables (docs/inventory.md "Agent reference"): validated
before any node is touched, passed by the acceptance_probe module, its credentials never written anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_acceptance.core.profile import ConfigError
from vllm_acceptance.core.rundir import open_run, validate_inventory_vars
from vllm_acceptance.probes.run import ProbeOptions, probe_secrets, run_probe

from support import modules as support_modules

REPO = Path(__file__).resolve().parents[2]
BASE = {"acceptance_profile": "cpu-lab", "acceptance_owner": "me", "vllm_serve_mode": "launch"}
CRED_URL = "https://ref-user:s3cretPass99@api.example.com:8443/v1"


def _error(extra: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        validate_inventory_vars({**BASE, **extra}, "inventory lab", REPO)
    return str(exc.value)


def test_a_well_formed_reference_is_accepted_even_with_credentials_in_the_url() -> None:
    validate_inventory_vars({**BASE, "agent_reference_url": CRED_URL, "agent_reference_model": "kimi-k2-0905",
                             "agent_reference_api_key_env": "MOONSHOT_API_KEY"}, "inventory lab", REPO)
    validate_inventory_vars({**BASE, "agent_reference_url": "http://10.0.0.7:8000/v1"}, "inventory lab", REPO)


@pytest.mark.parametrize(("url", "why"), [
    ("api.example.com/v1", "not an http(s) URL"),
    ("ftp://ref-user:s3cretPass99@api.example.com/v1", "not an http(s) URL"),
    ("https://ref-user:s3cretPass99@api.example.com:99999/v1", "port that is not a number"),
    ("http:///v1", "names no host"),
    ("https://api.example.com/v1?key=s3cretPass99", "query or fragment"),
    ("https://api.example .com/v1", "empty or holds spaces"),
])
def test_a_malformed_reference_url_is_refused_naming_the_field_and_the_fix(url: str, why: str) -> None:
    message = _error({"agent_reference_url": url})
    assert "field `agent_reference_url`" in message and why in message
    assert "e.g. agent_reference_url: https://" in message
    assert "s3cretPass99" not in message


def test_reference_variables_are_typo_proof_and_need_the_url() -> None:
    assert "did you mean `agent_reference_url`?" in _error({"agent_reference_ulr": "https://api.example.com/v1"})
    message = _error({"agent_reference_model": "kimi-k2-0905"})
    assert "field `agent_reference_model` is set but `agent_reference_url` is not" in message
    pasted_key = "sk-live-0123456789abcdef"
    message = _error({"agent_reference_url": "https://api.example.com/v1", "agent_reference_api_key_env": pasted_key})
    assert "field `agent_reference_api_key_env`" in message and "e.g. agent_reference_api_key_env: " in message
    assert pasted_key not in message
    # a site's own agent_* variable is not the product's: only agent_reference_* is checked
    validate_inventory_vars({**BASE, "agent_pool": "east"}, "inventory lab", REPO)


def test_credentials_in_the_reference_url_stay_out_of_run_json(tmp_path: Path) -> None:
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path, inventory="lab",
                          variables={**BASE, "agent_reference_url": CRED_URL}, hosts=[])
    text = (run_dir / "run.json").read_text()
    assert "s3cretPass99" not in text and "ref-user" not in text
    assert "api.example.com:8443/v1" in json.loads(text)["inventory_vars"]["agent_reference_url"]


def test_the_probe_refuses_a_malformed_reference_before_any_request(tmp_path: Path) -> None:
    # base_url answers nothing: the refusal comes before the first request, naming the field
    opts = ProbeOptions(kind="agent", base_url="http://127.0.0.1:9/v1", model="m", out_dir=tmp_path,
                        reference_url="ftp://ref-user:s3cretPass99@api.example.com/v1")
    with pytest.raises(ConfigError) as exc:
        run_probe(opts)
    assert "agent_reference_url" in str(exc.value) and "s3cretPass99" not in str(exc.value)
    assert not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match="Basic auth in place of the key"):
        run_probe(ProbeOptions(kind="agent", base_url="http://127.0.0.1:9/v1", model="m", out_dir=tmp_path,
                               reference_url=CRED_URL, reference_api_key="k-ref"))
    secrets = probe_secrets(ProbeOptions(kind="agent", base_url="http://x/v1", model="m", out_dir=tmp_path,
                                         api_key="k-main", reference_url=CRED_URL, reference_api_key="k-ref"))
    assert set(secrets) == {"k-main", "k-ref", "s3cretPass99"}
    token_only = ProbeOptions(kind="agent", base_url="http://x/v1", model="m", out_dir=tmp_path,
                              reference_url="https://tok_abcdef@api.example.com/v1")
    assert probe_secrets(token_only) == ["tok_abcdef"]


# Run the module file as Ansible would (tests/unit/test_monitoring.py run_module).
def run_module(args: dict, tmp_path: Path) -> tuple[dict, str]:
    return support_modules.run_module("acceptance_probe", args, tmp_path)


def test_module_takes_the_reference_for_the_agent_probe_only(tmp_path: Path) -> None:
    common = {"run_dir": str(tmp_path), "base_url": "http://127.0.0.1:9/v1", "model": "m",
              "_ansible_check_mode": True}
    ok, out = run_module({**common, "kind": "agent", "reference_url": "https://api.example.com/v1",
                          "reference_model": "ref", "reference_api_key": "k-ref-123456"}, tmp_path)
    assert not ok.get("failed") and ok["status"] == "skipped"
    assert "k-ref-123456" not in out
    creds, out = run_module({**common, "kind": "agent", "reference_url": CRED_URL}, tmp_path)
    assert not creds.get("failed") and "s3cretPass99" not in out
    both, out = run_module({**common, "kind": "agent", "reference_url": CRED_URL, "reference_api_key": "k-ref-123456"},
                           tmp_path)
    assert both.get("failed") and "give one of them" in both["msg"] and "s3cretPass99" not in out
    bad, out = run_module({**common, "kind": "agent",
                           "reference_url": "ftp://ref-user:s3cretPass99@api.example.com/v1"}, tmp_path)
    assert bad.get("failed") and "reference_url (inventory agent_reference_url)" in bad["msg"]
    assert "s3cretPass99" not in out
    other, _ = run_module({**common, "kind": "cache", "reference_url": "https://api.example.com/v1"}, tmp_path)
    assert other.get("failed") and "agent and quality probes' only (kind is cache)" in other["msg"]
    # the quality probe takes its reference path the same way (inventory quality_reference_url)
    quality, _ = run_module({**common, "kind": "quality", "reference_url": "https://ref.example.com/v1"}, tmp_path)
    assert not quality.get("failed") and quality["status"] == "skipped"
    bad, out = run_module({**common, "kind": "quality", "reference_url": "ftp://ref.example.com/v1"}, tmp_path)
    assert bad.get("failed") and "reference_url (inventory quality_reference_url)" in bad["msg"]
    alone, _ = run_module({**common, "kind": "agent", "reference_model": "ref"}, tmp_path)
    assert alone.get("failed") and "without reference_url" in alone["msg"]
