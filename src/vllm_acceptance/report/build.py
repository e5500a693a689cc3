"""Assemble report.json from a run directory: stage findings + stage details -> decision.

Layout of a run directory (reports/<inventory>/<run-id>/):
  run.json                  run metadata written at start (inventory, profile, run_id, started, hosts)
  findings/<stage>.json     findings of each stage, written when the stage ends
  stages/<stage>.json       details of each stage for tables and plots
  evidence/...              raw evidence; findings point here
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from ..core.arithmetic import required_paths
from ..core.findings import Consequence, Finding, Status, read_findings
from ..core.probes import PROBE_KINDS
from ..core.profile import ConfigError, Profile
from ..core.rundir import RunDir, check_run_files
from ..core.stage_details import StageDetails, TeardownDetails
from ..monitoring.generate import monitoring_summary
from ..rebuild.lineage import last_official_run, lineage_checks, load_lineage, off_recipe
from ..rebuild.remediation.isolated import isolated_environment_record
from ..rebuild.remediation.routes import route_for_report
from ..recipe.official import recipe_deviations
from ..rules.registry import get as catalog_get
from ..rules.registry import missing
from ..verdict import IMMEDIATE_ACTION, REOPEN_TRIGGERS, ROLLBACK_TRIGGERS, Decision, annotate, decide, traffic_gates
from .environment import environment_summary
from .reopen import reopen_status
from .signoff import attachments

SCHEMA_VERSION = "1.0"

# Each stage that must leave findings, with the check that stands for it when it left none.
# Each probe's stage stands for itself by the check core/probes.py names (stands_for); an opt-in probe's
# stage is required when the run's inventory named it (selected_stages).
REQUIRED_STAGES: dict[str, tuple[str, Consequence]] = {
    "preflight": ("compat.preflight", Consequence.REBUILD),
    "serve": ("compat.serve", Consequence.REBUILD),
    **{kind.name: (kind.stands_for, Consequence(kind.consequence)) for kind in PROBE_KINDS if kind.required},
}
OPT_IN_STAGES: dict[str, tuple[str, Consequence]] = {
    kind.name: (kind.stands_for, Consequence(kind.consequence)) for kind in PROBE_KINDS if not kind.required}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def selected_stages(run_dir: Path) -> dict[str, tuple[str, Consequence]]:
    """The stages this run must leave: the required ones, and each opt-in probe its inventory's
    `acceptance_probes` named (run.json)."""
    named = RunDir(run_dir).inventory_vars().get("acceptance_probes")
    chosen = {s: v for s, v in OPT_IN_STAGES.items() if isinstance(named, list) and s in named}
    if "quality" in OPT_IN_STAGES and "quality" not in chosen and unproven_paths(run_dir):
        chosen["quality"] = OPT_IN_STAGES["quality"]
    return {**REQUIRED_STAGES, **chosen}


def unproven_paths(run_dir: Path) -> list[str]:
    """The paths of this run's deployment for which the quality stage is required, named in acceptance_probes or
    not (core/arithmetic.py required_paths: P/D pools, speculative decoding)."""
    try:
        model = RunDir(run_dir).profile().model
    except (ConfigError, OSError, ValueError):
        return []
    return required_paths(model)


def collect_findings(run_dir: Path) -> tuple[list[Finding], list[str]]:
    """All stage findings; a required stage that left no findings becomes a `missing` finding."""
    findings: list[Finding] = []
    errors: list[str] = []
    stages = selected_stages(run_dir)
    for stage, (check, consequence) in stages.items():
        path = RunDir(run_dir).findings_path(stage)
        if not path.is_file():
            why = f"stage '{stage}' left no findings (skipped or failed)"
            if stage == "quality" and (paths := unproven_paths(run_dir)):
                why += (f": this deployment has {', '.join(paths)}, whose answers are proven only against a "
                        "reference; name quality in acceptance_probes (docs/acceptance.md \"Output parity\")")
            findings.append(missing(check, None, why, consequence))
            continue
        try:
            findings.extend(read_findings(path))
        except (ValueError, TypeError, KeyError) as exc:
            errors.append(f"{path.name}: {exc}")
            findings.append(missing(check, None, f"stage '{stage}' findings unreadable: {exc}", consequence))
    for path in sorted(RunDir(run_dir).findings_dir.glob("*.json")) if RunDir(run_dir).findings_dir.is_dir() else []:
        if path.stem not in stages:
            findings.extend(read_findings(path))
    return findings, errors


def probe_overrides(profile: Profile, overrides: Any) -> list[dict[str, Any]]:
    """The inventory's probe overrides as tested: probe, field, the profile's value, the value used."""
    rows = []
    for kind, fields in sorted((overrides or {}).items()) if isinstance(overrides, dict) else []:
        for name, value in sorted((fields or {}).items()):
            rows.append({"probe": kind, "field": name, "profile": profile.model.at(name), "tested": value})
    return [r for r in rows if r["profile"] != r["tested"]]


def tested_on_overrides(decision: Decision, overrides: list[dict[str, Any]], findings: list[Finding]) -> None:
    """The profile's test, weakened or not, is the one a release signs: a run whose probes ran with other
    settings is at most limited_observation, the settings named (never a release of the profile's contract)."""
    if not overrides or decision.verdict != "release":
        return
    decision.verdict = "limited_observation"
    decision.reasons.append("the probes ran with inventory overrides, not the profile's test: " + ", ".join(
        f"{r['field']} {r['profile']!r} -> {r['tested']!r}" for r in overrides)
        + "; remove acceptance_probe_overrides (or write a profile with these settings) to sign a release")
    decision.gates = traffic_gates(decision.verdict, findings)


def not_official_image(profile: Profile, findings: list[Finding]) -> dict[str, Any] | None:
    """The image the run judged, when it is not the profile's official one (rules/image.py, compat.image_identity
    observed.official false): which nodes, which image, why. None when every node ran the profile's image."""
    other = [f for f in findings if f.check == "compat.image_identity" and isinstance(f.observed, dict)
             and f.observed.get("official") is False]
    if not other:
        return None
    return {"official": False, "profile": profile.name,
            "official_reference": other[0].observed.get("official_reference"),
            "reference": sorted({str(f.observed.get("reference")) for f in other}),
            "hosts": sorted(str(f.host) for f in other),
            "why": sorted({r for f in other for r in f.observed.get("not_official") or []})}


def experimental_route(decision: Decision, other_image: dict[str, Any] | None, findings: list[Finding]) -> None:
    """Another image than the profile's official one is judged on the experimental route (SPEC: released only on
    its own experimental profile, with lineage): never a release of this profile, and the first reason says so."""
    if other_image is None:
        return
    decision.experimental = True
    if decision.verdict == "release":
        decision.verdict = "limited_observation"
        decision.gates = traffic_gates(decision.verdict, findings)
    why, name = "; ".join(other_image["why"]), other_image["profile"]
    decision.reasons.insert(0, (
        f"NOT THE OFFICIAL IMAGE: {', '.join(other_image['reference'])} on {', '.join(other_image['hosts'])} is not "
        f"profile {name}'s image {other_image['official_reference']} ({why}): never an acceptance of {name}; judged "
        "on the experimental route: release only on the image's own experimental profile with its lineage "
        "(playbooks/build_image.yml, compat.lineage.*)"))


def official_deviations(profile: Profile, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the profile's image, CUDA, driver or vLLM minimums or forbidden suffixes differ from the recipe it names
    (regenerated, recipe/official.py) or from an official profile it extends (recorded in run.json by open_run, as
    the frozen copy is merged; or known from the profile itself when it was loaded from its file)."""
    rows: dict[str, dict[str, Any]] = {}     # one row per field: the recipe's value first, else the official profile's
    recorded = run.get("recipe_deviations") if isinstance(run.get("recipe_deviations"), list) else []
    for row in [*recipe_deviations(profile.data), *recorded, *profile.official_deviations]:
        if isinstance(row, dict) and row.get("field") not in rows:
            rows[str(row.get("field"))] = dict(row)
    return list(rows.values())


def off_recipe_route(decision: Decision, profile: Profile, deviations: list[dict[str, Any]],
                     findings: list[Finding]) -> None:
    """A profile that is not its recipe's deployment (another image, weaker or other minimums) and not declared
    experimental is judged on the experimental route: never a release, and the first reason says so."""
    if not deviations or profile.experimental:
        return
    decision.experimental = True
    if decision.verdict == "release":
        decision.verdict = "limited_observation"
        decision.gates = traffic_gates(decision.verdict, findings)
    decision.reasons.insert(0, (
        "NOT THE RECIPE'S IMAGE AND MINIMUMS: " + off_recipe(profile.name, deviations) + f": never an acceptance "
        f"of the recipe's deployment (recipe commit {profile.model.at('recipe.commit') or 'not recorded'}); judged "
        "on the experimental route: release only on the image's own experimental profile with its lineage "
        "(playbooks/build_image.yml, compat.lineage.*)"))


def gpu_nodes_named(profile: Profile, run: dict[str, Any], findings: list[Finding]) -> list[Finding]:
    """A GPU profile judged without any GPU node (empty or misspelled gpu_nodes) is never a release:
    the preflight file alone proves nothing when it holds no node's evidence."""
    if not profile.has_gpus or run.get("hosts") or any(f.check == "compat.gpu_nodes" for f in findings):
        return []
    return [catalog_get("compat.gpu_nodes").missing(
        None, f"profile {profile.name} needs GPUs, but the run names no GPU node (the inventory's gpu_nodes "
              "group is empty or absent): list every GPU node under gpu_nodes")]


def drop_dangling_evidence(run_dir: Path, findings: list[Finding]) -> None:
    """Contract: every evidence path exists. A vanished file is named, and its finding cannot pass."""
    for finding in findings:
        kept = [p for p in finding.evidence if RunDir(run_dir).at(p).exists()]
        lost = [p for p in finding.evidence if p not in kept]
        if lost:
            finding.evidence = kept
            finding.reason = (finding.reason + "; " if finding.reason else "") + "evidence lost: " + ", ".join(lost)
            if finding.status == Status.PASS:
                finding.status = Status.INCONCLUSIVE


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def name_unreachable_cause(findings: list[Finding], unreachable: list[str]) -> None:
    """A stage that left no findings on a run with nodes down says so: the later plays left those nodes out
    (docs/acceptance.md "Unreachable nodes and refused inputs"), which is the likely reason it did not run."""
    if not unreachable:
        return
    for finding in findings:
        if finding.status == Status.MISSING and finding.host is None and "left no findings" in finding.reason:
            finding.reason += (f"; node(s) {', '.join(unreachable)} could not be reached at preflight and were left "
                               "out (evidence/preflight-unreachable.json)")


def build_report(run_dir: Path, profile: Profile, *, owner: str | None = None,
                 signoff: dict[str, Any] | None = None) -> dict[str, Any]:
    check_run_files(run_dir, "report", include_report=False)   # a finished run's files, edited since: refused
    run = read_json(RunDir(run_dir).run_json) or {}
    findings, errors = collect_findings(run_dir)
    findings += gpu_nodes_named(profile, run, findings)
    drop_dangling_evidence(run_dir, findings)
    # A profile whose image and minimums are not its recipe's is on the experimental route too (issue 42, item 2).
    deviations = official_deviations(profile, run)
    # A self-built image's lineage checks; its release scope is a finding the decision reads.
    lineage = experimental_lineage(run_dir, profile, findings, deviations)
    findings += [f for f in lineage.values() if f.check == "compat.lineage.release_scope"]
    review = profile.model.review
    annotate(findings, owner or run.get("owner") or review.owner, int(review.period_days))
    unreachable = sorted(run.get("unreachable_hosts", []))
    name_unreachable_cause(findings, unreachable)
    stages = {p.stem: read_json(p) for p in sorted(RunDir(run_dir).stages_dir.glob("*.json"))} \
        if RunDir(run_dir).stages_dir.is_dir() else {}
    # The nodes' GPU memory and the servers' logs after the probes were judged into the load stage by
    # probes/after.py (playbooks/probes.yml): the report assembles, it does not judge them again.
    unreachable_errors = {h: str(e) for h, e in (run.get("unreachable_errors") or {}).items() if h in unreachable}
    decision = decide(findings, experimental=profile.experimental, unreachable_hosts=unreachable,
                      unreachable_errors=unreachable_errors)
    overrides = probe_overrides(profile, (run.get("inventory_vars") or {}).get("acceptance_probe_overrides"))
    tested_on_overrides(decision, overrides, findings)
    other_image = not_official_image(profile, findings)
    experimental_route(decision, other_image, findings)
    off_recipe_route(decision, profile, deviations, findings)
    typed = StageDetails.from_stages(stages)
    facts = typed.preflight.hosts
    environment = {**environment_summary(facts), **run.get("environment", {})} if facts else run.get("environment", {})
    signoff = {"scenario_version": scenario_version(profile), **(run.get("signoff") or {}), **(signoff or {})}
    counts: dict[str, int] = {s.value: 0 for s in Status}
    for finding in findings:
        counts[finding.status.value] += 1
    report = {
        "schema_version": SCHEMA_VERSION,
        "inventory": run.get("inventory", run_dir.parent.name),
        "profile": profile.name,
        "profile_source": run.get("profile_source", profile.source),
        "run_id": run.get("run_id", run_dir.name),
        "started": run.get("started"),
        "finished": now_iso(),
        "verdict": decision.verdict,
        "verdict_reasons": decision.reasons,
        "immediate_action": IMMEDIATE_ACTION[decision.verdict],
        "experimental": decision.experimental,
        "official_image": other_image,
        "lineage": profile.model.at("lineage"),
        "lineage_checks": {k: f.to_dict() for k, f in lineage.items() if k != "compat.lineage.release_scope"},
        "recipe": profile.model.at("recipe"),
        "recipe_deviations": deviations,
        "gates": decision.gates,
        "limits": typed.load.limits,
        "slo": profile.model.at("contract.slo"),
        "contract": profile.model.at("contract"),
        "probe_overrides": overrides,
        "hosts": run.get("hosts", []),
        "unreachable_hosts": unreachable,
        "unreachable_errors": unreachable_errors,
        "missing": decision.missing,
        "summary": counts,
        "findings": [f.to_dict() for f in findings],
        "stages": stages,
        "environment": environment,
        "server": server_state(stages.get("teardown")),   # the raw record: absent or not a mapping = not recorded
        "signoff": signoff,
        "reopen_triggers": REOPEN_TRIGGERS,
        "rollback_triggers": ROLLBACK_TRIGGERS,
        "errors": errors,
    }
    inventory_vars = run.get("inventory_vars") or {}
    # A failed compatibility chain names the remediation route its evidence points to, and the command.
    compat_failed = [f for f in findings if f.check.startswith(("compat.", "interconnect."))
                     and f.status == Status.FAIL and f.consequence == Consequence.REBUILD]
    if compat_failed:
        report["remediation"] = route_for_report(
            findings, {"inventory": str(inventory_vars.get("acceptance_inventory_dir")
                                        or f"inventories/{report['inventory']}"),
                       "findings_path": str(RunDir(run_dir).findings_path("preflight"))})
    if any(k.startswith("isolated_env_") for k in inventory_vars):
        report["isolated_environment"] = isolated_environment_record(inventory_vars)
    # Monitoring derived from this run's figures (thresholds with their source, rollback triggers);
    # playbooks/report.yml writes the rule files when the verdict allows traffic.
    try:
        report["monitoring"] = monitoring_summary(report, profile)
    except Exception as exc:  # noqa: BLE001 - a report is written whatever the monitoring derivation hits
        report["monitoring"] = {"error": f"{type(exc).__name__}: {exc}"}
    # Against the inventory's last signed acceptance: which reopen triggers fired (report/reopen.py).
    report["reopen"] = reopen_status(run_dir, report)
    # Recorded beside report.json after a run: sign-off and restore rehearsal (report/signoff.py).
    report.update(attachments(run_dir))
    return report


def experimental_lineage(run_dir: Path, profile: Profile, findings: list[Finding],
                         deviations: list[dict[str, Any]] | None = None) -> dict[str, Finding]:
    """A self-built image's lineage checks (rebuild/lineage.py): the build's lineage.json and a rebuild's
    reproduction.json beside its build log, and this inventory's last official-profile run; also for a profile
    whose image and minimums are not its recipe's (`deviations`), declared experimental or not."""
    lineage = profile.model.lineage
    if not profile.experimental and lineage is None and not deviations:
        return {}
    build_dir = Path(str(lineage.build_log)).parent if lineage and lineage.build_log else None
    rebuilt_path = build_dir / "reproduction.json" if build_dir else None
    base = lineage.base_profile if lineage else ""
    official_dir = last_official_run(run_dir.resolve().parent, str(base), exclude=run_dir) if base else None
    run = {"run_id": run_dir.name, "findings": [f.to_dict() for f in findings]}
    official = read_json(RunDir(official_dir).report_json) if official_dir else None
    return lineage_checks(profile.data, build=load_lineage(build_dir / "lineage.json") if build_dir else None,
                          rebuilt=load_lineage(rebuilt_path), rebuilt_path=str(rebuilt_path) if rebuilt_path else None,
                          run=run, official=official, official_path=str(official_dir) if official_dir else None,
                          deviations=deviations)


def server_state(teardown: Any) -> dict[str, Any]:
    """What happened to the server at the end of the run (stages/teardown.json, written by the vllm_serve
    role's stop tasks): stopped and gone, kept running (vllm_serve_stop_at_end: false), attached (not ours)."""
    if not isinstance(teardown, dict):
        return {"state": "unknown", "text": "not recorded: the run did not reach its stop step (check the head node "
                                            "for a server or container this run launched)"}
    record = TeardownDetails.read(teardown)
    action = record.action
    where = record.container or (f"pid {record.pid}" if record.pid else None)
    label = f"{record.runtime} {where}" if where else str(record.runtime)
    nodes = ", ".join(record.nodes)
    if action == "stopped":
        gone = record.gone is True
        text = (f"stopped ({record.when}): {label} on {nodes} " + ("is gone" if gone else
                f"is NOT gone (left on {', '.join(record.left_on) or '-'}, port closed: {record.port_closed})"))
        return {**teardown, "state": "stopped" if gone else "stop_failed", "text": text}
    texts = {"kept": f"kept running at {record.base_url} ({label} on {nodes}; vllm_serve_stop_at_end: false): "
                     "stop it when done",
             "attached": f"attached to {record.base_url}: not launched by this run, left running",
             "not_launched": "no server was launched"}
    return {**teardown, "state": action, "text": texts.get(str(action), f"unknown teardown action {action!r}")}


def scenario_version(profile: Profile) -> str | None:
    """The sample set the probes used: scenario pack name and version."""
    from ..scenarios import load_scenario

    try:
        pack = load_scenario(str(profile.model.agent.scenario))
    except Exception:  # noqa: BLE001 - the report is written whatever the scenario's state
        return None
    return f"{pack.get('name')} {pack.get('version')}"


def point_latest(run_dir: Path) -> None:
    """reports/<inventory>/latest -> <run-id>, replaced atomically (run_dir may itself be `latest`)."""
    run_dir = run_dir.resolve()
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    tmp.replace(link)
