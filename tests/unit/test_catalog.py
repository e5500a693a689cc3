"""The check catalog: one entry per id, every id the code writes is in it, docs/checks.md is current."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pytest

from vllm_acceptance import cli
from vllm_acceptance.core.findings import Finding, Status, read_findings, write_findings
from vllm_acceptance.report.checklist import CHECKLIST
from vllm_acceptance.rules import catalog_docs, registry

REPO = Path(__file__).resolve().parents[2]
# Literal check ids where code builds findings or alerts: Finding(check="x"), Finding("x", ...),
# get("x"), missing("x", ...), not_applicable("x", ...), _finding("x", ...), check="x", CHECK* = "x".
ID_SITES = re.compile(
    r"""(?:check\s*=\s*|Finding\(\s*|(?:registry|catalog)\.get\(\s*|\bmissing\(\s*|not_applicable\(\s*|_finding\(\s*|CHECK\w*\s*=\s*)"""
    r"""["']((?:compat|capacity|cache|agent|interconnect)\.[a-z_.]+)["']""")


def catalog_ids() -> set[str]:
    return {c.id for c in catalog_docs.checks()}


def test_docs_checks_md_is_generated_from_the_catalog() -> None:
    text = (REPO / catalog_docs.DOC_PATH).read_text()
    assert text == catalog_docs.as_markdown(), (
        "docs/checks.md is stale: run `vllm-acceptance checks --format md > docs/checks.md`")


def test_every_literal_check_id_in_the_code_is_catalogued() -> None:
    sites: dict[str, list[str]] = {}
    for root in ("src", "plugins"):
        for path in (REPO / root).rglob("*.py"):
            for match in ID_SITES.finditer(path.read_text()):
                sites.setdefault(match.group(1), []).append(str(path.relative_to(REPO)))
    assert len(sites) > 40, "the scan found too few ids: its pattern no longer matches the code"
    unknown = {cid: where for cid, where in sites.items() if cid not in catalog_ids()}
    assert not unknown, f"check ids used in code but not in rules/catalog.py: {unknown}"


def test_a_finding_outside_the_catalog_is_a_programming_error() -> None:
    with pytest.raises(registry.UnknownCheck, match="not in the catalog"):
        Finding("compat.no_such_check", Status.PASS)
    with pytest.raises(registry.UnknownCheck):
        registry.get("capacity.no_such_check")


def test_findings_read_back_from_an_older_run_keep_their_ids(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps([{"check": "compat.nccl_bandwidth", "status": "pass"}]))
    assert [f.check for f in read_findings(path)] == ["compat.nccl_bandwidth"]
    write_findings(tmp_path / "again.json", read_findings(path))
    assert read_findings(tmp_path / "again.json")[0].check == "compat.nccl_bandwidth"


def test_the_result_builder_fills_the_catalog_fields() -> None:
    check = registry.get("compat.driver_module")
    failed = check.fail("gpu-01", observed={"nvidia_modules": []}, reason="not loaded", action="modprobe nvidia")
    assert (failed.check, failed.status, failed.host) == ("compat.driver_module", Status.FAIL, "gpu-01")
    assert failed.title == check.title and failed.rule == check.rule
    assert failed.consequence == check.consequence
    assert check.passed("gpu-01").action == "none"
    gone = check.missing("gpu-01", "lsmod did not answer", evidence=["evidence/nodes/gpu-01/lsmod.txt"])
    assert gone.status == Status.MISSING and gone.evidence == ["evidence/nodes/gpu-01/lsmod.txt"]
    assert check.passed("gpu-01", rule="kernel module nvidia loaded (R580)").rule.endswith("(R580)")


def test_an_id_is_registered_once_under_a_known_stage() -> None:
    registry.get("compat.preflight")
    with pytest.raises(ValueError, match="registered twice"):
        registry.register("compat.preflight", title="t", rule="r", consequence="rebuild_environment",
                          evidence="e", source="s", stage="preflight")
    with pytest.raises(ValueError, match="stage"):
        registry.register("compat.brand_new", title="t", rule="r", consequence="rebuild_environment",
                          evidence="e", source="s", stage="somewhere")
    assert "compat.brand_new" not in registry.CHECKS


def test_every_entry_says_what_it_proves() -> None:
    for check in catalog_docs.checks():
        assert check.title and check.rule and check.evidence and check.source, check.id
        assert check.family in registry.CATALOG_FAMILIES


# A source article cited by its bare number ("001: ...", "000/001: ...", "...; 004: ...",
# "001 'Stable observation': ...") instead of its anchor docs/sources.md#a001.
BARE_ARTICLE = re.compile(r"(?:^|;\s*)\d{3}(?:[:/]|\s')")
# docs/sources.md#a000, #a001: one citation, possibly of several anchors of that file.
SOURCES_CITATION = re.compile(r"docs/sources\.md((?:#[\w-]+(?:,\s*)?)+)")


def sources_md_anchors() -> set[str]:
    """The anchors of docs/sources.md: explicit ids and the slugs GitHub gives its headings."""
    text = (REPO / "docs" / "sources.md").read_text()
    anchors = set(re.findall(r"""\bid=["']([\w-]+)["']""", text))
    for heading in re.findall(r"^#{1,6}\s+(.+)$", text, flags=re.MULTILINE):
        plain = re.sub(r"<[^>]+>", "", heading).strip().lower()
        anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", plain)))
    return anchors


def citation_problems(source: str, anchors: set[str]) -> list[str]:
    problems = [f"bare article number {m.group(0).strip(';').strip()!r}: cite docs/sources.md#aNNN"
                for m in BARE_ARTICLE.finditer(source)]
    for match in SOURCES_CITATION.finditer(source):
        problems += [f"docs/sources.md#{name} has no such anchor"
                     for name in re.findall(r"#([\w-]+)", match.group(1)) if name not in anchors]
    return problems


def test_sources_cite_articles_by_their_anchor_in_docs_sources_md() -> None:
    anchors = sources_md_anchors()
    assert {"a000", "a001", "a003", "a004", "nvlink-domain"} <= anchors
    bad = {c.id: problems for c in catalog_docs.checks() if (problems := citation_problems(c.source, anchors))}
    assert not bad, f"catalog sources that cite no real anchor of docs/sources.md: {bad}"


def test_the_citation_check_catches_bare_numbers_and_unknown_anchors() -> None:
    anchors = sources_md_anchors()
    assert citation_problems("docs/sources.md#a000, #a001: image identity", anchors) == []
    assert citation_problems("recipe: multi-node settings; docs/sources.md#a001: NCCL", anchors) == []
    assert len(citation_problems("001: save the state first", anchors)) == 1
    assert len(citation_problems("000/001: image identity", anchors)) == 1
    assert len(citation_problems("recipe: min_vllm_version; 001: vLLM install source", anchors)) == 1
    assert len(citation_problems("001 'Stable observation': recurrence", anchors)) == 1
    assert citation_problems("docs/sources.md#a002: no such article", anchors) == [
        "docs/sources.md#a002 has no such anchor"]
    assert citation_problems("docs/sources.md#a000, #a009: one good, one bad", anchors) == [
        "docs/sources.md#a009 has no such anchor"]


def test_checklist_patterns_all_name_catalogued_checks() -> None:
    ids = catalog_ids()
    stale = [(item.ref, pattern) for item in CHECKLIST for pattern in item.checks
             if not pattern.startswith(("report:", "confirm:")) and not fnmatch.filter(ids, pattern)]
    assert not stale, f"checklist lines mapped to check ids that do not exist: {stale}"


def test_cli_lists_the_catalog_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["checks", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in rows} == catalog_ids()
    assert all(r["family"] and r["consequence"] and r["rule"] for r in rows)
    assert cli.main(["checks", "--family", "cache"]) == 0
    table = capsys.readouterr().out
    assert "cache.hot_reuse" in table and "compat.driver_branch" not in table


def test_every_registered_check_is_produced_somewhere() -> None:
    """A catalog entry no code builds is a check that can neither pass nor fail. Ids are found as literals in
    the package and the modules; the probe-stopped ids are built from each probe's family (core/probes.py)."""
    from vllm_acceptance.core.probes import probe_families
    from vllm_acceptance.rules import registry

    src = Path(__file__).resolve().parents[2]
    text = "\n".join(p.read_text() for base in ("src/vllm_acceptance", "plugins") for p in (src / base).rglob("*.py")
                     if p.name != "catalog.py")
    built = {f"{family}.probe" for family in probe_families()}
    assert built <= set(registry.CHECKS)
    unproduced = [cid for cid in sorted(registry.CHECKS) if cid not in built
                  and f'"{cid}"' not in text and f"'{cid}'" not in text]
    assert not unproduced, f"registered but never built: {unproduced}"
