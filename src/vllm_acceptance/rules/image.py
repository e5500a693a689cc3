"""The image under test: CUDA runtime inside it, identity and digest, vLLM version, one image on every node
(docs/checks.md, compat.container_cuda, compat.image_*, compat.vllm_version)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..core.findings import Consequence, Finding, Status
from ..parsers.base import version_at_least
from ..parsers.container import ImageInspect
from ..parsers.image_ref import digest_hex, parse_reference
from ..parsers.live import headless_container, hidden_server, running_container, same_running_image
from .context import ROUTE_IMAGE, ROUTE_SELF_BUILT, NodeContext, finding, why_missing
from .image_provenance import Provenance, provenance
from .live_server import MAKE_VISIBLE
from .registry import missing, not_applicable

# --- compat.container_cuda ------------------------------------------------------------------

def check_container_cuda(ctx: NodeContext) -> Finding:
    check = "compat.container_cuda"
    expected_major = ctx.profile.model.image.cuda_major
    if expected_major is None:
        return not_applicable(check, ctx.host, "profile image.cuda_major is null (no CUDA runtime to check: "
                                               f"{ctx.runtime} runtime, accelerator "
                                               f"{ctx.profile.model.hardware.accelerator})")
    probe, inspect = ctx.probe(), ctx.inspect() if ctx.containerised else None
    evidence = ctx.paths("image_probe", "image_inspect")
    rule = (f"CUDA major of the runtime inside the actual image == {expected_major} (torch.version.cuda, "
            "/usr/local/cuda/version.json, libcudart soname; never nvidia-smi's 'CUDA Version')")
    observed: dict[str, Any] = {}
    if probe is not None:
        observed["in_image"] = probe.cuda_majors()
        observed["torch"] = probe.torch_version
        observed["libcudart"] = probe.libcudart
        observed["loaded_libs"] = probe.loaded_libs
    if inspect is not None:
        observed["image_env_cuda"] = inspect.cuda_version
    wrong = {src: major for src, major in (observed.get("in_image") or {}).items() if major != expected_major}
    if inspect is not None and inspect.cuda_major is not None and inspect.cuda_major != expected_major:
        wrong["image env CUDA_VERSION"] = inspect.cuda_major
    action = (f"{ROUTE_IMAGE} (built for CUDA {expected_major}); or, when this host cannot run it, "
              f"{ROUTE_SELF_BUILT}")
    if wrong:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected_major, rule=rule,
                        evidence=evidence, action=action,
                        reason=f"image built for another CUDA major: {wrong}")
    if probe is None:
        if inspect is not None and inspect.cuda_major == expected_major:
            return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected_major,
                            rule=rule, evidence=evidence, action="fix what stopped the probe, re-run preflight",
                            reason="image metadata says CUDA "
                                   f"{inspect.cuda_version}, but the probe inside the image did not run: "
                                   + why_missing(ctx, "image_probe"))
        return missing(check, ctx.host, why_missing(ctx, "image_probe"), evidence=evidence)
    if not observed.get("in_image"):
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected_major,
                        rule=rule, evidence=evidence, action="check the probe output; re-run preflight",
                        reason="the probe ran but reported no CUDA runtime (CPU-only torch?)")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected_major, rule=rule,
                    evidence=evidence, action="none")


# --- compat.image_identity ------------------------------------------------------------------

def official_reference(ctx: NodeContext) -> tuple[str | None, str | None]:
    """The profile's own image: its reference and the digest the profile pins (on an experimental profile, the
    lineage's image digest). An inventory variable never changes it (issue 28, item 1)."""
    digest = ctx.profile.model.image.digest
    if ctx.profile.experimental:
        digest = digest or ctx.profile.model.at("lineage.image_digest")
    reference = ctx.profile.model.image.reference
    return (str(reference) if reference else None), (str(digest) if digest else None)


def judged_provenance(ctx: NodeContext, inspect: ImageInspect) -> Provenance:
    """Whether the inspected image is the profile's own image, on its content (rules/image_provenance.py): the
    digest the profile pins wherever it was pulled from, else a RepoDigest under the profile's repository and tag;
    names normalised (docker.io, library/, podman's short names)."""
    official, pin = official_reference(ctx)
    inventory_pin = ctx.evidence.inputs.get("image_digest")
    return provenance(configured=ctx.image_ref, official=official, pin=pin,
                      inventory_pin=str(inventory_pin) if inventory_pin else None, repo_tags=inspect.repo_tags,
                      repo_digests=inspect.repo_digests, image_id=inspect.id, podman=ctx.runtime == "podman")


def _not_official(ctx: NodeContext, observed: dict[str, Any], expected: dict[str, Any], rule: str,
                  evidence: list[str], reasons: list[str]) -> Finding:
    """Another image than the profile's own: whatever variable set it, never acceptance of the official image.
    The run is judged on the experimental route (SPEC: a self-built image is released only on its own
    experimental profile, with lineage): at most limited observation here (report/build.py says so first)."""
    official, _ = official_reference(ctx)
    return finding("compat.image_identity", Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, consequence=Consequence.LIMIT,
                   reason=f"not the profile's official image {official}: " + "; ".join(reasons)
                          + f"; judged on the experimental route, never as acceptance of {ctx.profile.name}",
                   action=f"{ROUTE_IMAGE}: run {official} (pinned by digest); or {ROUTE_SELF_BUILT}: "
                          "playbooks/build_image.yml writes the image's own experimental profile with its lineage")


def _running_container(ctx: NodeContext, judged: ImageInspect) -> dict[str, Any] | None:
    """What the attached server's container runs (issue 28 item 3; live_process evidence, parsers/live.py), for
    `observed.running_container`; None where no server was read (not attached). `matches_judged_image` is True or
    False only where the container's image ID, or its repo digest (crictl on containerd/CRI-O), could be compared
    with the judged image's ID or RepoDigests (parsers/live.py `same_running_image`); otherwise `reason` says why
    it is unknown."""
    record = ctx.rec("live_process")
    if not record.present:
        return None
    running = running_container(record.stdout)
    hidden = hidden_server(record.stdout)
    if running is None and hidden:     # a listener here whose process this user cannot see (issue 42 item 3)
        return {"matches_judged_image": None, "served_here": True, "not_visible": True,
                "reason": f"the server listening on this node is not visible to this user ({hidden})"}
    if running is None:
        try:
            told = json.loads(record.stdout)
        except ValueError:
            told = {}
        why = (told.get("reason") if isinstance(told, dict) else None) or (None if record.ok else record.why_not())
        return {"matches_judged_image": None,
                "reason": str(why or "the node's answer names no container (read by an older live_process script?)")}
    out: dict[str, Any] = {"id": running.id, "engine": running.engine, "image_id": running.image_id,
                           "image_ref": running.image_ref, "served_here": True}
    if running.id is None:     # the server on this node is a host process: no container runs it
        return {**out, "matches_judged_image": None, "host_process": True,
                "reason": f"the server on this node runs in no container: {running.reason}"}
    if running.image_digest:
        out["image_digest"] = running.image_digest
    if running.image_id is None and running.image_digest is None:
        return {**out, "matches_judged_image": None,
                "reason": f"the image of the server's container is unknown: {running.reason}"}
    same = same_running_image(running.image_id, running.image_digest, str(judged.id), judged.repo_digests)
    if same is None:
        return {**out, "matches_judged_image": None,
                "reason": f"the server's container runs the registry digest {running.image_digest} (no image ID "
                          "read) and the judged image has no RepoDigests to compare it with (built or loaded "
                          "locally): not comparable"}
    return {**out, "matches_judged_image": same}


def _no_container_runs(ctx: NodeContext, running: dict[str, Any], observed: dict[str, Any], expected: dict[str, Any],
                       rule: str, evidence: list[str], problems: list[str]) -> Finding:
    """The attached server is a host process while the profile serves from a container image: the image judged
    is not what serves (a pip install beside it, a hand-started server), whatever that image holds."""
    also = "; also " + "; ".join(problems) if problems else ""
    return finding("compat.image_identity", Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence,
                   reason=f"{running['reason']}: the judged image {ctx.image_ref} is not what serves "
                          f"(launch.runtime {ctx.runtime}){also}",
                   action=f"attach to the server started from {ctx.image_ref} in its container (docker, podman or "
                          "a Kubernetes pod); a host install is judged with a profile whose launch.runtime is "
                          "process")


def _running_image_unknown(ctx: NodeContext, running: dict[str, Any], observed: dict[str, Any],
                           expected: dict[str, Any], rule: str, evidence: list[str]) -> Finding:
    """The attached server runs in a container whose image could not be read: the configured image may not be
    the one that serves, so the image is not accepted on the configured one alone (docs/checks.md)."""
    return finding("compat.image_identity", Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected,
                   rule=rule, evidence=evidence,
                   reason=f"the server's container {str(running.get('id') or '')[:12]} was found, but "
                          f"{running['reason']}: whether it runs {ctx.image_ref} is unknown",
                   action="give the node the container runtime's CLI that knows the container (docker, podman, or "
                          "crictl for a Kubernetes pod), run as a user allowed to inspect it, and run again")


def _server_not_visible(ctx: NodeContext, running: dict[str, Any], observed: dict[str, Any],
                        expected: dict[str, Any], rule: str, evidence: list[str]) -> Finding:
    """A server listens on this node but its process is another user's (`ss` shows no pid): which container, and
    so which image, serves is unread; the configured image is never accepted in its place (issue 42 item 3)."""
    return finding("compat.image_identity", Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected,
                   rule=rule, evidence=evidence,
                   reason=f"{running['reason']}: whether the serving container runs {ctx.image_ref} is unknown; "
                          "the configured image alone is not what serves",
                   action=MAKE_VISIBLE)


def _other_image_runs(ctx: NodeContext, running: dict[str, Any], judged_id: str, observed: dict[str, Any],
                      expected: dict[str, Any], rule: str, evidence: list[str], problems: list[str]) -> Finding:
    runs = running["image_ref"] or "(reference unknown)"
    what = running["image_id"] or f"registry digest {running.get('image_digest')}, none of the judged image's " \
                                   "RepoDigests"
    use = running["image_ref"] or running["image_id"] or running.get("image_digest")
    reason = (f"the running server's container {str(running['id'])[:12]} runs {runs} ({what}), "
              f"not the judged image {ctx.image_ref} ({judged_id})")
    also = "; also " + "; ".join(problems) if problems else ""
    return finding("compat.image_identity", Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, reason=reason + also,
                   action=f"judge the image that runs (set vllm_image to {use})"
                          " or attach to the server started from the judged image")


def _unproven(ctx: NodeContext, found: Provenance, observed: dict[str, Any], expected: dict[str, Any], rule: str,
              evidence: list[str]) -> Finding:
    """Neither the official image nor another one is proven (no RepoDigest; a registry that is not the profile's
    with no pinned digest to compare): inconclusive, with how to prove it; never a rebuild, never a pass."""
    return finding("compat.image_identity", Status.INCONCLUSIVE, ctx.host, observed=observed, expected=expected,
                   rule=rule, evidence=evidence,
                   reason=f"whether this is the profile's image {official_reference(ctx)[0]} is unproven: "
                          f"{found.unproven}",
                   action=str(found.prove))


def check_image_identity(ctx: NodeContext) -> Finding:
    check = "compat.image_identity"
    if not ctx.containerised:
        return not_applicable(check, ctx.host, f"{ctx.runtime} runtime: no container image; vLLM identity "
                                               "and install source are in compat.vllm_version")
    reference = ctx.image_ref
    evidence = ctx.paths("image_inspect", "inputs")
    inspect = ctx.inspect()
    if inspect is None or not inspect.id:
        return missing(check, ctx.host, why_missing(ctx, "image_inspect"), evidence=evidence)
    pinned = ctx.evidence.inputs.get("image_digest") or ctx.profile.model.image.digest
    if ctx.profile.experimental:
        pinned = pinned or ctx.profile.model.at("lineage.image_digest")
    pinned = str(pinned).lower() if pinned else None
    forbidden = list(ctx.profile.model.image.forbidden_tag_suffixes)
    found = judged_provenance(ctx, inspect)
    observed = {"reference": reference, "id": inspect.id, "repo_tags": inspect.repo_tags,
                "repo_digests": inspect.repo_digests, "created": inspect.created,
                "pulled": inspect.last_tag_time, "architecture": inspect.architecture,
                "labels": inspect.labels, "pinned_digest": pinned, "normalised_reference": found.configured}
    if found.pulled_as:
        observed.update(pulled_as=found.pulled_as, official_by=found.by)
    expected = {"reference": ctx.profile.model.image.reference, "digest": pinned or "recorded",
                "forbidden_tag_suffixes": forbidden}
    rule = ("the image's content is the profile's own image: its RepoDigests carry the digest the profile pins, "
            "under whichever registry's name (a mirror serving the same manifest is the official image), else a "
            "RepoDigest under the profile's repository with its tag (names normalised: docker.io, library/, "
            "index.docker.io, podman short names), whatever inventory variable names another; no forbidden tag "
            "suffix; the configured name pulled from its own repository; digest == the pinned digest when one is "
            "pinned; no RepoDigest, or another registry with no pinned digest: unproven (inconclusive); attached: "
            "the running server's container runs the judged image (image ID; with crictl a repo digest, compared "
            "with the judged image's RepoDigests)")
    problems: list[str] = []
    tags = ([reference] if reference else []) + inspect.repo_tags
    bad_tags = sorted({t for t in tags for s in forbidden if s and _tag(t).endswith(s)})
    if bad_tags:
        problems.append(f"forbidden tag suffix in {bad_tags}")
    if found.retagged:
        problems.append(found.retagged)
    if pinned and found.digests and pinned not in found.digests:
        problems.append(f"digest {found.digests} != pinned {pinned}")
    if found.official is False:  # whatever else is wrong, the report says first that this is not the profile's image
        observed = {**observed, "official": False, "official_reference": official_reference(ctx)[0],
                    "not_official": found.reasons}
    running = _running_container(ctx, inspect)
    if running is not None:    # attach: the image the server's container runs, not only the configured one
        observed = {**observed, "running_container": running}
        evidence = evidence + ctx.paths("live_process")
        if running["matches_judged_image"] is False:
            return _other_image_runs(ctx, running, inspect.id, observed, expected, rule, evidence, problems)
        if running.get("host_process"):
            return _no_container_runs(ctx, running, observed, expected, rule, evidence, problems)
        if running.get("not_visible") and not problems and found.official is not False:
            return _server_not_visible(ctx, running, observed, expected, rule, evidence)
        if running.get("served_here") and running["matches_judged_image"] is None and not problems and \
                found.official is True:
            return _running_image_unknown(ctx, running, observed, expected, rule, evidence)
    if problems:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=expected, rule=rule,
                        evidence=evidence, reason="; ".join(problems),
                        action=f"{ROUTE_IMAGE}: pull {ctx.profile.model.image.reference} by digest and pin it "
                               f"(inventory vllm_image_digest); a self-built image only as {ROUTE_SELF_BUILT}")
    if found.official is False:
        return _not_official(ctx, observed, expected, rule, evidence, found.reasons)
    if found.official is None:
        return _unproven(ctx, found, observed, expected, rule, evidence)
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=expected, rule=rule,
                    evidence=evidence, action="none" if pinned else
                    "pin the recorded digest in the inventory (vllm_image_digest) so a re-tag is caught")


def _tag(reference: str) -> str:
    parsed = parse_reference(reference)
    if parsed is not None:
        return parsed.tag or ""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


# --- compat.vllm_version --------------------------------------------------------------------

def check_vllm_version(ctx: NodeContext) -> Finding:
    check = "compat.vllm_version"
    minimum = str(ctx.profile.model.vllm.min_version)
    probe = ctx.probe()
    evidence = ctx.paths("image_probe")
    if probe is None or not probe.vllm_version:
        why = why_missing(ctx, "image_probe") if probe is None else "the probe could not import vllm: " + \
            "; ".join(probe.errors)
        return missing(check, ctx.host, why, evidence=evidence)
    observed = {"vllm": probe.vllm_version, "distribution": probe.vllm_dist, "torch": probe.torch_version,
                "install_source": ctx.profile.model.vllm.install_source,
                "where": "image" if ctx.containerised else "runtime interpreter"}
    rule = f"vLLM in the actual runtime >= {minimum}"
    ok = version_at_least(probe.vllm_version, minimum)
    if ok is None:
        return finding(check, Status.INCONCLUSIVE, ctx.host, observed=observed, expected=f">= {minimum}",
                        rule=rule, evidence=evidence, reason="unreadable vLLM version",
                        action="check the probe output")
    if not ok:
        return finding(check, Status.FAIL, ctx.host, observed=observed, expected=f">= {minimum}", rule=rule,
                        evidence=evidence, reason=f"vLLM {probe.vllm_version} < {minimum}",
                        action=f"{ROUTE_IMAGE} with vLLM >= {minimum}")
    return finding(check, Status.PASS, ctx.host, observed=observed, expected=f">= {minimum}", rule=rule,
                    evidence=evidence, action="none")


@dataclass(frozen=True)
class _AtWork:
    """The image one GPU node runs, as content: its image ID (hex, no `sha256:`; None when only a repo digest was
    read), the manifest digests it is known by (its RepoDigests; docker's containerd image store reports the
    manifest digest as the ID), and its architecture when known."""

    image_id: str | None
    manifests: frozenset[str]
    architecture: str | None
    shown: str          # what observed/reason print for it

    def same_as(self, other: _AtWork) -> bool:
        """The same image: equal IDs (`sha256:` or bare hex alike: docker, podman); or one's ID is a manifest digest
        the other was pulled by (a containerd image store beside a classic one); or, where a node knows only a repo
        digest (crictl), a shared manifest digest. A digest shared on another architecture is another image."""
        if self.image_id and other.image_id and self.image_id == other.image_id:
            return True
        arch_ok = not (self.architecture and other.architecture and self.architecture != other.architecture)
        if arch_ok and ((self.image_id and self.image_id in other.manifests)
                        or (other.image_id and other.image_id in self.manifests)):
            return True
        return arch_ok and (self.image_id is None or other.image_id is None) and bool(self.manifests & other.manifests)


def _judged(inspect: ImageInspect | None) -> _AtWork | None:
    if inspect is None or not inspect.id:
        return None
    return _AtWork(digest_hex(inspect.id), frozenset(digest_hex(d) for d in inspect.digests), inspect.architecture,
                   inspect.id)


def _image_at_work(ctx: NodeContext) -> tuple[_AtWork | None, str, str | None]:
    """(the image, where it was read, why unread) of one GPU node: the image its vLLM container runs (the server's,
    or a multi-node worker's headless vLLM: live_process evidence, parsers/live.py), else the configured image as
    the node inspected it (before a launch, or where the server is a host process). A container that runs vLLM
    but whose image could not be read gives no image and says why: the configured one is never put in its place.
    The running image takes the judged image's RepoDigests and architecture only where it is that image."""
    record = ctx.rec("live_process")
    judged = _judged(ctx.inspect())
    if record.present and (hidden := hidden_server(record.stdout)):
        return None, "the serving process (not visible to this user)", f"{hidden}; {MAKE_VISIBLE}"
    if record.present:
        for read, role in ((running_container, "the serving container"),
                           (headless_container, "the headless worker's container")):
            running = read(record.stdout)
            if running is None or not running.id:
                continue
            where = f"{role} {running.id[:12]} ({running.engine})"
            if running.image_id:
                image_id = digest_hex(running.image_id)
                if judged is not None and judged.image_id == image_id:
                    return replace(judged, shown=running.image_id), where, None
                return _AtWork(image_id, frozenset(), None, running.image_id), where, None
            if running.image_digest:
                digest = digest_hex(running.image_digest)
                if judged is not None and digest in judged.manifests:
                    return replace(judged, shown=running.image_digest), where, None
                return _AtWork(None, frozenset({digest}), None, running.image_digest), where, None
            return None, where, f"{where}: image not read ({running.reason})"
    return judged, f"the configured image {ctx.image_ref}", None


def _groups(images: dict[str, _AtWork]) -> list[list[str]]:
    """The hosts that run one image, grouped (same_as, closed over chains), in the nodes' order."""
    groups: list[list[str]] = []
    for host, image in images.items():
        joined = [g for g in groups if any(images[h].same_as(image) for h in g)]
        merged = [h for g in joined for h in g] + [host]
        groups = [g for g in groups if g not in joined] + [merged]
    return groups


def check_image_uniform(contexts: list[NodeContext]) -> Finding:
    """Cluster level: every GPU node runs the same image. Each node can pass compat.image_identity
    on its own with a moving tag while one of them pulled it on another day; one run would then judge
    several images under one name. Where a node's vLLM container was read (attached: the server, and a worker's
    headless vLLM), the image it runs is compared, not only the one the inventory names (issue 28). Compared on
    content: the image ID, or the manifest digest where one node's store reports that as the ID (issue 41)."""
    check = "compat.image_uniform"
    containerised = [ctx for ctx in contexts if ctx.containerised]
    if len(containerised) < 2:
        return not_applicable(check, None, "fewer than two containerised GPU nodes: nothing to compare")
    evidence = [p for ctx in containerised for p in ctx.paths("image_inspect") + ctx.paths("live_process")]
    images: dict[str, _AtWork | None] = {}
    read_from: dict[str, str] = {}
    unread: dict[str, str] = {}
    for ctx in containerised:
        images[ctx.host], read_from[ctx.host], why = _image_at_work(ctx)
        if why:
            unread[ctx.host] = why
    if unread:
        return finding(check, Status.INCONCLUSIVE, None, observed={"read_from": read_from, "unread": unread},
                       expected="1 image ID", rule="one image ID on every GPU node of the run", evidence=evidence,
                       consequence=Consequence.REBUILD,
                       reason="the image a running vLLM container runs is unknown on "
                              + "; ".join(f"{h} ({w})" for h, w in sorted(unread.items())),
                       action="let the Ansible user read the container runtime on these nodes (docker/podman group, "
                              "crictl for pods, or become) and re-run accept.yml")
    unknown = [h for h, i in images.items() if i is None]
    if unknown:
        return missing(check, None, f"no image inspect from {unknown}", evidence=evidence)
    known = {h: i for h, i in images.items() if i is not None}
    groups = _groups(known)
    rule = ("one image on every GPU node of the run (the running container's where one was read), compared on "
            "content: the image ID, or a manifest digest where a containerd image store reports it as the ID")
    expected = "1 image ID"
    observed = {"images": {known[hosts[0]].shown: hosts for hosts in groups}, "read_from": read_from}
    if len(groups) == 1:
        return finding(check, Status.PASS, None, observed=observed, expected=expected, rule=rule,
                       evidence=evidence, consequence=Consequence.REBUILD, action="none")
    # The odd nodes: all but the largest group; on a tie (two nodes), the group running the configured image stays.
    configured = [j for j in (_judged(ctx.inspect()) for ctx in containerised) if j is not None]
    keep = max(groups, key=lambda hosts: (len(hosts), any(known[hosts[0]].same_as(c) for c in configured)))
    odd = [hosts for hosts in groups if hosts is not keep]
    return finding(check, Status.FAIL, None, observed=observed, expected=expected, rule=rule,
                   evidence=evidence, consequence=Consequence.REBUILD,
                   reason=f"{len(groups)} different images under one reference ("
                          + "; ".join(f"{h}: {read_from[h]}" for hosts in odd for h in hosts)
                          + "); the odd nodes: " + ", ".join(h for hosts in odd for h in hosts),
                   action=f"{ROUTE_IMAGE}: pull the pinned digest on every node (inventory vllm_image_digest) "
                          "and re-run accept.yml")
