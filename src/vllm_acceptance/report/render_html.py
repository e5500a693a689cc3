"""report.html: the self-contained document a platform lead signs.

Self-contained means air-gap safe: inline CSS, plots as inline SVG, no script, no external
URL of any kind (evidence links are relative paths inside the run directory). Everything from
the report is escaped by Jinja2 autoescape. A report of a run that died early (stages absent or
None, no findings of a family) renders with "not run" in place of the missing parts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from . import plots
from .checklist import SOURCES, coverage, coverage_summary

TEMPLATES = Path(__file__).parent / "templates"

VERDICT_TITLES = {
    "release": "Release",
    "limited_observation": "Limited observation",
    "rebuild_environment": "Rebuild environment",
    "expand_capacity": "Expand capacity",
    "incomplete": "Incomplete: no decision can be signed",
}
STATUS_RANK = {"fail": 0, "missing": 1, "inconclusive": 2, "warn": 3, "pass": 4, "not_applicable": 5}
FAMILIES = ("compat", "interconnect", "capacity", "cache", "agent")
SIGNOFF_FIELDS = [
    ("deployment_engineer", "Deployment engineer (ran the acceptance)"),
    ("reviewer", "Reviewer (SRE / platform lead)"),
    ("decision", "Decision"),
    ("date", "Date"),
    ("scenario_version", "Scenario (sample) version"),
    ("topology", "Hardware topology"),
    ("container", "Container (image and digest)"),
    ("monitoring_owner", "Monitoring owner"),
    ("rollback_rehearsed", "Restore to previous image rehearsed"),
]
# A scheme ("http:", "javascript:", "c:") or a protocol-relative "//": never a link in this report.
_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*:|//|\\\\)")


def fmt(value: Any, digits: int = 3) -> str:
    """One cell's text: numbers rounded, structures as compact JSON, absent as an em dash."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def fmt_pct(value: Any) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{value * 100:.1f}%" if value <= 1.0 else f"{value:.1f}%"


def evidence_href(path: str) -> str | None:
    """A relative link to a file of the run directory, or None when the path must not be a link."""
    if not isinstance(path, str) or not path or _SCHEME.match(path) or path.startswith(("/", "../")) \
            or "/../" in path:
        return None
    return quote(path, safe="/._-~")


def finding_id(f: dict[str, Any]) -> str:
    return f"{f.get('check')}@{f['host']}" if f.get("host") else str(f.get("check"))


def sorted_findings(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failing findings first, then by check and host, so the reader starts with what blocks."""
    return sorted(findings, key=lambda f: (STATUS_RANK.get(str(f.get("status")), 9), str(f.get("check")),
                                           str(f.get("host") or "")))


def host_names(report: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for h in report.get("hosts") or []:
        name = h.get("name") or h.get("host") if isinstance(h, dict) else h
        if name and str(name) not in names:
            names.append(str(name))
    for f in report.get("findings") or []:
        if f.get("host") and str(f["host"]) not in names and str(f.get("check", "")).startswith(
                ("compat.", "interconnect.")):
            names.append(str(f["host"]))
    for h in report.get("unreachable_hosts") or []:
        if h not in names:
            names.append(h)
    return names


def compat_matrix(report: dict[str, Any]) -> dict[str, Any]:
    """Nodes x compatibility checks; run-wide compat findings (no host) form their own row."""
    compat = [f for f in report.get("findings") or []
              if str(f.get("check", "")).startswith(("compat.", "interconnect."))]
    checks = sorted({str(f["check"]) for f in compat})
    rows = []
    unreachable = set(report.get("unreachable_hosts") or [])
    names = host_names(report)
    if any(not f.get("host") for f in compat):
        names = [*names, None]  # type: ignore[list-item]
    for host in names:
        cells = []
        for check in checks:
            found = [f for f in compat if f.get("check") == check and f.get("host") == host]
            if not found:
                cells.append({"status": "none", "text": "—", "title": "no finding for this node"})
                continue
            worst = min(found, key=lambda f: STATUS_RANK.get(str(f.get("status")), 9))
            title = f"observed: {fmt(worst.get('observed'))}\nexpected: {fmt(worst.get('expected'))}"
            if worst.get("reason"):
                title += f"\n{worst['reason']}"
            cells.append({"status": str(worst.get("status")), "text": str(worst.get("status")).replace("_", " "),
                          "title": title})
        rows.append({"host": host or "(run-wide)", "unreachable": host in unreachable, "cells": cells})
    return {"checks": checks, "rows": rows}


def checklist_chips(row: Any, report: dict[str, Any]) -> list[dict[str, str]]:
    """Matched findings grouped per check id: `compat.driver_branch x2`, coloured by the worst status."""
    by_id = {finding_id(f): str(f.get("status")) for f in report.get("findings") or []}
    groups: dict[str, list[tuple[str, str]]] = {}
    for m in row.matched:
        check, _, host = m.partition("@")
        groups.setdefault(check, []).append((host, by_id.get(m, "")))
    chips = []
    for check, members in groups.items():
        statuses = [s for _, s in members if s]
        worst = min(statuses, key=lambda s: STATUS_RANK.get(s, 9)) if statuses else ""
        hosts = [h for h, _ in members if h]
        text = f"{check} ×{len(members)}" if len(members) > 1 else (f"{check}@{hosts[0]}" if hosts else check)
        title = ", ".join(f"{h or '(run-wide)'}: {s or '-'}" for h, s in members)
        chips.append({"text": text, "status": worst, "title": title})
    return chips


def summary_counts(report: dict[str, Any]) -> dict[str, int]:
    counts = dict(report.get("summary") or {})
    if not counts:
        for f in report.get("findings") or []:
            counts[str(f.get("status"))] = counts.get(str(f.get("status")), 0) + 1
    return {k: v for k, v in sorted(counts.items(), key=lambda kv: STATUS_RANK.get(kv[0], 9)) if v}


def stage(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = (report.get("stages") or {}).get(name)
    return value if isinstance(value, dict) else None


def family_findings(report: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return sorted_findings([f for f in report.get("findings") or [] if str(f.get("check", "")).startswith(prefix)])


def signoff_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Given values, else what the run's evidence says (marked so), else an empty line to sign."""
    given = report.get("signoff") or {}
    derived = {"topology": derive_topology(report), "container": derive_container(report),
               "scenario_version": report.get("profile")}
    rows = []
    for key, label in SIGNOFF_FIELDS:
        if given.get(key):
            rows.append({"label": label, "value": fmt(given[key]), "derived": False})
        elif derived.get(key) and key in ("topology", "container"):
            rows.append({"label": label, "value": derived[key], "derived": True})
        else:
            rows.append({"label": label, "value": "", "derived": False})
    return rows


def derive_topology(report: dict[str, Any]) -> str | None:
    hosts = (stage(report, "preflight") or {}).get("hosts") or {}
    if not isinstance(hosts, dict) or not hosts:
        return (report.get("environment") or {}).get("topology") if isinstance(report.get("environment"), dict) \
            else None
    gpus = {f"{h.get('gpu_count', '?')} x {h.get('gpu_name', '?')}" for h in hosts.values() if isinstance(h, dict)}
    return f"{len(hosts)} node(s): " + ", ".join(sorted(gpus))


def derive_container(report: dict[str, Any]) -> str | None:
    hosts = (stage(report, "preflight") or {}).get("hosts") or {}
    images = {f"{h.get('image')}@{h.get('image_digest')}" if h.get("image_digest") else str(h.get("image"))
              for h in hosts.values() if isinstance(h, dict) and h.get("image")} if isinstance(hosts, dict) else set()
    return ", ".join(sorted(images)) or None


def env_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("profile", fmt(report.get("profile"))),
                                   ("profile file", fmt(report.get("profile_source")))]
    recipe = report.get("recipe") or {}
    if isinstance(recipe, dict):
        for key in ("source", "status", "checked"):
            if key in recipe:
                rows.append((f"recipe {key}", fmt(recipe[key])))
    env = report.get("environment") or {}
    if isinstance(env, dict):
        rows += [(str(k), fmt(v)) for k, v in sorted(env.items())]
    serve = stage(report, "serve") or {}
    for key in ("vllm_version", "model", "base_url", "max_model_len", "kv_cache_tokens", "max_concurrency", "ready_s"):
        if serve.get(key) is not None:
            rows.append((f"serve {key}", fmt(serve[key])))
    return rows


def node_cell(column: str, value: Any) -> dict[str, str]:
    """A digest is 71 characters: shown short so the node table fits, the full value in the tooltip."""
    text = fmt(value)
    if column == "image_digest" and len(text) > 24:
        return {"text": text[:19] + "…", "title": text}
    return {"text": text, "title": ""}


def preflight_rows(report: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    hosts = (stage(report, "preflight") or {}).get("hosts") or {}
    cols = ["driver_version", "driver_branch", "gpu_count", "gpu_name", "cuda_runtime", "vllm_version",
            "torch_version", "image", "image_digest", "fabric_manager"]
    rows = []
    if isinstance(hosts, dict):
        for host, data in sorted(hosts.items()):
            data = data if isinstance(data, dict) else {}
            rows.append({"host": host, "cells": [node_cell(c, data.get(c)) for c in cols]})
    return cols, rows


def load_view(report: dict[str, Any]) -> dict[str, Any] | None:
    load = stage(report, "load")
    if not load:
        return None
    steps = []
    for s in plots._steps(load):  # sorted, concurrency present
        steps.append({k: fmt(s.get(k)) for k in s} | {"max_kv_usage": fmt_pct(s.get("max_kv_usage")),
                                                       "meets_slo": s.get("meets_slo")})
    return {"contract": fmt(load.get("contract_concurrency")), "knee": fmt(load.get("knee")), "steps": steps}


def cache_view(report: dict[str, Any]) -> dict[str, Any] | None:
    cache = stage(report, "cache")
    if not cache:
        return None
    reqs = sorted([r for r in cache.get("requests") or [] if isinstance(r, dict)],
                  key=lambda r: (r.get("session") or 0, plots.KIND_ORDER.index(r["kind"])
                                 if r.get("kind") in plots.KIND_ORDER else 9))
    rows = [{k: fmt(r.get(k)) for k in ("session", "kind", "prompt_tokens", "queries", "hits", "cached_tokens",
                                          "prefill_computed_tokens", "prefill_time_s", "ttft_s")}
            | {"clean": r.get("clean")} for r in reqs]
    return {"block_size": fmt(cache.get("block_size")), "shared": fmt(cache.get("shared_prefix_tokens")),
            "expected": fmt(cache.get("expected_hot_hits")), "rows": rows}


def agent_view(report: dict[str, Any]) -> dict[str, Any] | None:
    agent = stage(report, "agent")
    if not agent:
        return None
    rates = agent.get("rates") or {}
    cases = [c for c in agent.get("cases") or [] if isinstance(c, dict)]
    return {"cases": sorted(cases, key=lambda c: (STATUS_RANK.get(str(c.get("status")), 9), str(c.get("id")))),
            "rates": [("schema accuracy", fmt_pct(rates.get("schema_accuracy"))),
                      ("trigger consistency", fmt_pct(rates.get("trigger_consistency"))),
                      ("format error rate", fmt_pct(rates.get("format_error_rate")))]}


def limit_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    limits = report.get("limits") or {}
    if not isinstance(limits, dict):
        return []
    rows = []
    for key, value in sorted(limits.items()):
        if isinstance(value, dict):
            rows += [(f"{key}.{k}", fmt(v)) for k, v in sorted(value.items())]
        else:
            rows.append((key, fmt(value)))
    return rows


def context(report: dict[str, Any]) -> dict[str, Any]:
    """Everything the template shows, computed defensively from a possibly partial report."""
    verdict = str(report.get("verdict") or "incomplete")
    rows = coverage(report)
    limits = report.get("limits") if isinstance(report.get("limits"), dict) else {}
    return {
        "r": report,
        "verdict": verdict,
        "verdict_title": VERDICT_TITLES.get(verdict, verdict),
        "findings": sorted_findings(list(report.get("findings") or [])),
        "counts": summary_counts(report),
        "matrix": compat_matrix(report),
        "gates": report.get("gates") or {},
        "limits": limit_rows(report),
        "env": env_rows(report),
        "preflight": preflight_rows(report),
        "serve": stage(report, "serve"),
        "load": load_view(report),
        "cache": cache_view(report),
        "agent": agent_view(report),
        "svgs": plots.all_svgs(report.get("stages") or {}, report.get("slo") or (limits or {}).get("slo")),
        "families": {fam: family_findings(report, fam + ".") for fam in FAMILIES},
        "checklist": [{"item": row.item, "status": row.status, "detail": row.detail,
                       "chips": checklist_chips(row, report)} for row in rows],
        "host_count": len([h for h in host_names(report)]),
        "checklist_counts": coverage_summary(rows),
        "sources": SOURCES,
        "signoff": signoff_rows(report),
        "lineage": report.get("lineage") if isinstance(report.get("lineage"), dict) else None,
    }


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.filters["pct"] = fmt_pct
    env.filters["href"] = evidence_href
    env.filters["fid"] = finding_id
    return env


def render_html(report: dict[str, Any]) -> str:
    return environment().get_template("report.html.j2").render(**context(report))
