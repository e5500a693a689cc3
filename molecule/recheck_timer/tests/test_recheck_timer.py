"""Testinfra verifier of the recheck_timer scenario: what the role installed on each namespace host, and one run of
the installed command by hand with the stand-in re-check (files/recheck_standin.py; named as a stand-in: the real
re-check needs a served deployment). Every path sits under /tmp/vllm-acceptance-molecule-recheck/<host>.

`host` is a live ssh connection to each host of the scenario (recheck-systemd, recheck-cron); no systemd runs there.
"""

from __future__ import annotations

import re

import pytest

ROOT = "/tmp/vllm-acceptance-molecule-recheck"
NAME = "vllm-acceptance-recheck-lab"
SECRET = "sk-molecule-PLANTED-secret"


def _root(host) -> str:
    return f"{ROOT}/{host.backend.get_hostname()}"


def _mode(host) -> str:
    return "systemd" if host.backend.get_hostname().endswith("systemd") else "cron"


def _paths(host) -> dict[str, str]:
    root = _root(host)
    return {"service": f"{root}/etc/systemd/system/{NAME}.service", "timer": f"{root}/etc/systemd/system/{NAME}.timer",
            "cron": f"{root}/etc/cron.d/{NAME}", "env": f"{root}/etc/vllm-acceptance/recheck-lab.env",
            "wrapper": f"{root}/usr/local/lib/vllm-acceptance/{NAME}",
            "results": f"{root}/var/lib/vllm-acceptance/recheck/lab",
            "prom": f"{root}/var/lib/prometheus/node-exporter/{NAME}.prom"}


def _unit(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_the_environment_file_holds_the_secret_and_only_root_reads_it(host) -> None:
    env = host.file(_paths(host)["env"])
    assert env.mode == 0o600 and env.user == "root"
    assert f"VLLM_API_KEY='{SECRET}'" in env.content_string


def test_no_secret_in_the_units_the_cron_file_or_the_wrapper(host) -> None:
    p = _paths(host)
    for key in ("service", "timer", "cron", "wrapper"):
        f = host.file(p[key])
        if f.exists:
            assert SECRET not in f.content_string, key


def test_systemd_mode_installs_a_oneshot_service_and_its_timer(host) -> None:
    if _mode(host) != "systemd":
        pytest.skip("the cron host")
    p = _paths(host)
    service, timer = _unit(host.file(p["service"]).content_string), _unit(host.file(p["timer"]).content_string)
    assert service["Type"] == "oneshot" and service["ExecStart"] == p["wrapper"]
    assert service["EnvironmentFile"] == p["env"] and service["WorkingDirectory"] == f"{_root(host)}/project"
    assert timer["OnCalendar"] == "daily" and timer["Persistent"] == "true" and timer["Unit"] == f"{NAME}.service"
    assert timer["WantedBy"] == "timers.target"
    assert not host.file(p["cron"]).exists


def test_systemd_analyze_verify_accepts_the_units(host) -> None:
    if _mode(host) != "systemd":
        pytest.skip("the cron host")
    if not host.exists("systemd-analyze"):
        pytest.skip("systemd-analyze not installed on the host")
    p = _paths(host)
    run = host.run(f"systemd-analyze verify {p['service']} {p['timer']}")
    assert run.rc == 0, run.stdout + run.stderr
    # and it refuses a broken one: the check can fail
    bad = host.run(f"d=$(mktemp -d) && sed 's|^ExecStart=/|ExecStart=|' {p['service']} > $d/{NAME}.service && "
                   f"systemd-analyze verify $d/{NAME}.service; rc=$?; rm -rf $d; exit $rc")
    assert bad.rc != 0


def test_cron_mode_installs_one_entry_and_no_units(host) -> None:
    if _mode(host) != "cron":
        pytest.skip("the systemd host")
    p = _paths(host)
    lines = [line for line in host.file(p["cron"]).content_string.splitlines() if line and not line.startswith("#")]
    assert lines == ["SHELL=/bin/bash", f"0 0 * * * root {p['wrapper']} {p['env']}"]
    assert not host.file(p["service"]).exists and not host.file(p["timer"]).exists


def _run_as_installed(host) -> object:
    """The command the scheduler runs: systemd's ExecStart with its EnvironmentFile, or cron's line."""
    p = _paths(host)
    if _mode(host) == "systemd":
        service = _unit(host.file(p["service"]).content_string)
        return host.run(f"cd {service['WorkingDirectory']} && set -a && . {service['EnvironmentFile']} && set +a "
                        f"&& {service['ExecStart']}")
    line = host.file(p["cron"]).content_string.strip().splitlines()[-1]
    return host.run(" ".join(line.split()[6:]))     # after the five fields and the user


def test_one_run_by_hand_keeps_its_result_and_writes_the_metrics_file(host) -> None:
    p = _paths(host)
    before = set(host.run(f"ls {p['results']}").stdout.split())
    run = _run_as_installed(host)
    assert run.rc == 50, run.stdout + run.stderr      # the stand-in's verdict: drifted
    new = sorted(set(host.run(f"ls {p['results']}").stdout.split()) - before - {"latest"})
    assert len(new) == 1 and re.fullmatch(r"\d{8}T\d{6}Z-\d+", new[0])
    run_dir = f"{p['results']}/{new[0]}"
    assert host.file(f"{run_dir}/exit_code").content_string.strip() == "50"
    stdout = host.file(f"{run_dir}/stdout.log").content_string
    assert "stand-in re-check of 20261207T010203Z-signed: drifted" in stdout
    assert "secret from the environment file reached the re-check: yes" in stdout
    assert host.file(f"{p['results']}/latest").linked_to == run_dir
    # the re-check wrote its own directory in the checkout
    assert host.run(f"ls {_root(host)}/project/reports/lab/rechecks").stdout.split()
    prom = host.file(p["prom"]).content_string
    base = 'inventory="lab",baseline="20261207T010203Z-signed"'
    assert f'vllm_acceptance_recheck_verdict{{{base},verdict="drifted"}} 1' in prom
    assert f'vllm_acceptance_recheck_verdict{{{base},verdict="still_accepted"}} 0' in prom
    assert f"vllm_acceptance_recheck_exit_code{{{base}}} 50" in prom
    assert f"vllm_acceptance_recheck_period_seconds{{{base}}} 86400" in prom
    assert SECRET not in prom and SECRET not in stdout


def test_the_oldest_runs_are_removed_beyond_the_retention_count(host) -> None:
    p = _paths(host)
    for _ in range(3):
        assert _run_as_installed(host).rc == 50
    kept = [n for n in host.run(f"ls {p['results']}").stdout.split() if n != "latest"]
    assert len(kept) == 2       # recheck_timer_keep: 2
    assert host.file(f"{p['results']}/latest").linked_to == f"{p['results']}/{max(kept)}"
