"""Compare two acceptance runs: the re-acceptance view after a change.

    vllm-acceptance diff RUN_A RUN_B

RUN_A / RUN_B are run directories (or their report.json, or an inventory's `latest` link).
What changed: the reopen triggers that fired from A to B (image digest, driver, topology,
context limit, recipe record: the same comparison a run makes with the inventory's last signed
acceptance, report/reopen.py), the verdict and gates, versions and environment (driver, CUDA,
image, vLLM, launch command, cache config, recipe), findings whose status changed (added,
removed, changed), and figures (knee, per-step p95s, errors, preemptions, cache hits, agent rates).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.rundir import RunDir, check_run_files
from ..core.stage_details import StageDetails
from .reopen import fired_triggers

FIGURE_KEYS = ("ttft_p95", "itl_p95", "e2e_p95", "errors", "preemptions", "max_waiting", "max_kv_usage")


class RunNotFound(FileNotFoundError):
    """The path is not a run directory with a report.json."""


def load_report(path: Path) -> tuple[Path, dict[str, Any]]:
    path = Path(path)
    file = path if path.is_file() else RunDir(path).report_json
    if not file.is_file():
        raise RunNotFound(f"{path}: no report.json (give a run directory reports/<inventory>/<run-id>, "
                          "its report.json, or reports/<inventory>/latest)")
    if RunDir(file.parent).run_json.is_file():
        check_run_files(file.parent, "diff")   # a run whose files changed since its verdict: refused (exit 2)
    try:
        return file.parent.resolve(), json.loads(file.read_text())
    except ValueError as exc:
        raise RunNotFound(f"{file}: not valid JSON ({exc})") from exc


def finding_key(f: dict[str, Any]) -> str:
    return f"{f.get('check')}@{f['host']}" if f.get("host") else str(f.get("check"))


def flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def environment(report: dict[str, Any]) -> dict[str, Any]:
    """The facts whose change reopens acceptance, flattened to dotted keys."""
    stages = StageDetails.of(report)
    env: dict[str, Any] = {"profile": report.get("profile")}
    flatten("recipe", report.get("recipe") or {}, env)
    flatten("environment", report.get("environment") or {}, env)
    for host, data in stages.preflight.hosts.items():
        flatten(f"node.{host}", data or {}, env)
    serve = stages.serve
    for key in ("vllm_version", "model", "launch_command", "max_model_len", "kv_cache_tokens", "max_concurrency"):
        if serve.has(key):
            env[f"serve.{key}"] = serve.value(key)
    flatten("serve.cache_config", serve.cache_config, env)
    flatten("lineage", report.get("lineage") or {}, env)
    return env


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """Measured figures, flattened: knee, per-step p95s and pressure, cache hits, agent rates."""
    stages = StageDetails.of(report)
    out: dict[str, Any] = {"load.knee": stages.load.knee, "load.contract_concurrency": stages.load.contract_concurrency}
    for step in stages.load.steps:
        if isinstance(step, dict) and step.get("concurrency") is not None:
            for key in FIGURE_KEYS:
                if key in step:
                    out[f"load.c{step['concurrency']}.{key}"] = step[key]
    out["cache.expected_hot_hits"] = stages.cache.expected_hot_hits
    by_kind: dict[str, list[float]] = {}
    for r in stages.cache.requests:
        if isinstance(r, dict) and isinstance(r.get("hits"), int | float):
            by_kind.setdefault(str(r.get("kind")), []).append(float(r["hits"]))
    for kind, hits in sorted(by_kind.items()):
        out[f"cache.{kind}.max_hits"] = max(hits)
    for key, value in stages.agent.rates.items():
        out[f"agent.{key}"] = value
    return {k: v for k, v in out.items() if v is not None}


def changed(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            row: dict[str, Any] = {"key": key, "a": a.get(key), "b": b.get(key)}
            if isinstance(a.get(key), int | float) and isinstance(b.get(key), int | float) \
                    and not isinstance(a.get(key), bool):
                row["delta"] = b[key] - a[key]
            rows.append(row)
    return rows


def diff_findings(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    fa = {finding_key(f): f for f in a.get("findings") or []}
    fb = {finding_key(f): f for f in b.get("findings") or []}
    brief = ("status", "observed", "expected")
    return {
        "added": [{"id": k, **{x: fb[k].get(x) for x in brief}} for k in sorted(set(fb) - set(fa))],
        "removed": [{"id": k, **{x: fa[k].get(x) for x in brief}} for k in sorted(set(fa) - set(fb))],
        "changed": [{"id": k, "a": fa[k].get("status"), "b": fb[k].get("status"),
                     "observed_a": fa[k].get("observed"), "observed_b": fb[k].get("observed")}
                    for k in sorted(set(fa) & set(fb)) if fa[k].get("status") != fb[k].get("status")],
    }


def run_ref(path: Path, report: dict[str, Any]) -> dict[str, Any]:
    return {"path": str(path), "run_id": report.get("run_id"), "inventory": report.get("inventory"),
            "profile": report.get("profile"), "finished": report.get("finished"), "verdict": report.get("verdict")}


def diff_runs(a: Path, b: Path) -> dict[str, Any]:
    """What changed from run A to run B (B is the newer one, by convention)."""
    path_a, ra = load_report(a)
    path_b, rb = load_report(b)
    gates = {}
    for name in ("text", "agent"):
        ga = ((ra.get("gates") or {}).get(name) or {}).get("open")
        gb = ((rb.get("gates") or {}).get(name) or {}).get("open")
        gates[name] = {"a": ga, "b": gb, "changed": ga != gb}
    return {
        "a": run_ref(path_a, ra),
        "b": run_ref(path_b, rb),
        "verdict": {"a": ra.get("verdict"), "b": rb.get("verdict"), "changed": ra.get("verdict") != rb.get("verdict")},
        "reopen": fired_triggers(ra, rb),
        "gates": gates,
        "environment": changed(environment(ra), environment(rb)),
        "findings": diff_findings(ra, rb),
        "figures": changed(figures(ra), figures(rb)),
    }


def _short(value: Any, limit: int = 100) -> str:
    text = "—" if value is None else (value if isinstance(value, str) else json.dumps(value, default=str))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return _short(value)


def render_diff_text(d: dict[str, Any]) -> str:
    a, b = d["a"], d["b"]
    lines = [f"A: {a['inventory']}/{a['run_id']}  profile {a['profile']}  ({a['path']})",
             f"B: {b['inventory']}/{b['run_id']}  profile {b['profile']}  ({b['path']})", ""]
    fired = d.get("reopen") or []
    if fired:
        lines.append(f"reopen triggers fired: {len(fired)} (acceptance must be redone)")
        for t in fired:
            lines.append(f"  ! {t['title']}: " + "; ".join(t["changed"]))
    else:
        lines.append("reopen triggers fired: none (image, driver, topology, context limit, recipe record unchanged)")
    v = d["verdict"]
    lines.append(f"verdict: {v['a']} -> {v['b']}" if v["changed"] else f"verdict: {v['a']} (unchanged)")
    for name, gate in d["gates"].items():
        if gate["changed"]:
            state = {True: "open", False: "blocked", None: "not stated"}
            lines.append(f"{name} traffic gate: {state[gate['a']]} -> {state[gate['b']]}")
    sections = [("environment and versions", d["environment"], _short), ("figures", d["figures"], _num)]
    for title, rows, show in sections:
        lines += ["", f"{title}: {len(rows)} changed" if rows else f"{title}: no change"]
        for row in rows:
            delta = f"  ({row['delta']:+.4g})" if "delta" in row else ""
            lines.append(f"  {row['key']}: {show(row['a'])} -> {show(row['b'])}{delta}")
    f = d["findings"]
    total = len(f["added"]) + len(f["removed"]) + len(f["changed"])
    lines += ["", f"findings: {total} changed" if total else "findings: no status change"]
    for row in f["changed"]:
        lines.append(f"  ~ {row['id']}: {row['a']} -> {row['b']}  (observed {_short(row['observed_a'], 60)} -> "
                     f"{_short(row['observed_b'], 60)})")
    for row in f["added"]:
        lines.append(f"  + {row['id']}: {row['status']}  (observed {_short(row['observed'], 60)})")
    for row in f["removed"]:
        lines.append(f"  - {row['id']}: was {row['status']}")
    return "\n".join(lines) + "\n"
