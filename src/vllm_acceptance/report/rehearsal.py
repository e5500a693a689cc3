"""Restore rehearsal: relaunch what the inventory's last signed acceptance ran, smoke-test it, record it.

    python -m vllm_acceptance.report.rehearsal plan --reports-dir DIR --inventory NAME [--port P]
    python -m vllm_acceptance.report.rehearsal record --plan JSON --result JSON

`plan` reads the last signed acceptance (report/reopen.py) and returns, as JSON, how to relaunch it:
for a container runtime the accepted image pinned by its digest (from the run's preflight facts) with
the launch arguments of the profile as judged (the run's evidence/profile.yml); for the process
runtime (the lab) the exact argv the accepted server ran (evidence/serve/process-args.json), on the
rehearsal's own port. `record` writes restore_rehearsal.json into the run being signed (the
inventory's `latest`) and re-renders its report, so the sign-off shows the rehearsal.
playbooks/restore_rehearsal.yml runs the three steps.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from ..core.profile_model import ProfileModel
from ..core.redact import redact_obj
from ..core.rundir import RunDir
from ..core.stage_details import StageDetails
from .reopen import last_signed_acceptance
from .sign import rerender
from .signoff import REHEARSAL_FILE

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SERVE_CLI = "vllm.entrypoints.cli.main"
OWN_FLAGS = ("--model", "--served-model-name", "--host", "--port")


class RehearsalError(ValueError):
    """The rehearsal cannot be planned; the message says what to do."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def split_argv(argv: list[str]) -> dict[str, Any]:
    """python -m vllm...api_server --model M (or -m vllm.entrypoints.cli.main serve M) --served-model-name N
    --host H --port P FLAGS -> parts."""
    out: dict[str, Any] = {"python": argv[0] if argv else None, "args": []}
    rest = argv[1:]
    if rest[:2] == ["-m", SERVER_MODULE]:
        rest = rest[2:]
    elif rest[:3] == ["-m", SERVE_CLI, "serve"] and len(rest) > 3:   # vllm serve MODEL (runtime/process.py)
        rest = ["--model", *rest[3:]]
    i = 0
    while i < len(rest):
        item = rest[i]
        name, eq, value = item.partition("=")
        if name in OWN_FLAGS:
            if not eq:
                value = rest[i + 1] if i + 1 < len(rest) else ""
                i += 1
            out[name.lstrip("-").replace("-", "_")] = value
        else:
            out["args"].append(item)
        i += 1
    return out


def accepted_profile(run_dir: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(RunDir(run_dir).profile_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RehearsalError(f"{run_dir.name}: the profile as judged (evidence/profile.yml) is unreadable ({exc}): "
                             "the accepted launch cannot be reconstructed") from exc
    return data if isinstance(data, dict) else {}


def plan(reports_dir: Path, inventory: str, port: int | None = None, project_dir: Path | None = None) -> dict[str, Any]:
    found = last_signed_acceptance(reports_dir / inventory)
    if not found:
        raise RehearsalError(f"no signed acceptance (release or limited_observation) of inventory {inventory!r} "
                             f"under {reports_dir}: sign an accepted run first (vllm-acceptance sign ...); "
                             "there is nothing to restore to")
    run_dir, record = found
    report = read_json(RunDir(run_dir).report_json) or {}
    judged = accepted_profile(run_dir)   # the document as the run recorded it (evidence/profile.yml), not re-validated
    launch = judged.get("launch") or {}
    model = judged.get("model") or {}
    runtime = str(launch.get("runtime") or "process")
    latest = reports_dir / inventory / "latest"
    out: dict[str, Any] = {
        "from_run": run_dir.name, "from_dir": str(run_dir),
        "signed": {k: record.get(k) for k in ("decision", "reviewer", "signed_at")},
        "record_into": str(latest.resolve() if latest.exists() else run_dir),
        "runtime": runtime, "port": int(port or launch.get("port") or ProfileModel.default_of("launch.port")),
        "ready_timeout_s": int(launch.get("ready_timeout_s") or ProfileModel.default_of("launch.ready_timeout_s")),
        "env": {str(k): str(v) for k, v in (launch.get("env") or {}).items()},
        "served_model_name": model.get("served_name") or model.get("name"),
    }
    if runtime == "process":
        argv = read_json(RunDir(run_dir).evidence_path("serve", "process-args.json"))
        if not isinstance(argv, list) or not argv:
            raise RehearsalError(f"{run_dir.name}: no evidence/serve/process-args.json: the accepted server's argv "
                                 "was not recorded, so its launch cannot be repeated exactly")
        parts = split_argv([str(a) for a in argv])
        model_path = parts.get("model")
        # The accepted server resolved a relative model path against the directory it started in (the
        # project's); the relaunch starts elsewhere.
        if model_path and not Path(model_path).is_absolute() and project_dir and (project_dir / model_path).exists():
            parts["model"] = str((project_dir / model_path).resolve())
        out.update(python=parts["python"], model=parts.get("model"), host=parts.get("host") or "127.0.0.1",
                   args=parts["args"], served_model_name=parts.get("served_model_name") or out["served_model_name"])
        out["relaunched"] = f"the accepted lab launch: {parts.get('model')} with {' '.join(parts['args'])}"
        return out
    hosts = StageDetails.of(report).preflight.hosts
    pinned = sorted({(h.get("image"), h.get("image_digest")) for h in hosts.values()
                     if isinstance(h, dict) and h.get("image") and h.get("image_digest")})
    if len(pinned) != 1:
        raise RehearsalError(f"{run_dir.name}: expected one image@digest across the accepted nodes, found "
                             f"{[f'{i}@{d}' for i, d in pinned] or 'none'}: pin the image by digest before releasing")
    image, digest = pinned[0]
    digest = str(digest).split("@")[-1]
    out.update(image=image, digest=digest, ref=f"{image.split('@')[0]}@{digest}",
               model=model.get("name"), host=str(launch.get("host") or "0.0.0.0"),
               args=[str(a) for a in launch.get("args") or []])
    out["relaunched"] = f"{out['ref']} (the accepted image, by digest)"
    return out


def record(plan_data: dict[str, Any], result: dict[str, Any]) -> Path:
    """restore_rehearsal.json in the run being signed; its report re-rendered to show it."""
    target = Path(plan_data["record_into"])
    smoke = result.get("smoke") if isinstance(result.get("smoke"), dict) else {}
    passed = bool(result.get("ready")) and smoke.get("status") == "ok"
    data = {
        "status": "passed" if passed else "failed",
        "from_run": plan_data.get("from_run"), "signed": plan_data.get("signed"),
        "relaunched": plan_data.get("relaunched"), "runtime": plan_data.get("runtime"),
        "port": plan_data.get("port"), "started": result.get("started"),
        "finished": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "ready": bool(result.get("ready")), "smoke": {**smoke, "ready_s": result.get("ready_s")},
        "error": result.get("error"), "log_tail": result.get("log_tail"),
    }
    # the log tail and the error quote the server's own lines: redacted as every file a run writes
    RunDir(target).report_file(REHEARSAL_FILE).write_text(json.dumps(redact_obj(data), indent=2, ensure_ascii=False)
                                                          + "\n")
    if RunDir(target).report_json.is_file():
        rerender(target)
    return RunDir(target).report_file(REHEARSAL_FILE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.report.rehearsal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--reports-dir", required=True, type=Path)
    p.add_argument("--inventory", required=True)
    p.add_argument("--port", type=int)
    p.add_argument("--project-dir", type=Path, help="where the accepted server started (relative model paths)")
    r = sub.add_parser("record")
    r.add_argument("--plan", required=True, help="the plan's JSON")
    r.add_argument("--result", required=True, help="the playbook's result JSON (ready, smoke, error, log_tail)")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            print(json.dumps(plan(args.reports_dir, args.inventory, args.port, args.project_dir)))
        else:
            print(record(json.loads(args.plan), json.loads(args.result)))
    except RehearsalError as exc:
        print(f"restore rehearsal: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
