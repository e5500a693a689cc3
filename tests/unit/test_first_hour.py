"""Issue 30 item 9: the small things a new user meets first (--version, validate, report's exit code, the printed
sign command, report.md that reads as Markdown, the contract row's wording). No lab."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import shlex
import shutil
from importlib.metadata import version
from pathlib import Path

import pytest

from vllm_acceptance import __version__, cli
from vllm_acceptance.api import EXIT_CODES
from vllm_acceptance.report import views
from vllm_acceptance.report.render_md import cell, render_markdown
from vllm_acceptance.report.write import write_reports

from support.examples import fill_placeholders

REPO = Path(__file__).resolve().parents[2]
SAMPLES_PATH = REPO / "tests" / "fixtures" / "reports" / "samples.py"
_spec = importlib.util.spec_from_file_location("report_samples_first_hour", SAMPLES_PATH)
assert _spec and _spec.loader
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)


def test_version_names_the_package_and_ansible_core(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"vllm-acceptance {__version__}"
    assert lines[1] == f"ansible-core {version('ansible-core')}"


def test_validate_takes_what_the_inventory_takes_and_reads_its_vars(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "--profile", "kimi-k3", "--project", str(REPO)]) == 0      # a name, as inventories
    assert json.loads(capsys.readouterr().out)["profile_path"] == str(REPO / "profiles" / "kimi-k3.yml")
    assert cli.main(["validate", "--profile", str(REPO / "profiles" / "cpu-lab.yml")]) == 0  # or a path
    capsys.readouterr()
    # the example as shipped holds placeholders: refused, naming each and the fix (gate.py, issue 43)
    assert cli.main(["validate", "-i", str(REPO / "inventories" / "example-gb300"), "--project", str(REPO)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "field `vllm_image_digest` (group_vars) is the example's placeholder" in err
    assert "field `vllm_serve_multinode_env`: the launch across 2 nodes needs GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME" \
        in err
    site = tmp_path / "copy"
    shutil.copytree(REPO / "inventories" / "example-gb300", site)
    fill_placeholders(site / "group_vars" / "all.yml")
    assert cli.main(["validate", "-i", str(site), "--project", str(REPO)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "kimi-k3" and out["variables_checked"] >= 5    # acceptance_profile came from group_vars
    # a wrong inventory variable is refused, naming the field (exit 2), as accept.yml's validate stage refuses it
    bad = tmp_path / "site"
    (bad / "group_vars").mkdir(parents=True)
    (bad / "hosts.yml").write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        gpu-01: {}\n")
    (bad / "group_vars" / "all.yml").write_text("acceptance_profile: kimi-k3\nvllm_serve_mode: attach\n"
                                                "acceptance_probes: [cache, warp]\n")
    assert cli.main(["validate", "-i", str(bad), "--project", str(REPO)]) == 2
    assert "acceptance_probes" in capsys.readouterr().err
    assert cli.main(["validate", "--profile", "kimi-k9", "--project", str(REPO)]) == 2
    err = capsys.readouterr().err
    assert "--profile" in err and "kimi-k3" in err                          # names the field and what exists


@pytest.mark.parametrize("kind", ["limited", "incomplete"])
def test_report_exits_by_verdict_as_run_does(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = samples.make_run(kind, tmp_path / "reports")
    code = cli.main(["report", "--run-dir", str(run_dir), "--profile", str(samples.profile_for(kind, tmp_path))])
    verdict = json.loads((run_dir / "report.json").read_text())["verdict"]
    assert f"verdict: {verdict}" in capsys.readouterr().out
    assert code == EXIT_CODES[verdict] and code != 0


def test_the_printed_sign_command_is_one_sign_accepts_with_a_reviewer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, report = samples.build("limited", tmp_path / "reports")
    write_reports(run_dir, report)
    shown = re.search(r'<code id="sign-command">(.*?)</code>', (run_dir / "report.html").read_text())
    assert shown, "the unsigned report prints no sign command"
    command = html.unescape(shown.group(1))
    assert f"`{command}`" in (run_dir / "report.md").read_text()          # the same command in report.md
    argv = shlex.split(command)
    assert argv[0] == "vllm-acceptance"
    monkeypatch.chdir(tmp_path)                                             # the directory holding reports/
    # pasted as printed, the placeholder is refused with what to give; so are no reviewer and the operator
    assert cli.main(argv[1:]) == 2
    assert "SRE or platform lead" in capsys.readouterr().err
    with pytest.raises(SystemExit):                                         # argparse: --reviewer is required
        cli.main(["sign", str(run_dir), "--decision", "limited_observation"])
    assert "--reviewer" in capsys.readouterr().err
    engineer = json.loads((run_dir / "run.json").read_text())["owner"]
    assert cli.main(["sign", str(run_dir), "--reviewer", engineer, "--decision", "limited_observation",
                     "--deployment-engineer", engineer]) == 2
    assert "another person" in capsys.readouterr().err and not (run_dir / "signoff.json").exists()
    assert argv[argv.index("--decision") + 1] == "limited_observation"    # the verdict's own decision
    filled = ["L. Chen (SRE)" if a == "NAME" else a for a in argv[1:]]
    assert cli.main(filled) == 0, capsys.readouterr().err
    assert json.loads((run_dir / "signoff.json").read_text())["reviewer"] == "L. Chen (SRE)"


def test_markdown_is_not_html_escaped_and_checklist_lines_name_their_source(tmp_path: Path) -> None:
    assert cell("p99 >= 2 s, <= 5 s") == "p99 >= 2 s, <= 5 s"
    assert cell("<script>x</script>") == "\\<script>x\\</script>"          # no raw tag reaches a Markdown viewer
    run_dir, report = samples.build("limited", tmp_path / "reports")
    md = render_markdown(report)
    assert "&gt;" not in md and "&lt;" not in md
    assert not re.search(r"\| 00[0-4]#\d+ \|", md)
    assert re.search(r"\| source 000, item \d+ \|", md) and "docs/sources.md#a000" in md


def test_the_long_prompt_row_says_what_was_sent_and_why_it_counts() -> None:
    report = {"contract": {"context_tokens": 1984},
              "findings": [{"check": "capacity.long_prompt", "status": "pass", "observed": {"prompt_tokens": 1983}}]}
    row = next(r for r in views.contract_rows(report) if r["item"] == "context (one long prompt)")
    assert row["ok"] is True and row["profile"] == "1984 tokens" and row["tested"] == "1983 prompt tokens sent"
    assert "1983 of 1984" in row["why"] and "85 %" in row["why"]
    short = {**report, "findings": [{"check": "capacity.long_prompt", "observed": {"prompt_tokens": 900}}]}
    row = next(r for r in views.contract_rows(short) if r["item"] == "context (one long prompt)")
    assert row["ok"] is False and row["note"] == "the long prompt stayed below the contracted context"


FREE_FORM = {"raw", "command", "shell", "script", "meta", "include_tasks", "import_tasks", "include_role",
             "import_role", "import_playbook", "include_vars"}
TASK_KEYWORDS = {"name", "when", "register", "loop", "loop_control", "vars", "tags", "block", "rescue", "always",
                 "delegate_to", "run_once", "become", "changed_when", "failed_when", "until", "retries", "delay",
                 "no_log", "ignore_errors", "environment", "notify", "check_mode", "diff", "async", "poll", "args",
                 "with_items", "with_dict", "throttle", "timeout", "listen", "module_defaults", "any_errors_fatal",
                 "ignore_unreachable", "delegate_facts", "become_user", "connection", "local_action"}


def _tasks(node: object):
    """Every task (or play) of a task list or playbook: the items of lists, and the lists they nest."""
    for item in node if isinstance(node, list) else []:
        if isinstance(item, dict):
            yield item
            for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
                yield from _tasks(item.get(key))


def test_no_task_passes_its_arguments_as_one_template() -> None:
    """ansible-core warns "Using a template for task args is unsafe" for `module: "{{ dict }}"` (it was printed at
    playbooks/tasks/probe.yml): every task of the project names its arguments."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
    offenders = []
    files = [*REPO.glob("*.yml"), *REPO.glob("playbooks/**/*.yml"), *REPO.glob("roles/*/tasks/*.yml"),
             *REPO.glob("roles/*/handlers/*.yml")]
    for path in files:
        for task in _tasks(yaml.load(path.read_text(), Loader=Loader)):  # noqa: S506
            for key, value in task.items():
                module = key.rsplit(".", 1)[-1]
                if key in TASK_KEYWORDS - {"args"} or module in FREE_FORM or not isinstance(value, str):
                    continue
                if value.strip().startswith("{{") and value.strip().endswith("}}"):
                    offenders.append(f"{path.relative_to(REPO)}: {task.get('name')} ({key})")
    assert not offenders, offenders
