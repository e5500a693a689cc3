"""Issue 44 item 5, the last part: the vendor verifier's own prompts as a case pack, where public and licensed.
Moonshot's Kimi-Vendor-Verifier (MIT) stores its tool-call JSON schema cases in the repository; a subset is
vendored under scenarios/packs/kimi-vendor-verifier/ with its LICENSE and SOURCE.md, and `agent.case_pack`
adds it to the case set as call cases sent as the verifier sends them."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.profile import ConfigError
from vllm_acceptance.core.profile_model import ProfileModel
from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig
from vllm_acceptance.probes.agent.plan import agent_plan
from vllm_acceptance.probes.agent.rules import judge_case, judge_tool_choice
from vllm_acceptance.probes.agent.unit import config
from vllm_acceptance.probes.options import ProbeOptions
from vllm_acceptance.scenarios import load_scenario, tool_schema_problems
from vllm_acceptance.scenarios.case_packs import load_case_pack, pack_cases, pack_license, packaged_case_packs

PACK = "kimi-vendor-verifier"
FOLDER = Path(str(resources.files("vllm_acceptance.scenarios").joinpath("packs", PACK)))


def test_the_pack_loads_with_its_licence_and_source_recorded() -> None:
    assert PACK in packaged_case_packs()
    data = load_case_pack(PACK)
    source = data["source"]
    assert source["repository"] == "https://github.com/MoonshotAI/Kimi-Vendor-Verifier"
    assert len(source["commit"]) == 40 and source["commit"] in (FOLDER / "SOURCE.md").read_text()
    licence = pack_license(PACK)
    assert licence.startswith("MIT License") and "Copyright (c) 2026 Moonshot AI" in licence
    assert "MIT" in source["license"] and "walle" in source["upstream"]
    # each schema is a verifier testdata line verbatim (JSON text), its suite and line recorded
    assert len(data["cases"]) == 29
    assert all(c["suite"].startswith("Test") and c["line"] >= 1 and json.loads(c["schema"]) is not None
               for c in data["cases"])
    assert len({(c["suite"], c["line"]) for c in data["cases"]}) == 29


def test_every_case_validates_as_a_single_case_of_the_case_set_with_the_verifiers_request() -> None:
    cases = pack_cases(PACK)
    assert len(cases) == 29 and len({c.id for c in cases}) == 29
    for case in cases:
        assert (case.cls, case.expect, case.tool_choice) == ("single", ["kvv_walle_case"], "required")
        assert not tool_schema_problems(case.tools)  # the scenario schema's rule for tools: 2020-12 meta-valid
        body = case.body("m", 64, 0.0)
        tool = body["tools"][0]["function"]
        assert body["tool_choice"] == "required" and tool["strict"] is True and tool["name"] == "kvv_walle_case"
        assert tool["parameters"]["required"] == ["value"] and "default" not in json.dumps(tool["parameters"])
        assert body["messages"][0]["content"].startswith("Call the kvv_walle_case tool exactly once")
        assert case.trimmed() is None  # the verifier's request is never trimmed


def test_a_pack_case_answered_with_arguments_off_its_schema_is_a_failed_call() -> None:
    case = next(c for c in pack_cases(PACK) if c.id == f"{PACK}-TestRangeConstraints-002")  # a 5-char string
    schema = case.tools[0]["function"]["parameters"]
    good = {"value": "abcde"}
    jsonschema.validate(good, schema)

    def answer(args: dict) -> dict:
        return {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [{"id": "chatcmpl-tool-0", "type": "function",
                                                                  "function": {"name": "kvv_walle_case",
                                                                               "arguments": json.dumps(args)}}]}}]}

    assert judge_case(case.id, case.cls, case.expect, None, 200, answer(good), case.tools).ok
    bad = judge_case(case.id, case.cls, case.expect, None, 200, answer({"value": "abc"}), case.tools)
    assert not bad.ok and bad.check.problems
    assert judge_tool_choice(case.id, case.cls, case.expect, case.tool_choice, [], set()).violations


def test_a_profile_selects_the_pack_and_the_probe_and_plan_send_it(tmp_path: Path) -> None:
    k3 = yaml.safe_load((Path(__file__).parents[2] / "profiles" / "kimi-k3.yml").read_text())
    assert ProfileModel.model_validate({**k3, "agent": {**k3["agent"], "case_pack": PACK}}).agent.case_pack == PACK
    with pytest.raises(ValueError, match="case_pack"):
        ProfileModel.model_validate({**k3, "agent": {**k3["agent"], "case_pack": "k2-sample"}})
    on = ProbeOptions(kind="agent", base_url="http://x/v1", model="m", out_dir=tmp_path,
                      overrides={"agent.case_pack": PACK})
    off = ProbeOptions(kind="agent", base_url="http://x/v1", model="m", out_dir=tmp_path)
    ops = load_scenario("ops-agent")
    assert config(on, ops).case_pack == PACK and config(off, ops).case_pack is None
    assert agent_plan(on).requests - agent_plan(off).requests >= 29 * 2  # each sent, and streamed (twins)

    class NoModels:
        def models(self) -> dict:
            raise ConnectionError("no /v1/models: no context fitting")

    probe = AgentProbe(NoModels(), AgentProbeConfig(model="m", scenario=ops, case_pack=PACK), EvidenceStore(tmp_path))
    ids = [c.id for c in probe.case_set()]
    assert sum(1 for i in ids if i.startswith(f"{PACK}-")) == 29
    with pytest.raises(ConfigError, match="agent.case_pack"):
        pack_cases("k2-vendor-verifier")

