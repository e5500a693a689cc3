"""playbooks/recheck_timer.yml's input checks (roles/recheck_timer/meta/argument_specs.yml and its assert): the real
ansible-playbook on localhost in check mode; a wrong input stops the play naming the field, a right one writes
nothing in check mode. The molecule scenario molecule/recheck_timer installs it for real on namespace hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _play(tmp_path: Path, extra: dict) -> tuple[int, str]:
    root = tmp_path / "root"
    paths = {f"recheck_timer_{k}_dir": str(root / k) for k in ("results", "textfile", "env", "wrapper", "unit",
                                                                 "cron")}
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    variables = {"recheck_timer_start": False, **paths, **extra}
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("recheck:\n  hosts:\n    localhost:\n")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "-c", "local",
                           "--check", "-e", f"ansible_python_interpreter={sys.executable}", "-e",
                           json.dumps(variables), str(REPO / "playbooks" / "recheck_timer.yml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


GOOD = {"recheck_timer_baseline": "20261207T010203Z-signed", "recheck_timer_inventory": "inventories/lab"}


@pytest.mark.parametrize(("extra", "expected"), [
    ({"recheck_timer_inventory": "inventories/lab"}, "recheck_timer_baseline"),
    ({**GOOD, "recheck_scheduler": "anacron"}, "recheck_timer_scheduler"),
    ({**GOOD, "recheck_timer_on_calendar": "*-*-* 03:30:00"}, "recheck_timer_period_s must be the schedule's period"),
    ({**GOOD, "recheck_scheduler": "cron", "recheck_timer_cron_schedule": "30 3 *"},
     "recheck_timer_cron_schedule must be the five cron fields"),
    ({**GOOD, "recheck_timer_environment": {"VLLM_API_KEY": "it's"}}, "may hold a single quote"),
])
def test_a_wrong_input_stops_the_play_naming_the_field(tmp_path: Path, extra: dict, expected: str) -> None:
    code, out = _play(tmp_path, extra)
    assert code != 0 and expected in out, out[-3000:]
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize("scheduler", ["systemd", "cron"])
def test_check_mode_with_right_inputs_writes_nothing(tmp_path: Path, scheduler: str) -> None:
    code, out = _play(tmp_path, {**GOOD, "recheck_scheduler": scheduler,
                                 "recheck_timer_environment": {"VLLM_API_KEY": "sk-PLANTED"}})
    assert code == 0, out[-3000:]
    assert not (tmp_path / "root").exists()
    assert "sk-PLANTED" not in out      # the environment file's task is no_log
