"""Which image the node holds, read from its content: compat.image_identity's question "is this the profile's
official image?" (docs/checks.md; docs/sources.md#image-reference).

The manifest digest is the truth. A RepoDigest `repo@sha256:<d>` says the image's manifest has digest `<d>`, whatever
registry served it: an image whose RepoDigests carry the digest the profile pins is the official image, pulled
under whichever name (a registry mirror, a proxy cache). Names are compared normalised (parsers/image_ref.py:
`docker.io`, `library/`, `index.docker.io`, podman's short names). Without a pinned digest the official
repository vouches for its tag: a RepoDigest under the profile's repository, the configured tag the profile's.
What cannot be told apart is said, never guessed: an image with no RepoDigest (`docker load`, a local build) or one
pulled from another registry with no digest to compare is *unproven*, with how to prove it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..parsers.image_ref import ImageName, parse_reference, same_path_elsewhere, same_repository


@dataclass(frozen=True)
class Provenance:
    """`official`: True (proven), False (another image: `reasons`), None (unproven: `unproven` says why, `prove`
    how). `pulled_as`: the names (RepoDigests) whose digest proves it; `by`: "digest" or "repository".
    `retagged`: the configured name was not pulled from its own repository (a local retag), a problem of its own."""

    official: bool | None
    reasons: list[str] = field(default_factory=list)
    unproven: str | None = None
    prove: str | None = None
    pulled_as: list[str] = field(default_factory=list)
    by: str | None = None
    retagged: str | None = None
    configured: str | None = None       # the configured reference, normalised (None: not a reference)
    digests: list[str] = field(default_factory=list)     # the image's manifest digests, lowercase


def _names(values: list[str]) -> list[ImageName]:
    return [n for n in (parse_reference(v) for v in values) if n is not None]


def _resolves_to(configured: ImageName, names: list[ImageName], podman: bool) -> set[str]:
    """The repositories the configured name stands for on this node: its own (normalised), and with podman's
    short-name lookup every repository of the image's names that it matches."""
    return {configured.repository} | {n.repository for n in names if same_repository(configured, n, podman=podman)}


def _how_to_prove_local(wanted: ImageName, pin: str | None, image_id: str | None) -> str:
    pull = (f"{wanted.familiar}@{pin}" if pin else
            f"{wanted.familiar}:{wanted.effective_tag} (and pin the digest it prints)")
    return (f"prove it: pull the profile's image on this node by digest (docker pull {pull}): its RepoDigests then "
            "carry the digest and this check compares it; or, from a host that reaches the registry, read the "
            f"official image's config digest for this platform (docker manifest inspect {wanted.familiar}:"
            f"{wanted.effective_tag} lists the platform manifests; docker manifest inspect "
            f"{wanted.familiar}@<platform manifest digest> shows config.digest) and compare it with this image's ID "
            f"{image_id or '(unknown)'} (docker's classic image store and podman give the config digest as the image "
            "ID); then re-run preflight")


def _how_to_prove_mirror(wanted: ImageName, mirrors: list[str], digests: list[str]) -> str:
    official = f"{wanted.familiar}:{wanted.effective_tag}"
    return (f"prove it: read the official image's manifest digest from its own registry (docker buildx imagetools "
            f"inspect {official}, or skopeo inspect docker://{wanted.repository}:{wanted.effective_tag}) and compare "
            f"it with {', '.join(digests)} served by {', '.join(mirrors)}; then pin that digest in the profile "
            "(image.digest, e.g. a site profile with `extends:`), which lets this check accept the mirror's copy by "
            "digest, or pull through a mirror configured in the engine (docker: registry-mirrors in daemon.json; "
            "podman: [[registry.mirror]] in registries.conf), which keeps the official name and its RepoDigest")


def _unproven_local(configured: str, wanted: ImageName, pin: str | None, image_id: str | None, podman_local: bool,
                    base: Provenance) -> Provenance:
    how = ("podman named it localhost/ (built or tagged locally; podman computes its RepoDigests itself)"
           if podman_local else "no RepoDigest: loaded (docker load) or built locally, never pulled from a registry")
    against = (f"the profile's pinned {pin}" if pin else
               f"the profile's {wanted.familiar}:{wanted.effective_tag} (the profile pins no digest either)")
    return replace(base, official=None, prove=_how_to_prove_local(wanted, pin, image_id),
                   unproven=f"{configured}: {how}, so nothing shows whether it is {against}")


def provenance(*, configured: str | None, official: str | None, pin: str | None, inventory_pin: str | None,
               repo_tags: list[str], repo_digests: list[str], image_id: str | None,
               podman: bool = False) -> Provenance:
    """Whether the image (its RepoTags, RepoDigests, ID) is the profile's official image `official`, pinned at
    `pin` (the profile's digest, or an experimental profile's lineage digest; never an inventory variable), when
    the inventory names it `configured` and pins `inventory_pin`. `podman`: the engine is podman (short names)."""
    wanted, name = parse_reference(official), parse_reference(configured)
    pin = pin.lower() if pin else None
    inventory_pin = inventory_pin.lower() if inventory_pin else None
    tags, digested = _names(repo_tags), [n for n in _names(repo_digests) if n.digest]
    digests = sorted({str(n.digest) for n in digested})
    if wanted is None or not configured:       # no official image to compare with, or no reference given
        return Provenance(official=True, configured=str(name) if name else None, digests=digests)
    if name is None:
        return Provenance(official=False, digests=digests, reasons=[
            f"{configured!r} is not an image reference docker or podman accepts"])
    resolves = _resolves_to(name, tags + digested, podman)
    registry = [n for n in digested if n.domain != "localhost"]     # podman's localhost/: built or tagged here
    in_configured_repo = [n for n in digested if n.repository in resolves]
    own = [n for n in registry if n.repository == wanted.repository]
    elsewhere = [n for n in registry if same_path_elsewhere(wanted, n)]
    name_is_official = wanted.repository in resolves
    name_is_mirror = not name_is_official and same_path_elsewhere(wanted, name) and name.domain != "localhost"
    tag_differs = name.digest is None and name.effective_tag != wanted.effective_tag
    reasons: list[str] = []
    if pin and inventory_pin and inventory_pin != pin:
        reasons.append(f"the inventory pins {inventory_pin}, not the profile's {pin}")
    pinned_here = bool((pin and pin in digests) or (inventory_pin and inventory_pin in digests))
    mirror_copy = (name_is_official or name_is_mirror) and bool(elsewhere) and not own and not pin
    retagged = None
    if name.digest is None and digested and not in_configured_repo and not pinned_here and not mirror_copy:
        retagged = (f"{configured} was not pulled from {name.familiar} (no RepoDigest for it): a retagged or "
                    "locally built image")
    base = Provenance(official=None, configured=str(name), digests=digests, retagged=retagged)
    if pin:
        carrying = sorted({n.familiar for n in digested if n.digest == pin})
        if carrying:
            return replace(base, official=not reasons, reasons=reasons, pulled_as=carrying, by="digest")
        if not name_is_official and not name_is_mirror:
            reasons.append(f"repository {name.familiar} is not the profile's {wanted.familiar}")
        if not registry and not reasons:
            return _unproven_local(configured, wanted, pin, image_id, bool(digested), base)
        if not digested:
            reasons.append("no RepoDigest (loaded or built locally): its digest cannot be compared")
        else:
            reasons.append(f"digest {digests} is not the profile's pinned {pin}")
        return replace(base, official=False, reasons=reasons)
    # No pinned digest: the official repository vouches for its tag.
    if not name_is_official and not name_is_mirror:
        return replace(base, official=False, reasons=[f"repository {name.familiar} is not the profile's "
                                                   f"{wanted.familiar}"])
    if tag_differs:
        return replace(base, official=False, reasons=[f"tag {name.tag or '(none)'} is not the profile's "
                                                   f"{wanted.tag or '(none)'}"])
    if own:
        return replace(base, official=True, pulled_as=sorted({n.familiar for n in own}), by="repository")
    if not registry:
        return _unproven_local(configured, wanted, inventory_pin, image_id, bool(digested), base)
    if elsewhere:
        mirrors = sorted({n.familiar for n in elsewhere})
        told = (f"; the inventory pins {inventory_pin}, which it carries, but an inventory variable never says "
                "which digest the official image has") if inventory_pin and inventory_pin in digests else ""
        return replace(base, official=None, unproven=(
            f"pulled from {', '.join(mirrors)} ({', '.join(digests)}), not from the profile's repository "
            f"{wanted.familiar}, and the profile pins no digest: whether that registry serves the official "
            f"image's manifest is unknown{told}"),
            prove=_how_to_prove_mirror(wanted, mirrors, digests))
    return replace(base, official=False, reasons=[
        f"its RepoDigests name {sorted({n.familiar for n in registry})}, not the profile's {wanted.familiar}"])
