"""Reopen detection: which of the reopen triggers fired since the inventory's last signed acceptance.

A signed acceptance holds for the facts it was signed on (docs/report.md): the
container image and digest, the host driver, the topology, the contracted context limit and
concurrency, and the recipe record. Every run compares its own facts with those of the last run of
the same inventory whose sign-off allowed traffic (decision `release` or `limited_observation`),
and names each trigger that fired with the value then and now. `diff` uses the same comparison
between any two runs.

The facts are read from report.json alone (stages, environment, contract, recipe), so an old
signed report is compared with the same extraction as a new one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..core.rundir import RunDir
from ..core.stage_details import StageDetails

SIGNOFF_FILE = "signoff.json"
ACCEPTING_DECISIONS = ("release", "limited_observation")

# key -> (title shown to people, what a change means)
TRIGGERS: dict[str, tuple[str, str]] = {
    "image": ("container image or digest", "a new image or digest was deployed"),
    "driver": ("host driver version", "a node's driver version or branch changed"),
    "topology": ("topology", "node count, GPU model or count, or the parallel layout changed"),
    "context_limit": ("context limit or concurrency", "the contracted context, output or concurrency, or "
                                                      "the served max_model_len changed"),
    "recipe": ("recipe record", "the official recipe changed: its file (commit, sha256) or its record (source, "
                                "status, check date); `vllm-acceptance recipe diff` names what changed for the "
                                "deployment"),
}


def _hosts(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(k): v for k, v in StageDetails.of(report).preflight.hosts.items() if isinstance(v, dict)}


def image_fact(report: dict[str, Any]) -> Any:
    """image@digest of every containerised node; for the process runtime (the lab) the vLLM build and model."""
    images = sorted({f"{h.get('image')}@{h.get('image_digest') or 'no digest'}"
                     for h in _hosts(report).values() if h.get("image")})
    if images:
        return images
    serve = StageDetails.of(report).serve
    env = report.get("environment") if isinstance(report.get("environment"), dict) else {}
    version = serve.version or serve.vllm_version or env.get("vllm_version")
    if version or serve.model:
        return f"process runtime: vLLM {version or '?'}, model {serve.model or '?'}"
    return None


def driver_fact(report: dict[str, Any]) -> Any:
    drivers = {host: h.get("driver_version") for host, h in sorted(_hosts(report).items()) if h.get("driver_version")}
    return drivers or None


def topology_fact(report: dict[str, Any]) -> dict[str, Any]:
    hosts = _hosts(report)
    names = [h for h in report.get("hosts") or [] if isinstance(h, str)]
    gpus = sorted({f"{h.get('gpu_count')} x {h.get('gpu_name')}" for h in hosts.values() if h.get("gpu_count")})
    serve = StageDetails.of(report).serve
    layout = {k: serve.value(k) for k in ("tp_size", "pp_size", "dp_size", "world_size") if serve.value(k) is not None}
    return {"nodes": len(names) or len(hosts), "gpus": gpus, "layout": layout}


def context_fact(report: dict[str, Any]) -> dict[str, Any]:
    contract = report.get("contract") if isinstance(report.get("contract"), dict) else {}
    return {"context_tokens": contract.get("context_tokens"), "max_output_tokens": contract.get("max_output_tokens"),
            "concurrency": contract.get("concurrency"),
            "served_max_model_len": StageDetails.of(report).serve.max_model_len}


RECIPE_FACT_KEYS = ("source", "status", "checked", "commit", "sha256", "hardware", "strategy", "variant")


def recipe_fact(report: dict[str, Any]) -> Any:
    recipe = report.get("recipe")
    if not isinstance(recipe, dict):
        return None
    # commit and sha256: the recipe file a generated profile came from (recipes/vllm-project/SOURCE.yml);
    # hardware/strategy/variant: the deployment of the recipe it was generated for (recipe/generate.py).
    return {k: recipe.get(k) for k in RECIPE_FACT_KEYS if k in recipe}


FACTS = {"image": image_fact, "driver": driver_fact, "topology": topology_fact, "context_limit": context_fact,
         "recipe": recipe_fact}


def reopen_facts(report: dict[str, Any]) -> dict[str, Any]:
    return {key: fn(report) for key, fn in FACTS.items()}


def fired_triggers(then: dict[str, Any], now: dict[str, Any]) -> list[dict[str, Any]]:
    """Each trigger whose fact differs between two runs' reports, with both values."""
    a, b = reopen_facts(then), reopen_facts(now)
    fired = []
    for key, (title, meaning) in TRIGGERS.items():
        if a[key] != b[key]:
            fired.append({"trigger": key, "title": title, "meaning": meaning, "was": a[key], "now": b[key],
                          "changed": changed_parts(a[key], b[key])})
    return fired


def changed_parts(a: Any, b: Any) -> list[str]:
    """For dict facts, the sub-keys that changed ("context_tokens: 1536 -> 1024")."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [f"{short(a)} -> {short(b)}"]
    return [f"{k}: {short(a.get(k))} -> {short(b.get(k))}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def short(value: Any, limit: int = 90) -> str:
    text = "none" if value is None else value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_signoff(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(RunDir(run_dir).report_file(SIGNOFF_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def last_signed_acceptance(inventory_dir: Path, exclude: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """The newest run of this inventory whose sign-off allowed traffic: (run_dir, signoff record)."""
    best: tuple[str, Path, dict[str, Any]] | None = None
    if not inventory_dir.is_dir():
        return None
    skip = exclude.resolve() if exclude else None
    for child in inventory_dir.iterdir():
        if child.is_symlink() or not child.is_dir() or (skip and child.resolve() == skip):
            continue
        record = read_signoff(child)
        if not record or record.get("decision") not in ACCEPTING_DECISIONS:
            continue
        key = str(record.get("signed_at") or "")
        if best is None or (key, child.name) > (best[0], best[1].name):
            best = (key, child, record)
    return (best[1], best[2]) if best else None


def reopen_status(run_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """report.json `reopen`: the baseline signed run and the triggers that fired since."""
    found = last_signed_acceptance(run_dir.parent, exclude=run_dir)
    out: dict[str, Any] = {"triggers": {k: v[0] for k, v in TRIGGERS.items()}, "facts": reopen_facts(report)}
    if not found:
        return {**out, "status": "no_baseline", "baseline": None, "fired": [],
                "note": f"no signed acceptance of inventory {report.get('inventory')!r} before this run: "
                        "this is a first acceptance"}
    base_dir, record = found
    try:
        base = json.loads(RunDir(base_dir).report_json.read_text())
    except (OSError, ValueError) as exc:
        return {**out, "status": "baseline_unreadable", "fired": [],
                "baseline": {"run_id": base_dir.name, "signed_at": record.get("signed_at")},
                "note": f"the last signed run {base_dir.name} has no readable report.json ({exc}): "
                        "treat acceptance as reopened"}
    intact = record.get("report_sha256") == sha256_file(RunDir(base_dir).report_json)
    fired = fired_triggers(base, report)
    return {**out, "status": "reopened" if fired else "unchanged", "fired": fired,
            "baseline": {"run_id": base_dir.name, "decision": record.get("decision"),
                         "reviewer": record.get("reviewer"), "signed_at": record.get("signed_at"),
                         "report_intact": intact}}
