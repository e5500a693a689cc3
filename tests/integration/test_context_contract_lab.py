"""A site contract below what the server serves (issue 31, item 6), on the real lab vLLM (max_model_len 2048):
the cpu-lab profile with a 1,000 + 64-token contract. The over-contract request is served (nothing enforces the
contract: a warn naming --max-model-len and a gateway limit, not a fail), the request over the served 2048 is
rejected by vLLM for its length, the served max_model_len passes with its difference recorded, and the run can
still be a release. One context stage (three requests), no ramp: seconds."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.probes.load import LoadProbeConfig, LoadRun, stage_context_contract
from vllm_acceptance.rules import registry
from vllm_acceptance.rules.compat import ServerReports, check_actual_config
from vllm_acceptance.runtime.metrics import DirectMetrics
from vllm_acceptance.verdict import decide

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.lab


def site_profile() -> Profile:
    base = load_profile(REPO / "profiles" / "cpu-lab.yml")
    data = json.loads(json.dumps(base.data))
    data["contract"].update(context_tokens=1000, max_output_tokens=64)
    return Profile(data=data, source="site contract below the served max_model_len")


def test_over_contract_but_served_is_a_warn_and_over_the_served_limit_is_rejected(lab_server, tmp_path: Path) -> None:
    profile = site_profile()
    cfg = LoadProbeConfig.from_profile(profile, {}, model=lab_server.model)
    run = LoadRun(lab_server.base_url, DirectMetrics(lab_server.metrics_url), cfg, EvidenceStore(tmp_path))
    finding = stage_context_contract(run)
    observed = finding.observed
    assert observed["served_max_model_len"] == 2048 and observed["contract_window_tokens"] == 1064
    assert observed["at_contract"]["http_status"] == 200
    assert observed["over_contract"]["http_status"] == 200 and observed["over_contract"]["prompt_tokens"] > 1064
    over_served = observed["over_served"]
    assert over_served["http_status"] == 400 and over_served["prompt_tokens"] > 2048
    assert "maximum context length is 2048" in over_served["body"]
    assert observed["healthy_after"] is True
    assert finding.status == Status.WARN, finding.reason
    assert "--max-model-len 1064" in finding.action and "gateway" in finding.action
    assert json.loads((tmp_path / "context_contract.json").read_text())["over_served"]["http_status"] == 400

    models = httpx.get(lab_server.base_url + "/models", timeout=10).json()
    served = {f.check: f for f in check_actual_config(ServerReports(models=models), profile, "localhost")}
    max_len = served["compat.actual_config.max_model_len"]
    assert max_len.status == Status.PASS and max_len.observed["difference_from_recipe"] == 0
    assert "984 tokens over the contract are served" in max_len.reason

    passed = [registry.get(c).passed(None) for c in ("compat.startup_log", "capacity.ramp", "agent.tool_call")]
    assert decide([*passed, max_len, finding]).verdict == "release"
