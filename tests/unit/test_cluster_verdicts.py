"""Verdicts on the cluster path (containers, several nodes, attach): each for the right reason.

Each test builds the run directory a GPU-cluster run leaves (the sample run of
tests/fixtures/reports/samples.py) and changes the one fact the case is about.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Consequence, Finding, Status, read_findings, write_findings
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.probes.after import judge_after_probes
from vllm_acceptance.probes.load.rules import MEMORY_UNSEEN
from vllm_acceptance.report.build import build_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "reports"))
import samples  # noqa: E402 - the sample run builder lives with the fixtures

KIMI = Path(__file__).resolve().parents[2] / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml"
SOAK_START = samples.T0 + 3300


def soak_without_process_memory(run_dir: Path, metrics_rss_growth_pct: float | None = None) -> None:
    """The load stage of a containerised server: the soak had no local pid to read memory from; with
    `metrics_rss_growth_pct` its own /metrics exported its RSS (one API server), else not (several)."""
    path = run_dir / "findings" / "load.json"
    findings = read_findings(path)
    host = {"memory_growth_pct": metrics_rss_growth_pct, "memory_samples": 0 if metrics_rss_growth_pct is None else 60,
            "memory_source": None if metrics_rss_growth_pct is None else "rss:/metrics"}
    findings.append(Finding(
        check="capacity.soak", status=Status.INCONCLUSIVE, consequence=Consequence.EXPAND,
        observed={"seconds": 600, "requests": 640, "errors": 0, **host,
                  "not_observed": [] if metrics_rss_growth_pct is not None else [MEMORY_UNSEEN]},
        expected="no errors or hangs; memory growth <= 20.0%", evidence=[],
        configuration={"window": {"start": SOAK_START, "end": SOAK_START + 600}, "max_growth_pct": 20.0},
        rule="a steady memory rise blocks release"))
    write_findings(path, findings)


def node_memory_stream(run_dir: Path, host: str, mib: list[int]) -> None:
    """evidence/memory/<host>.csv as the gpu_memory_sampler role fetches it (nvidia-smi -lms)."""
    lines = []
    for i, value in enumerate(mib):
        t = dt.datetime.fromtimestamp(SOAK_START + 10 + i * 60, dt.UTC).strftime("%Y/%m/%d %H:%M:%S.000")
        for gpu in range(2):
            lines.append(f"{t}, {gpu}, {value if gpu == 1 else 150000}")
    (run_dir / "evidence" / "memory").mkdir(parents=True, exist_ok=True)
    (run_dir / "evidence" / "memory" / f"{host}.csv").write_text("\n".join(lines) + "\n")


def test_soak_flat_gpu_memory_alone_never_passes_without_the_servers_own_memory(tmp_path: Path) -> None:
    """Issue 42: a host-memory leak inside a container passed the soak, vLLM's preallocated GPU memory being
    flat. With neither a local pid nor process_resident_memory_bytes in /metrics, the soak's memory stays
    unobserved: flat GPU series do not make it pass."""
    run_dir = samples.make_run("release", tmp_path)
    soak_without_process_memory(run_dir)
    for host in samples.NODES:
        node_memory_stream(run_dir, host, [150000] * 8)
    assert judge_after_probes(run_dir)["changed"] == []
    report = build_report(run_dir, load_profile(KIMI))
    soak = next(f for f in report["findings"] if f["check"] == "capacity.soak")
    assert soak["status"] == "inconclusive" and "server's own memory" in soak["reason"]
    assert soak["observed"]["worst_gpu"] == f"gpu0@{samples.NODES[0]}"
    assert report["verdict"] == "incomplete" and "capacity.soak" in report["missing"]


def test_soak_judged_from_node_gpu_memory_before_the_decision_flat_releases(tmp_path: Path) -> None:
    run_dir = samples.make_run("release", tmp_path)
    soak_without_process_memory(run_dir, metrics_rss_growth_pct=0.4)
    for host in samples.NODES:
        node_memory_stream(run_dir, host, [150000] * 8)
    # The report assembles: until the step after the probes has judged the series, the soak stays unknown.
    assert build_report(run_dir, load_profile(KIMI))["verdict"] == "incomplete"
    assert judge_after_probes(run_dir)["changed"] == ["capacity.soak"]
    assert judge_after_probes(run_dir)["status"] == "already_judged"  # once per run: the timeline is not doubled
    report = build_report(run_dir, load_profile(KIMI))
    soak = next(f for f in report["findings"] if f["check"] == "capacity.soak")
    assert soak["status"] == "pass"
    assert "evidence/memory/gb300-node1.csv" in soak["evidence"]
    assert report["verdict"] == "release", report["verdict_reasons"]


def test_soak_gpu_memory_rise_on_one_gpu_is_expand_capacity(tmp_path: Path) -> None:
    run_dir = samples.make_run("release", tmp_path)
    soak_without_process_memory(run_dir)
    node_memory_stream(run_dir, samples.NODES[0], [150000] * 8)
    node_memory_stream(run_dir, samples.NODES[1], [100000, 110000, 130000, 150000, 170000, 190000, 200000, 207000])
    judge_after_probes(run_dir)
    report = build_report(run_dir, load_profile(KIMI))
    soak = next(f for f in report["findings"] if f["check"] == "capacity.soak")
    assert soak["status"] == "fail"
    assert soak["observed"]["worst_gpu"] == f"gpu1@{samples.NODES[1]}"
    assert report["verdict"] == "expand_capacity", report["verdict_reasons"]
    assert "capacity.soak" in report["verdict_reasons"][0]


def test_soak_without_any_memory_source_stays_incomplete(tmp_path: Path) -> None:
    run_dir = samples.make_run("release", tmp_path)
    soak_without_process_memory(run_dir)
    assert judge_after_probes(run_dir)["changed"] == []
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "incomplete"
    assert "capacity.soak" in report["missing"]


def soak_with_nothing_but_gpus_and_logs_unseen(run_dir: Path) -> None:
    """The soak of a launched container as the load probe leaves it: no local process (its RSS read from its own
    /metrics, flat), no growing log."""
    soak_without_process_memory(run_dir, metrics_rss_growth_pct=0.4)
    path = run_dir / "findings" / "load.json"
    findings = read_findings(path)
    findings[-1].observed = {**findings[-1].observed, "log_observed": False, "comm_errors": [], "not_observed": [
        "communication errors (the server log did not grow over the window)"]}
    write_findings(path, findings)


@pytest.mark.parametrize(("worker_log", "verdict"), [
    ("INFO Launching vLLM headless\nINFO:     shutting down\n", "release"),
    ("INFO step\nERROR NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)\n", "expand_capacity"),
])
def test_container_soak_reads_communication_errors_from_every_nodes_log_after_the_probes(
        tmp_path: Path, worker_log: str, verdict: str) -> None:
    """The whole log of each node's container, taken after the probes, spans the soak window: an NCCL error in
    any fails the soak (the worker's too); none makes the errors observed, and the GPU series decide memory."""
    run_dir = samples.make_run("release", tmp_path)
    soak_with_nothing_but_gpus_and_logs_unseen(run_dir)
    for host in samples.NODES:
        node_memory_stream(run_dir, host, [150000] * 8)
    after = run_dir / "evidence" / "serve" / "after-probes"
    after.mkdir(parents=True)
    (after / f"{samples.NODES[0]}.log").write_text("INFO Application startup complete.\n")
    (after / f"{samples.NODES[1]}.log").write_text(worker_log)
    assert judge_after_probes(run_dir)["changed"] == ["capacity.soak"]
    report = build_report(run_dir, load_profile(KIMI))
    soak = next(f for f in report["findings"] if f["check"] == "capacity.soak")
    assert report["verdict"] == verdict, report["verdict_reasons"]
    assert soak["observed"]["log_observed"] is True
    assert f"evidence/serve/after-probes/{samples.NODES[1]}.log" in soak["evidence"]
    if verdict == "expand_capacity":
        assert soak["status"] == "fail" and "NCCL error" in soak["reason"]
        assert soak["observed"]["comm_errors"][0].startswith(f"{samples.NODES[1]}.log:2: ")


def test_container_soak_without_a_log_after_the_probes_stays_unobserved(tmp_path: Path) -> None:
    run_dir = samples.make_run("release", tmp_path)
    soak_with_nothing_but_gpus_and_logs_unseen(run_dir)
    for host in samples.NODES:
        node_memory_stream(run_dir, host, [150000] * 8)
    judge_after_probes(run_dir)
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "incomplete" and "capacity.soak" in report["missing"]


def test_gpu_profile_with_no_gpu_nodes_is_never_release(tmp_path: Path) -> None:
    """An empty or misspelled gpu_nodes group: preflight judged no node, so it cannot pass."""
    from vllm_acceptance.preflight.stage import judge

    run_dir = samples.make_run("release", tmp_path)
    profile = load_profile(KIMI)
    preflight = judge(run_dir, profile, [], today=dt.date(2026, 8, 30))
    assert [f.check for f in preflight if f.status == Status.MISSING] == ["compat.gpu_nodes"]
    assert "gpu_nodes group is empty or absent" in preflight[-1].reason
    write_findings(run_dir / "findings" / "preflight.json", preflight)
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run, "hosts": []}))
    report = build_report(run_dir, profile)
    assert report["verdict"] == "incomplete", report["verdict_reasons"]
    assert "compat.gpu_nodes" in report["missing"]


def test_report_refuses_a_gpu_run_without_nodes_even_when_preflight_said_nothing(tmp_path: Path) -> None:
    run_dir = samples.make_run("release", tmp_path)
    write_findings(run_dir / "findings" / "preflight.json",
                   [f for f in read_findings(run_dir / "findings" / "preflight.json") if f.host is None])
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run, "hosts": []}))
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "incomplete"
    assert "compat.gpu_nodes" in report["missing"]
    # the same run with its nodes named is the sample's release
    (run_dir / "run.json").write_text(json.dumps(run))
    assert build_report(run_dir, load_profile(KIMI))["verdict"] == "release"


FAILURES = Path(__file__).resolve().parents[1] / "fixtures" / "launch_failures"
DOCKER_HINT = "Run 'docker run --help' for more information\n"


def test_reason_quotes_the_causal_line_not_dockers_help_hint() -> None:
    from vllm_acceptance.parsers.causal import causal_line

    refused = (FAILURES / "env_container_requirement.log").read_text() + DOCKER_HINT
    assert "unsatisfied condition: cuda>=13.0" in causal_line(refused)
    assert "--help" not in causal_line(refused)
    oom = (FAILURES / "cap_cuda_oom_loading.log").read_text()
    assert "out of memory" in causal_line(oom).lower()



def test_no_access_or_info_line_is_quoted_as_a_cause() -> None:
    """A SIGKILLed lab server's real log tail (tests/integration/test_load_probe_lab.py, killed mid-ramp) ends
    in uvicorn access lines: none of them says why, so none is the cause."""
    from vllm_acceptance.parsers.causal import causal_line

    tail = ['INFO:     127.0.0.1:57484 - "POST /tokenize HTTP/1.1" 200 OK',
            '(APIServer pid=4242) INFO 12-01 19:40:01 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0',
            'INFO:     127.0.0.1:57614 - "GET /metrics HTTP/1.1" 200 OK']
    assert causal_line("\n".join(tail)) == ""
    assert causal_line("\n".join([*tail, "Killed"])) == "Killed"
    failed = 'INFO:     127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error'
    assert "500" in causal_line(failed)


def test_model_load_reason_quotes_the_runtime_refusal(tmp_path: Path) -> None:
    from vllm_acceptance.serve.stage import ServeFacts, model_load

    refused = (FAILURES / "env_container_requirement.log").read_text() + DOCKER_HINT
    finding = model_load(ServeFacts(base_url="http://127.0.0.1:9/v1", launch_error=refused), [])
    assert finding.status == Status.FAIL
    assert "unsatisfied condition: cuda>=13.0" in finding.reason


OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity "
            "of 279.00 GiB")


def crashed_load(run_dir: Path, record: dict) -> None:
    """The load stage's findings as run_load_probe writes them after the server died in the ramp."""
    from vllm_acceptance.probes.load import crash_finding
    from vllm_acceptance.rules.registry import missing

    path = run_dir / "findings" / "load.json"
    kept = [f for f in read_findings(path) if f.check in ("capacity.model_load", "capacity.long_context")]
    (run_dir / "evidence" / "load").mkdir(parents=True, exist_ok=True)
    (run_dir / "evidence" / "load" / "oom_record.json").write_text(json.dumps(record))
    kept.append(crash_finding(record, ["evidence/load/oom_record.json"]))
    kept += [missing(c, None, f"not run: the server died in stage {record['stage']}", Consequence.EXPAND)
             for c in ("capacity.ramp", "capacity.mixed", "capacity.soak")]
    write_findings(path, kept)


def record(log_tail: list[str]) -> dict:
    from vllm_acceptance.probes.load import OOM_MARKERS

    oom = [line for line in log_tail if any(m in line.lower() for m in OOM_MARKERS)]
    return {"stage": "ramp", "kind": "oom" if oom else "crash", "oom_lines": oom, "log_tail": log_tail,
            "errors": ["httpx.RemoteProtocolError: Server disconnected"], "process_state": "exited"}


def test_oom_under_load_is_expand_capacity_with_the_oom_line(tmp_path: Path) -> None:
    run_dir = samples.make_run("release", tmp_path)
    crashed_load(run_dir, record(["INFO step", OOM_LINE, "INFO shutting down"]))
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "expand_capacity", report["verdict_reasons"]
    assert any(OOM_LINE in r for r in report["verdict_reasons"])
    assert any("not reached because the server died under load" in r for r in report["verdict_reasons"])


def test_crash_without_capacity_signature_is_incomplete_naming_the_cause(tmp_path: Path) -> None:
    run_dir = samples.make_run("release", tmp_path)
    cause = "RuntimeError: Worker proc VllmWorker-2 died unexpectedly, shutting down executor."
    crashed_load(run_dir, record(["INFO step", cause, "INFO:     Shutting down"]))
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "incomplete", report["verdict_reasons"]
    assert any(cause in r for r in report["verdict_reasons"])


def test_container_oom_seen_only_in_the_log_after_the_probes(tmp_path: Path) -> None:
    """In a container the probe cannot read the server's log: the log taken after the probes decides."""
    run_dir = samples.make_run("release", tmp_path)
    crashed_load(run_dir, record([]))
    assert build_report(run_dir, load_profile(KIMI))["verdict"] == "incomplete"
    after = run_dir / "evidence" / "serve" / "after-probes"
    after.mkdir(parents=True)
    (after / "gb300-node1.log").write_text(f"INFO ramp\n{OOM_LINE}\n")
    assert build_report(run_dir, load_profile(KIMI))["verdict"] == "incomplete"  # the report does not re-judge
    assert judge_after_probes(run_dir)["changed"] == ["capacity.crash"]
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "expand_capacity", report["verdict_reasons"]
    crash = next(f for f in report["findings"] if f["check"] == "capacity.crash")
    assert "evidence/serve/after-probes/gb300-node1.log" in crash["evidence"] and OOM_LINE in crash["reason"]


# --- the launched plan (profile + inventory), not the profile's own layout -------------------------

NODE_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "generated-nodes"
EXAMPLE_GB300 = {"vllm_parallel": {"tensor": 8, "pipeline": 2}, "vllm_interconnect": "nvl"}
TODAY = dt.date(2026, 8, 30)


def tp8_pp2_log() -> str:
    """The recorded good startup log (TP 8) as a TP 8 x PP 2 replica over two nodes would print it
    (generated from tests/fixtures/generated-nodes/good/startup.log: world size 16, pipeline 2)."""
    text = (NODE_FIXTURES / "good" / "startup.log").read_text()
    return (text.replace("world_size=8 ", "world_size=16 ").replace("world_size=8,", "world_size=16,")
            .replace("in world size 8 ", "in world size 16 ")
            .replace("pipeline_parallel_size=1", "pipeline_parallel_size=2")
            .replace("'tensor_parallel_size': 8", "'tensor_parallel_size': 8, 'pipeline_parallel_size': 2"))


def test_startup_log_world_size_is_judged_against_the_launched_plan() -> None:
    from vllm_acceptance.parsers.startup_log import scan_startup_log
    from vllm_acceptance.rules.compat import check_startup_log
    from vllm_acceptance.rules.launched import launched_plan

    kimi = load_profile(KIMI)
    scan = scan_startup_log(tp8_pp2_log())
    assert scan.world_size == 16
    launched = launched_plan(kimi, EXAMPLE_GB300)
    assert check_startup_log(scan, kimi, "gb300-a01", [], launched).status == Status.PASS
    # the same log judged against the profile's layout alone (TP 8) is the false rebuild of before
    assert check_startup_log(scan, kimi, "gb300-a01", []).status == Status.FAIL
    # and a TP 8 log where TP 8 x PP 2 was launched fails, naming the launched layout
    single = scan_startup_log((NODE_FIXTURES / "good" / "startup.log").read_text())
    finding = check_startup_log(single, kimi, "gb300-a01", [], launched)
    assert finding.status == Status.FAIL and "launched layout tensor 8 x pipeline 2 = 16" in finding.reason


def judged_cluster(tmp_path: Path, cases: dict[str, str],
                   inventory_vars: dict) -> dict[tuple[str, str | None], Finding]:
    from vllm_acceptance.preflight.stage import judge

    from nodefixtures import build_evidence

    for host, case in cases.items():
        build_evidence(case, tmp_path, host=host)
    (tmp_path / "run.json").write_text(json.dumps({"hosts": list(cases), "inventory_vars": inventory_vars}))
    return {(f.check, f.host): f for f in judge(tmp_path, load_profile(KIMI), list(cases), today=TODAY)}


def test_cluster_gpu_count_is_judged_against_the_launched_world(tmp_path: Path) -> None:
    cases = {"gb300-a01": "good", "gb300-a02": "seven-gpus"}
    launched = judged_cluster(tmp_path / "pp2", cases, EXAMPLE_GB300)
    topology = launched[("compat.topology", None)]
    assert topology.status == Status.FAIL and "needing 1 / 16" in topology.reason
    # the profile's layout alone (TP 8) needs 8 GPUs in all: 15 passed for a launch of 16
    assert judged_cluster(tmp_path / "tp8", cases, {})[("compat.topology", None)].status == Status.PASS
    healthy = judged_cluster(tmp_path / "ok", {"gb300-a01": "good", "gb300-a02": "good"}, EXAMPLE_GB300)
    assert healthy[("compat.topology", None)].status == Status.PASS
    assert healthy[("compat.gpu_visibility", "gb300-a02")].observed["host_count"] == 8


def test_interconnect_env_is_judged_on_what_the_inventory_launches(tmp_path: Path) -> None:
    two = {"gb300-a01": "good", "gb300-a02": "good"}
    nvls_off = judged_cluster(tmp_path / "a", two, {**EXAMPLE_GB300,
                                                     "vllm_serve_multinode_env": {"NCCL_NVLS_ENABLE": "0"}})
    env = nvls_off[("interconnect.nccl_env", "gb300-a02")]
    assert env.status == Status.FAIL and "NCCL_NVLS_ENABLE='0'" in env.reason
    plain = judged_cluster(tmp_path / "b", two, EXAMPLE_GB300)
    assert plain[("interconnect.nccl_env", "gb300-a01")].status == Status.PASS


def test_dmabuf_workaround_is_justified_by_the_startup_log_that_showed_the_error(tmp_path: Path) -> None:
    two = {"gb300-a01": "good", "gb300-a02": "good"}
    unjustified = judged_cluster(tmp_path / "a", two, {**EXAMPLE_GB300, "vllm_nccl_dmabuf_workaround": True})
    assert unjustified[("interconnect.nccl_env", "gb300-a01")].status == Status.WARN
    proof = str(NODE_FIXTURES / "nccl-error" / "startup.log")
    justified = judged_cluster(tmp_path / "b", two, {**EXAMPLE_GB300, "vllm_nccl_dmabuf_workaround": True,
                                                      "vllm_nccl_dmabuf_evidence": proof})
    finding = justified[("interconnect.nccl_env", "gb300-a01")]
    assert finding.status == Status.PASS and finding.observed["dmabuf_error_in_log"] is True


# --- user-facing: the inventory as copied, every variable documented -------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _schema_properties() -> set[str]:
    schema = json.loads((ROOT / "src" / "vllm_acceptance" / "schemas" / "inventory.schema.json").read_text())
    return set(schema["properties"])


def test_every_inventory_variable_is_in_the_schema_and_documented() -> None:
    import re

    import yaml

    reference = (ROOT / "docs" / "inventory.md").read_text()   # the README's "Inventory" links to it
    assert "docs/inventory.md" in (ROOT / "README.md").read_text()
    props = _schema_properties()
    undocumented = sorted(p for p in props if f"`{p}`" not in reference)
    assert not undocumented, f"inventory variables missing from docs/inventory.md: {undocumented}"
    used = set()
    for path in list((ROOT / "inventories").glob("*/group_vars/*.yml")) + [ROOT / "accept.yml",
                                                                           *(ROOT / "playbooks").glob("*.yml")]:
        text = path.read_text()
        if "group_vars" in str(path):
            used |= {k for k in (yaml.safe_load(text) or {}) if k.startswith(("acceptance_", "vllm_", "prometheus_"))}
        else:   # what a playbook reads from the inventory with a default
            used |= set(re.findall(r"\b((?:acceptance|vllm|prometheus)_[a-z0-9_]+) \| default", text))
    internal = {"acceptance_run_dir", "acceptance_profile_path", "acceptance_validated_profile",
                "vllm_serve_ok", "vllm_serve_base_url", "vllm_serve_launch_error", "vllm_serve_log_copy",
                "vllm_serve_launched_container", "vllm_serve_pid_file", "vllm_serve_launched",
                "vllm_serve_restart", "acceptance_unreachable_hosts"}   # facts the plays set for each other
    assert sorted(used - internal - props) == []


def test_example_inventory_runs_the_controller_locally() -> None:
    """Copied as it is, the example must not SSH to localhost (the probes and load run there)."""
    import subprocess

    out = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i",
                          str(ROOT / "inventories" / "example-gb300"), "--host", "localhost"],
                         capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout)["ansible_connection"] == "local"


# --- inventory overrides never sign the profile's contract on a weaker test ------------------------

def test_overrides_of_the_contract_are_refused_naming_the_field_and_the_fix() -> None:
    import pytest

    from vllm_acceptance.core.profile import ConfigError
    from vllm_acceptance.core.rundir import validate_inventory_vars

    base = {"acceptance_profile": "kimi-k3", "acceptance_owner": "me", "vllm_serve_mode": "launch"}
    for bad in ({"load": {"contract.concurrency": 1}}, {"load": {"thresholds.memory_growth_pct": 500}},
                {"cache": {"load.soak_s": 1}}):
        with pytest.raises(ConfigError) as err:
            validate_inventory_vars({**base, "acceptance_probe_overrides": bad}, "inventory site")
        kind, fields = next(iter(bad.items()))
        assert f"acceptance_probe_overrides.{kind}.{next(iter(fields))}" in str(err.value)
        assert "write profiles/<site>.yml" in str(err.value)
    validate_inventory_vars({**base, "acceptance_probe_overrides": {"load": {"load.soak_s": 600}}}, "inventory site")


def test_a_run_on_probe_overrides_is_recorded_and_never_a_release(tmp_path: Path) -> None:
    from vllm_acceptance.report.render_md import render_markdown

    run_dir = samples.make_run("release", tmp_path)
    run = json.loads((run_dir / "run.json").read_text())
    run["inventory_vars"] = {"acceptance_probe_overrides": {"load": {"load.soak_s": 5}}}
    (run_dir / "run.json").write_text(json.dumps(run))
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "limited_observation"
    assert report["probe_overrides"] == [{"probe": "load", "field": "load.soak_s",
                                          "profile": load_profile(KIMI).get("load.soak_s"), "tested": 5}]
    assert any("load.soak_s" in r and "-> 5" in r for r in report["verdict_reasons"])
    first_screen = render_markdown(report).split("## Traffic gates")[0]
    assert "inventory overrides" in first_screen


def test_remediation_command_names_the_inventory_path_the_user_gave(tmp_path: Path) -> None:
    run_dir = samples.make_run("rebuild", tmp_path)
    run = json.loads((run_dir / "run.json").read_text())
    run["inventory_vars"] = {"acceptance_inventory_dir": "/srv/sites/gb300-prod"}
    (run_dir / "run.json").write_text(json.dumps(run))
    report = build_report(run_dir, load_profile(KIMI))
    assert report["verdict"] == "rebuild_environment"
    assert "-i /srv/sites/gb300-prod " in report["remediation"]["command"]
    assert "inventories/gb300-prod" not in report["remediation"]["command"]


# --- a missing source is `missing`; the driver's sources must agree --------------------------------

# nvidia-smi's words when the loaded kernel module and the user-space NVML differ (a driver upgraded
# without a reboot), as printed by nvidia-smi 5xx (exit 18).
NVML_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n"
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
             "latest NVIDIA driver is installed and running.\n")


def _smi_fails(base: Path, stdout: str, rc: int) -> None:
    for name in ("nvidia_smi", "nvidia_smi_query", "nvidia_smi_xml"):
        (base / f"{name}.txt").write_text(stdout)
        (base / f"{name}.json").write_text(json.dumps({"cmd": name, "rc": rc, "stderr": "", "missing": False}))


def _node_checks(tmp_path: Path, stdout: str | None, rc: int = 0) -> dict[str, Finding]:
    from vllm_acceptance.preflight.stage import judge

    from nodefixtures import build_evidence

    base = build_evidence("good", tmp_path, host="gb300-a01")
    if stdout is not None:
        _smi_fails(base, stdout, rc)
    return {f.check: f for f in judge(tmp_path, load_profile(KIMI), ["gb300-a01"], today=TODAY)
            if f.host == "gb300-a01"}


def test_driver_module_and_nvml_disagreeing_is_a_failure_with_the_reload_action(tmp_path: Path) -> None:
    assert _node_checks(tmp_path / "ok", None)["compat.driver_branch"].status == Status.PASS
    driver = _node_checks(tmp_path / "bad", NVML_MISMATCH, 18)["compat.driver_branch"]
    assert driver.status == Status.FAIL
    assert "Driver/library version mismatch" in driver.reason and "reload the nvidia kernel module" in driver.action


def test_fabric_manager_without_an_answering_nvidia_smi_is_missing_not_pass(tmp_path: Path) -> None:
    assert _node_checks(tmp_path / "ok", None)["compat.fabric_manager"].status == Status.PASS
    checks = _node_checks(tmp_path / "bad", NO_DRIVER, 9)
    assert checks["compat.fabric_manager"].status == Status.MISSING
    # A driver that does not answer nvidia-smi is a failing node (its own words quoted), never a pass.
    driver = checks["compat.driver_branch"]
    assert driver.status == Status.FAIL and "couldn't communicate" in driver.reason
    assert "modprobe nvidia" in driver.action


def test_gpu_memory_rise_fails_a_soak_that_passed_on_the_server_process_memory(tmp_path: Path) -> None:
    """Attached with the server's pid: host RSS flat, one GPU leaking. The GPU decides (found by the
    rehearsal: a rising GPU stream ended release)."""
    def attached_run(name: str, gpu_mib: list[int]) -> Path:
        run_dir = samples.make_run("release", tmp_path / name)
        soak_without_process_memory(run_dir)
        path = run_dir / "findings" / "load.json"
        findings = read_findings(path)
        for f in findings:
            if f.check == "capacity.soak":
                f.status, f.observed = Status.PASS, {**f.observed, "memory_growth_pct": 0.3, "memory_samples": 38}
        write_findings(path, findings)
        node_memory_stream(run_dir, samples.NODES[0], gpu_mib)
        judge_after_probes(run_dir)
        return run_dir

    leaking = attached_run("leak", [100000, 110000, 130000, 150000, 170000, 190000, 200000, 207000])
    report = build_report(leaking, load_profile(KIMI))
    assert report["verdict"] == "expand_capacity", report["verdict_reasons"]
    assert build_report(attached_run("flat", [150000] * 8), load_profile(KIMI))["verdict"] == "release"


def test_a_crash_without_oom_quotes_the_servers_own_causal_line(tmp_path: Path) -> None:
    """A container server that died mid-ramp: the probe saw only a dropped connection; the container's log
    read after the probes (a real vLLM engine-core failure, tests/fixtures/real/vllm) gives the why."""
    from vllm_acceptance.probes.after import crash_from_server_logs
    from vllm_acceptance.rules import registry

    log = tmp_path / "evidence" / "serve" / "after-probes" / "gb300-a01.log"
    log.parent.mkdir(parents=True)
    log.write_text((ROOT / "tests" / "fixtures" / "real" / "vllm" / "v1-0.8-rtx50-no-kernel-image.log").read_text())
    crash = registry.get("capacity.crash").inconclusive(
        reason="the server died in stage ramp_c4 without an OOM signature: ServerDisconnectedError", evidence=[])
    [judged] = crash_from_server_logs(tmp_path, [crash], [log])
    assert judged.status == Status.INCONCLUSIVE   # no OOM line: still unknown, never a capacity verdict
    assert judged.reason.endswith("gb300-a01.log: ERROR 05-21 20:51:38 [core.py:489] RuntimeError: CUDA error: no "
                                  "kernel image is available for execution on the device")
    assert "evidence/serve/after-probes/gb300-a01.log" in judged.evidence


def node_container_memory(run_dir: Path, host: str, anon: list[int], *, cut_last: bool = False) -> None:
    """evidence/memory/cgroup/<host>.csv as the gpu_memory_sampler role fetches it (memory.stat anon, bytes)."""
    lines = [f"{dt.datetime.fromtimestamp(SOAK_START + 10 + i * 60, dt.UTC).strftime('%Y/%m/%d %H:%M:%S.000')}, {v}"
             for i, v in enumerate(anon)]
    folder = run_dir / "evidence" / "memory" / "cgroup"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{host}.csv").write_text("\n".join(lines) + ("" if cut_last else "\n"))


@pytest.mark.parametrize(("anon", "verdict"), [
    ([2_400_000_000] * 8, "release"),
    ([2_400_000_000 + i * 150_000_000 for i in range(8)], "expand_capacity"),
])
def test_the_servers_container_memory_read_on_its_node_decides_the_soak(tmp_path: Path, anon: list[int],
                                                                       verdict: str) -> None:
    """Issue 42 item 4: no local pid, no RSS in /metrics (several API servers), GPU memory flat: the container's
    anonymous memory sampled on the head node (cgroup v2 memory.stat anon) is the server's own memory; flat, the
    soak passes; rising (a host-memory leak in the container), it fails like rising GPU memory."""
    run_dir = samples.make_run("release", tmp_path)
    soak_without_process_memory(run_dir)
    for host in samples.NODES:
        node_memory_stream(run_dir, host, [150000] * 8)
    node_container_memory(run_dir, samples.NODES[0], anon)
    assert judge_after_probes(run_dir)["changed"] == ["capacity.soak"]
    report = build_report(run_dir, load_profile(KIMI))
    soak = next(f for f in report["findings"] if f["check"] == "capacity.soak")
    assert report["verdict"] == verdict, report["verdict_reasons"]
    assert f"evidence/memory/cgroup/{samples.NODES[0]}.csv" in soak["evidence"]
    assert list(soak["observed"]["container_memory_growth_pct"]) == [f"cgroup:{samples.NODES[0]}"]
    if verdict == "expand_capacity":
        assert soak["reason"].startswith("container memory rises") and f"cgroup:{samples.NODES[0]}" in soak["reason"]


def test_a_container_memory_line_cut_by_the_kill_is_dropped_never_read_smaller() -> None:
    from vllm_acceptance.parsers.gpu_memory import parse_container_memory_csv

    rows = parse_container_memory_csv("2026/12/06 21:43:45.425, 1000\n2026/12/06 21:43:45.637, 10\n"
                                      "garbage\n2026/12/06 21:43:45.849, 99", "n1")
    assert [r["bytes"] for r in rows] == [1000, 10] and {r["series"] for r in rows} == {"cgroup:n1"}
