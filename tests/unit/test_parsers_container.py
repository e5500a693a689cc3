"""docker/podman inspect, info, version and the in-image probe; never raising."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_acceptance.parsers.base import cuda_major, version_at_least
from vllm_acceptance.parsers.container import (
    parse_image_inspect,
    parse_probe,
    parse_runtime_info,
    parse_runtime_version,
)
from vllm_acceptance.parsers.env import comm_env, parse_env

from nodefixtures import NODES


def read(case: str, name: str) -> str:
    return (NODES / case / name).read_text()


def test_image_inspect_identity_and_cuda() -> None:
    image = parse_image_inspect(read("good", "docker-image-inspect.json"))
    assert image.ok and image.repo_tags == ["vllm/vllm-openai:kimi-k3"]
    assert image.digests[0].startswith("sha256:") and len(image.digests[0]) == 71
    assert image.cuda_version == "13.0.1" and image.cuda_major == 13
    assert image.last_tag_time and image.entrypoint == ["vllm", "serve"]
    assert parse_image_inspect(read("image-cu129", "docker-image-inspect.json")).cuda_major == 12


def test_image_inspect_of_an_absent_image() -> None:
    assert not parse_image_inspect("[]").ok
    assert not parse_image_inspect("Error: No such image: vllm/vllm-openai:kimi-k3").ok


def test_runtime_info_and_version() -> None:
    info = parse_runtime_info(read("good", "docker-info.json"))
    assert info.server_version == "28.3.3" and "nvidia" in info.runtimes and info.gpu_capable
    version = parse_runtime_version(read("good", "docker-version.json"))
    assert version.server_version == "28.3.3" and version.client_version == "28.3.3"
    # a real docker 28 CLI without a daemon: Server null
    no_daemon = parse_runtime_version('{"Client":{"Version":"28.2.2"},"Server":null}')
    assert no_daemon.client_version == "28.2.2" and no_daemon.server_version is None
    assert not parse_runtime_info('{"ServerVersion":""}').ok
    podman = parse_runtime_info(json.dumps({"host": {"ociRuntime": {"name": "crun"}, "kernel": "6.8"},
                                            "version": {"Version": "5.4.2"}}))
    assert podman.server_version == "5.4.2" and podman.runtimes == ["crun"]


def test_probe_cuda_sources() -> None:
    good = parse_probe(read("good", "probe.json"))
    assert set(good.cuda_majors().values()) == {13} and good.device_count == 8
    assert good.vllm_version == "0.28.0"
    cu129 = parse_probe(read("image-cu129", "probe.json"))
    assert cu129.cuda_majors()["torch.version.cuda"] == 12
    assert cu129.cuda_majors()["ldconfig: libcudart.so.12"] == 12


def test_probe_with_banner_noise_and_errors() -> None:
    probe = parse_probe("== CUDA ==\nCUDA Version 13.0.1\n" + '{"torch_error": "ImportError(torch)", "x": 1}')
    assert not probe.ok and probe.torch_version is None
    assert not parse_probe("").ok
    assert not parse_probe('{"torch_cuda": ').ok


def test_versions() -> None:
    assert cuda_major("13.0") == 13 and cuda_major("libcudart.so.12") == 12 and cuda_major("12090") == 12
    assert cuda_major(None) is None and cuda_major("none") is None
    assert version_at_least("0.32.0+cpu", "0.27.1") is True
    assert version_at_least("0.27.0", "0.27.1") is False
    assert version_at_least("580.65.06", "580.65.06") is True
    assert version_at_least("garbage", "1.0") is None


def test_env_parse_and_comm_subset() -> None:
    env = parse_env("NCCL_DEBUG=INFO\nUCX_TLS=rc,cuda_copy\nMULTI=a\nb\nPATH=/bin\n")
    assert env["MULTI"] == "a\nb"
    assert comm_env(env) == {"NCCL_DEBUG": "INFO", "UCX_TLS": "rc,cuda_copy"}


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_container_parsers_never_raise(text: str) -> None:
    for parser in (parse_image_inspect, parse_runtime_info, parse_runtime_version, parse_probe, parse_env):
        parser(text)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_container_parsers_never_raise_on_arbitrary_json(value: object) -> None:
    text = json.dumps(value)
    for parser in (parse_image_inspect, parse_runtime_info, parse_runtime_version, parse_probe):
        parser(text)
