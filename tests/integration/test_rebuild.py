"""playbooks/rebuild.yml and rollback.yml on real SSH hosts (network namespaces) that act as GPU nodes.

Each host's /usr/local/bin is a stateful fake node (tests/fixtures/rebuild/node.sh): its nvidia-smi,
docker, nv-fabricmanager... replay the recorded outputs of tests/fixtures/generated-nodes/<case> for the
driver installed in <bin>/.state/driver, which the fake package manager `pkg` changes on install.
The role installs through the stock ansible.builtin.package with a test backend (use: fake_pkg):
the stock apt/dnf modules would act on the controller's real package database (shared fs).

The incompatibility is confirmed the real way: playbooks/preflight.yml on three R575 nodes first;
its findings/preflight.json is the evidence every rebuild here starts from.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vllm_acceptance.lab.nshosts import Cluster, HostSpec
from vllm_acceptance.rebuild.remediation import load_capture

from support.hosts import REPO, ClusterFactory, ansible_bin, ansible_env, cluster_factory

pytestmark = pytest.mark.hosts

FIXTURES = REPO / "tests" / "fixtures" / "rebuild"
OLD, NEW = "575.57.08", "580.95.05"
HOSTS = ["node0", "node1", "node2"]
# The full roll and its rollback run on two of them: one node at a time shows as well on two as on three, and each
# node of a roll costs ~28 s of playbook on 2 cores (the entry preflight covers all three; a subset is allowed).
ROLL_HOSTS = HOSTS[:2]
PROFILE = str(REPO / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
RDMA_FALLBACK = str(REPO / "tests/fixtures/profiles/kimi-k3-8gpu-node-rdma-fallback.yml")

_spec = importlib.util.spec_from_file_location("fakenode", FIXTURES / "fakenode.py")
assert _spec and _spec.loader
fakenode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fakenode)


def _window(start_h: float = -1, end_h: float = 2) -> str:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    return f"{(now + dt.timedelta(hours=start_h)).strftime(fmt)}/{(now + dt.timedelta(hours=end_h)).strftime(fmt)}"


def make_cluster(factory: ClusterFactory, work: Path, *, driver: str = OLD,
                 after_upgrade_case: dict[str, str] | None = None,
                 host_vars: dict[str, dict[str, Any]] | None = None, reboot: bool = False,
                 faults: dict[str, list[str]] | None = None,
                 hosts: list[str] | None = None) -> tuple[Cluster, dict[str, Path], Path]:
    """reboot: the nodes' kernel module changes only when the driver_upgrade role reboots them (through
    the fake node's `reboot`, which changes the boot id ansible.builtin.reboot waits for)."""
    hosts = hosts or HOSTS
    bins = {h: fakenode.make_node(work / h / "bin", driver, after_upgrade_case=(after_upgrade_case or {}).get(h),
                                  reboot=reboot, faults=(faults or {}).get(h, []))
            for h in hosts}
    cluster = factory([HostSpec(h, bins[h]) for h in hosts], name="rebuild-hosts")
    reboot_vars = {
        "driver_upgrade_reboot": True,
        "driver_upgrade_reboot_command": fakenode.NODE_REBOOT_COMMAND,
        "driver_upgrade_boot_time_command": fakenode.NODE_BOOT_ID_COMMAND,
    } if reboot else {
        "driver_upgrade_reboot": False,  # the fake module changes at install
    }
    inventory = cluster.write_inventory(work / "inventory.yml", group="gpu_nodes", host_vars=host_vars, extra_vars={
        "preflight_driver_version_file": fakenode.NODE_PROC_FILE,
        "node_state_driver_version_file": fakenode.NODE_PROC_FILE,
        "node_state_boot_id_file": fakenode.NODE_BOOT_ID_FILE,
        "node_state_package_query": ["pkg", "list"],
        "driver_upgrade_package_use": "fake_pkg",
        "driver_upgrade_dkms_log_glob": fakenode.NODE_DKMS_LOG_GLOB,
        **reboot_vars,
        "scheduler_hook_kind": "slurm",
        "scheduler_hook_delegate_to": "{{ inventory_hostname }}",
        "rebuild_workload": {"name": "legacy-llm-regression", "argv": ["legacy-workload", "--steps", "200"]},
        "rebuild_smoke_skip_reason": "no vLLM server on namespace test hosts (smoke covered by the lab test)",
    })
    return cluster, bins, inventory


def run_playbook(playbook: str, inventory: Path, extra: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    env = ansible_env(ANSIBLE_LIBRARY=f"{REPO / 'plugins' / 'modules'}:{FIXTURES / 'modules'}")
    argv = [ansible_bin(), "-i", str(inventory), playbook, "-e", json.dumps(extra), *args]
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    print(f"{playbook} {' '.join(args)}: rc={proc.returncode} in {time.monotonic() - started:.1f}s")
    return proc


def calls(bin_dir: Path) -> list[tuple[int, str]]:
    lines = (bin_dir / ".state" / "calls.log").read_text().splitlines()
    return [(int(ts), rest) for ts, _, rest in (line.partition(" ") for line in lines)]


def changes(bin_dir: Path) -> list[str]:
    """Calls that change the node or its scheduling (queries are not changes)."""
    return [c for _, c in calls(bin_dir) if c.startswith(("pkg install", "scontrol", "kubectl", "legacy-workload"))]


def state(bin_dir: Path) -> tuple[str, str]:
    s = fakenode.state_of(bin_dir)
    return s["driver"], s["fabricmanager"]


def ledger(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "rebuild.json").read_text())


def out(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout[-6000:] + proc.stderr[-3000:]


# --- the evidence every rebuild starts from: a real preflight of three R575 nodes -----------------------


@pytest.fixture(scope="module")
def hosts_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    yield from cluster_factory(tmp_path_factory)


@pytest.fixture(scope="module")
def old_cluster(hosts_module: ClusterFactory, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three untouched R575 nodes, and the findings of a real preflight run on them."""
    work = tmp_path_factory.mktemp("rebuild-old")
    cluster, bins, inventory = make_cluster(hosts_module, work)
    run_dir = work / "preflight-run"
    run_dir.mkdir()
    proc = run_playbook("playbooks/preflight.yml", inventory, {
        "acceptance_run_dir": str(run_dir), "acceptance_profile_path": PROFILE})
    findings = run_dir / "findings" / "preflight.json"
    assert findings.is_file(), out(proc)
    failed = [f["host"] for f in json.loads(findings.read_text())
              if f["check"] == "compat.driver_branch" and f["status"] == "fail"]
    assert failed == HOSTS, failed
    for h in HOSTS:
        (bins[h] / ".state" / "calls.log").write_text("")
    return {"cluster": cluster, "bins": bins, "inventory": inventory, "findings": findings, "work": work}


def upgrade_vars(run_dir: Path, findings: Path, **over: Any) -> dict[str, Any]:
    data = {"rebuild_run_dir": str(run_dir), "acceptance_profile_path": PROFILE,
            "rebuild_preflight_findings": str(findings),
            "rebuild_maintenance_window": _window(), "driver_upgrade_version": NEW,
            "rebuild_rollback_plan": "playbooks/rollback.yml -e rollback_from_run=<this run>"}
    data.update(over)
    return {k: v for k, v in data.items() if v is not None}


# --- a full roll, then a rollback on the same nodes ------------------------------------------------------


@pytest.fixture(scope="module")
def rolled(hosts_module: ClusterFactory, old_cluster: dict[str, Any],
           tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rebuild-roll")
    cluster, bins, inventory = make_cluster(hosts_module, work, hosts=ROLL_HOSTS)
    run_dir = work / "upgrade"
    started = time.monotonic()
    proc = run_playbook("playbooks/rebuild.yml", inventory, upgrade_vars(run_dir, old_cluster["findings"]))
    return {"proc": proc, "bins": bins, "inventory": inventory, "run_dir": run_dir, "work": work,
            "seconds": time.monotonic() - started,
            "states": {h: state(bins[h]) for h in ROLL_HOSTS}, "calls": {h: calls(bins[h]) for h in ROLL_HOSTS}}


def test_roll_upgrades_every_node_one_at_a_time_in_order(rolled: dict[str, Any]) -> None:
    assert rolled["proc"].returncode == 0, out(rolled["proc"])
    assert rolled["states"] == {h: (NEW, NEW) for h in ROLL_HOSTS}  # driver and Fabric Manager, same version
    # One node at a time: every call on node N precedes every call on node N+1.
    # (The read-only capture of every node before any change runs in parallel; it only queries.)
    acts = {h: [t for t, c in rolled["calls"][h] if not c.startswith(("pkg query", "pkg list"))] for h in ROLL_HOSTS}
    spans = [(min(acts[h]), max(acts[h])) for h in ROLL_HOSTS]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    for h in ROLL_HOSTS:
        sequence = [c.split()[0] + " " + c.split()[1] for _, c in rolled["calls"][h]
                    if not c.startswith(("pkg query", "pkg list"))]
        assert sequence == ["scontrol update", "squeue --noheader", "pkg install", "legacy-workload --steps",
                            "scontrol update"], sequence
        drain, resume = [c for _, c in rolled["calls"][h] if c.startswith("scontrol")]
        assert f"nodename={h} state=drain" in drain and f"nodename={h} state=resume" in resume
    book = ledger(rolled["run_dir"])
    assert book["status"] == "completed" and book["failed"] is None and book["untouched"] == []
    assert [book["nodes"][h]["result"] for h in ROLL_HOSTS] == ["done"] * len(ROLL_HOSTS)
    steps = [s["step"] for s in book["nodes"]["node0"]["steps"]]
    assert steps == ["drain", "install", "preflight", "smoke", "workload", "done"]
    smoke = book["nodes"]["node0"]["steps"][3]
    assert smoke["status"] == "skipped" and "namespace test hosts" in smoke["detail"]["reason"]
    install = book["nodes"]["node1"]["steps"][1]
    assert install["status"] == "changed" and install["detail"]["from"] == OLD and install["detail"]["to"] == NEW


def test_roll_leaves_evidence_per_node(rolled: dict[str, Any]) -> None:
    run_dir: Path = rolled["run_dir"]
    from vllm_acceptance.rebuild.remediation import load_capture

    for h in ROLL_HOSTS:
        before = load_capture(run_dir / "evidence" / "rebuild" / h / "before")
        after = load_capture(run_dir / "evidence" / "rebuild" / h / "after")
        assert (before["driver_version"], after["driver_version"]) == (OLD, NEW)
        assert before["missing"] == [] and before["hostname"] == h
        assert before["containers"] and "legacy-llm" in before["containers"][0]
        assert any(p.startswith("nvidia-driver-575") for p in before["packages"])
        assert "nvidia" in before["modules"]
        findings = json.loads((run_dir / "nodes" / h / "preflight" / "findings" / "preflight.json").read_text())
        driver = next(f for f in findings if f["check"] == "compat.driver_branch" and f["host"] == h)
        assert driver["status"] == "pass" and driver["observed"]["version"] == NEW
    entry = json.loads((run_dir / "upgrade-entry.json").read_text())
    assert entry["decision"]["allowed"] is True
    assert entry["route"]["name"] == "driver_upgrade"


def test_rollback_restores_the_recorded_version(rolled: dict[str, Any]) -> None:
    assert rolled["proc"].returncode == 0, out(rolled["proc"])
    for h in ROLL_HOSTS:
        (rolled["bins"][h] / ".state" / "calls.log").write_text("")
    run_dir = rolled["work"] / "rollback"
    proc = run_playbook("playbooks/rollback.yml", rolled["inventory"], {
        "rebuild_run_dir": str(run_dir), "rollback_from_run": str(rolled["run_dir"]),
        "acceptance_profile_path": PROFILE, "rollback_scope": "all",
        "rebuild_maintenance_window": _window()})
    assert proc.returncode == 0, out(proc)
    assert {h: state(rolled["bins"][h]) for h in ROLL_HOSTS} == {h: (OLD, OLD) for h in ROLL_HOSTS}
    book = ledger(run_dir)
    assert book["kind"] == "rollback" and book["status"] == "completed"
    assert book["plan"]["targets"] == {h: OLD for h in ROLL_HOSTS}
    assert book["plan"]["scope"] == "all"
    assert all("not at its recorded state" in book["plan"]["why"][h] for h in ROLL_HOSTS)
    assert book["nodes"]["node0"]["restored"]["packages"] == [f"nvidia-driver-575-open={OLD}-0ubuntu1",
                                                              f"nvidia-fabricmanager-575={OLD}-1"]
    assert book["nodes"]["node0"]["verified"]["workload"]["status"] == "ok"
    for h in ROLL_HOSTS:
        assert [c for c in changes(rolled["bins"][h]) if c.startswith("pkg install")] == [
            f"pkg install nvidia-driver-575-open={OLD} nvidia-fabricmanager-575={OLD}"]


# --- a node that does not come back healthy stops the roll ----------------------------------------------


@pytest.mark.full
def test_failed_post_upgrade_check_stops_the_roll_on_that_node(
        ns_hosts: ClusterFactory, old_cluster: dict[str, Any], tmp_path: Path) -> None:
    # node1 loses a GPU after the upgrade (recorded seven-gpus outputs at R580).
    cluster, bins, inventory = make_cluster(ns_hosts, tmp_path, after_upgrade_case={"node1": "seven-gpus"})
    run_dir = tmp_path / "upgrade"
    proc = run_playbook("playbooks/rebuild.yml", inventory, upgrade_vars(run_dir, old_cluster["findings"]))
    assert proc.returncode != 0
    assert "stopped on node1 at step 'preflight'" in proc.stdout, out(proc)
    assert "compat.gpu_visibility fail" in proc.stdout
    book = ledger(run_dir)
    assert book["failed"]["host"] == "node1" and book["failed"]["step"] == "preflight"
    assert any("gpu_visibility" in p for p in book["failed"]["detail"]["problems"])
    assert book["untouched"] == ["node2"] and book["status"] == "stopped"
    assert book["nodes"]["node0"]["result"] == "done"
    # node0 upgraded and back; node1 upgraded, still drained, workload not run; node2 untouched.
    assert state(bins["node0"])[0] == NEW and any("state=resume" in c for c in changes(bins["node0"]))
    assert state(bins["node1"])[0] == NEW
    assert not any("state=resume" in c for c in changes(bins["node1"]))
    assert not any(c.startswith("legacy-workload") for c in changes(bins["node1"]))
    assert state(bins["node2"]) == (OLD, OLD) and calls(bins["node2"]) == [
        c for c in calls(bins["node2"]) if c[1].startswith(("pkg query", "pkg list"))]
    assert changes(bins["node2"]) == []


# --- --check and refusals change nothing ------------------------------------------------------------------


def test_check_mode_shows_the_plan_and_changes_nothing(old_cluster: dict[str, Any], tmp_path: Path) -> None:
    run_dir = tmp_path / "plan"
    proc = run_playbook("playbooks/rebuild.yml", old_cluster["inventory"],
                        upgrade_vars(run_dir, old_cluster["findings"]), "--check")
    assert proc.returncode == 0, out(proc)
    for h in HOSTS:
        assert f"upgrade {h}: driver {OLD} -> {NEW}" in proc.stdout
        assert state(old_cluster["bins"][h]) == (OLD, OLD)
        assert changes(old_cluster["bins"][h]) == []
    book = ledger(run_dir)
    assert book["status"].startswith("planned") and book["failed"] is None
    assert all(book["nodes"][h]["result"] == "planned" for h in HOSTS)
    install = book["nodes"]["node0"]["steps"][1]
    assert install["detail"]["would_change"] in (True, "True") and install["status"] == "skipped"


def _findings_without_driver_failure(src: Path, dest: Path) -> Path:
    data = json.loads(src.read_text())
    for f in data:
        if f["check"] == "compat.driver_branch":
            f["status"] = "pass"
    dest.write_text(json.dumps(data))
    return dest


@pytest.mark.parametrize(("case", "expected"), [
    ("no_window", "rebuild_maintenance_window is not set"),
    ("closed_window", "is outside"),
    ("no_rollback_plan", "rebuild_rollback_plan is empty"),
    ("no_incompatibility", "no host fails compat.driver_branch"),
    ("no_findings", "no preflight findings given"),
])
def test_unmet_entry_conditions_refuse_with_the_reason(
        old_cluster: dict[str, Any], tmp_path: Path, case: str, expected: str) -> None:
    run_dir = tmp_path / "refused"
    over: dict[str, Any] = {
        "no_window": {"rebuild_maintenance_window": None},
        "closed_window": {"rebuild_maintenance_window": _window(-5, -3)},
        "no_rollback_plan": {"rebuild_rollback_plan": None},
        "no_incompatibility": {"rebuild_preflight_findings": str(_findings_without_driver_failure(
            old_cluster["findings"], tmp_path / "passing.json"))},
        "no_findings": {"rebuild_preflight_findings": None},
    }[case]
    proc = run_playbook("playbooks/rebuild.yml", old_cluster["inventory"],
                        upgrade_vars(run_dir, old_cluster["findings"], **over))
    assert proc.returncode != 0
    assert "refused" in proc.stdout and expected in proc.stdout, out(proc)
    for h in HOSTS:
        assert state(old_cluster["bins"][h]) == (OLD, OLD) and changes(old_cluster["bins"][h]) == []
    entry = json.loads((run_dir / "upgrade-entry.json").read_text())
    assert entry["decision"]["allowed"] is False
    assert not (run_dir / "rebuild.json").exists()


# --- the model smoke test against a real vLLM (the lab server) ------------------------------------------


@pytest.mark.lab
def test_smoke_test_hits_the_real_model_and_a_failing_smoke_stops_the_roll(
        ns_hosts: ClusterFactory, old_cluster: dict[str, Any], lab_server: Any, tmp_path: Path) -> None:
    # The agent profile's smoke rule: a report_status tool call with JSON arguments (the tiny lab model
    # answers plain text prompts with EOS at once, which the rule rightly refuses as an empty answer).
    # rebuild_smoke_url set as docs/inventory.md says, the base URL; the tool call comes from the profile's
    # `agent` section (kimi-k3), so the request must go to the chat endpoint under it.
    url = lab_server.base_url
    smoke = {"node0": {"rebuild_smoke_url": url, "rebuild_smoke_model": lab_server.model},
             "node1": {"rebuild_smoke_url": url, "rebuild_smoke_model": "no-such-model"}}
    cluster, bins, inventory = make_cluster(ns_hosts, tmp_path, host_vars=smoke)
    run_dir = tmp_path / "upgrade"
    proc = run_playbook("playbooks/rebuild.yml", inventory, upgrade_vars(run_dir, old_cluster["findings"]))
    assert proc.returncode != 0 and "stopped on node1 at step 'smoke'" in proc.stdout, out(proc)
    book = ledger(run_dir)
    node0_smoke = next(s for s in book["nodes"]["node0"]["steps"] if s["step"] == "smoke")
    assert node0_smoke["status"] == "ok" and node0_smoke["detail"]["model"] == lab_server.model
    assert node0_smoke["detail"]["endpoint"] == url.rstrip("/") + "/chat/completions"
    assert node0_smoke["detail"]["tool_call"] in (True, "True")
    assert book["nodes"]["node0"]["result"] == "done" and state(bins["node0"]) == (NEW, NEW)
    assert book["failed"]["host"] == "node1" and book["failed"]["step"] == "smoke"
    assert book["untouched"] == ["node2"] and changes(bins["node2"]) == []


def test_smoke_url_that_cannot_take_the_request_is_refused_before_anything_runs(
        old_cluster: dict[str, Any], tmp_path: Path) -> None:
    run_dir = tmp_path / "refused-smoke"
    proc = run_playbook("playbooks/rebuild.yml", old_cluster["inventory"],
                        {**upgrade_vars(run_dir, old_cluster["findings"]),
                         "rebuild_smoke_url": "http://127.0.0.1:8011/v1/models"})
    assert proc.returncode != 0
    assert "rebuild_smoke_url of node0" in proc.stdout and "names the /models endpoint" in proc.stdout, out(proc)
    assert not run_dir.exists()
    for h in HOSTS:
        assert state(old_cluster["bins"][h]) == (OLD, OLD) and changes(old_cluster["bins"][h]) == []


# --- a broken node: failed install, old module after reboot, GPUs or peer memory gone, foreign evidence -----
# Reboot mode: the kernel module loads only at the role's reboot (the fake node's `reboot`), as on a real node.

PAIR = ["node0", "node1"]
REBOOT_MODE_FAULTS = {"failed_install": {"node1": ["dkms_fails"]}, "old_module": {"node0": ["stale_initramfs"]},
                      "gpus_lost": {"node0": ["gpus_lost"]}, "peermem_lost": {"node0": ["peermem_lost"]}}


def _broken_roll(factory: ClusterFactory, old_cluster: dict[str, Any], work: Path, case: str,
                 hosts: list[str] | None = None, profile: str | None = None) -> dict[str, Any]:
    """hosts: a two-node cluster where the roll stops on node0 (multi-node, one untouched node; cheaper). profile:
    another acceptance profile than PROFILE, whose own preflight on this cluster is the acceptance the roll starts
    from (else the old cluster's)."""
    cluster, bins, inventory = make_cluster(factory, work, reboot=True, faults=REBOOT_MODE_FAULTS[case], hosts=hosts)
    boot = {h: fakenode.state_of(bins[h])["boot_id"] for h in bins}
    findings = old_cluster["findings"]
    if profile is not None:
        before = work / "preflight-before"
        proc = run_playbook("playbooks/preflight.yml", inventory, {"acceptance_run_dir": str(before),
                                                                   "acceptance_profile_path": profile})
        findings = before / "findings" / "preflight.json"
        assert findings.is_file(), out(proc)
        for h in bins:
            (bins[h] / ".state" / "calls.log").write_text("")
    run_dir = work / "upgrade"
    proc = run_playbook("playbooks/rebuild.yml", inventory, upgrade_vars(
        run_dir, findings, **({"acceptance_profile_path": profile} if profile else {})))
    return {"proc": proc, "bins": bins, "inventory": inventory, "run_dir": run_dir, "work": work, "boot": boot}


def _rollback(roll: dict[str, Any], **extra: Any) -> tuple[subprocess.CompletedProcess[str], Path]:
    run_dir = roll["work"] / "rollback"
    proc = run_playbook("playbooks/rollback.yml", roll["inventory"], {
        "rebuild_run_dir": str(run_dir), "rollback_from_run": str(roll["run_dir"]),
        "acceptance_profile_path": PROFILE, "rebuild_maintenance_window": _window(), **extra})
    return proc, run_dir


def _entry_status(roll: dict[str, Any], check: str, host: str) -> str:
    """The check's status in the preflight every roll here starts from."""
    upgrade_entry = json.loads((roll["run_dir"] / "upgrade-entry.json").read_text())
    findings = json.loads(Path(upgrade_entry["preflight_findings"]).read_text())
    return next(f["status"] for f in findings if f["check"] == check and f["host"] == host)


def _module(bin_dir: Path) -> tuple[str, str]:
    """(user-space driver, loaded kernel module) of a fake node."""
    s = fakenode.state_of(bin_dir)
    return s["driver"], s["module_loaded"]


@pytest.fixture(scope="module")
def failed_install(hosts_module: ClusterFactory, old_cluster: dict[str, Any],
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """node0 upgrades and reboots; node1's DKMS build fails in the package's post-install script."""
    roll = _broken_roll(hosts_module, old_cluster, tmp_path_factory.mktemp("rebuild-dkms"), "failed_install")
    roll["after_upgrade"] = {h: _module(roll["bins"][h]) for h in HOSTS}
    roll["rollback"] = _rollback(roll)
    return roll


@pytest.mark.full
def test_failed_install_keeps_its_cause_and_stops_the_roll(failed_install: dict[str, Any]) -> None:
    proc = failed_install["proc"]
    assert proc.returncode != 0 and "stopped on node1 at step 'install'" in proc.stdout, out(proc)
    # node0 rebooted into R580; node1 is half-installed: new user space over the old module.
    assert failed_install["after_upgrade"] == {"node0": (NEW, NEW), "node1": (NEW, OLD), "node2": (OLD, OLD)}
    book = ledger(failed_install["run_dir"])
    assert book["failed"]["host"] == "node1" and book["failed"]["step"] == "install"
    assert book["untouched"] == ["node2"]
    assert book["nodes"]["node0"]["installed"]["rebooted"] in (True, "True")
    cause = book["failed"]["detail"]["install_failure"]
    assert any("post-installation script subprocess returned error exit status 10" in line
               for line in cause["stderr_tail"]), cause
    assert any("unrecognized command-line option" in line for line in cause["dkms_log_tail"]), cause
    assert "make.log" in book["failed"]["detail"]["msg"]


@pytest.mark.full
def test_rollback_of_a_broken_node_restores_only_the_failed_node(failed_install: dict[str, Any]) -> None:
    proc, run_dir = failed_install["rollback"]
    assert proc.returncode == 0, out(proc)
    bins = failed_install["bins"]
    # Default scope `failed`: node1 back on R575 (packages and module, after a reboot); node0 keeps its
    # healthy upgrade; node2 was never changed.
    assert {h: _module(bins[h]) for h in HOSTS} == {"node0": (NEW, NEW), "node1": (OLD, OLD), "node2": (OLD, OLD)}
    assert state(bins["node1"]) == (OLD, OLD)
    assert fakenode.state_of(bins["node1"])["boot_id"] != failed_install["boot"]["node1"]
    entry = json.loads((run_dir / "rollback-entry.json").read_text())
    tool = entry["captures"]["node1"]["gpu_tool"]
    assert tool["rc"] == 18 and "Failed to initialize NVML: Driver/library version mismatch" in tool["output"]
    assert entry["decision"]["allowed"] is True
    book = ledger(run_dir)
    assert book["hosts"] == ["node1"] and book["status"] == "completed"
    assert book["plan"]["not_in_scope"] == ["node0", "node2"]
    assert "stopped on it at step 'install'" in book["plan"]["why"]["node1"]
    node = book["nodes"]["node1"]
    assert node["restored"]["packages"] == [f"nvidia-driver-575-open={OLD}-0ubuntu1",
                                            f"nvidia-fabricmanager-575={OLD}-1"]
    assert node["restored"]["rebooted"] in (True, "True") and node["restored"]["gpu_tool_before"]["rc"] == 18
    checks = node["verified"]["preflight"]["checks"]
    assert {checks[c] for c in ("compat.driver_module", "compat.fabric_manager", "compat.peermem",
                                "compat.topology (cluster)", "compat.image_uniform (cluster)")} == {"pass"}
    # Back on R575 the cu130 image is refused again: the in-container GPU check is as before the upgrade.
    assert checks["compat.gpu_visibility"] == _entry_status(failed_install, "compat.gpu_visibility", "node1")
    assert load_capture(run_dir / "evidence" / "rebuild" / "node1" / "after")["gpu_count"] == 8
    assert node["verified"]["workload"]["status"] == "ok"


@pytest.mark.full
def test_old_module_after_reboot_stops_the_roll(hosts_module: ClusterFactory, old_cluster: dict[str, Any],
                                                 tmp_path: Path) -> None:
    roll = _broken_roll(hosts_module, old_cluster, tmp_path, "old_module", hosts=PAIR)
    proc = roll["proc"]
    assert proc.returncode != 0 and "stopped on node0 at step 'preflight'" in proc.stdout, out(proc)
    # Rebooted (a new boot id), but the stale initramfs loaded the R575 module under R580 user space.
    assert _module(roll["bins"]["node0"]) == (NEW, OLD)
    assert fakenode.state_of(roll["bins"]["node0"])["boot_id"] != roll["boot"]["node0"]
    problems = ledger(roll["run_dir"])["failed"]["detail"]["problems"]
    assert any(f"expected {NEW} on every source" in p for p in problems), problems
    assert ledger(roll["run_dir"])["untouched"] == ["node1"]
    assert not any("state=resume" in c for c in changes(roll["bins"]["node0"]))


@pytest.mark.full
def test_gpus_missing_after_upgrade_then_rollback_accepts_the_failing_gpu_tool(
        hosts_module: ClusterFactory, old_cluster: dict[str, Any], tmp_path: Path) -> None:
    roll = _broken_roll(hosts_module, old_cluster, tmp_path, "gpus_lost", hosts=PAIR)
    assert roll["proc"].returncode != 0, out(roll["proc"])
    assert "stopped on node0 at step 'preflight'" in roll["proc"].stdout, out(roll["proc"])
    problems = ledger(roll["run_dir"])["failed"]["detail"]["problems"]
    assert any(p.startswith("compat.gpu_visibility") for p in problems), problems
    proc, run_dir = _rollback(roll)
    assert proc.returncode == 0, out(proc)
    entry = json.loads((run_dir / "rollback-entry.json").read_text())
    tool = entry["captures"]["node0"]["gpu_tool"]
    assert tool["rc"] == 6 and tool["output"].strip() == "No devices were found"
    assert "nvidia-smi exit 6 (kept as the broken state)" in json.dumps(entry["decision"]["conditions"])
    assert _module(roll["bins"]["node0"]) == (OLD, OLD)
    book = ledger(run_dir)
    assert book["hosts"] == ["node0"] and book["status"] == "completed"
    after = load_capture(run_dir / "evidence" / "rebuild" / "node0" / "after")
    assert after["gpu_count"] == 8 and after["gpu_tool"]["rc"] == 0 and after["mixed"] is False
    assert book["nodes"]["node0"]["verified"]["preflight"]["status"] == "ok"


def test_lost_peer_memory_module_stops_the_roll_in_cluster_context(
        hosts_module: ClusterFactory, old_cluster: dict[str, Any], tmp_path: Path) -> None:
    # nvidia_peermem matters on the recipe's DMA-BUF fallback over RDMA only (compat.peermem, issue 41): this
    # cluster's acceptance launches that path (its own preflight before the roll judged the module loaded), so
    # losing the module after the upgrade is a regression that stops the roll
    roll = _broken_roll(hosts_module, old_cluster, tmp_path, "peermem_lost", hosts=PAIR, profile=RDMA_FALLBACK)
    proc = roll["proc"]
    assert proc.returncode != 0 and "stopped on node0 at step 'preflight'" in proc.stdout, out(proc)
    problems = ledger(roll["run_dir"])["failed"]["detail"]["problems"]
    assert any(p.startswith("compat.peermem fail") for p in problems), problems
    assert any(p.startswith("compat.peermem passed before the change and is fail after it") for p in problems)
    assert _module(roll["bins"]["node0"]) == (NEW, NEW)
    assert not any("state=resume" in c for c in changes(roll["bins"]["node0"]))


def test_foreign_evidence_is_refused_by_node_name(hosts_module: ClusterFactory, old_cluster: dict[str, Any],
                                                  tmp_path: Path) -> None:
    # The preflight proved the incompatibility on node0..node2; this inventory also changes node7.
    cluster, bins, inventory = make_cluster(hosts_module, tmp_path, hosts=["node0", "node7"])
    run_dir = tmp_path / "refused"
    proc = run_playbook("playbooks/rebuild.yml", inventory, upgrade_vars(run_dir, old_cluster["findings"]))
    assert proc.returncode != 0
    assert "refused" in proc.stdout, out(proc)
    assert "node7: no compat.driver_branch failure of its own" in proc.stdout, out(proc)
    bound = json.loads((run_dir / "upgrade-entry.json").read_text())["decision"]["conditions"][1]
    assert bound["key"] == "evidence_bound" and bound["met"] is False and "node0:" not in bound["detail"]
    assert all(changes(bins[h]) == [] and state(bins[h]) == (OLD, OLD) for h in bins)
