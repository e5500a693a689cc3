"""The lineage of a self-built (experimental) image, its reproducibility, its results against the official
image, and where it may be released (docs/acceptance.md "Remediation playbooks", docs/sources.md#a001).

    vllm-acceptance lineage PROFILE [--build LINEAGE.json] [--rebuild LINEAGE.json] [--run RUN] [--official RUN]

- ``compat.lineage.complete``: every lineage field recorded (a missing one names itself), the exit date ahead;
- ``compat.lineage.reproducible``: a rebuild from the recorded inputs (playbooks/build_image.yml with
  ``build_image_reproduce_from``) gives the recorded digest, or the differing inputs are listed;
- ``compat.lineage.official_diff``: the experimental run's findings against the last run of the official
  (base) profile on the same inventory; a check passing there and failing here is a regression;
- ``compat.lineage.release_scope``: ``release`` only on the image's own experimental profile (a name other
  than its base profile), with complete lineage, a reproducible build and the exit date ahead; never for the
  official profile. verdict.decide keeps an experimental release only when this check passed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.findings import Finding, Status
from ..rules.registry import get as catalog_get

# Each field a self-built image's lineage must carry (docs/sources.md#a001 and docs/acceptance.md); `patches` may be
# an empty list (no patch applied), every other list must name at least one entry.
LINEAGE_FIELDS: dict[str, str] = {
    "source_repo": "the repository the image was built from",
    "source_branch": "the branch (or tag) the build checked out",
    "source_commit": "the commit actually built",
    "dockerfile": "the Dockerfile path in the source",
    "dependency_sources": "where dependencies came from (package indexes, base image)",
    "lock_files": "the dependency lock files used",
    "compile_options": "compile options (build args such as CUDA_VERSION, TORCH_CUDA_ARCH_LIST)",
    "patches": "the patches applied (an empty list when none)",
    "build_log": "the build log",
    "image_digest": "the built image's digest",
    "rollback_image": "the image to go back to",
    "owner": "the owner of the custom stack",
    "exit_date": "the date the experimental route ends",
}
EMPTY_ALLOWED = ("patches",)
# Inputs whose difference explains a different digest on a rebuild.
INPUT_FIELDS = ("source_repo", "source_commit", "dockerfile", "dependency_sources", "lock_files", "compile_options",
                "patches", "inputs")


def missing_fields(lineage: Mapping[str, Any]) -> list[str]:
    out = []
    for key in LINEAGE_FIELDS:
        value = lineage.get(key)
        if key in EMPTY_ALLOWED and isinstance(value, list):
            continue
        if value is None or (isinstance(value, str | list | dict) and not value):
            out.append(key)
    return out


def lineage_complete(lineage: Mapping[str, Any] | None, *, today: dt.date | None = None) -> Finding:
    check = catalog_get("compat.lineage.complete")
    today = today or dt.datetime.now(dt.UTC).date()
    if not isinstance(lineage, Mapping) or not lineage:
        return check.fail(None, observed=None, expected=list(LINEAGE_FIELDS),
                          reason="no lineage recorded: " + ", ".join(LINEAGE_FIELDS),
                          action="record the lineage (playbooks/build_image.yml writes it) before any decision")
    absent = missing_fields(lineage)
    problems = [f"{k} missing ({LINEAGE_FIELDS[k]})" for k in absent]
    exit_date = lineage.get("exit_date")
    if exit_date:
        try:
            if dt.date.fromisoformat(str(exit_date)) < today:
                problems.append(f"exit_date {exit_date} has passed: retire the image or set a new exit date")
        except ValueError:
            problems.append(f"exit_date {exit_date!r} is not YYYY-MM-DD")
    observed = {k: lineage.get(k) for k in LINEAGE_FIELDS}
    if problems:
        return check.fail(None, observed=observed, expected=list(LINEAGE_FIELDS), reason="; ".join(problems),
                          action="record the missing fields (build_image.yml variables) and rebuild the profile")
    return check.passed(None, observed=observed, expected=list(LINEAGE_FIELDS),
                        reason=f"every lineage field recorded; exit date {exit_date}")


def load_lineage(path: Path | None) -> dict[str, Any] | None:
    if path is None or not Path(path).is_file():
        return None
    data = json.loads(Path(path).read_text())
    return data if isinstance(data, dict) else None


def reproducible(recorded: Mapping[str, Any] | None, rebuilt: Mapping[str, Any] | None,
                 *, rebuilt_path: str | None = None) -> Finding:
    """The recorded build against a rebuild from its recorded inputs (both lineage.json records)."""
    check = catalog_get("compat.lineage.reproducible")
    evidence = [rebuilt_path] if rebuilt_path else []
    if not recorded:
        return check.missing(None, "no lineage of the original build recorded")
    if not rebuilt:
        return check.missing(None, "no rebuild from the recorded inputs: run playbooks/build_image.yml -e "
                                   "build_image_reproduce_from=BUILD_DIR/evidence/build/lineage.json and compare",
                             evidence=evidence)
    want, got = recorded.get("image_digest"), rebuilt.get("image_digest")
    differences = [{"field": k, "recorded": recorded.get(k), "rebuilt": rebuilt.get(k)}
                   for k in INPUT_FIELDS if recorded.get(k) != rebuilt.get(k)]
    observed = {"recorded_digest": want, "rebuilt_digest": got, "differences": differences}
    if not want or not got:
        return check.missing(None, f"a digest is missing (recorded {want!r}, rebuilt {got!r})", evidence=evidence)
    if want == got:
        return check.passed(None, observed=observed, expected=want, evidence=evidence,
                            reason=f"the rebuild from the recorded inputs gives the same digest {want}")
    why = ("inputs differ: " + "; ".join(f"{d['field']}: {_short(d['recorded'])} -> {_short(d['rebuilt'])}"
                                          for d in differences)
           if differences else "the same recorded inputs give another digest: the build is not deterministic "
                               "(unpinned downloads, timestamps in layers)")
    return check.fail(None, observed=observed, expected=want, evidence=evidence,
                      reason=f"digest {got} is not the recorded {want}: {why}",
                      action="pin what differs (lock files, base image digest, build args) and rebuild; a build that "
                             "cannot be reproduced never becomes a long-term base")


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _key(f: Mapping[str, Any]) -> str:
    return f"{f.get('check')}@{f['host']}" if f.get("host") else str(f.get("check"))


def official_diff(experimental: Mapping[str, Any] | None, official: Mapping[str, Any] | None,
                  *, official_path: str | None = None) -> Finding:
    """The experimental run's finding statuses against the official run's (both report.json dicts)."""
    check = catalog_get("compat.lineage.official_diff")
    evidence = [official_path] if official_path else []
    if not experimental:
        return check.missing(None, "no experimental run to compare")
    if not official:
        return check.missing(None, "no run of the official (base) profile on this inventory to compare with: run "
                                   "the acceptance with the official profile first", evidence=evidence)
    fo = {_key(f): f.get("status") for f in official.get("findings") or []}
    fe = {_key(f): f.get("status") for f in experimental.get("findings") or []}
    changed = [{"id": k, "official": fo.get(k), "experimental": fe.get(k)}
               for k in sorted(set(fo) | set(fe)) if fo.get(k) != fe.get(k)]
    regressions = [c for c in changed if c["official"] == "pass" and c["experimental"] in ("fail", "missing",
                                                                                           "inconclusive")]
    observed = {"official_run": official.get("run_id"), "official_verdict": official.get("verdict"),
                "experimental_verdict": experimental.get("verdict"), "changed": changed}
    if regressions:
        return check.fail(None, observed=observed, expected="no check passing on the official image fails here",
                          evidence=evidence, reason="worse than the official image: " + ", ".join(
                              f"{c['id']} pass -> {c['experimental']}" for c in regressions),
                          action="fix the self-built image (or its profile) where it regresses")
    if changed:
        return check.warn(None, observed=observed, evidence=evidence,
                          expected="the same results as the official image",
                          reason="differs from the official image: " + ", ".join(
                              f"{c['id']} {c['official']} -> {c['experimental']}" for c in changed),
                          action="review each difference in the lineage record")
    return check.passed(None, observed=observed, evidence=evidence, expected="the same results as the official image",
                        reason=f"every finding's status equals the official run {official.get('run_id')}")


def last_official_run(inventory_dir: Path, base_profile: str, *, exclude: Path | None = None) -> Path | None:
    """The newest run directory of reports/<inventory>/ whose report.json was judged on the base profile."""
    best: tuple[str, Path] | None = None
    for report in sorted(Path(inventory_dir).glob("*/report.json")):
        run_dir = report.parent
        if run_dir.is_symlink() or (exclude is not None and run_dir.resolve() == Path(exclude).resolve()):
            continue
        try:
            data = json.loads(report.read_text())
        except ValueError:
            continue
        if data.get("profile") == base_profile and not data.get("experimental"):
            stamp = str(data.get("finished") or data.get("run_id") or "")
            if best is None or stamp > best[0]:
                best = (stamp, run_dir)
    return best[1] if best else None


def off_recipe(name: str, deviations: list[Mapping[str, Any]]) -> str:
    """The deviations from the recipe (or official profile) a profile names, in words (issue 42, item 2)."""
    return (f"profile {name}'s image and minimums are not its recipe's: " + "; ".join(
        f"{d.get('field')} {d.get('profile')!r} (official {d.get('official')!r}, {d.get('source')})"
        for d in deviations))


def release_scope(document: Mapping[str, Any], checks: Mapping[str, Finding],
                  deviations: list[Mapping[str, Any]] | None = None) -> Finding:
    """May a `release` of this run stand? Only on the image's own experimental profile, never the official one.
    `deviations`: where the profile's image, CUDA, driver or vLLM minimums or forbidden suffixes differ from the
    recipe or official profile it names (core/profile.py, recipe/official.py): such a profile not declared
    experimental is never released (as the recipe's deployment or otherwise)."""
    check = catalog_get("compat.lineage.release_scope")
    name = str(document.get("name") or "")
    lineage = document.get("lineage") if isinstance(document.get("lineage"), Mapping) else None
    if not document.get("experimental") and deviations:
        return check.fail(None, observed={"profile": name, "experimental": False,
                                          "recipe_deviations": [dict(d) for d in deviations]},
                          expected="the recipe's image and minimums, or a profile declared experimental with the "
                                   "image's lineage",
                          reason=off_recipe(name, deviations) + ": never released as the recipe's deployment",
                          action="run the recipe's image and minimums (drop the overrides), or declare the profile "
                                 "experimental: true with the image's lineage (playbooks/build_image.yml writes it)")
    if not document.get("experimental"):
        if lineage:
            return check.fail(None, observed={"profile": name, "lineage": True},
                              expected="a self-built image only on an experimental profile",
                              reason=f"profile {name} carries a self-built image's lineage but is not experimental: "
                                     "a self-built image is never released as the official profile",
                              action="run it on its own experimental profile (playbooks/build_image.yml writes it)")
        return check.not_applicable(None, f"official profile {name}: no self-built image")
    base = str((lineage or {}).get("base_profile") or "")
    problems = []
    if not base or base == name:
        problems.append(f"the experimental profile is named like its base profile ({name!r}): it would stand for "
                        "the official profile")
    for key in ("compat.lineage.complete", "compat.lineage.reproducible"):
        finding = checks.get(key)
        if finding is None or finding.status != Status.PASS:
            problems.append(f"{key} {finding.status.value if finding else 'not judged'}"
                            + (f": {finding.reason}" if finding and finding.reason else ""))
    observed = {"profile": name, "base_profile": base or None, "exit_date": (lineage or {}).get("exit_date")}
    if problems:
        return check.fail(None, observed=observed, expected="its own experimental profile, lineage complete, "
                                                            "build reproducible",
                          reason="release not allowed: " + "; ".join(problems),
                          action="at most limited observation until every precondition holds")
    return check.passed(None, observed=observed, expected="its own experimental profile",
                        reason=f"release allowed on the experimental profile {name} only (EXPERIMENTAL, owner "
                               f"{lineage.get('owner')}, exit {lineage.get('exit_date')}); never as acceptance of "
                               f"the official profile {base}")


def lineage_checks(document: Mapping[str, Any], *, build: Mapping[str, Any] | None = None,
                   rebuilt: Mapping[str, Any] | None = None, rebuilt_path: str | None = None,
                   run: Mapping[str, Any] | None = None, official: Mapping[str, Any] | None = None,
                   official_path: str | None = None, today: dt.date | None = None,
                   deviations: list[Mapping[str, Any]] | None = None) -> dict[str, Finding]:
    """Every lineage check of one experimental profile, or of one whose image and minimums are not its recipe's
    (`deviations`), and of its run, when given."""
    lineage = document.get("lineage") if isinstance(document.get("lineage"), Mapping) else {}
    merged = {**(build or {}), **{k: v for k, v in (lineage or {}).items() if v not in (None, "", [])}}
    if "patches" in (build or {}) and "patches" not in merged:
        merged["patches"] = build["patches"]  # type: ignore[index]
    checks = {"compat.lineage.complete": lineage_complete(merged if (lineage or build) else None, today=today),
              "compat.lineage.reproducible": reproducible(build or (merged or None), rebuilt,
                                                          rebuilt_path=rebuilt_path)}
    if run is not None:
        checks["compat.lineage.official_diff"] = official_diff(run, official, official_path=official_path)
    checks["compat.lineage.release_scope"] = release_scope(document, checks, deviations)
    return checks
