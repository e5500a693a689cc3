"""report.html: the self-contained document a platform lead signs.

Self-contained means air-gap safe: inline CSS, plots as inline SVG, no script, no external
URL of any kind (evidence links are relative paths inside the run directory). Everything from
the report is escaped by Jinja2 autoescape. A report of a run that died early (stages absent or
None, no findings of a family) renders with "not run" in place of the missing parts.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2

from ..core.stage_details import AgentDetails, StageDetails
from ..rules import registry
from . import plots, views
from .checklist import SOURCES, coverage, coverage_groups, coverage_summary
from .signoff import CONFIRM_FIELDS, sign_command

TEMPLATES = Path(__file__).parent / "templates"

VERDICT_TITLES = {
    "release": "Release",
    "limited_observation": "Limited observation",
    "rebuild_environment": "Rebuild environment",
    "expand_capacity": "Expand capacity",
    "incomplete": "Incomplete: no decision can be signed",
}
STATUS_RANK = {"fail": 0, "missing": 1, "inconclusive": 2, "to_confirm": 3, "warn": 3, "pass": 4, "not_applicable": 5}
# The report's family sections in reading order; a family the registry adds (a new probe's) comes last.
_FAMILY_ORDER = ("compat", "interconnect", "capacity", "cache", "agent")
FAMILIES = _FAMILY_ORDER + tuple(f for f in registry.FAMILIES if f not in _FAMILY_ORDER)
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
    ("limits", "Limits signed (traffic cap)"),
    ("note", "Note"),
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


CELL_MARK = {"pass": "✓", "fail": "✗", "warn": "!", "missing": "?", "inconclusive": "?", "not_applicable": "n/a",
             "none": "—"}
DEVIATING = ("fail", "missing", "inconclusive", "warn")


def compat_findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report.get("findings") or [] if str(f.get("check", "")).startswith(("compat.", "interconnect."))]


def matrix_cell(found: list[dict[str, Any]]) -> dict[str, str]:
    if not found:
        return {"status": "none", "text": CELL_MARK["none"], "title": "no finding for this node"}
    worst = min(found, key=lambda f: STATUS_RANK.get(str(f.get("status")), 9))
    status = str(worst.get("status"))
    title = (f"{status}\nobserved: {short_text(worst.get('observed'), 300)}"
             f"\nexpected: {short_text(worst.get('expected'), 200)}")
    if worst.get("reason"):
        title += f"\n{worst['reason']}"
    return {"status": status, "text": CELL_MARK.get(status, status), "title": title}


def compat_matrix(report: dict[str, Any]) -> dict[str, Any]:
    """Nodes x compatibility checks, readable for 1 to 64+ nodes at 1280 px.

    Nodes with the same status in every column form one row ("62 nodes"); rows with a deviating cell
    come first, then the rest by size. Every deviating cell is also listed with observed and expected.
    The full per-node grid is kept, folded. Run-wide compat findings (no host) form their own row.
    """
    compat = compat_findings(report)
    checks = sorted({str(f["check"]) for f in compat})
    unreachable = set(report.get("unreachable_hosts") or [])
    names: list[str | None] = list(host_names(report))
    if any(not f.get("host") for f in compat):
        names.append(None)
    by_key: dict[tuple[str | None, str], list[dict[str, Any]]] = {}
    for f in compat:
        by_key.setdefault((f.get("host"), str(f["check"])), []).append(f)
    rows, deviations = [], []
    for host in names:
        cells = [matrix_cell(by_key.get((host, c), [])) for c in checks]
        label = host or "(run-wide)"
        rows.append({"host": label, "unreachable": host in unreachable, "cells": cells})
        for check, cell in zip(checks, cells, strict=True):
            if cell["status"] in DEVIATING:
                worst = min(by_key[(host, check)], key=lambda f: STATUS_RANK.get(str(f.get("status")), 9))
                deviations.append({"host": label, "check": check, "status": cell["status"],
                                   "observed": short_text(worst.get("observed"), 160),
                                   "expected": short_text(worst.get("expected"), 120),
                                   "action": worst.get("action"), "fid": finding_id(worst)})
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = (row["unreachable"], tuple(c["status"] for c in row["cells"]))
        group = groups.setdefault(key, {"hosts": [], "cells": row["cells"], "unreachable": row["unreachable"]})
        group["hosts"].append(row["host"])
    grouped = []
    for group in groups.values():
        bad = sum(1 for c in group["cells"] if c["status"] in DEVIATING) + (1 if group["unreachable"] else 0)
        hosts = group["hosts"]
        grouped.append({**group, "deviating": bad > 0, "count": len(hosts),
                        "label": hosts[0] if len(hosts) == 1 else f"{len(hosts)} nodes alike",
                        "members": host_range(hosts)})
    grouped.sort(key=lambda g: (not g["deviating"], g["count"] if g["deviating"] else -g["count"], g["label"]))
    rows.sort(key=lambda r: (not (r["unreachable"] or any(c["status"] in DEVIATING for c in r["cells"])), r["host"]))
    deviations.sort(key=lambda d: (STATUS_RANK.get(d["status"], 9), d["check"], d["host"]))
    return {"checks": checks, "columns": [matrix_column(c) for c in checks], "groups": grouped, "rows": rows,
            "deviations": deviations, "nodes": len([n for n in names if n])}


def matrix_column(check: str) -> dict[str, str]:
    fam, _, name = check.partition(".")
    return {"id": check, "fam": fam, "name": name.replace("_", " ").replace(".", " · ")}


def host_range(hosts: list[str], limit: int = 12) -> str:
    """'node01 … node62' style summary of many names; all of them up to `limit`."""
    if len(hosts) <= limit:
        return ", ".join(hosts)
    return ", ".join(hosts[: limit - 2]) + f", … ({len(hosts) - limit + 1} more) …, " + hosts[-1]


def short_text(value: Any, limit: int = 120) -> str:
    text = fmt(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def stages_of(report: dict[str, Any]) -> StageDetails:
    """The report's stage details, typed (core/stage_details.py)."""
    return StageDetails.of(report)


def family_findings(report: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return sorted_findings([f for f in report.get("findings") or [] if str(f.get("check", "")).startswith(prefix)])


def signoff_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The signed record's values, else the run's preset values, else what the evidence says (marked so),
    else an empty line to sign. The items a person confirms at sign-off are fields here too."""
    record = report.get("signed") if isinstance(report.get("signed"), dict) else {}
    given = {**(report.get("signoff") or {}), **{k: v for k, v in record.items() if v}}
    if record:
        given["date"] = record.get("signed_at")
        if record.get("limits"):
            given["limits"] = ", ".join(record["limits"])
    rehearsal = report.get("restore_rehearsal") if isinstance(report.get("restore_rehearsal"), dict) else None
    if rehearsal:
        given["rollback_rehearsed"] = rehearsal_text(rehearsal)
    derived = {"topology": derive_topology(report), "container": derive_container(report)}
    confirmations = record.get("confirmations") or {}
    rows = []
    for key, label in SIGNOFF_FIELDS:
        if given.get(key):
            rows.append({"key": key, "label": label, "value": fmt(given[key]), "derived": False})
        elif derived.get(key):
            rows.append({"key": key, "label": label, "value": derived[key], "derived": True})
        else:
            rows.append({"key": key, "label": label, "value": "", "derived": False})
    for key, label in CONFIRM_FIELDS.items():
        rows.append({"key": key, "label": f"Confirmed by a person: {label}", "value": confirmations.get(key, ""),
                     "derived": False, "confirm": True})
    return rows


def rehearsal_text(rehearsal: dict[str, Any]) -> str:
    text = f"{rehearsal.get('status')}: relaunched {rehearsal.get('relaunched')} (accepted in run " \
           f"{rehearsal.get('from_run')}) at {rehearsal.get('finished')}"
    smoke = rehearsal.get("smoke") if isinstance(rehearsal.get("smoke"), dict) else {}
    if smoke:
        text += f"; smoke probe {smoke.get('status')}"
        if smoke.get("ready_s") is not None:
            text += f", ready in {smoke['ready_s']} s"
    return text


def derive_topology(report: dict[str, Any]) -> str | None:
    hosts = stages_of(report).preflight.hosts
    env = report.get("environment") if isinstance(report.get("environment"), dict) else {}
    if env.get("topology"):
        return str(env["topology"])
    if views.no_gpu(report):
        names = host_names(report)
        return f"{len(names)} node(s) ({', '.join(names[:4])}): CPU only, no GPU (CPU lab): GPU topology not " \
               "provable here"
    if not hosts:
        return None
    gpus = {f"{h.get('gpu_count')} x {h.get('gpu_name')}" for h in hosts.values()
            if isinstance(h, dict) and h.get("gpu_count")}
    if not gpus:
        return f"{len(hosts)} node(s): GPU model and count not recorded"
    return f"{len(hosts)} node(s): " + ", ".join(sorted(gpus))


def derive_container(report: dict[str, Any]) -> str | None:
    hosts = stages_of(report).preflight.hosts
    images = {f"{h.get('image')}@{h.get('image_digest')}" if h.get("image_digest") else str(h.get("image"))
              for h in hosts.values() if isinstance(h, dict) and h.get("image")}
    if images:
        return ", ".join(sorted(images))
    serve = stages_of(report).serve
    if serve.version or serve.model:
        return f"no container (process runtime): vLLM {serve.version or '?'}, model {serve.model or '?'}"
    return None


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
    serve = stages_of(report).serve
    for key in ("vllm_version", "model", "base_url", "max_model_len", "kv_cache_tokens", "max_concurrency", "ready_s"):
        if serve.value(key) is not None:
            rows.append((f"serve {key}", fmt(serve.value(key))))
    return rows


def node_cell(column: str, value: Any) -> dict[str, str]:
    """A digest is 71 characters: shown short so the node table fits, the full value in the tooltip."""
    text = fmt(value)
    if column == "image_digest" and len(text) > 24:
        return {"text": text[:19] + "…", "title": text}
    return {"text": text, "title": ""}


def preflight_rows(report: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    """Per-node versions; nodes with identical values form one row ("62 nodes"), deviating rows first."""
    hosts = stages_of(report).preflight.hosts
    cols = ["driver_version", "driver_branch", "gpu_count", "gpu_name", "cuda_runtime", "vllm_version",
            "torch_version", "image", "image_digest", "fabric_manager"]
    groups: dict[tuple[str, ...], list[str]] = {}
    for host, data in sorted(hosts.items()):
        data = data if isinstance(data, dict) else {}
        groups.setdefault(tuple(fmt(data.get(c)) for c in cols), []).append(str(host))
    rows = []
    for values, members in sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[1][0])):
        label = members[0] if len(members) == 1 else f"{len(members)} nodes alike"
        rows.append({"host": label, "members": host_range(members) if len(members) > 1 else "",
                     "cells": [node_cell(c, v) for c, v in zip(cols, values, strict=True)]})
    return cols, rows


def load_view(report: dict[str, Any]) -> dict[str, Any] | None:
    load = stages_of(report).load
    if not load:
        return None
    steps = []
    for s in plots._steps(load.document()):  # sorted, concurrency present
        queue = s.get("queue_p95") if s.get("queue_p95") is not None else s.get("queue_time_mean_s")
        steps.append({k: fmt(s.get(k)) for k in s} | {"max_kv_usage": fmt_pct(s.get("max_kv_usage")),
                                                       "meets_slo": s.get("meets_slo"), "queue": fmt(queue),
                                                       "queue_kind": "p95" if s.get("queue_p95") is not None
                                                       else "mean"})
    kinds = {s["queue_kind"] for s in steps}
    return {"contract": fmt(load.contract_concurrency), "knee": fmt(load.knee), "steps": steps,
            "queue_label": "Queue p95" if kinds == {"p95"} else "Queue mean"}


def cache_view(report: dict[str, Any]) -> dict[str, Any] | None:
    cache = stages_of(report).cache
    if not cache:
        return None
    reqs = sorted([r for r in cache.requests if isinstance(r, dict)],
                  key=lambda r: (r.get("session") or 0, plots.KIND_ORDER.index(r["kind"])
                                 if r.get("kind") in plots.KIND_ORDER else 9))
    rows = [{k: fmt(r.get(k)) for k in ("session", "kind", "prompt_tokens", "queries", "expected_hits", "hits",
                                          "cached_tokens",
                                          "prefill_computed_tokens", "prefill_time_s", "ttft_s")}
            | {"clean": r.get("clean")} for r in reqs]
    return {"block_size": fmt(cache.block_size), "shared": fmt(cache.shared_prefix_tokens),
            "expected": fmt(cache.expected_hot_hits), "rows": rows}


def agent_view(report: dict[str, Any]) -> dict[str, Any] | None:
    agent = stages_of(report).agent
    if not agent:
        return None
    rates = agent.rates
    cases = [c for c in agent.cases if isinstance(c, dict)]
    return {"cases": sorted(cases, key=lambda c: (STATUS_RANK.get(str(c.get("status")), 9), str(c.get("id")))),
            "exchanges": views.agent_case_rows(report), "root": str(agent.evidence_root or ""),
            "rate_rows": plots.agent_rate_rows(agent.document()), "resolution": str(rates.get("resolution") or ""),
            "rates": [("schema accuracy", fmt_pct(rates.get("schema_accuracy"))),
                      ("trigger consistency", fmt_pct(rates.get("trigger_consistency"))),
                      ("format error rate", fmt_pct(rates.get("format_error_rate")))],
            "classes": views.agent_class_rows(agent), "assumptions": str(rates.get("assumptions") or ""),
            "under_load": (rates.get("under_load") or {}).get("concurrency"),
            "case_files": [evidence_path(str(agent.evidence_root or ""), name) for name in
                           ("cases.json", "cases-under-load.json", "reference.json", "repeats.json")
                           if _kept(agent, name)]}


def _kept(agent: AgentDetails, name: str) -> bool:
    """A case-set file the probe wrote: named in the rates (cases.json always with a case set)."""
    rates = agent.rates
    return {"cases.json": bool(rates.get("classes")), "cases-under-load.json": bool(rates.get("under_load")),
            "reference.json": bool(rates.get("reference")), "repeats.json": bool(rates.get("repeats"))}[name]


def evidence_path(root: str, path: Any) -> str:
    """Stage details keep evidence relative to their probe directory; links are relative to the run."""
    text = str(path)
    if root and not text.startswith((root.rstrip("/") + "/", "evidence/", "probes/")):
        return f"{root.rstrip('/')}/{text}"
    return text


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
    signed = report.get("signed") if isinstance(report.get("signed"), dict) else None
    reopen = report.get("reopen") if isinstance(report.get("reopen"), dict) else None
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
        "serve": stages_of(report).serve.document() or None,
        "startup": views.startup_view(report),
        "load": load_view(report),
        "cache": cache_view(report),
        "agent": agent_view(report),
        "svgs": plots.all_svgs(stages_of(report), report.get("slo") or (limits or {}).get("slo")),
        "families": {fam: family_findings(report, fam + ".") for fam in FAMILIES},
        # a probe's family without its own section above (core/probes.py): a section of its findings
        "other_families": [fam for fam in FAMILIES if fam not in _FAMILY_ORDER],
        "checklist_groups": [{"key": g["key"], "title": g["title"], "counts": g["counts"],
                              "rows": [{"item": row.item, "status": row.status, "detail": row.detail,
                                        "chips": checklist_chips(row, report)} for row in g["rows"]]}
                             for g in coverage_groups(rows)],
        "host_count": len(host_names(report)),
        "hosts_text": hosts_text(report),
        "checklist_counts": coverage_summary(rows),
        "sources": SOURCES,
        "signoff": signoff_rows(report),
        "signed": signed,
        "sign_command": sign_command(report),
        "reopen": reopen,
        "rehearsal": report.get("restore_rehearsal") if isinstance(report.get("restore_rehearsal"), dict) else None,
        "blockers": views.blockers(report),
        "unproven": views.unproven(report),
        "not_provable": views.not_provable(report),
        "no_gpu": views.no_gpu(report),
        "contract_rows": views.contract_rows(report),
        "observed": {finding_id(f): views.observed_view(f) for f in report.get("findings") or []},
        "expected": {finding_id(f): views.observed_view({"observed": f.get("expected")})
                     for f in report.get("findings") or []},
        "lineage": report.get("lineage") if isinstance(report.get("lineage"), dict) else None,
    }


def brief(f: dict[str, Any], limit: int = 100) -> str:
    """One line for a finding in a family list: a scalar observed value, else its title or reason."""
    value = f.get("observed")
    if views.scalar(value) and value not in (None, ""):
        return short_text(value, limit)
    return short_text(f.get("title") or f.get("reason") or "", limit) if (f.get("title") or f.get("reason")) else ""


def hosts_text(report: dict[str, Any]) -> str:
    names = host_names(report)
    text = f"{len(names)}"
    if views.no_gpu(report):
        text += " (CPU lab: no GPU)" if len(names) == 1 else " (no GPU)"
    return text


@cache
def environment() -> jinja2.Environment:
    """One environment per process: Jinja keeps the compiled templates (most of a render's time without it) and
    still reloads a template whose file changed (auto_reload). Nothing changes it after it is built."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.ChainableUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["fmt"] = fmt
    env.filters["pct"] = fmt_pct
    env.filters["href"] = evidence_href
    env.filters["fid"] = finding_id
    env.filters["evpath"] = evidence_path
    env.filters["brief"] = brief
    return env


def render_html(report: dict[str, Any]) -> str:
    return environment().get_template("report.html.j2").render(**context(report))
