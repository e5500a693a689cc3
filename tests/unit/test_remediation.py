"""Remediation decisions: route choice (source 001's checklist), entry conditions, post-change check,
the rebuild record, and the experimental profile of a self-built image."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Consequence, Finding, Status
from vllm_acceptance.core.profile import ConfigError, load_profile, validate_document
from vllm_acceptance.rebuild import remediation as rem
from vllm_acceptance.verdict import decide

REPO = Path(__file__).resolve().parents[2]
KIMI = load_profile(REPO / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
NOW = dt.datetime(2026, 8, 30, 23, 0, tzinfo=dt.UTC)
WINDOW = "2026-08-30T22:00Z/2026-08-31T04:00Z"


def driver(host: str, version: str, status: Status = Status.FAIL, sources: dict[str, str] | None = None) -> Finding:
    return Finding(check="compat.driver_branch", status=status, host=host,
                   observed={"version": version, "branch": int(version.split(".")[0]),
                             "sources": sources or {"/proc/driver/nvidia/version": version}},
                   expected={"min_branch": 580, "min_version": "580.65.06"}, evidence=[f"evidence/{host}.txt"])


def node(host: str, check: str, status: Status) -> Finding:
    return Finding(check=check, status=status, host=host, reason=f"{check} {status}")


OLD_575 = [driver("n1", "575.57.08"), driver("n2", "575.57.08")]
READY = {"cluster_managed": True, "maintenance_window": WINDOW, "spare_node": True, "rollback_recorded": True,
         "regression_workload": True}


# --- choose_route ------------------------------------------------------------------------------------


def test_confirmed_incompatibility_on_a_managed_cluster_is_the_driver_upgrade() -> None:
    route = rem.choose_route(OLD_575, READY)
    assert route.name == rem.DRIVER_UPGRADE and route.ready
    assert "playbooks/rebuild.yml" in route.command
    assert "575.57.08" in route.reasons[0] and "n1, n2" in route.reasons[0]


def test_unknown_site_facts_keep_the_upgrade_route_but_list_what_to_confirm() -> None:
    route = rem.choose_route(OLD_575, {})
    assert route.name == rem.DRIVER_UPGRADE and not route.ready
    assert any("maintenance window" in b for b in route.blocked_by)
    assert any("roll back" in b for b in route.blocked_by)


def test_frozen_shared_cluster_goes_to_an_isolated_environment() -> None:
    iso = {"owner": "ml-platform", "review_date": "2026-09-15", "move_back_criteria": "R580 on the shared cluster"}
    route = rem.choose_route(OLD_575, {**READY, "shared_cluster_frozen": True, "isolated_environment": iso})
    assert route.name == rem.ISOLATED_ENVIRONMENT and route.ready
    assert any("cannot change" in r for r in route.reasons)


def test_isolated_environment_without_its_record_is_blocked_by_what_is_missing() -> None:
    route = rem.choose_route(OLD_575, {"shared_cluster_frozen": True, "isolated_environment": {"owner": "x"}})
    assert route.name == rem.ISOLATED_ENVIRONMENT
    assert route.blocked_by == ["isolated environment record lacks review_date",
                                "isolated environment record lacks move_back_criteria"]


def test_no_upgrade_possible_and_a_stack_owner_is_the_self_built_route() -> None:
    facts = {"cluster_managed": False, "self_built": {"owner": "inference-team", "exit_date": "2026-10-31"}}
    route = rem.choose_route(OLD_575, facts)
    assert route.name == rem.SELF_BUILT_IMAGE
    assert "playbooks/build_image.yml" in route.command
    assert any("exit date 2026-10-31" in r for r in route.reasons)


def test_an_unmet_upgrade_condition_stops_changes_and_moves_to_isolation() -> None:
    route = rem.choose_route(OLD_575, {**READY, "rollback_recorded": False})
    assert route.name == rem.ISOLATED_ENVIRONMENT
    assert any("roll back" in r for r in route.reasons)


def test_no_evidence_means_capture_state_first() -> None:
    assert rem.choose_route([], READY).name == rem.CAPTURE_STATE_FIRST
    missing = [Finding(check="compat.driver_branch", status=Status.MISSING, host="n1", reason="unreachable")]
    assert rem.choose_route(missing, READY).name == rem.CAPTURE_STATE_FIRST


def test_passing_driver_is_no_driver_change_and_names_what_fails_instead() -> None:
    findings = [driver("n1", "580.95.05", Status.PASS), node("n1", "compat.container_cuda", Status.FAIL)]
    route = rem.choose_route(findings, READY)
    assert route.name == rem.NO_DRIVER_CHANGE and "compat.container_cuda" in route.reasons[0]


def test_versions_differing_between_sources_is_a_reload_not_an_upgrade() -> None:
    split = driver("n1", "575.57.08", sources={"/proc/driver/nvidia/version": "575.57.08",
                                               "nvidia-smi --query-gpu": "580.95.05"})
    route = rem.choose_route([split], READY)
    assert route.name == rem.NO_DRIVER_CHANGE
    assert any("reload" in r for r in route.reasons)


def test_a_model_or_auth_failure_in_the_startup_log_does_not_confirm_the_driver() -> None:
    auth = Finding(check="compat.startup_log", status=Status.FAIL, host="n1", reason="401 gated repo",
                   observed={"failure_class": "other", "driver_incompatible": []})
    incompat = rem.driver_incompatibility([driver("n1", "575.57.08"), auth])
    assert not incompat.confirmed and any("auth" in n for n in incompat.notes)


def test_route_for_report_is_json_ready() -> None:
    facts = {"inventory": "inventories/prod", "findings_path": "r/findings/preflight.json"}
    data = rem.route_for_report(OLD_575, facts)
    json.dumps(data)
    assert data["name"] == "driver_upgrade" and data["title"].startswith("Upgrade the host driver")
    assert "-i inventories/prod" in data["command"] and "r/findings/preflight.json" in data["command"]
    assert {c["key"] for c in data["conditions"]} >= {"maintenance_window", "rollback_recorded", "spare_node"}


# --- entry conditions ----------------------------------------------------------------------------------


def capture(version: str | None) -> dict[str, object]:
    return {"driver_version": version, "missing": [] if version else ["nvidia_smi_query"]}


def test_entry_allowed_with_evidence_window_capture_and_rollback() -> None:
    decision = rem.entry_conditions(OLD_575, hosts=["n1", "n2"], maintenance_window=WINDOW,
                                    captures={"n1": capture("575.57.08"), "n2": capture("575.57.08")},
                                    rollback_plan="playbooks/rollback.yml", now=NOW)
    assert decision.allowed, decision.reasons
    assert decision.rollback_versions == {"n1": "575.57.08", "n2": "575.57.08"}


@pytest.mark.parametrize(("change", "reason"), [
    ({"maintenance_window": ""}, "not set"),
    ({"maintenance_window": "tonight"}, "not START/END"),
    ({"maintenance_window": "2026-08-30T22:00/2026-08-31T04:00"}, "time zone"),
    ({"maintenance_window": "2026-08-29T22:00Z/2026-08-30T04:00Z"}, "outside"),
    ({"rollback_plan": ""}, "rebuild_rollback_plan is empty"),
    ({"captures": {"n1": capture("575.57.08")}}, "n2: no state captured"),
    ({"captures": {"n1": capture("575.57.08"), "n2": capture(None)}}, "n2: capture lacks"),
    ({"findings": [driver("n1", "580.95.05", Status.PASS)]}, "no host fails compat.driver_branch"),
    ({"findings": None}, "no preflight findings given"),
])
def test_entry_refused_with_the_reason(change: dict[str, object], reason: str) -> None:
    args: dict[str, object] = {"findings": OLD_575, "hosts": ["n1", "n2"], "maintenance_window": WINDOW,
                               "captures": {"n1": capture("575.57.08"), "n2": capture("575.57.08")},
                               "rollback_plan": "playbooks/rollback.yml", "now": NOW}
    args.update(change)
    findings = args.pop("findings")
    decision = rem.entry_conditions(findings, **args)  # type: ignore[arg-type]
    assert not decision.allowed
    assert any(reason in r for r in decision.reasons), decision.reasons


def test_rollback_entry_takes_versions_from_the_recorded_state() -> None:
    recorded = {**capture("575.57.08"), "packages": ["nvidia-driver-575-open 575.57.08-0ubuntu1"]}
    decision = rem.entry_conditions(None, hosts=["n1"], maintenance_window=WINDOW, kind="rollback",
                                    captures={"n1": capture("580.95.05")}, recorded={"n1": recorded},
                                    rollback_plan="re-run rebuild.yml", now=NOW, scope="all")
    assert decision.allowed, decision.reasons
    assert decision.rollback_versions == {"n1": "575.57.08"} and decision.current_versions == {"n1": "580.95.05"}
    assert decision.restore["n1"]["packages"] == ["nvidia-driver-575-open=575.57.08-0ubuntu1"]
    # Scope `failed`: a healthy upgraded node (no failure, no mixed state) is left as it is.
    kept = rem.entry_conditions(None, hosts=["n1"], maintenance_window=WINDOW, kind="rollback",
                                captures={"n1": capture("580.95.05")}, recorded={"n1": recorded},
                                rollback_plan="re-run rebuild.yml", now=NOW)
    assert kept.allowed and kept.targets == {} and kept.rollback_versions == {}


# --- post-change check ----------------------------------------------------------------------------------


def test_upgrade_post_check_needs_every_node_check_and_the_target_version() -> None:
    good = [driver("n1", "580.95.05", Status.PASS), node("n1", "compat.gpu_visibility", Status.PASS),
            node("n2", "compat.gpu_visibility", Status.FAIL)]
    assert rem.post_check(good, "n1", expect_version="580.95.05") == (True, [])
    ok, problems = rem.post_check(good, "n1", expect_version="580.99.01")
    assert not ok and "expected 580.99.01" in problems[0]
    bad = [driver("n1", "580.95.05", Status.PASS), node("n1", "compat.gpu_visibility", Status.FAIL)]
    ok, problems = rem.post_check(bad, "n1", expect_version="580.95.05")
    assert not ok and problems == ["compat.gpu_visibility fail: compat.gpu_visibility fail"]
    unknown = [driver("n1", "580.95.05", Status.PASS), node("n1", "compat.fabric_manager", Status.MISSING)]
    assert not rem.post_check(unknown, "n1", expect_version="580.95.05")[0]
    assert rem.post_check([], "n1", expect_version=None) == (False, ["no preflight findings for n1"])


def test_rollback_post_check_accepts_the_old_driver_but_not_a_lost_gpu() -> None:
    back = [driver("n1", "575.57.08"), node("n1", "compat.gpu_visibility", Status.PASS),
            node("n1", "compat.container_cuda", Status.INCONCLUSIVE)]
    assert rem.post_check(back, "n1", expect_version="575.57.08", kind="rollback") == (True, [])
    # The cu130 image is refused again on R575: what the container sees is unknown, as before the upgrade.
    refused = [*back[:1], node("n1", "compat.gpu_visibility", Status.INCONCLUSIVE)]
    assert rem.post_check(refused, "n1", expect_version="575.57.08", kind="rollback")[0]
    lost = [*back[:1], node("n1", "compat.gpu_visibility", Status.FAIL)]
    assert not rem.post_check(lost, "n1", expect_version="575.57.08", kind="rollback")[0]
    blind = [*back[:1], node("n1", "compat.fabric_manager", Status.MISSING)]
    assert not rem.post_check(blind, "n1", expect_version="575.57.08", kind="rollback")[0]
    assert not rem.post_check(back, "n1", expect_version="580.95.05", kind="rollback")[0]


# --- capture and record -----------------------------------------------------------------------------------


def test_load_capture_reads_the_driver_and_names_what_is_missing(tmp_path: Path) -> None:
    nodes = REPO / "tests" / "fixtures" / "generated-nodes" / "driver-575"
    records = [{"name": "hostname", "rc": 0, "stdout": "gpu-01\n"}, {"name": "uname_a", "rc": 0, "stdout": "Linux"},
               {"name": "nvidia_smi", "rc": 0, "stdout": "table"},
               {"name": "nvidia_smi_query", "rc": 0, "stdout": (nodes / "nvidia-smi-query.csv").read_text()},
               {"name": "lsmod", "rc": 0, "stdout": (nodes / "lsmod.txt").read_text()},
               {"name": "fabricmanager_version", "rc": 0,
                "stdout": (nodes / "nv-fabricmanager-version.txt").read_text()}]
    (tmp_path / "state.json").write_text(json.dumps({"host": "gpu-01", "records": records}))
    summary = rem.load_capture(tmp_path)
    assert summary["driver_version"] == "575.57.08" and summary["driver_branch"] == 575
    assert summary["fabricmanager_version"] == "575.57.08" and summary["gpu_count"] == 8
    assert summary["missing"] == [] and "nvidia" in summary["modules"]
    records[3]["rc"] = 127
    (tmp_path / "state.json").write_text(json.dumps({"host": "gpu-01", "records": records}))
    assert "nvidia_smi_query" in rem.load_capture(tmp_path)["missing"]
    assert rem.load_capture(tmp_path / "absent")["missing"] == list(rem.CAPTURE_REQUIRED)


def test_ledger_says_which_step_failed_on_which_node_and_what_is_untouched(tmp_path: Path) -> None:
    book = rem.Ledger(tmp_path)
    book.start("upgrade", ["a", "b", "c"], {"target": "580.95.05"})
    for step in ("drain", "install", "preflight", "smoke", "workload", "done"):
        book.record("a", step, "ok")
    book.record("b", "drain", "ok")
    data = book.record("b", "preflight", "failed", {"problems": ["compat.gpu_visibility fail"]})
    assert data["failed"] == {"host": "b", "step": "preflight", "detail": {"problems": ["compat.gpu_visibility fail"]}}
    assert data["untouched"] == ["c"] and data["status"] == "stopped"
    assert json.loads((tmp_path / "rebuild.json").read_text())["nodes"]["a"]["result"] == "done"


# --- self-built image: an experimental profile, never a release of the official one ------------------------


LINEAGE = {"owner": "inference-team", "exit_date": "2099-01-31", "source_repo": "https://github.com/vllm-project/vllm",
           "source_commit": "0123456789abcdef0123456789abcdef01234567", "dockerfile": "docker/Dockerfile",
           "lock_files": ["requirements/cuda.txt"], "patches": [], "build_log": "evidence/build/build.log",
           "image_digest": "sha256:" + "a" * 64, "rollback_image": "vllm/vllm-openai:kimi-k3"}


def test_experimental_profile_is_valid_and_carries_lineage() -> None:
    data = rem.experimental_profile(KIMI, name="kimi-k3-cu129", image_reference="registry.local/vllm:kimi-k3-cu129",
                                    image_digest="sha256:" + "a" * 64, cuda_major=12, lineage=LINEAGE,
                                    driver_min_branch=575, driver_min_version="575.51.03")
    validate_document(data, "profile", "test")
    assert data["experimental"] is True and data["lineage"]["base_profile"] == "kimi-k3"
    assert data["lineage"]["owner"] == "inference-team" and data["image"]["cuda_major"] == 12
    assert data["image"]["forbidden_tag_suffixes"] == [] and data["recipe"]["status"] == "experimental"
    assert data["driver"]["min_branch"] == 575 and data["model"] == KIMI.data["model"]


@pytest.mark.parametrize("lineage", [{**LINEAGE, "owner": ""}, {**LINEAGE, "exit_date": "2020-01-01"}])
def test_experimental_profile_needs_an_owner_and_a_future_exit_date(lineage: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        rem.experimental_profile(KIMI, name="x", image_reference="r/x:y", image_digest=None, cuda_major=12,
                                 lineage=lineage)


def test_an_experimental_run_with_every_check_passing_is_never_release() -> None:
    passing = [Finding(check="compat.driver_branch", status=Status.PASS, host="n1"),
               Finding(check="cache.reuse", status=Status.PASS, consequence=Consequence.LIMIT)]
    assert decide(passing).verdict == "release"
    decision = decide(passing, experimental=True)
    assert decision.verdict == "limited_observation" and decision.experimental
    assert any("experimental" in r for r in decision.reasons)


def test_isolated_environment_record_needs_owner_review_date_and_criteria() -> None:
    today = dt.date(2026, 9, 1)
    full = {"isolated_env_owner": "agent-team", "isolated_env_review_date": "2026-09-15",
            "isolated_env_move_back_criteria": "shared cluster on R580 and rebuild.yml completed",
            "isolated_env_shared_inventory": "inventories/shared-gb300"}
    record = rem.isolated_environment_record(full, today)
    assert record["complete"] and record["owner"] == "agent-team"
    assert "inventories/shared-gb300" in record["note"] and "do not carry over" in record["note"]
    partial = rem.isolated_environment_record({"isolated_env_owner": "x"}, today)
    assert partial["problems"] == ["isolated_env_review_date is not set", "isolated_env_move_back_criteria is not set"]
    overdue = rem.isolated_environment_record({**full, "isolated_env_review_date": "2026-08-01"}, today)
    assert not overdue["complete"] and "has passed" in overdue["problems"][0]


# --- a broken node: its capture, the rollback's targets, evidence bound to the nodes ---------------------------

REAL = REPO / "tests" / "fixtures" / "real"
GEN = REPO / "tests" / "fixtures" / "generated-nodes" / "driver-575"


def _state(tmp_path: Path, **records: tuple[int, str]) -> Path:
    rows = [{"name": n, "rc": rc, "stdout": out, "stderr": "", "missing": rc == 127}
            for n, (rc, out) in records.items()]
    (tmp_path / "state.json").write_text(json.dumps({"host": "gpu-01", "records": rows}))
    return tmp_path


def test_a_capture_whose_nvidia_smi_fails_is_the_evidence_of_a_broken_node(tmp_path: Path) -> None:
    mismatch = (REAL / "nvidia-smi-error" / "mismatch-580-truenas.txt").read_text()   # real capture
    proc = (REAL / "driver-version").glob("*580*truenas*")
    state = _state(tmp_path, hostname=(0, "gpu-01\n"), uname_a=(0, "Linux"), nvidia_smi=(18, mismatch),
                   nvidia_smi_query=(18, mismatch), driver_version=(0, next(proc).read_text()),
                   lsmod=(0, (GEN / "lsmod.txt").read_text()), boot_id=(0, "b3c1\n"),
                   packages=(0, "nvidia-driver-580-open 580.178-0ubuntu1\nnvidia-fabricmanager-580 580.178-1\n"))
    capture = rem.load_capture(state)
    assert capture["gpu_tool"]["rc"] == 18 and capture["gpu_tool"]["version_mismatch"]
    assert capture["gpu_tool"]["output"].startswith("Failed to initialize NVML: Driver/library version mismatch")
    assert capture["sources"] == {"kernel_module": "580.173.02", "packages": "580.178"}
    assert capture["mixed"] and capture["boot_id"] == "b3c1"
    assert "nvidia_smi" in capture["missing"]            # not a start for an upgrade
    assert capture["missing_for_rollback"] == []         # but enough for a rollback
    targets = rem.rollback_targets(["gpu-01"], {"gpu-01": capture}, {"gpu-01": {}}, None)
    assert targets["gpu-01"].startswith("mixed state: kernel_module 580.173.02, packages 580.178; nvidia-smi exit 18")
    no_packages = _state(tmp_path, hostname=(0, "gpu-01\n"), nvidia_smi=(6, "No devices were found\n"))
    assert rem.load_capture(no_packages)["missing_for_rollback"] == ["packages"]


def test_rollback_scope_failed_takes_the_failed_and_mixed_nodes_all_takes_every_changed_one() -> None:
    same = {"driver_version": "575.57.08", "packages": ["nvidia-driver-575-open 575.57.08-0ubuntu1"]}
    upgraded = {"driver_version": "580.95.05", "packages": ["nvidia-driver-580-open 580.95.05-0ubuntu1"]}
    mixed = {**upgraded, "mixed": True, "sources": {"kernel_module": "575.57.08", "packages": "580.95.05"}}
    captures = {"a": upgraded, "b": mixed, "c": same, "d": upgraded}
    recorded = dict.fromkeys(captures, same)
    record = {"failed": {"host": "d", "step": "preflight"}}
    assert set(rem.rollback_targets(list(captures), captures, recorded, record)) == {"b", "d"}
    assert set(rem.rollback_targets(list(captures), captures, recorded, record, "all")) == {"a", "b", "d"}
    with pytest.raises(ConfigError, match="rollback_scope 'some'"):
        rem.rollback_targets(["a"], captures, recorded, record, "some")


def test_restore_specs_pin_the_recorded_driver_packages_only() -> None:
    dpkg = ["nvidia-driver-575-open 575.57.08-0ubuntu1", "libnvidia-compute-575 575.57.08-0ubuntu1",
            "nvidia-container-toolkit 1.17.8-1"]
    assert rem.restore_specs(dpkg, "575.57.08") == ["nvidia-driver-575-open=575.57.08-0ubuntu1",
                                                     "libnvidia-compute-575=575.57.08-0ubuntu1"]
    rpm = ["nvidia-driver-580.95.05-1.el9.x86_64", "nvidia-fabricmanager-580-580.95.05-1.x86_64"]
    assert rem.restore_specs(rpm, "580.95.05") == rpm
    assert rem.package_driver_version(dpkg) == "575.57.08" and rem.package_driver_version(rpm) == "580.95.05"


def _preflight_evidence(run_dir: Path, host: str, hostname: str, date_u: str) -> None:
    base = run_dir / "evidence" / "preflight" / host
    base.mkdir(parents=True)
    for name, text in (("hostname", hostname + "\n"), ("date_u", date_u + "\n")):
        (base / f"{name}.txt").write_text(text)
        (base / f"{name}.json").write_text(json.dumps({"rc": 0}))


@pytest.mark.parametrize(("hostname", "date_u", "problem"), [
    ("n1", "Sun Aug 30 21:00:00 UTC 2026", None),
    ("gpu-17", "Sun Aug 30 21:00:00 UTC 2026", "n1: the preflight evidence is of host 'gpu-17'"),
    ("n1", "Wed Aug 26 21:00:00 UTC 2026", "older than 72 h"),
    ("n1", "yesterday", "no readable `date -u`"),
])
def test_upgrade_evidence_must_be_each_nodes_own_and_recent(tmp_path: Path, hostname: str, date_u: str,
                                                            problem: str | None) -> None:
    run_dir = tmp_path / "run"
    _preflight_evidence(run_dir, "n1", hostname, date_u)
    _preflight_evidence(run_dir, "n2", "n2", "Sun Aug 30 21:00:00 UTC 2026")
    captures = {h: {**capture("575.57.08"), "hostname": h} for h in ("n1", "n2")}
    decision = rem.entry_conditions(OLD_575, hosts=["n1", "n2"], maintenance_window=WINDOW, captures=captures,
                                    rollback_plan="playbooks/rollback.yml", now=NOW,
                                    findings_path=run_dir / "findings" / "preflight.json")
    bound = next(c for c in decision.conditions if c.key == "evidence_bound")
    if problem is None:
        assert decision.allowed and bound.met, decision.reasons
    else:
        assert not decision.allowed and problem in bound.detail and "n2:" not in bound.detail


def test_a_node_without_its_own_proof_is_refused_by_name() -> None:
    decision = rem.entry_conditions(OLD_575[:1], hosts=["n1", "n2"], maintenance_window=WINDOW,
                                    captures={"n1": capture("575.57.08"), "n2": capture("575.57.08")},
                                    rollback_plan="playbooks/rollback.yml", now=NOW)
    assert not decision.allowed
    assert any("n2: no compat.driver_branch failure of its own" in r for r in decision.reasons), decision.reasons


def test_a_check_that_passed_before_and_not_after_stops_the_roll() -> None:
    before = [driver("n1", "575.57.08"), node("n1", "compat.peermem", Status.PASS),
              node(None, "compat.image_uniform", Status.PASS), node("n2", "compat.peermem", Status.PASS),
              node("n1", "interconnect.nccl_bandwidth", Status.PASS)]   # type: ignore[arg-type]
    after = [driver("n1", "580.95.05", Status.PASS), node("n1", "compat.peermem", Status.NOT_APPLICABLE),
             node(None, "compat.image_uniform", Status.PASS), node("n1", "interconnect.nccl_bandwidth", Status.FAIL)]  # type: ignore[arg-type]
    ok, problems = rem.post_check(after, "n1", expect_version="580.95.05", before=before)
    assert not ok and problems == ["compat.peermem passed before the change and is not_applicable after it: "
                                   "compat.peermem not_applicable"]
    assert {"compat.startup_log", "interconnect.nccl_bandwidth",
            "interconnect.fabric_path"} == rem.NODE_CHECKS_SKIPPED_AFTER_CHANGE
    assert rem.post_check(after[:1] + after[2:3], "n1", expect_version="580.95.05", before=before[:1])[0]


@pytest.mark.parametrize(("status", "body", "tool_call", "expect", "problem"), [
    (200, {"choices": [{"text": " OK.", "finish_reason": "stop"}]}, False, None, None),
    (200, {"choices": [{"text": "", "finish_reason": "length"}]}, False, None, "empty answer"),
    (200, {"choices": [{"text": "Hello"}]}, False, "(?i)ok", "does not match"),
    (404, {"object": "error", "message": "The model `x` does not exist."}, False, None, "HTTP 404"),
    (200, {"choices": [{"message": {"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "report_status", "arguments": "{\"status\": \"ok\"}"}}]}, "finish_reason": "tool_calls"}]},
     True, None, None),
    (200, {"choices": [{"message": {"role": "assistant", "content": "All good", "tool_calls": []},
                        "finish_reason": "stop"}]}, True, None, "no tool call"),
    (200, {"choices": [{"message": {"tool_calls": [{"function": {"name": "report_status",
                                                                 "arguments": "{\"status\": "}}]}}]},
     True, None, "not JSON"),
    (200, {"choices": [{"message": {"tool_calls": [{"function": {"name": "report_status",
                                                                 "arguments": "{\"state\": 1}"}}]}}]},
     True, None, "lack the required string field"),
])
def test_smoke_rule(status: int, body: dict[str, object], tool_call: bool, expect: str | None,
                    problem: str | None) -> None:
    result = rem.judge_smoke(status, body, tool_call=tool_call, expect=expect)
    assert result["ok"] is (problem is None), result
    assert problem is None or any(problem in p for p in result["problems"]), result


@pytest.mark.parametrize(("url", "tool_call", "endpoint"), [
    ("http://10.0.0.5:8000/v1", True, "http://10.0.0.5:8000/v1/chat/completions"),
    ("http://10.0.0.5:8000/v1/", False, "http://10.0.0.5:8000/v1/completions"),
    # The endpoint form of either kind is read as its base: the body decides where the request goes.
    ("http://10.0.0.5:8000/v1/completions", True, "http://10.0.0.5:8000/v1/chat/completions"),
    ("https://gw.example/llm/v1/chat/completions", False, "https://gw.example/llm/v1/completions"),
])
def test_smoke_endpoint_is_the_one_the_body_needs_under_the_base_url(url: str, tool_call: bool,
                                                                     endpoint: str) -> None:
    assert rem.smoke_endpoint(url, tool_call=tool_call) == endpoint


@pytest.mark.parametrize(("url", "problem"), [
    ("http://10.0.0.5:8000/v1/models", "names the /models endpoint"),
    ("http://10.0.0.5:8000/v1/embeddings", "names the /embeddings endpoint"),
    ("10.0.0.5:8000/v1", "not an http(s) URL"),
    ("http://10.0.0.5:8000/v1?x=1", "query or fragment"),
])
def test_smoke_url_that_cannot_take_the_body_is_refused_naming_node_and_fix(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        rem.smoke_endpoint(url, tool_call=True, host="gb300-a01")
    assert problem in str(err.value) and "rebuild_smoke_url of gb300-a01" in str(err.value)
    assert "base URL, e.g. http://HOST:8000/v1" in str(err.value)


def test_capture_records_cut_the_framed_answer(tmp_path: Path) -> None:
    marker = "@@node-state-" + "x" * 24
    stream = (f"{marker} begin hostname [\"hostname\"]\ngpu-01\n\n{marker} end hostname 0 \n\n{marker} done hostname\n"
              f"{marker} begin nvidia_smi [\"nvidia-smi\"]\nNo devices were found\n\n{marker} end nvidia_smi 6 \n\n"
              f"{marker} done nvidia_smi\n{marker} fin\n")
    commands = [{"name": "hostname", "argv": ["hostname"]}, {"name": "nvidia_smi", "argv": ["nvidia-smi"]},
                {"name": "lsmod", "argv": ["lsmod"]}]
    records = rem.capture_records(stream, marker, commands)
    assert [(r["name"], r["rc"], r["stdout"]) for r in records] == [
        ("hostname", 0, "gpu-01\n"), ("nvidia_smi", 6, "No devices were found\n"), ("lsmod", None, "")]
    assert records[2]["stderr"] == "the node's answer never reached this command"


def test_capture_records_redact_a_secret_in_a_command_as_in_its_answer() -> None:
    """A site's check with a credential in its arguments (node_state_extra_commands): the record keeps the command
    with the value redacted, as its answer (found by molecule/node_state)."""
    marker = "@@node-state-" + "x" * 24
    stream = (f"{marker} begin extra_site [\"curl\"]\nok key=site-secret-4711\n\n{marker} end extra_site 0 \n\n"
              f"{marker} done extra_site\n{marker} fin\n")
    argv = ["curl", "-H", "X-Key: site-secret-4711", "https://health.example/api"]
    [record] = rem.capture_records(stream, marker, [{"name": "extra_site", "argv": argv}], ["site-secret-4711"])
    assert record["rc"] == 0 and record["cmd"][0] == "curl" and record["cmd"][-1] == argv[-1]
    assert "site-secret-4711" not in json.dumps(record)


# --- the module's actions (plugins/modules/acceptance_remediation.py calls rebuild/remediation/actions.py) ---------


def _module_action_choices() -> list[str]:
    import ast
    tree = ast.parse((REPO / "plugins/modules/acceptance_remediation.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == "action" for k in node.keys):
            spec = node.values[[k.value for k in node.keys if isinstance(k, ast.Constant)].index("action")]
            return ast.literal_eval(spec)["choices"]
    raise AssertionError("acceptance_remediation has no action option")


def test_every_module_action_has_one_function_in_the_package() -> None:
    from vllm_acceptance.rebuild.remediation.actions import ACTIONS
    assert list(ACTIONS) == _module_action_choices()


def test_an_action_without_its_options_or_with_unmet_entry_fails_with_the_message(tmp_path: Path) -> None:
    from vllm_acceptance.rebuild.remediation.actions import ActionError, run_action
    with pytest.raises(ActionError, match=r"^action=record needs host, step$"):
        run_action({"action": "record", "run_dir": str(tmp_path), "host": None, "step": ""})
    params = {"action": "entry", "run_dir": str(tmp_path), "hosts": ["n1"], "kind": "rollback",
              "preflight_findings": None, "maintenance_window": None, "rollback_plan": "re-run rebuild.yml",
              "capture_dirs": {}, "recorded_dirs": {}, "upgrade_record": None, "rollback_scope": "failed",
              "profile_path": None, "site_facts": {}}
    with pytest.raises(ActionError) as err:
        run_action(params)
    assert err.value.msg.startswith("refused: the rollback changes nothing until these are met: ")
    assert "rebuild_maintenance_window is not set" in err.value.msg
    assert err.value.fields["decision"]["allowed"] is False and err.value.fields["route"] is None
    # The refusal is evidence: written before the action fails.
    assert json.loads((tmp_path / "rollback-entry.json").read_text())["decision"]["allowed"] is False
