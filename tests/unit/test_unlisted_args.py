"""Every non-default argument of the running server judged (issue 28, item 4) and the inventory overrides that
weaken the contract refused before any node (items 4 and 8). The startup logs are real lab captures
(tests/fixtures/real/vllm/, each with its source)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.core.rundir import open_run
from vllm_acceptance.parsers.startup_log import scan_startup_log
from vllm_acceptance.rules.serve import ServerReports, check_actual_config
from vllm_acceptance.verdict import decide

from support.refusal import BASE, refused

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "fixtures" / "real" / "vllm"
LAB = load_profile(REPO / "profiles" / "cpu-lab.yml")
HEALTHY = REAL / "v1-0.32-cpu-lab-ready-one-line-kv.log"        # the lab launch as the profile states it
MAX_SEQS_1 = REAL / "v1-0.32-cpu-lab-max-num-seqs-1.log"         # the same launch plus --max-num-seqs 1
CHECK = "compat.actual_config.unlisted_args"


def unlisted(log: Path | None, profile=LAB):
    scan = scan_startup_log(log.read_text()) if log else None
    reports = ServerReports(startup=scan, log_evidence=["evidence/serve/startup.log"])
    return {f.check: f for f in check_actual_config(reports, profile, "localhost")}[CHECK]


def test_the_healthy_lab_lists_its_unlisted_args_and_passes() -> None:
    finding = unlisted(HEALTHY)
    assert finding.status == Status.PASS, finding.reason
    assert {"host", "port", "model", "served_model_name"} <= set(finding.observed["unlisted"])
    assert finding.observed["limiting"] == {} and "port" in finding.reason


def test_the_lab_started_with_max_num_seqs_1_fails_and_is_never_a_release() -> None:
    finding = unlisted(MAX_SEQS_1)
    assert finding.status == Status.FAIL and finding.consequence == Consequence.REBUILD
    assert finding.observed["unlisted"]["max_num_seqs"] == 1
    assert "max_num_seqs=1" in finding.reason and "below the contract's 4 concurrent sessions" in finding.reason
    assert finding.evidence == ["evidence/serve/startup.log"]
    assert decide([finding]).verdict == "rebuild_environment"


def test_a_profile_that_states_the_limit_accepts_it(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "profiles" / "cpu-lab.yml").read_text())
    data["launch"]["args"].append("--max-num-seqs=1")
    data["contract"]["concurrency"] = 1
    path = tmp_path / "cpu-lab-one-seq.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    finding = unlisted(MAX_SEQS_1, load_profile(path))
    assert finding.status == Status.PASS and "max_num_seqs" not in finding.observed["unlisted"]


def test_no_startup_log_is_missing_and_an_unreadable_args_line_inconclusive(tmp_path: Path) -> None:
    assert unlisted(None).status == Status.MISSING
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(line for line in HEALTHY.read_text().splitlines() if "non-default args" not in line))
    assert unlisted(cut).status == Status.INCONCLUSIVE


def test_extra_args_below_the_contract_are_refused_before_any_node(tmp_path: Path) -> None:
    text = refused(tmp_path, {"vllm_serve_extra_args": ["--max-num-seqs", "1"]})
    assert "field `vllm_serve_extra_args`: --max-num-seqs 1 caps the concurrent sequences" in text
    assert "below the contract's 4" in text and "launch.args state --max-num-seqs 1" in text
    text = refused(tmp_path, {}, {"head-01": {"preflight_launch_args": ["--enforce-eager", "--speculative-config",
                                                                         '{"method": "ngram"}']}})
    assert "host head-01): field `preflight_launch_args`: --speculative-config" in text
    assert "--enforce-eager" not in text                                    # the lab profile states it


def test_overrides_that_do_not_weaken_the_contract_are_accepted(tmp_path: Path) -> None:
    run_dir, _ = open_run(project_dir=REPO, reports_dir=tmp_path, inventory="site", hosts=["h"],
                          variables={**BASE, "vllm_serve_extra_args": ["--max-num-seqs", "4", "--enforce-eager"],
                                     "loadgen_prompt_tokens": 256})
    assert (run_dir / "run.json").is_file()     # at the contract's concurrency; --enforce-eager is the lab's own


def test_loadgen_values_below_the_profile_load_are_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, {"loadgen_prompt_tokens": 16, "loadgen_output_tokens": "8"})
    assert "field `loadgen_prompt_tokens`: 16 is below the profile's load.prompt_tokens (256)" in text
    assert "field `loadgen_output_tokens`: 8 is below the profile's load.output_tokens (32)" in text


def test_validate_cli_refuses_the_extra_limit_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    localhost: {ansible_connection: local}\n")
    (inv / "group_vars" / "all.yml").write_text("acceptance_profile: cpu-lab\nacceptance_owner: me\n"
                                                "vllm_serve_mode: launch\n"
                                                "vllm_serve_extra_args: [--max-num-seqs, \"1\"]\n")
    assert cli.main(["validate", "-i", str(inv), "--project", str(REPO)]) == 2
    assert "vllm_serve_extra_args" in capsys.readouterr().err
