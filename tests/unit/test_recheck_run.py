"""The day-N re-check's orchestration (recheck/run.py, recheck/plan.py, recheck.yml; docs/recheck.md): which
baselines are refused, what today's run is given, the light settings and their cost from the probes' own plans,
and the exit code per verdict. The judgement itself (recheck/judge.py, recheck/report.py) is recheck-judge's: the
tests that need it put a small stand-in module in its place (`stand_in_judge`) and say so."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance import cli
from vllm_acceptance.core.bounds import ramp_plan
from vllm_acceptance.core.profile import ConfigError, load_profile
from vllm_acceptance.core.variables import check_variables, validate_variables
from vllm_acceptance.probes.load.config import LoadProbeConfig
from vllm_acceptance.probes.load.plan import load_plan
from vllm_acceptance.recheck import run as recheck_run
from vllm_acceptance.recheck.outcome import RECHECK_EXIT_CODES, Drift, RecheckOutcome
from vllm_acceptance.recheck.plan import light_overrides, load_concurrency, recheck_plan

REPO = Path(__file__).resolve().parents[2]
LAB_PROFILE = REPO / "profiles" / "cpu-lab.yml"


def lab_profile(tmp_path: Path, **recheck: Any) -> Path:
    data = yaml.safe_load(LAB_PROFILE.read_text())
    if recheck:
        data["recheck"] = recheck
    path = tmp_path / "profile.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_run(reports: Path, run_id: str, *, inventory: str = "lab", decision: str | None = "release",
             signed_at: str = "2026-12-01T10:00:00Z", base_url: str = "http://127.0.0.1:8680/v1") -> Path:
    """A finished run as the report stage leaves it (run.json, the frozen profile, report.json, the serve stage),
    signed with `decision` (None: not signed)."""
    run = reports / inventory / run_id
    (run / "evidence").mkdir(parents=True)
    (run / "stages").mkdir()
    (run / "run.json").write_text(json.dumps({"inventory": inventory, "run_id": run_id, "profile": "cpu-lab"}))
    (run / "evidence" / "profile.yml").write_text(LAB_PROFILE.read_text())
    (run / "report.json").write_text(json.dumps({"inventory": inventory, "run_id": run_id, "verdict": "release",
                                                 "profile": "cpu-lab", "findings": []}))
    (run / "stages" / "serve.json").write_text(json.dumps({"base_url": base_url, "mode": "attach"}))
    if decision:
        sha = hashlib.sha256((run / "report.json").read_bytes()).hexdigest()
        (run / "signoff.json").write_text(json.dumps({"decision": decision, "reviewer": "R. Checker",
                                                      "signed_at": signed_at, "report_sha256": sha,
                                                      "run_id": run_id}))
    return run


# --- the light settings and their cost --------------------------------------------------------------------------

def test_the_load_window_is_the_contract_fraction_and_never_goes_past_it(tmp_path: Path) -> None:
    profile = load_profile(lab_profile(tmp_path, load_fraction=0.5))
    k = load_concurrency(profile)
    assert k == 2 and int(profile.model.contract.concurrency) == 4
    load = light_overrides(profile)["load"]
    assert load["contract.concurrency"] == k and load["load.verify_limit"] is False
    # the load probe's own ramp walks exactly [k]: no step at the contract, none past it to find the knee
    assert ramp_plan(load["load.ramp"], load["contract.concurrency"], load["load.max_step"]) == [k]
    cfg = LoadProbeConfig.from_profile(profile, load, model="tiny-agent")
    ramp = next(s for s in load_plan(cfg) if s.name == "ramp")
    assert {step["concurrency"] for step in ramp.steps} == {k}


def test_a_small_fraction_keeps_one_request_in_flight(tmp_path: Path) -> None:
    profile = load_profile(lab_profile(tmp_path, load_fraction=0.01))
    assert load_concurrency(profile) == 1


def test_the_agent_sample_is_seeded_and_small(tmp_path: Path) -> None:
    agent = light_overrides(load_profile(lab_profile(tmp_path, agent_cases=10, agent_concurrency=3)))["agent"]
    assert agent["agent.cases"] == agent["agent.turn_budget"] == 10
    assert agent["agent.concurrency"] == 3 and agent["agent.under_load"] == 0
    assert agent["agent.case_seed"] == 0        # the signed profile's own seed: the same cases
    seeded = light_overrides(load_profile(lab_profile(tmp_path, agent_seed=7)))["agent"]
    assert seeded["agent.case_seed"] == 7


def test_the_plan_adds_up_the_probes_own_plans(tmp_path: Path) -> None:
    light = recheck_plan(load_profile(lab_profile(tmp_path)))
    heavier = recheck_plan(load_profile(lab_profile(tmp_path, load_fraction=1.0, agent_cases=48)))
    assert light.requests == sum(s.requests or 0 for s in light.stages if s.in_total)
    assert light.bound_s == pytest.approx(sum(s.bound_s for s in light.stages if s.in_total))
    assert {s.name for s in light.stages} >= {"cache", "agent", "ramp", "mixed", "soak"}
    assert light.load_concurrency == 1 and light.max_in_flight == 2          # agent.concurrency 2 of the sample
    assert heavier.load_concurrency == 4 and heavier.max_in_flight == 4
    assert heavier.requests > light.requests and heavier.bound_s > light.bound_s
    only_cache = recheck_plan(load_profile(lab_profile(tmp_path, probes=["cache"])))
    assert [s.name for s in only_cache.stages] == ["cache"] and set(only_cache.overrides) == {"cache"}


def test_plan_recheck_prints_the_cost(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = cli.main(["plan", "-i", str(REPO / "inventories" / "lab"), "--recheck", "--profile",
                     str(lab_profile(tmp_path)), "--project-dir", str(REPO), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["load_concurrency"] == 1 and out["contract_concurrency"] == 4
    assert out["requests"] > 0 and out["bound_s"] > 0


def test_a_recheck_fraction_outside_its_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="load_fraction"):
        load_profile(lab_profile(tmp_path, load_fraction=0))


# --- the baseline ---------------------------------------------------------------------------------------------------

def test_an_unsigned_baseline_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path, "A", decision=None)
    with pytest.raises(recheck_run.BaselineRefused, match="not signed"):
        recheck_run.check_baseline(run, "lab")


def test_a_baseline_signed_without_traffic_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path, "A", decision="rebuild_environment")
    with pytest.raises(recheck_run.BaselineRefused, match="lets no traffic through"):
        recheck_run.check_baseline(run, "lab")


def test_a_baseline_whose_report_changed_since_signing_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path, "A")
    (run / "report.json").write_text(json.dumps({"verdict": "release", "findings": [], "edited": True}))
    with pytest.raises(recheck_run.BaselineRefused, match="not the one signed"):
        recheck_run.check_baseline(run, "lab")


def test_a_baseline_of_another_inventory_is_refused_naming_the_fix(tmp_path: Path) -> None:
    run = make_run(tmp_path, "A", inventory="prod")
    with pytest.raises(recheck_run.BaselineRefused, match=r"inventory 'prod'.*give -i the inventory"):
        recheck_run.check_baseline(run, "lab")
    assert recheck_run.check_baseline(make_run(tmp_path, "B"), "lab")["decision"] == "release"


def test_latest_signed_is_the_newest_signed_run(tmp_path: Path) -> None:
    make_run(tmp_path, "old", signed_at="2026-11-01T00:00:00Z")
    newest = make_run(tmp_path, "new", signed_at="2026-12-01T00:00:00Z")
    make_run(tmp_path, "unsigned", decision=None)
    (tmp_path / "lab" / "rechecks").mkdir()
    assert recheck_run.resolve_baseline("latest-signed", tmp_path, "lab") == newest.resolve()
    with pytest.raises(recheck_run.BaselineRefused, match="no signed run of inventory 'other'"):
        recheck_run.resolve_baseline("latest-signed", tmp_path, "other")


def test_prepare_gives_the_recheck_its_own_run_and_the_baselines_profile(tmp_path: Path) -> None:
    run = make_run(tmp_path, "A")
    prepared = recheck_run.prepare("latest-signed", tmp_path, "lab")
    assert prepared["run_id"].startswith("rechecks/") and prepared["baseline_dir"] == str(run.resolve())
    assert prepared["profile_path"] == str((run / "evidence" / "profile.yml").resolve())
    assert prepared["base_url"] == "http://127.0.0.1:8680/v1"
    assert set(prepared["overrides"]) == set(prepared["probes"]) == {"cache", "agent", "load"}
    assert recheck_run.prepare(run, tmp_path, "lab", base_url="http://10.0.0.5:8000/v1")["base_url"] == \
        "http://10.0.0.5:8000/v1"
    with pytest.raises(recheck_run.BaselineRefused, match="rechecks/<id>"):
        recheck_run.prepare(run, tmp_path, "lab", run_id="20261201T000000Z-abcdef")
    with pytest.raises(recheck_run.BaselineRefused, match="acceptance_baseline"):
        recheck_run.prepare("", tmp_path, "lab")


def test_the_prepare_step_of_the_playbook_exits_2_on_a_refusal(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path, "A", decision=None)
    code = recheck_run.main(["prepare", "--baseline", str(tmp_path / "lab" / "A"), "--reports-dir", str(tmp_path),
                             "--inventory", "lab"])
    assert code == 2 and "not signed" in capsys.readouterr().err


def test_the_inventory_variables_of_a_recheck_are_declared() -> None:
    validate_variables({"acceptance_profile": "cpu-lab", "acceptance_owner": "x", "vllm_serve_mode": "attach",
                        "vllm_base_url": "http://127.0.0.1:8680/v1", "acceptance_baseline": "latest-signed",
                        "acceptance_run_id": "rechecks/20261207T0000Z-ab"},
                       "test", REPO)
    with pytest.raises(ConfigError, match="acceptance_run_id"):
        validate_variables({"acceptance_profile": "cpu-lab", "acceptance_owner": "x", "vllm_serve_mode": "attach",
                            "vllm_base_url": "http://127.0.0.1:8680/v1", "acceptance_run_id": "../elsewhere"},
                           "test", REPO)



def test_the_facts_recheck_yml_sets_before_the_gate_are_no_unknown_product_variables() -> None:
    """validate.yml gates every product-prefixed variable the host holds, facts included: a fact the prepare play
    registers or sets under a product prefix (recheck_, acceptance_, vllm_, ...) must be a declared variable, or
    every re-check is refused at its gate (what merging the recheck_ prefix of the scheduled re-check did)."""
    from vllm_acceptance.core.variables import is_product_variable

    plays = yaml.safe_load((REPO / "recheck.yml").read_text())
    names: set[str] = set()
    for play in plays:
        if any(str(key).endswith("import_playbook") for key in play):
            break
        for task in play.get("tasks") or []:
            if task.get("register"):
                names.add(task["register"])
            names |= set((task.get("ansible.builtin.set_fact") or {}).keys()) - {"cacheable"}
    assert names, "the prepare play sets its facts"
    undeclared = [n for n in sorted(names) if is_product_variable(n)
                  and check_variables({n: "x"}, "recheck.yml", REPO, schema=False)
                  and "unknown variable" in " ".join(check_variables({n: "x"}, "recheck.yml", REPO, schema=False))]
    assert not undeclared, undeclared

# --- the command and its exit codes ---------------------------------------------------------------------------------

def test_recheck_of_an_unsigned_run_exits_2_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import vllm_acceptance.api as api

    run = make_run(tmp_path, "A", decision=None)
    monkeypatch.setattr(api, "accept", lambda *a, **k: pytest.fail("the playbook ran on an unsigned baseline"))
    code = cli.main(["recheck", "--baseline", str(run), "-i", str(REPO / "inventories" / "lab"),
                     "--reports-dir", str(tmp_path), "--project", str(REPO)])
    assert code == 2 and "not signed" in capsys.readouterr().err


def fake_accept(verdict: str | None, seen: dict[str, Any]) -> Any:
    """api.accept's stand-in: records what it was given and leaves today's run as recheck.yml would."""
    def accept(inventory: Any, **kw: Any) -> Any:
        seen.update(kw)
        today = Path(kw["reports_dir"]) / "lab" / kw["extra_vars"]["acceptance_run_id"]
        today.mkdir(parents=True)
        (today / "report.json").write_text(json.dumps({"verdict": "release", "findings": []}))
        if verdict:
            (today / "recheck.json").write_text(json.dumps({"verdict": verdict, "reasons": ["why"], "drifts": []}))
        return types.SimpleNamespace(run_dir=today, reason=None if verdict else "the judge task failed")
    return accept


@pytest.mark.parametrize("verdict", ["still_accepted", "drifted", "reopen", "incomplete", None])
def test_recheck_attaches_under_rechecks_and_exits_per_verdict(verdict: str | None, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm_acceptance.api as api

    make_run(tmp_path, "A")
    seen: dict[str, Any] = {}
    monkeypatch.setattr(api, "accept", fake_accept(verdict, seen))
    code = cli.main(["recheck", "--baseline", "latest-signed", "-i", str(REPO / "inventories" / "lab"),
                     "--reports-dir", str(tmp_path), "--project", str(REPO)])
    assert code == (RECHECK_EXIT_CODES[verdict] if verdict else 1)
    extra = seen["extra_vars"]
    assert extra["vllm_serve_mode"] == "attach" and extra["acceptance_run_id"].startswith("rechecks/")
    assert extra["vllm_base_url"] == "http://127.0.0.1:8680/v1"
    assert seen["playbook"] == str(REPO / "recheck.yml")


def test_the_exit_codes_are_distinct_per_verdict() -> None:
    assert sorted(RECHECK_EXIT_CODES) == ["drifted", "incomplete", "reopen", "still_accepted"]
    assert len(set(RECHECK_EXIT_CODES.values())) == 4 and RECHECK_EXIT_CODES["still_accepted"] == 0
    assert not {1, 2} & set(RECHECK_EXIT_CODES.values())


@pytest.fixture
def stand_in_judge(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A LOCAL STAND-IN for recheck/judge.py and recheck/report.py (recheck-judge's): judge returns the outcome
    the test sets; write_recheck records it. Only the orchestration around them is under test here."""
    state: dict[str, Any] = {"written": []}
    judge_mod = types.ModuleType("vllm_acceptance.recheck.judge")
    judge_mod.judge = lambda baseline, today: state["outcome"]             # type: ignore[attr-defined]
    report_mod = types.ModuleType("vllm_acceptance.recheck.report")

    def write_recheck(baseline: Path, today: Path, outcome: RecheckOutcome) -> list[Path]:
        state["written"].append((baseline, today, outcome.verdict))
        return [today / "recheck.json"]

    report_mod.write_recheck = write_recheck                               # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm_acceptance.recheck.judge", judge_mod)
    monkeypatch.setitem(sys.modules, "vllm_acceptance.recheck.report", report_mod)
    return state


def test_the_playbooks_judge_step_prints_the_drift_and_exits_with_its_code(
        tmp_path: Path, stand_in_judge: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    base = make_run(tmp_path, "A")
    today = make_run(tmp_path / "lab", "rechecks/T", decision=None)
    stand_in_judge["outcome"] = RecheckOutcome(
        verdict="drifted", baseline_run="A", recheck_id="T", started="s", finished="f", signed_decision="release",
        signed_decision_holds=True, reasons=["the tool-call error rate left its baseline interval"],
        drifts=[Drift(check="drift.agent_rate", what="tool-call error rate", baseline=[0, 0.01], today=0.2,
                      consequence="drifted", reason="above the baseline's upper bound")])
    code = recheck_run.main(["judge", "--baseline", str(base), "--today", str(today)])
    out = capsys.readouterr().out
    assert code == 50 and "RECHECK: drifted (signed release: still holds)" in out
    assert "drift.agent_rate tool-call error rate: [0, 0.01] -> 0.2" in out
    assert stand_in_judge["written"] == [(base, today, "drifted")]
    assert recheck_run.main(["judge", "--baseline", str(base), "--today", str(tmp_path / "nowhere")]) == 1


def test_recheck_yml_runs_the_acceptances_own_plays_without_a_launch() -> None:
    plays = yaml.safe_load((REPO / "recheck.yml").read_text())
    imported = [p.get("ansible.builtin.import_playbook") for p in plays if "ansible.builtin.import_playbook" in p]
    assert imported == ["playbooks/validate.yml", "playbooks/preflight.yml", "playbooks/serve.yml",
                        "playbooks/probes.yml", "playbooks/report.yml"]
    text = (REPO / "recheck.yml").read_text()
    assert "vllm_serve_mode: attach" in text and "vllm_acceptance.recheck.run" in text
    assert "acceptance_recheck_overrides" in (REPO / "playbooks" / "tasks" / "probe.yml").read_text()


def test_the_readme_and_docs_name_each_exit_code() -> None:
    readme = (REPO / "README.md").read_text()
    doc = (REPO / "docs" / "recheck.md").read_text()
    for verdict, code in RECHECK_EXIT_CODES.items():
        assert f"| {code} {verdict} |" in readme
        assert f"| `{verdict}` | {code} |" in doc
