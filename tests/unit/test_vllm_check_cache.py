"""The kept answers of vLLM's argument checks (serve/vllm_check.py, VLLM_ACCEPTANCE_ARGCHECK_CACHE): the same
question to the same installation is answered once; another installation, another command or an answer that could
not judge is asked again; unset, every check runs.

The judging interpreter here is a small generated stand-in (it counts its runs and answers as vllm_argcheck.py
does); the last test asks the lab's real vLLM.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from conftest import LAB_PYTHON, _skip_or_fail

from vllm_acceptance.serve import vllm_check

ANSWER = ('{"vllm_version": "0.0-generated", "platform": "cpu", "deployments": {"launch": [{"host": "head", '
          '"role": "head", "accepted": %s, "stage": "parser", "message": "said by the stand-in", '
          '"mode": "api_server"}]}}')
NODES = {"launch": [{"host": "head", "role": "head", "entry": "serve", "serve_args": ["m", "--port", "8000"],
                     "env": {}}]}
TARGET = {"device": "cpu", "same_build": False, "on_node": False, "runtime": "docker"}


def _interpreter(tmp_path: Path, accepted: str = "true", error: bool = False) -> Path:
    """An interpreter that reads its installation with the real Python and answers the check itself, counting."""
    count = tmp_path / "runs"
    answer = '{"error": "vllm could not be imported"}' if error else ANSWER % accepted
    script = tmp_path / "python"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi
cat >/dev/null
echo run >> {count}
echo '{vllm_argcheck_mark()} {answer}'
""")
    script.chmod(0o755)
    return script


def vllm_argcheck_mark() -> str:
    from vllm_acceptance.serve.vllm_argcheck import MARK

    return MARK


def _runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "kept"
    monkeypatch.setenv(vllm_check.CACHE_VARIABLE, str(folder))
    return folder


def test_the_same_question_to_the_same_installation_is_answered_once(tmp_path: Path, kept: Path) -> None:
    python = str(_interpreter(tmp_path, accepted="false"))
    first = vllm_check.run(NODES, python, TARGET)
    second = vllm_check.run(NODES, python, TARGET)
    assert _runs(tmp_path) == 1 and not first.reused and second.reused
    assert [(n.accepted, n.message) for n in second.nodes()] == [(False, "said by the stand-in")]
    assert second.vllm_version == first.vllm_version == "0.0-generated"
    assert "the answer kept from the same question earlier" in vllm_check.summary(second, "")[0]


def test_another_command_or_environment_is_asked_again(tmp_path: Path, kept: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    python = str(_interpreter(tmp_path))
    vllm_check.run(NODES, python, TARGET)
    other = {"launch": [{**NODES["launch"][0], "serve_args": ["m", "--port", "8001"]}]}
    assert not vllm_check.run(other, python, TARGET).reused
    monkeypatch.setenv("VLLM_USE_RUST_FRONTEND", "1")
    assert not vllm_check.run(NODES, python, TARGET).reused
    assert _runs(tmp_path) == 3


def test_a_changed_installation_is_asked_again(tmp_path: Path, kept: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package installed, upgraded or removed changes a directory of the import path."""
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(site))
    python = str(_interpreter(tmp_path))
    vllm_check.run(NODES, python, TARGET)
    (site / "vllm-0.33.0.dist-info").mkdir()
    os.utime(site, ns=(os.stat(site).st_atime_ns, os.stat(site).st_mtime_ns + 1_000_000_000))
    assert not vllm_check.run(NODES, python, TARGET).reused
    assert vllm_check.run(NODES, python, TARGET).reused
    assert _runs(tmp_path) == 2


def test_an_answer_that_could_not_judge_is_never_kept(tmp_path: Path, kept: Path) -> None:
    python = str(_interpreter(tmp_path, error=True))
    for _ in range(2):
        check = vllm_check.run(NODES, python, TARGET)
        assert not check.ran and not check.reused
    assert _runs(tmp_path) == 2 and not any(kept.glob("*.json"))


def test_unset_every_check_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(vllm_check.CACHE_VARIABLE, raising=False)
    python = str(_interpreter(tmp_path))
    assert not any(vllm_check.run(NODES, python, TARGET).reused for _ in range(2))
    assert _runs(tmp_path) == 2


def test_the_lab_vllms_refusal_is_kept_as_it_said_it(tmp_path: Path, kept: Path) -> None:
    if not LAB_PYTHON.exists():
        _skip_or_fail(f"no lab vLLM environment at {LAB_PYTHON}: run `make lab-venv` (make test does)")
    nodes = {"launch": [{**NODES["launch"][0], "serve_args": ["m", "--moe-backend=not_a_backend"]}]}
    first, second = (vllm_check.run(nodes, str(LAB_PYTHON), TARGET) for _ in range(2))
    assert first.ran and not first.reused and second.reused
    assert [n.describe(second.vllm_version) for n in second.nodes()] == \
        [n.describe(first.vllm_version) for n in first.nodes()]
    assert "invalid choice: 'not_a_backend'" in (second.nodes()[0].message or "")
