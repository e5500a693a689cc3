"""Pytest fixtures for real SSH test hosts (network namespaces + sshd, see lab/nshosts.py).

tests/conftest.py imports these, e.g. ``from support.hosts import ns_hosts, ns_hosts_session``.
Tests that use them skip with the reason when the machine cannot make hosts (not root, or
iproute2/openssh-server missing); CI runs as root, so there they run.

    def test_x(ns_hosts):
        cluster = ns_hosts([HostSpec("node0", bin_dir), HostSpec("node1", None, reachable=False)])
        inventory = cluster.write_inventory(tmp_path / "inventory.yml")

Every cluster made through a factory is torn down when the fixture's scope ends, even when the
test fails; ``cluster.down()`` may also be called earlier (it is idempotent).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from vllm_acceptance.lab.nshosts import Cluster, HostSpec, NsHostsError, check_environment

REPO = Path(__file__).resolve().parents[2]
ClusterFactory = Callable[..., Cluster]


def hosts_skip_reason() -> str | None:
    """Why namespace hosts cannot be made here, or None when they can."""
    try:
        check_environment()
    except NsHostsError as exc:
        return str(exc)
    return None


def ansible_bin(tool: str = "ansible-playbook") -> str:
    """The controller venv's Ansible tool (next to the running python), else the one on PATH."""
    import sys

    candidate = Path(sys.executable).parent / tool
    if candidate.exists():
        return str(candidate)
    found = shutil.which(tool)
    if found is None:
        pytest.skip(f"{tool} not installed: pip install -e '.[test]' in the controller venv")
    return found


def ansible_env(**extra: str) -> dict[str, str]:
    """Environment for running ansible-playbook against namespace hosts from this repo.

    Pipelining halves playbook time (docs/lab.md); the repo's plugin and role paths are set
    explicitly so tests do not depend on the working directory picking up ansible.cfg.
    """
    import sys

    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env.update(
        {
            "ANSIBLE_PIPELINING": "1",
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_LIBRARY": str(REPO / "plugins" / "modules"),
            "ANSIBLE_FILTER_PLUGINS": str(REPO / "plugins" / "filter"),
            "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
        }
    )
    env.update(extra)
    return env


def cluster_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """Generator behind the fixtures: ``yield from cluster_factory(tmp_path_factory)`` in a
    fixture of any scope; skips when hosts cannot be made, tears down on exit."""
    reason = hosts_skip_reason()
    if reason is not None:
        pytest.skip(f"namespace hosts unavailable: {reason}")
    clusters: list[Cluster] = []

    def make(specs: Sequence[HostSpec], name: str = "hosts") -> Cluster:
        from vllm_acceptance.lab.nshosts import up

        cluster = up(specs, tmp_path_factory.mktemp(name))
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        errors = []
        for cluster in clusters:
            try:
                cluster.down()
            except Exception as exc:  # keep tearing down the rest; report at the end
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def ns_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """Factory ``(specs, name="hosts") -> Cluster``; hosts torn down after the test."""
    yield from cluster_factory(tmp_path_factory)


@pytest.fixture(scope="module")
def ns_hosts_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """Same factory, hosts torn down after the test module."""
    yield from cluster_factory(tmp_path_factory)


@pytest.fixture(scope="session")
def ns_hosts_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFactory]:
    """Same factory, hosts torn down at the end of the session."""
    yield from cluster_factory(tmp_path_factory)


__all__ = [
    "ClusterFactory",
    "HostSpec",
    "ansible_bin",
    "ansible_env",
    "cluster_factory",
    "hosts_skip_reason",
    "ns_hosts",
    "ns_hosts_module",
    "ns_hosts_session",
]
