"""Image identity on content (issue 41 item 8): names normalised the way docker/distribution and podman do, the
manifest digest decides (a mirror serving the pinned digest is the official image), an image with no RepoDigest is
unproven (inconclusive, with how to prove it), never a rebuild and never a pass; compat.image_uniform compares
content, not the ID string one image store happens to print.

The inspect outputs are the real captures of tests/fixtures/real/image-inspect/ (sources in their YAML and in
docs/sources.md#image-reference); where a case needs another name on one of them, the test says so (generated)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from vllm_acceptance.core.findings import Consequence, Status
from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.parsers.image_ref import parse_reference, same_path_elsewhere, same_repository
from vllm_acceptance.preflight.stage import judge
from vllm_acceptance.rules.image_provenance import provenance

from nodefixtures import build_evidence

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real" / "image-inspect"
TODAY = dt.date(2026, 9, 1)
GOOD_DIGEST = "sha256:181ec868e19acf210c3bf194732b2f2d50459a1c59df63a1d2653a6c9450c5b6"   # the good case's
MEDIAWIKI = "sha256:2f3e53bf0fc1d59384507ff776be3f7cb0f7b777db60eb5cb42fa3aae8148da9"     # podman capture's
NODE = ("sha256:1b1928c9eea9e6cd5ff6155a2adda33a022a08911a1418f5ebe8ff992abd2a69",
        "sha256:7daef4e511bcd3655c18cb58bfc382a4391b04c7881c4debc17a5882908917e4")


# --- the reference implementation's own cases -----------------------------------------------------------------

# distribution/reference normalize_test.go (Apache-2.0, commit 0965666), TestParseRepositoryInfo: every familiar,
# full and ambiguous spelling of one repository normalises to FullName, with its Domain and RemoteName (Path).
REPOSITORY_INFO = [  # (remote name, familiar, full, ambiguous, domain)
    ("fooo", "localhost/fooo", "localhost/fooo", "localhost/fooo", "localhost"),
    ("fooo/bar", "localhost/fooo/bar", "localhost/fooo/bar", "localhost/fooo/bar", "localhost"),
    ("fooo", "LOCALDOMAIN/fooo", "LOCALDOMAIN/fooo", "LOCALDOMAIN/fooo", "LOCALDOMAIN"),
    ("fooo/bar", "LOCALDOMAIN/fooo/bar", "LOCALDOMAIN/fooo/bar", "LOCALDOMAIN/fooo/bar", "LOCALDOMAIN"),
    ("fooo/bar", "fooo/bar", "docker.io/fooo/bar", "index.docker.io/fooo/bar", "docker.io"),
    ("library/ubuntu", "ubuntu", "docker.io/library/ubuntu", "library/ubuntu", "docker.io"),
    ("nonlibrary/ubuntu", "nonlibrary/ubuntu", "docker.io/nonlibrary/ubuntu", "", "docker.io"),
    ("other/library", "other/library", "docker.io/other/library", "", "docker.io"),
    ("private/moonbase", "127.0.0.1:8000/private/moonbase", "127.0.0.1:8000/private/moonbase", "",
     "127.0.0.1:8000"),
    ("privatebase", "127.0.0.1:8000/privatebase", "127.0.0.1:8000/privatebase", "", "127.0.0.1:8000"),
    ("private/moonbase", "example.com/private/moonbase", "example.com/private/moonbase", "", "example.com"),
    ("privatebase", "example.com/privatebase", "example.com/privatebase", "", "example.com"),
    ("private/moonbase", "example.com:8000/private/moonbase", "example.com:8000/private/moonbase", "",
     "example.com:8000"),
    ("privatebasee", "example.com:8000/privatebasee", "example.com:8000/privatebasee", "", "example.com:8000"),
    ("library/ubuntu-12.04-base", "ubuntu-12.04-base", "docker.io/library/ubuntu-12.04-base",
     "index.docker.io/library/ubuntu-12.04-base", "docker.io"),
    ("library/foo", "foo", "docker.io/library/foo", "docker.io/foo", "docker.io"),
    ("library/foo/bar", "library/foo/bar", "docker.io/library/foo/bar", "", "docker.io"),
    ("store/foo/bar", "store/foo/bar", "docker.io/store/foo/bar", "", "docker.io"),
    ("bar", "Foo/bar", "Foo/bar", "", "Foo"),
    ("bar", "FOO/bar", "FOO/bar", "", "FOO"),
]


@pytest.mark.parametrize(("remote", "familiar", "full", "ambiguous", "domain"), REPOSITORY_INFO)
def test_every_spelling_normalises_as_docker_distribution_does(remote: str, familiar: str, full: str,
                                                               ambiguous: str, domain: str) -> None:
    for spelling in filter(None, (familiar, full, ambiguous)):
        name = parse_reference(spelling)
        assert name is not None, spelling
        assert (name.repository, name.domain, name.path, name.familiar) == (full, domain, remote, familiar), spelling


# TestParseDockerRef of the same file: the reference as docker pulls it (a missing tag is latest; beside a digest
# the tag is dropped, "the digest is the sole source of truth").
DOCKER_REF = [
    ("busybox", "docker.io/library/busybox:latest"),
    ("busybox:latest", "docker.io/library/busybox:latest"),
    ("busybox@sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582",
     "docker.io/library/busybox@sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582"),
    ("library/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/library/busybox", "docker.io/library/busybox:latest"),
    ("docker.io/busybox:latest", "docker.io/library/busybox:latest"),
    ("library/busybox:latest", "docker.io/library/busybox:latest"),
    ("docker.io/library/busybox:latest", "docker.io/library/busybox:latest"),
    ("gcr.io/library/busybox", "gcr.io/library/busybox:latest"),
    ("gcr.io/library/busybox:latest@sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582",
     "gcr.io/library/busybox@sha256:e6693c20186f837fc393390135d8a598a96a833917917789d63766cab6c59582"),
]


@pytest.mark.parametrize(("given", "pulled"), DOCKER_REF)
def test_the_reference_docker_pulls(given: str, pulled: str) -> None:
    name = parse_reference(given)
    assert name is not None
    as_pulled = f"{name.repository}@{name.digest}" if name.digest else f"{name.repository}:{name.effective_tag}"
    assert as_pulled == pulled


@pytest.mark.parametrize("bad", ["", "   ", "sha256:" + "a" * 64, "a" * 64, "vllm/VLLM-openai:kimi-k3",
                                 "vllm/vllm-openai:kimi k3", "vllm//vllm-openai", "vllm/vllm-openai@sha256:xyz",
                                 "vllm/vllm-openai:-tag"])
def test_what_is_not_a_reference_is_said_never_guessed(bad: str) -> None:
    assert parse_reference(bad) is None


def test_the_official_image_under_each_of_its_names_is_one_repository() -> None:
    official = parse_reference("vllm/vllm-openai:kimi-k3")
    assert official is not None
    for alias in ("docker.io/vllm/vllm-openai:kimi-k3", "index.docker.io/vllm/vllm-openai:kimi-k3",
                  "docker.io/vllm/vllm-openai@" + GOOD_DIGEST):
        name = parse_reference(alias)
        assert name is not None and same_repository(official, name), alias
    for other in ("ghcr.io/vllm/vllm-openai:kimi-k3", "vllm/vllm-openai-rocm:kimi-k3", "localhost/vllm/vllm-openai"):
        name = parse_reference(other)
        assert name is not None and not same_repository(official, name), other


def test_a_podman_short_name_resolves_to_any_registry_at_a_path_boundary() -> None:
    """containers/common libimage `referenceFuzzilyMatchingRepoAndTag`: a short name matches a local image whose
    repository ends in `/<name>`; docker reads the same name as Docker Hub only."""
    short = parse_reference("vllm/vllm-openai:kimi-k3")
    assert short is not None and not short.qualified
    for name in ("quay.io/vllm/vllm-openai:kimi-k3", "localhost/vllm/vllm-openai:kimi-k3",
                 "registry.example.com:5000/vllm/vllm-openai:kimi-k3"):
        parsed = parse_reference(name)
        assert parsed is not None
        assert same_repository(short, parsed, podman=True) and not same_repository(short, parsed), name
    near = parse_reference("quay.io/myvllm/vllm-openai:kimi-k3")      # not at a path boundary
    qualified = parse_reference("docker.io/vllm/vllm-openai:kimi-k3")  # named its registry: not a short name
    quay = parse_reference("quay.io/vllm/vllm-openai")
    assert near is not None and qualified is not None and quay is not None
    assert not same_repository(short, near, podman=True)
    assert not same_repository(qualified, quay, podman=True)


def test_a_mirror_is_the_official_path_under_another_registry() -> None:
    official = parse_reference("vllm/vllm-openai:kimi-k3")
    assert official is not None
    for mirror in ("mirror.example.com/vllm/vllm-openai", "harbor.example.com/dockerhub/vllm/vllm-openai"):
        parsed = parse_reference(mirror)
        assert parsed is not None and same_path_elsewhere(official, parsed), mirror
    for other in ("docker.io/vllm/vllm-openai", "ghcr.io/acme/vllm-k3", "mirror.example.com/vllm/vllm-openai-rocm"):
        parsed = parse_reference(other)
        assert parsed is not None and not same_path_elsewhere(official, parsed), other


# --- compat.image_identity on real inspect outputs ----------------------------------------------------------

def profile_with(tmp_path: Path, reference: str, digest: str | None = None) -> Any:
    """The node fixtures' profile with another official image (and pinned digest)."""
    data = yaml.safe_load((ROOT / "tests/fixtures/profiles/kimi-k3-8gpu-node.yml").read_text())
    data["image"]["reference"], data["image"]["digest"] = reference, digest
    data["image"]["forbidden_tag_suffixes"] = []
    path = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_profile(path)


def identity(tmp_path: Path, capture: str | dict[str, Any], profile: Any, *, image: str, runtime: str = "docker",
             image_digest: str | None = None) -> Any:
    """compat.image_identity of one node whose `image inspect` is the capture (or a changed copy of it)."""
    run = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    base = build_evidence("good", run, host="gpu-01", image=image, image_digest=image_digest,
                          launch={"runtime": runtime})
    text = (REAL / capture).read_text() if isinstance(capture, str) else json.dumps([capture])
    (base / "image_inspect.txt").write_text(text)
    findings = judge(run, profile, ["gpu-01"], today=TODAY)
    return next(f for f in findings if f.check == "compat.image_identity" and f.host == "gpu-01")


def real(name: str) -> dict[str, Any]:
    return json.loads((REAL / name).read_text())[0]


@pytest.mark.parametrize("configured", ["node:8.11.1-alpine", "docker.io/library/node:8.11.1-alpine",
                                        "index.docker.io/library/node:8.11.1-alpine", "library/node:8.11.1-alpine",
                                        "docker.io/node:8.11.1-alpine"])
def test_docker_familiar_names_are_the_official_image_under_every_spelling(tmp_path: Path, configured: str) -> None:
    """docker prints `node:8.11.1-alpine` / `node@sha256:...`; the inventory may name it fully qualified. Before:
    every spelling but the familiar one failed as "not pulled from docker.io/library/node" and "not the official"."""
    found = identity(tmp_path, "docker-classic-library-node-two-digests.json",
                     profile_with(tmp_path, "node:8.11.1-alpine"), image=configured)
    assert found.status == Status.PASS, found.reason
    assert found.observed["normalised_reference"] == "docker.io/library/node:8.11.1-alpine"
    assert found.observed["pulled_as"] == ["node"] and found.observed["official_by"] == "repository"


def test_podman_fully_qualified_names_are_the_official_image(tmp_path: Path) -> None:
    """podman prints docker.io/... for the image the profile calls `kristophjunge/mediawiki:1.30`. Before: fail,
    "not pulled from kristophjunge/mediawiki", and the run was put on the experimental route."""
    profile = profile_with(tmp_path, "kristophjunge/mediawiki:1.30")
    for configured in ("kristophjunge/mediawiki:1.30", "docker.io/kristophjunge/mediawiki:1.30"):
        found = identity(tmp_path, "podman-docker-io-mediawiki.json", profile, image=configured, runtime="podman")
        assert found.status == Status.PASS, (configured, found.reason)
        assert found.observed["pulled_as"] == ["kristophjunge/mediawiki"]
    pinned = identity(tmp_path, "podman-docker-io-mediawiki.json",
                      profile_with(tmp_path, "kristophjunge/mediawiki:1.30", MEDIAWIKI),
                      image="kristophjunge/mediawiki:1.30", runtime="podman")
    assert pinned.status == Status.PASS and pinned.observed["official_by"] == "digest"


def test_a_podman_short_name_resolved_to_another_registry_is_never_the_docker_hub_image(tmp_path: Path) -> None:
    """podman resolved the short name `coreos-assembler/coreos-assembler` to quay.io (real capture): the profile's
    image is Docker Hub's, and with no pinned digest nothing says quay.io serves the same manifest: unproven."""
    profile = profile_with(tmp_path, "coreos-assembler/coreos-assembler:latest")
    found = identity(tmp_path, "podman-quay-coreos-assembler.json", profile,
                     image="coreos-assembler/coreos-assembler:latest", runtime="podman")
    assert found.status == Status.INCONCLUSIVE, found.reason
    assert "pulled from quay.io/coreos-assembler/coreos-assembler" in found.reason
    assert "docker buildx imagetools inspect coreos-assembler/coreos-assembler:latest" in found.action
    # docker reads the same short name as Docker Hub's only: the quay.io image is not what it names
    docker = identity(tmp_path, "podman-quay-coreos-assembler.json", profile,
                      image="coreos-assembler/coreos-assembler:latest")
    assert docker.status == Status.INCONCLUSIVE and "was not pulled from" not in docker.reason


def mirrored(capture: str, registry: str) -> dict[str, Any]:
    """The real capture as the same image reads pulled from a mirror (generated: its names under `registry`)."""
    data = real(capture)
    data["RepoTags"] = [f"{registry}/{t.removeprefix('docker.io/')}" for t in data["RepoTags"]]
    data["RepoDigests"] = [f"{registry}/{d.removeprefix('docker.io/')}" for d in data["RepoDigests"]]
    return data


def test_a_mirror_serving_the_pinned_digest_is_the_official_image(tmp_path: Path) -> None:
    """The manifest digest is the truth: the profile pins the podman capture's digest; the same image pulled from
    mirror.example.com (and from a Harbor proxy project) passes, observed naming the mirror. Before: fail, not
    the official image (limited observation at most)."""
    profile = profile_with(tmp_path, "kristophjunge/mediawiki:1.30", MEDIAWIKI)
    for registry in ("mirror.example.com", "harbor.example.com/dockerhub"):
        image = f"{registry}/kristophjunge/mediawiki:1.30"
        found = identity(tmp_path, mirrored("podman-docker-io-mediawiki.json", registry), profile, image=image,
                         runtime="podman")
        assert found.status == Status.PASS, found.reason
        assert found.observed["pulled_as"] == [f"{registry}/kristophjunge/mediawiki"]
        assert found.observed["official_by"] == "digest" and "official" not in found.observed
    # and retagged locally under the official name after the pull (the digest still proves the content)
    retag = mirrored("podman-docker-io-mediawiki.json", "mirror.example.com")
    retag["RepoTags"].append("docker.io/kristophjunge/mediawiki:1.30")
    found = identity(tmp_path, retag, profile, image="kristophjunge/mediawiki:1.30")
    assert found.status == Status.PASS, found.reason


def test_a_mirror_with_another_digest_is_not_the_official_image(tmp_path: Path) -> None:
    profile = profile_with(tmp_path, "kristophjunge/mediawiki:1.30", "sha256:" + "d" * 64)
    found = identity(tmp_path, mirrored("podman-docker-io-mediawiki.json", "mirror.example.com"), profile,
                     image="mirror.example.com/kristophjunge/mediawiki:1.30", runtime="podman")
    assert found.status == Status.FAIL and found.observed["official"] is False
    assert f"!= pinned sha256:{'d' * 64}" in found.reason
    assert f"is not the profile's pinned sha256:{'d' * 64}" in found.observed["not_official"][-1]


def test_a_mirror_with_no_pinned_digest_is_unproven_never_pass_never_rebuild(tmp_path: Path) -> None:
    """No digest to compare: whether the mirror serves the official manifest is unknown. The inventory's pin is the
    operator's word, not the profile's: it does not make it the official image either."""
    profile = profile_with(tmp_path, "kristophjunge/mediawiki:1.30")
    for pin in (None, MEDIAWIKI):
        found = identity(tmp_path, mirrored("podman-docker-io-mediawiki.json", "mirror.example.com"), profile,
                         image="mirror.example.com/kristophjunge/mediawiki:1.30", runtime="podman", image_digest=pin)
        assert found.status == Status.INCONCLUSIVE, found.reason
        assert "pulled from mirror.example.com/kristophjunge/mediawiki" in found.reason
        assert "registry-mirrors in daemon.json" in found.action and "image.digest" in found.action
        assert ("an inventory variable never says" in found.reason) == (pin is not None)


@pytest.mark.parametrize(("capture", "official"), [
    ("docker-classic-buildkit-local-no-repodigest.json", "gsantomaggio/go-stream-client:latest"),
    ("docker-buildx-load-localhost-5000-no-repodigest.json", "localhost:5000/test1:latest"),
])
def test_an_image_with_no_repodigest_is_unproven_with_how_to_prove_it(tmp_path: Path, capture: str,
                                                                      official: str) -> None:
    """A `docker load`ed or locally built image has no RepoDigest (real captures, classic image store): its content
    cannot be compared. Before: fail, "no registry digest", rebuild_environment."""
    image_id = real(capture)["Id"]
    for digest in (None, "sha256:" + "a" * 64):
        found = identity(tmp_path, capture, profile_with(tmp_path, official, digest), image=official)
        assert found.status == Status.INCONCLUSIVE, found.reason
        assert "no RepoDigest" in found.reason and "docker load" in found.reason
        assert found.action.startswith("prove it: pull the profile's image on this node by digest")
        assert image_id in found.action and "config.digest" in found.action
        assert found.consequence != Consequence.LIMIT and "official" not in found.observed


def test_a_loaded_image_under_another_name_stays_on_the_experimental_route(tmp_path: Path) -> None:
    """No RepoDigest and a name that is not the profile's: the name alone says it is another image."""
    found = identity(tmp_path, "docker-classic-buildkit-local-no-repodigest.json",
                     profile_with(tmp_path, "vllm/vllm-openai:kimi-k3"), image="gsantomaggio/go-stream-client:latest")
    assert found.status == Status.FAIL and found.consequence == Consequence.LIMIT
    assert found.observed["official"] is False


def test_a_containerd_store_load_keeps_its_manifest_digest_and_is_judged_by_it(tmp_path: Path) -> None:
    """docker's containerd image store gives a loaded image `name@<its manifest digest>` (real capture, Docker 29):
    the pinned digest proves it; another pin does not."""
    digest = real("docker-c8d-load-repodigest-is-id.json")["Id"]
    name = "test:7bwkndsdbb4ialj34vsz8jx3i3hs3kdh"
    found = identity(tmp_path, "docker-c8d-load-repodigest-is-id.json", profile_with(tmp_path, name, digest),
                     image=name)
    assert found.status == Status.PASS and found.observed["official_by"] == "digest"
    other = identity(tmp_path, "docker-c8d-load-repodigest-is-id.json",
                     profile_with(tmp_path, name, "sha256:" + "b" * 64), image=name)
    assert other.status == Status.FAIL and other.observed["official"] is False


def test_a_retag_of_another_registrys_image_under_the_official_name_still_fails(tmp_path: Path) -> None:
    """What compat.image_identity already caught stays caught: the official name on an image whose only RepoDigest
    is another repository (not the official path) is a retag, rebuild_environment."""
    data = real("docker-c8d-ghcr-pulled-by-digest.json")
    data["RepoTags"].append("vllm/vllm-openai:kimi-k3")
    found = identity(tmp_path, data, profile_with(tmp_path, "vllm/vllm-openai:kimi-k3"),
                     image="vllm/vllm-openai:kimi-k3")
    assert found.status == Status.FAIL and found.consequence == Consequence.REBUILD
    assert "was not pulled from vllm/vllm-openai" in found.reason and found.observed["official"] is False


def test_provenance_never_calls_an_unreadable_reference_the_official_image() -> None:
    found = provenance(configured="vllm/VLLM-openai:kimi-k3", official="vllm/vllm-openai:kimi-k3", pin=None,
                       inventory_pin=None, repo_tags=[], repo_digests=[f"vllm/vllm-openai@{GOOD_DIGEST}"],
                       image_id="sha256:" + "1" * 64)
    assert found.official is False and "not an image reference" in found.reasons[0]


# --- compat.image_uniform on content ---------------------------------------------------------------------------

def uniform(tmp_path: Path, inspects: dict[str, dict[str, Any]], runtime: dict[str, str] | None = None) -> Any:
    for host, data in inspects.items():
        base = build_evidence("good", tmp_path, host=host, launch={"runtime": (runtime or {}).get(host, "docker")})
        (base / "image_inspect.txt").write_text(json.dumps([data]))
    findings = judge(tmp_path, load_profile(ROOT / "profiles" / "kimi-k3.yml"), list(inspects), today=TODAY)
    return next(f for f in findings if f.check == "compat.image_uniform")


def good() -> dict[str, Any]:
    return json.loads((ROOT / "tests/fixtures/generated-nodes/good/docker-image-inspect.json").read_text())[0]


def test_one_image_in_a_containerd_store_and_a_classic_one_is_one_image(tmp_path: Path) -> None:
    """docker's containerd image store reports the manifest digest as the ID (real captures: docker/cli#6996,
    regclient#1035); the classic store the config digest. One image pulled on both: one image. Before: fail,
    rebuild_environment, "2 different images"."""
    classic = good()
    c8d = good() | {"Id": GOOD_DIGEST}
    found = uniform(tmp_path / "a", {"gpu-01": classic, "gpu-02": c8d})
    assert found.status == Status.PASS, found.reason
    podman = good() | {"Id": good()["Id"].removeprefix("sha256:"),
                       "RepoDigests": ["docker.io/" + d for d in good()["RepoDigests"]]}
    found = uniform(tmp_path / "b", {"gpu-01": classic, "gpu-02": podman}, {"gpu-02": "podman"})
    assert found.status == Status.PASS, found.reason


def test_another_image_still_fails_uniform_on_content(tmp_path: Path) -> None:
    """The containerd store's ID of another manifest, or a shared manifest-list digest on another architecture,
    is another image."""
    classic = good()
    found = uniform(tmp_path / "a", {"gpu-01": classic, "gpu-02": good() | {"Id": "sha256:" + "9" * 64,
                                                                          "RepoDigests": []}})
    assert found.status == Status.FAIL and found.reason.endswith("the odd nodes: gpu-02")
    other_arch = good() | {"Id": GOOD_DIGEST, "Architecture": "amd64"}
    found = uniform(tmp_path / "b", {"gpu-01": classic, "gpu-02": other_arch})
    assert found.status == Status.FAIL


def test_the_node_captures_read_alike_by_the_corpus_reader() -> None:
    """The real captures hold what this file relies on (their YAML `expect`, tests/unit/test_real_corpus.py)."""
    assert set(real("docker-classic-library-node-two-digests.json")["RepoDigests"]) == {f"node@{d}" for d in NODE}
    assert real("docker-classic-buildkit-local-no-repodigest.json")["RepoDigests"] == []
