"""Container image references as the reference implementations read them (docs/sources.md#image-reference).

docker (and the `docker/distribution` reference library every engine vendors) normalises a "familiar" name before
comparing it: no registry means Docker Hub (`docker.io`), a single-name Docker Hub repository is an official image
under `library/`, the legacy `index.docker.io` is `docker.io`, and a name with neither tag nor digest means
`:latest` (distribution/reference `normalize.go` `splitDockerDomain`, `ParseDockerRef`). So
`vllm/vllm-openai:kimi-k3`, `docker.io/vllm/vllm-openai:kimi-k3` and `index.docker.io/vllm/vllm-openai:kimi-k3`
name one repository; docker prints the familiar form in RepoTags/RepoDigests, podman the full one.

podman also reads a name without a registry as a *short name*: it may resolve to `localhost/<name>` (an image built
or tagged locally), to a registry of `unqualified-search-registries`, to docker.io, or to any local image whose
RepoTags end in `/<name>` (containers/common `libimage/runtime.go` `LookupImage`,
`libimage/image.go` `referenceFuzzilyMatchingRepoAndTag`). `same_repository(..., podman=True)` follows that.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_DOMAIN = "docker.io"
LEGACY_DEFAULT_DOMAIN = "index.docker.io"
OFFICIAL_REPO_PREFIX = "library/"
DEFAULT_TAG = "latest"

# A bare 64-hex string is an image ID, never a name (distribution/reference anchoredIdentifierRegexp).
_IDENTIFIER = re.compile(r"^(?:sha256:)?[0-9a-f]{64}$")
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,}$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")


@dataclass(frozen=True)
class ImageName:
    """One reference, normalised: `domain/path[:tag][@digest]`. `written` is the name as given (no tag or digest)
    and `qualified` whether it named its registry (a podman short name does not)."""

    domain: str
    path: str
    tag: str | None
    digest: str | None
    written: str
    qualified: bool

    @property
    def repository(self) -> str:
        """`docker.io/library/busybox`: what two references must share to name one repository."""
        return f"{self.domain}/{self.path}"

    @property
    def familiar(self) -> str:
        """The repository as docker prints it (`busybox`, `vllm/vllm-openai`, `ghcr.io/acme/x`)."""
        if self.domain != DEFAULT_DOMAIN:
            return self.repository
        rest = self.path.removeprefix(OFFICIAL_REPO_PREFIX)
        return rest if "/" not in rest else self.path

    @property
    def effective_tag(self) -> str | None:
        """The tag a pull of this reference uses: its own, `latest` when it names neither tag nor digest, and None
        for a digest reference (the digest alone decides; docker drops a tag given beside it)."""
        if self.digest:
            return None
        return self.tag or DEFAULT_TAG

    def __str__(self) -> str:
        text = self.repository
        if self.tag and not self.digest:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def split_domain(name: str) -> tuple[str, str, bool]:
    """(domain, path, qualified) of a repository name without tag or digest, as distribution/reference
    `splitDockerDomain` decides it: the first component is a registry when it is `localhost`, holds a `.` or a `:`,
    or is not lowercase; otherwise Docker Hub, with `library/` before a single-component name."""
    first, slash, rest = name.partition("/")
    if not slash:
        return DEFAULT_DOMAIN, OFFICIAL_REPO_PREFIX + name, False
    if first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        domain, path, qualified = first, rest, True
    else:
        domain, path, qualified = DEFAULT_DOMAIN, name, False
    if domain == LEGACY_DEFAULT_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = OFFICIAL_REPO_PREFIX + path
    return domain, path, qualified


def parse_reference(text: str | None) -> ImageName | None:
    """The normalised reference, or None for what is not an image reference (empty, an image ID, spaces, an
    uppercase repository path, a malformed tag or digest): the caller states it, never guesses."""
    raw = (text or "").strip()
    if not raw or any(c.isspace() for c in raw) or _IDENTIFIER.match(raw):
        return None
    name, at, digest = raw.partition("@")
    if at and not _DIGEST.match(digest):
        return None
    tag = None
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.match(tag):
            return None
    if not name or name.startswith("/") or name.endswith("/") or "//" in name:
        return None
    domain, path, qualified = split_domain(name)
    if not all(_COMPONENT.match(part) for part in path.split("/")):
        return None
    written = name.split("/", 1)[1] if qualified else name
    return ImageName(domain=domain, path=path, tag=tag, digest=digest.lower() if at else None,
                     written=written, qualified=qualified)


def same_repository(configured: ImageName, name: ImageName, *, podman: bool = False) -> bool:
    """Whether `name` (a RepoTag or RepoDigest as the engine printed it) is in the repository `configured` names.
    docker: the normalised repositories are equal. podman with a short name: also any registry's repository that
    ends in `/<name as written>` (podman's local lookup of a short name, containers/common libimage)."""
    if configured.repository == name.repository:
        return True
    if podman and not configured.qualified:
        return name.repository.endswith("/" + configured.written)
    return False


def same_path_elsewhere(official: ImageName, name: ImageName) -> bool:
    """`name` is the official repository's path under another registry: a mirror or a proxy cache
    (`mirror.example.com/vllm/vllm-openai`, Harbor's `harbor.example.com/dockerhub/vllm/vllm-openai`), or a
    podman `localhost/vllm/vllm-openai` (built or tagged locally). Never the official repository itself."""
    if name.repository == official.repository:
        return False
    return name.path == official.path or name.path.endswith("/" + official.path) or \
        name.path == official.familiar or name.path.endswith("/" + official.familiar)


def digest_hex(reference_or_id: str) -> str:
    """The hex of an image ID or of a repo digest's digest, lowercase (`sha256:` and any `repo@` dropped)."""
    return reference_or_id.rsplit("@", 1)[-1].split(":", 1)[-1].lower()
