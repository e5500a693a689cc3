"""The model that serves is the profile's model (issue 42, item 1; docs/checks.md, compat.served_model), and the
same arguments in the inventory refused at validation.

Startup logs: the lab's real vLLM 0.32 capture (tests/fixtures/real/vllm/), a deployed vLLM 0.25.1's non-default
args with chat_template / quantization / dtype / override_generation_config (noonghunna/club-3090#851, same
directory), and vLLM 0.32's own non-default args for the Kimi K3 recipe launch with one identity override each
(tests/fixtures/serve/kimi-k3-identity-overrides-vllm-0.32.generated.log, made with vLLM's real parser).
/v1/models answers have vLLM's ModelCard fields (id, root, parent)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.core.model_identity import argv_identity_flags, identity_overrides, names_model
from vllm_acceptance.core.profile import Profile, load_profile
from vllm_acceptance.core.rundir import open_run
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.serve import ServerReports
from vllm_acceptance.rules.served_model import CheckpointConfig, check_served_model
from vllm_acceptance.serve.stage import checkpoint_config
from vllm_acceptance.verdict import decide

from support.refusal import BASE, refused

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "fixtures" / "real" / "vllm"
LAB = load_profile(REPO / "profiles" / "cpu-lab.yml")
KIMI = load_profile(REPO / "profiles" / "kimi-k3.yml")
LAB_LOG = (REAL / "v1-0.32-cpu-lab-ready-one-line-kv.log").read_text()
CLUB_LOG = (REAL / "v1-0.25-nondefault-chat-template-quantization.log").read_text()
GENERATED = REPO / "tests" / "fixtures" / "serve" / "kimi-k3-identity-overrides-vllm-0.32.generated.log"


def k3_lines() -> dict[str, str]:
    """kind -> the non-default args line vLLM 0.32 logs for the K3 recipe launch with that override."""
    lines = GENERATED.read_text().splitlines()
    return {lines[i][2:].split(":", 1)[0]: lines[i + 1] for i in range(0, len(lines), 2)}


def card(name: str, root: str | None, **extra: Any) -> dict[str, Any]:
    entry = {"id": name, "object": "model", "owned_by": "vllm", "max_model_len": 2048, **extra}
    if root is not None:
        entry["root"] = root
    return entry


def judge(profile: Profile, log: str | None, *cards: dict[str, Any], models: Any = "cards",
          checkpoint: CheckpointConfig | None = None):
    reports = ServerReports(models={"object": "list", "data": list(cards)} if models == "cards" else models,
                            startup=scan_startup_log(log) if log is not None else None,
                            models_evidence=["evidence/serve/v1-models.json"],
                            log_evidence=["evidence/serve/startup.log"])
    return check_served_model(reports, profile, "head", checkpoint)


# --- the running server against the profile ------------------------------------------------------------------

def test_the_lab_serving_its_own_model_passes() -> None:
    finding = judge(LAB, LAB_LOG, card("tiny-agent", ".lab/models/tiny-agent"))
    assert finding.status == Status.PASS, finding.reason
    assert finding.observed["startup_log"]["model"]["value"] == ".lab/models/tiny-agent"
    assert finding.observed["startup_log"]["overrides"] == {}        # --dtype=float32 is the profile's own
    assert finding.evidence == ["evidence/serve/v1-models.json", "evidence/serve/startup.log"]


def test_the_lab_launched_by_the_role_with_an_absolute_path_passes() -> None:
    # roles/vllm_serve passes vllm_serve_model_path = "{{ playbook_dir }}/../.lab/models/tiny-agent"
    root = "/srv/acceptance/playbooks/../.lab/models/tiny-agent"
    log = LAB_LOG.replace("'.lab/models/tiny-agent'", repr(root))
    assert judge(LAB, log, card("tiny-agent", root)).status == Status.PASS


def test_the_k3_recipe_launch_as_it_is_passes() -> None:
    finding = judge(KIMI, k3_lines()["none"], card("moonshotai/Kimi-K3", "moonshotai/Kimi-K3"))
    assert finding.status == Status.PASS, finding.reason


OVERRIDE_KINDS = ["revision", "quantization", "hf_overrides", "chat_template", "tokenizer",
                  "override_generation_config", "generation_config"]


@pytest.mark.parametrize("kind", OVERRIDE_KINDS)
def test_each_identity_override_in_the_servers_own_args_fails_naming_it(kind: str) -> None:
    line = k3_lines()[kind]
    finding = judge(KIMI, line, card("moonshotai/Kimi-K3", "moonshotai/Kimi-K3"))
    assert finding.status == Status.FAIL and finding.consequence == Consequence.REBUILD
    value = scan_startup_log(line).non_default_args[kind]
    assert f"{kind}={value!r}" in finding.reason and "the profile does not state it" in finding.reason
    assert finding.observed["startup_log"]["overrides"] == {kind: value}
    assert decide([finding]).verdict != "release"


def test_dummy_weights_fail_even_where_the_profile_states_a_load_format() -> None:
    finding = judge(KIMI, k3_lines()["load_format"], card("moonshotai/Kimi-K3", "moonshotai/Kimi-K3"))
    assert finding.status == Status.FAIL
    assert "--load-format=fastsafetensors: the server shows dummy" in finding.reason and "random" in finding.reason


def test_quantization_fp8_on_the_k3_launch_names_both_values() -> None:
    finding = judge(KIMI, k3_lines()["quantization"], card("moonshotai/Kimi-K3", "moonshotai/Kimi-K3"))
    assert "quantization='fp8'" in finding.reason
    assert "quantization" in finding.expected["identity_arguments"]      # the profile states none: shipped as is


def test_another_model_fails_on_the_live_root_and_the_log() -> None:
    finding = judge(KIMI, k3_lines()["model"], card("someorg/Kimi-K3-distilled", "someorg/Kimi-K3-distilled"))
    assert finding.status == Status.FAIL
    assert "root 'someorg/Kimi-K3-distilled', not the profile's model 'moonshotai/Kimi-K3'" in finding.reason
    assert "model 'someorg/Kimi-K3-distilled', not the profile's 'moonshotai/Kimi-K3'" in finding.reason
    assert "not the profile's name 'moonshotai/Kimi-K3'" in finding.reason


def test_another_model_behind_the_profiles_served_name_fails() -> None:
    # --model someorg/Kimi-K3-distilled --served-model-name moonshotai/Kimi-K3: the name is right, the weights not
    finding = judge(KIMI, k3_lines()["served_model_name"], card("moonshotai/Kimi-K3", "someorg/Kimi-K3-distilled"))
    assert finding.status == Status.FAIL
    assert "/v1/models 'moonshotai/Kimi-K3' serves root 'someorg/Kimi-K3-distilled'" in finding.reason
    assert decide([finding]).verdict == "rebuild_environment"


def test_the_live_root_alone_catches_another_model_when_the_log_is_missing() -> None:
    finding = judge(LAB, None, card("tiny-agent", ".lab/models/tiny-agent-k3"))
    assert finding.status == Status.FAIL                       # a difference is never softened by missing evidence
    assert "'.lab/models/tiny-agent-k3'" in finding.reason and "'.lab/models/tiny-agent'" in finding.reason


def test_a_lora_adapter_behind_a_name_fails() -> None:
    finding = judge(LAB, LAB_LOG, card("tiny-agent", ".lab/models/tiny-agent"),
                    card("tiny-agent", "/adapters/other", parent="tiny-agent"))
    assert finding.status == Status.FAIL and "adapter" in finding.reason


def deployed_profile(tmp_path: Path, args: list[str]) -> Profile:
    """A site profile for the deployed server of club-3090#851 (its model path and served name)."""
    data = yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text())
    data["name"] = "qwen-site"
    data["model"].update(name="~/.cache/huggingface/qwen3.6-35b-a3b-autoround-int4",
                         path="~/.cache/huggingface/qwen3.6-35b-a3b-autoround-int4",
                         served_name="qwen3.6-35b-a3b-autoround", tool_call_parser="qwen3_coder")
    data["launch"]["args"] = args
    path = tmp_path / "qwen-site.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_profile(path)


def test_a_real_deployed_log_with_unstated_overrides_fails_and_the_profile_stating_them_passes(tmp_path: Path) -> None:
    served = card("qwen3.6-35b-a3b-autoround", "~/.cache/huggingface/qwen3.6-35b-a3b-autoround-int4")
    finding = judge(deployed_profile(tmp_path, []), CLUB_LOG, served)
    assert finding.status == Status.FAIL
    assert set(finding.observed["startup_log"]["overrides"]) == {
        "chat_template", "dtype", "quantization", "override_generation_config"}
    assert "quantization='auto_round'" in finding.reason
    stated = deployed_profile(tmp_path, [
        "--chat-template=/etc/qwen-froggeric-chat-template.jinja", "--dtype=float16", "--quantization=auto_round",
        '--override-generation-config={"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, '
        '"repetition_penalty": 1.0}'])
    finding = judge(stated, CLUB_LOG, served)
    assert finding.status == Status.PASS, finding.reason    # stated ones are compat.actual_config.flags' to judge


# --- evidence that cannot be read is never a pass -----------------------------------------------------------------

def test_no_v1_models_or_no_log_is_missing() -> None:
    assert judge(LAB, LAB_LOG, models=None).status == Status.MISSING
    assert judge(LAB, LAB_LOG, models={"data": []}).status == Status.MISSING
    assert judge(LAB, None, card("tiny-agent", ".lab/models/tiny-agent")).status == Status.MISSING


def test_a_card_without_root_or_an_unreadable_args_line_is_inconclusive() -> None:
    finding = judge(LAB, LAB_LOG, card("tiny-agent", None))
    assert finding.status == Status.INCONCLUSIVE and "states no root" in finding.reason
    without = "\n".join(line for line in LAB_LOG.splitlines() if "non-default args" not in line)
    finding = judge(LAB, without, card("tiny-agent", ".lab/models/tiny-agent"))
    assert finding.status == Status.INCONCLUSIVE and "no non-default args line" in finding.reason
    broken = LAB_LOG.replace("'served_model_name': ['tiny-agent']", "'served_model_name': <object at 0x7f>")
    finding = judge(LAB, broken, card("tiny-agent", ".lab/models/tiny-agent"))
    assert finding.status == Status.INCONCLUSIVE and "unreadable" in finding.reason


# --- what names the profile's model -------------------------------------------------------------------------------

@pytest.mark.parametrize(("served", "accepted", "same"), [
    (".lab/models/tiny-agent", ".lab/models/tiny-agent", True),
    ("/work/x/playbooks/../.lab/models/tiny-agent/", ".lab/models/tiny-agent", True),
    ("/mnt/cache/tiny-agent", "tiny-agent", True),                        # rehearsal: the name in a mounted cache
    ("/models/moonshotai/Kimi-K3", "moonshotai/Kimi-K3", True),
    ("/root/.cache/huggingface/hub/models--moonshotai--Kimi-K3/snapshots/0a1b2c", "moonshotai/Kimi-K3", True),
    ("/root/.cache/huggingface/hub/models--someorg--Kimi-K3/snapshots/0a1b2c", "moonshotai/Kimi-K3", False),
    (".lab/models/tiny-agent-k3", ".lab/models/tiny-agent", False),
    ("someorg/Kimi-K3-distilled", "moonshotai/Kimi-K3", False),
    ("/models/Kimi-K3", "moonshotai/Kimi-K3", False),                     # the org is not shown: not the id
    ("/srv/a/tiny-agent", "/srv/b/tiny-agent", False),                    # two absolute paths: the same or not
    ("Kimi-K3", "moonshotai/Kimi-K3", False),                             # a shorter name is not the id
    ("tiny-agent", "/srv/models/tiny-agent", False),                      # relative to an unknown directory
    ("", "tiny-agent", False),
])
def test_names_model(served: str, accepted: str, same: bool) -> None:
    assert names_model(served, accepted) is same


def test_the_checkpoint_config_is_hashed_only_for_a_server_on_this_machine(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    reports = ServerReports(models={"data": [card("tiny-agent", str(tmp_path))]})
    read = checkpoint_config(reports, "http://127.0.0.1:8011/v1")
    assert read is not None and read.sha256 == hashlib.sha256((tmp_path / "config.json").read_bytes()).hexdigest()
    assert checkpoint_config(reports, "http://gpu-01:8000/v1") is None      # a remote node's path is not ours
    finding = judge(LAB, LAB_LOG, card("tiny-agent", ".lab/models/tiny-agent"), checkpoint=read)
    assert finding.observed["checkpoint_config"]["sha256"] == read.sha256


# --- the same arguments in the inventory: refused at validation ---------------------------------------------------

@pytest.mark.parametrize(("args", "shown"), [
    (["--model", "someorg/Kimi-K3-distilled"], "--model someorg/Kimi-K3-distilled"),
    (["--served-model-name", "other"], "--served-model-name other"),
    (["--revision=0123abc"], "--revision 0123abc"),
    (["--quantization", "fp8"], "--quantization fp8"),
    (["-q", "fp8"], "--quantization fp8"),
    (["--quant=fp8"], "--quantization fp8"),                               # argparse expands the prefix
    (["--hf-overrides", '{"num_experts_per_tok": 2}'], '--hf-overrides {"num_experts_per_tok": 2}'),
    (["--hf-overrides.num_experts_per_tok", "2"], "--hf-overrides 2"),
    (["--chat-template", "/opt/other.jinja"], "--chat-template /opt/other.jinja"),
    (["--tokenizer", "someorg/tok"], "--tokenizer someorg/tok"),
    (["--override-generation-config", '{"temperature": 0.2}'], "--override-generation-config"),
    (["--generation-config", "vllm"], "--generation-config vllm"),
    (["--load-format", "dummy"], "--load-format dummy"),
    (["--dtype", "bfloat16"], "--dtype bfloat16"),                         # the lab profile states float32
])
def test_identity_arguments_in_extra_args_are_refused(tmp_path: Path, args: list[str], shown: str) -> None:
    text = refused(tmp_path, {"vllm_serve_extra_args": args})
    assert f"field `vllm_serve_extra_args`: {shown}" in text
    assert "another model than the profile's" in text and "profiles/<site>.yml" in text


def test_identity_arguments_in_a_hosts_preflight_launch_args_are_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, {}, {"head-01": {"preflight_launch_args": ["--quantization", "fp8"]}})
    assert "host head-01): field `preflight_launch_args`: --quantization fp8" in text


def test_a_process_model_path_or_served_name_of_another_model_is_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, {"vllm_serve_model_path": "/srv/models/other-model"})
    assert "field `vllm_serve_model_path`: '/srv/models/other-model' is not the profile's" in text
    text = refused(tmp_path, {"vllm_serve_served_name": "gpt-4o"})
    assert "field `vllm_serve_served_name`: 'gpt-4o' is not the profile's 'tiny-agent'" in text
    # the lab inventory's own value, rendered by Ansible, names the profile's model
    rendered = "/srv/acceptance/playbooks/../.lab/models/tiny-agent"
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path / "ok", inventory="site", hosts=["h"],
                          variables={**BASE, "vllm_serve_model_path": rendered, "vllm_serve_served_name": "tiny-agent"})
    assert (run_dir / "run.json").is_file()


def test_the_model_variables_are_judged_only_where_the_launch_reads_them(tmp_path: Path) -> None:
    """The lab inventory's rendered vllm_serve_model_path (the hermes model) with `-e acceptance_profile=cpu-lab-k3`:
    attached, the variable is unused and nothing is refused (test_agent_k3_lab.py's run); launched, the process
    runtime would load it, and it is refused."""
    lab_path = "/srv/acceptance/playbooks/../.lab/models/tiny-agent"
    k3 = {**BASE, "acceptance_profile": "cpu-lab-k3", "vllm_serve_model_path": lab_path}
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path / "attach", inventory="site", hosts=["h"],
                          variables={**k3, "vllm_serve_mode": "attach", "vllm_base_url": "http://127.0.0.1:8011/v1"})
    assert (run_dir / "run.json").is_file()
    (tmp_path / "launch").mkdir()
    text = refused(tmp_path / "launch", k3)
    assert "field `vllm_serve_model_path`" in text and "tiny-agent-k3" in text
    # a host's own attach mode frees its host variables only
    (tmp_path / "host").mkdir()
    text = refused(tmp_path / "host", {**BASE, "acceptance_profile": "cpu-lab-k3"},
                   {"h": {"vllm_serve_model_path": lab_path}})
    assert "(host h): field `vllm_serve_model_path`" in text


def test_the_profiles_own_values_and_other_loaders_are_accepted() -> None:
    data = LAB.data
    assert identity_overrides(data, ["--dtype=float32", "--served-model-name", "tiny-agent",
                                     "--model", ".lab/models/tiny-agent", "--load-format", "safetensors"]) == {}
    # a site's own launch line naming the recipe's model in its model cache
    assert identity_overrides(KIMI.data, ["--model", "/mnt/models/moonshotai/Kimi-K3"]) == {}
    assert identity_overrides(KIMI.data, ["--model", "/mnt/models/Kimi-K3-distilled"]) == {
        "model": "/mnt/models/Kimi-K3-distilled"}
    assert argv_identity_flags(["--max-num-seqs", "4", "--enforce-eager"]) == {}


def test_validate_cli_refuses_a_quantization_override_with_exit_2(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    localhost: {ansible_connection: local}\n")
    (inv / "group_vars" / "all.yml").write_text("acceptance_profile: cpu-lab\nacceptance_owner: me\n"
                                                "vllm_serve_mode: launch\n"
                                                "vllm_serve_extra_args: [--quantization, fp8]\n")
    assert cli.main(["validate", "-i", str(inv), "--project", str(REPO)]) == 2
    err = capsys.readouterr().err
    assert "field `vllm_serve_extra_args`: --quantization fp8" in err and "write profiles/<site>.yml" in err
