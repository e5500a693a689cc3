"""vllm-acceptance: the command line (docs/acceptance.md "Contracts", 3), sharing the modules' code.

Probe exit codes: 0 pass, 1 fail, 3 inconclusive, 2 usage or set-up error.
`run` exit codes (one per verdict, README "Exit codes"): 0 release, 10 limited_observation, 20 expand_capacity,
30 rebuild_environment, 40 incomplete; 2 inputs refused; 1 the run failed before a verdict; --check: 0 ok.
`remediation-decision` (docs/remediation.md): 0 keep, 1 revert, 3 no choice (a sign lacks evidence), 2 usage.
`lineage`: 0 every check passes, 1 a check fails (or release not allowed), 3 evidence missing, 2 usage.
`recheck` (docs/recheck.md): 0 still_accepted, 50 drifted, 60 reopen, 40 incomplete (recheck/outcome.py); 2 the
baseline refused (not signed, another inventory's); 1 the re-check failed before a verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .core.probes import PROBE_KINDS
from .core.profile import ConfigError, Profile, load_profile
from .core.rundir import RunDir
from .probes.result import EXIT_USAGE, exit_code
from .recipe import commands as recipe_commands
from .rules.registry import FAMILIES
from .runtime.client import ServerUnreachable


def _add_probe(sub: argparse._SubParsersAction, kind: str, help_text: str) -> None:
    p = sub.add_parser(kind, help=help_text)
    p.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8011/v1")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--out", required=True, type=Path, help="directory for result.json and evidence")
    p.add_argument("--profile", help="profile YAML (default: profiles/cpu-lab.yml)")
    p.add_argument("--metrics-url", help="vLLM /metrics URL (default: <base-url root>/metrics)")
    p.add_argument("--prometheus-url", help="read metrics through this Prometheus instead")
    p.add_argument("--prometheus-instance", help="the scrape target's instance label in Prometheus")
    p.add_argument("--prometheus-selector", help="label matchers naming the server's one scrape target in "
                                                 "Prometheus, e.g. 'job=\"vllm\",instance=\"10.0.0.5:8000\"'")
    p.add_argument("--api-key-env", default="VLLM_API_KEY",
                   help="environment variable holding the API key (never passed on the command line)")
    if kind == "agent":
        p.add_argument("--direct-url", help="the server's direct base URL when --base-url is a gateway")
        p.add_argument("--reference-url", help="a reference endpoint (the vendor's API, an accepted deployment): "
                                               "the case set is sent to it too (agent.reference_agreement)")
        p.add_argument("--reference-model", help="the reference's model name (default: --model)")
        p.add_argument("--reference-api-key-env", default="VLLM_REFERENCE_API_KEY",
                       help="environment variable holding the reference's API key")
        p.add_argument("--under-load", type=int, default=0, metavar="N",
                       help="also send the case set while N other requests are held in flight (agent.under_load)")
    if kind == "quality":
        p.add_argument("--reference-url", help="the reference path (inventory quality_reference_url): the same weights "
                                               "served the accepted way; default for a P/D deployment: a prefill "
                                               "instance called directly")
        p.add_argument("--reference-model", help="the reference's model name (default: --model)")
        p.add_argument("--reference-api-key-env", default="VLLM_QUALITY_REFERENCE_API_KEY",
                       help="environment variable holding the reference's API key")
    if kind in ("load", "cache"):
        p.add_argument("--server-pid", type=int, help="the server's pid: tells an exited server from a hung one "
                                                      "(load: its RSS is the lab memory series)")
        p.add_argument("--server-log", help="server log, its last lines kept when the server dies mid-probe")
        if kind == "cache":
            p.add_argument("--restart-command", help="shell command that restarts the server; give it only when "
                                                     "this run launched the server (hot A again after a restart)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a profile field for this probe, e.g. --set load.ramp=[1,2]")
    p.add_argument("--pools", metavar="JSON|@FILE",
                   help="a P/D deployment's pools (--base-url is its router): {\"prefill\": [{\"base_url\", "
                        "\"metrics_url\"}], \"decode\": [...]}, or @FILE holding it or the serve stage's P/D record "
                        "(serve/pools.py serve_record, e.g. .lab/pd/pd-serve.json)")


class _Version(argparse.Action):
    """--version prints one line per component (argparse's own action folds the lines into one)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help")))

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-acceptance", description=__doc__)
    parser.add_argument("--version", action=_Version, help="the package version and the ansible-core it runs with")
    sub = parser.add_subparsers(dest="command", required=True)
    probe = sub.add_parser("probe", help="run one probe against a running server")
    probe_sub = probe.add_subparsers(dest="kind", required=True)
    for kind in PROBE_KINDS:   # core/probes.py
        _add_probe(probe_sub, kind.name, kind.summary)

    val = sub.add_parser("validate", help="validate a profile and an inventory's variables as accept.yml's validate "
                                          "stage does, before touching any node; exit 0 valid, 2 refused")
    val.add_argument("--profile", help="a profile name (profiles/<name>.yml, as acceptance_profile takes it) or path "
                                       "(default: the inventory's acceptance_profile)")
    val.add_argument("-i", "--inventory", type=Path, help="inventory file or directory: its variables are validated "
                                                          "(read with ansible-inventory; no host is contacted)")
    val.add_argument("--project", type=Path, help="the project whose profiles/ a name resolves in (default: the "
                                                  "current directory or the nearest above it holding accept.yml)")
    val.add_argument("--vllm-python", metavar="PYTHON",
                     help="the Python whose vLLM judges every node's command (default: the inventory's "
                          "acceptance_vllm_check_python, else .venv-lab/bin/python where present; none: skip)")

    rep = sub.add_parser("report", help="judge a run directory and write report.json/html/md, junit.xml; exit code "
                                        "per verdict as `run` (0 release, 10, 20, 30, 40 incomplete)")
    rep.add_argument("--run-dir", required=True, type=Path)
    rep.add_argument("--profile", help="the profile the run ran with (default and only allowed value: the run's frozen "
                                       "evidence/profile.yml); another profile is refused, exit 2")

    diff = sub.add_parser("diff", help="what changed between two runs (re-acceptance view)")
    diff.add_argument("run_a", type=Path)
    diff.add_argument("run_b", type=Path)

    checks = sub.add_parser("checks", help="list the check catalog (every check id, its rule and consequence)")
    checks.add_argument("--format", choices=("table", "json", "md"), default="table")
    checks.add_argument("--family", choices=FAMILIES, help="only this family")
    _add_sign(sub)
    _add_remediation(sub)
    recipe_commands.add_arguments(sub)          # profile from-recipe, recipe diff (recipe/commands.py)
    _add_plan(sub)
    _add_recheck(sub)
    lin = sub.add_parser("lineage", help="a self-built image's lineage, reproducibility, results against the official "
                                         "run, and where it may be released; exit 0 all pass, 1 a check fails, 3 "
                                         "evidence missing")
    lin.add_argument("profile", help="the experimental profile (profiles/<name>.yml written by build_image.yml)")
    lin.add_argument("--build", type=Path, help="the build's lineage.json (default: beside lineage.build_log)")
    lin.add_argument("--rebuild", type=Path, help="a rebuild's lineage.json (default: reproduction.json beside it)")
    lin.add_argument("--run", type=Path, help="an acceptance run on this experimental profile")
    lin.add_argument("--official", type=Path,
                     help="the official run to compare with (default: the newest base-profile run beside --run)")

    lab = sub.add_parser("lab", help="the embedded lab: real vLLM on CPU")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True)
    up = lab_sub.add_parser("up", help="start the lab server; prints its base URL last")
    up.add_argument("--profile", default="profiles/cpu-lab.yml")
    up.add_argument("--python", default=".venv-lab/bin/python")
    up.add_argument("--state-dir", default=".lab", type=Path)
    up.add_argument("--extra-args", default="", help="extra vLLM flags (LAB_ARGS)")
    up.add_argument("--port", type=int)
    run = sub.add_parser("run", help="the whole acceptance (ansible-runner), with progress; exit code per verdict")
    run.add_argument("-i", "--inventory", required=True, type=Path, help="inventory file or directory")
    run.add_argument("--check", action="store_true",
                     help="check mode: the inputs gated as `validate` and `plan` gate them (refused: exit 2), the "
                          "plan shown, then preflight's read-only commands on every node (SSH: driver, CUDA, "
                          "runtime, image inspect); nothing is started there (no container run, image pull, "
                          "all-reduce or vLLM: those checks are reported as not run in check mode); no verdict, "
                          "exit 0 (docs/plan.md)")
    run.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE|@FILE|JSON",
                     help="extra variables, as ansible-playbook -e takes them (repeatable)")
    run.add_argument("--playbook", help="playbook path or FQCN (default accept.yml / vllm.acceptance.accept)")
    run.add_argument("--project", "--project-dir", dest="project_dir", type=Path,
                     help="the project: a checkout (the directory holding accept.yml) or an installed collection "
                          "(default: the current directory or the nearest above it holding accept.yml, else the "
                          "inventory's, else the installed vllm.acceptance collection); reports go to its reports/")
    run.add_argument("--reports-dir", type=Path, help="where run directories go")
    run.add_argument("--json", action="store_true", help="print the result as JSON last")
    down = lab_sub.add_parser("down", help="stop the lab server")
    down.add_argument("--state-dir", default=".lab", type=Path)
    return parser


def _add_plan(sub: argparse._SubParsersAction) -> None:
    from .plan import add_arguments

    add_arguments(sub.add_parser("plan", help="what a run would launch on which node, its probes, and the estimated "
                                              "wall time and GPU-hours per stage (docs/plan.md); nothing is touched"))


def _add_recheck(sub: argparse._SubParsersAction) -> None:
    rc = sub.add_parser("recheck", help="day-N re-check of a signed run against the deployment that serves, light and "
                                        "attach only (docs/recheck.md); exit 0 still_accepted, 50 drifted, 60 reopen, "
                                        "40 incomplete, 2 baseline refused, 1 failed before a verdict")
    rc.add_argument("--baseline", required=True, metavar="RUN",
                    help="the signed run directory (reports/<inventory>/<run-id>), or latest-signed")
    rc.add_argument("-i", "--inventory", required=True, type=Path, help="the inventory the baseline was accepted on")
    rc.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE|@FILE|JSON",
                    help="extra variables, as ansible-playbook -e takes them (e.g. vllm_base_url=..., vllm_serve_pid=)")
    rc.add_argument("--project", "--project-dir", dest="project_dir", type=Path,
                    help="the project holding recheck.yml (default: as `run` finds it)")
    rc.add_argument("--reports-dir", type=Path, help="where run directories go (the baseline's inventory is there)")
    rc.add_argument("--json", action="store_true", help="print the outcome as JSON last")


def cmd_recheck(args: argparse.Namespace) -> int:
    from .recheck.run import run_recheck, summary_lines

    done = run_recheck(args.inventory, args.baseline, extra_vars=parse_extra_vars(args.extra_vars),
                       project_dir=args.project_dir, reports_dir=args.reports_dir,
                       on_line=lambda line: print(line, flush=True))
    if done.outcome is not None:
        for line in summary_lines(done):
            print(line)
    elif done.reason:
        print(f"why: {done.reason}")
    print(f"recheck: {done.today_dir or '-'}")
    print(f"exit: {done.exit_code}")
    if args.json:
        print(json.dumps({"exit_code": done.exit_code, "today": str(done.today_dir) if done.today_dir else None,
                          "baseline": str(done.baseline_dir), "reason": done.reason, "outcome": done.outcome},
                         default=str))
    return done.exit_code


def _add_sign(sub: argparse._SubParsersAction) -> None:
    from .report.signoff import CONFIRM_FIELDS, DECISIONS

    sign = sub.add_parser("sign", help="record the reviewer's signed decision (signoff.json) and re-render the report")
    sign.add_argument("run_dir", type=Path, help="the run directory (reports/<inventory>/<run-id> or .../latest)")
    sign.add_argument("--reviewer", required=True,
                      help="required: the SRE or platform lead who reviewed the run, not the person who ran it")
    sign.add_argument("--decision", required=True, choices=DECISIONS)
    sign.add_argument("--limit", action="append", default=[], metavar="CAP",
                      help="a traffic cap signed with the decision, e.g. max_num_seqs=48 (repeatable)")
    sign.add_argument("--note", help="free text recorded with the decision")
    sign.add_argument("--override-reason", help="required for a decision more permissive than the verdict; "
                                                "recorded and shown in red")
    sign.add_argument("--deployment-engineer", help="who ran the acceptance (default: the run's owner)")
    sign.add_argument("--monitoring-owner", help="who owns the generated monitoring after release")
    sign.add_argument("--confirm", action="append", default=[], metavar="FIELD=TEXT",
                      help="an item a person confirms at sign-off; FIELD one of " + ", ".join(CONFIRM_FIELDS))
    sign.add_argument("--replace", action="store_true", help="sign again over an existing signoff.json")


def _add_remediation(sub: argparse._SubParsersAction) -> None:
    from .rebuild.remediation.routes import ROUTES

    dec = sub.add_parser("remediation-decision",
                         help="after remediation: the four signs and the choice (keep / isolate / revert); "
                              "exit 0 keep, 1 revert, 3 no choice (a sign lacks evidence)")
    dec.add_argument("run_dir", type=Path, help="the acceptance re-run after the change (its run directory)")
    dec.add_argument("--before", type=Path, help="the acceptance run that failed before the change")
    dec.add_argument("--record", type=Path, help="the rebuild record (rebuild.json or its run directory)")
    dec.add_argument("--route", choices=ROUTES, help="the remediation taken (default: from the record or the run)")
    dec.add_argument("--max-manual-actions", type=int, default=0,
                     help="manual actions the site accepts for keeping the environment (default 0)")
    dec.add_argument("--json", action="store_true", help="print the decision as JSON")
    man = sub.add_parser("rebuild-manual", help="record a manual action (or that there were none) in a rebuild record")
    man.add_argument("record", type=Path, help="rebuild.json or its run directory")
    man.add_argument("--what", help="what was done by hand")
    man.add_argument("--host", help="on which node")
    man.add_argument("--by", help="who did it")
    man.add_argument("--none", action="store_true", help="state that no manual action was needed")


def cmd_remediation_decision(args: argparse.Namespace) -> int:
    from .rebuild.decision import REVERT, DecisionInputError, decide_after_remediation, write_decision
    from .report.sign import rerender

    try:
        decision = decide_after_remediation(args.run_dir, before_dir=args.before, record=args.record,
                                            route=args.route, max_manual_actions=args.max_manual_actions)
    except DecisionInputError as exc:
        print(f"vllm-acceptance remediation-decision: {exc}", file=sys.stderr)
        return EXIT_USAGE
    path = write_decision(args.run_dir, decision)
    rerender(args.run_dir)
    for sign in decision["signs"].values():
        print(f"{sign['status']:>14}  {sign['check']}  {sign['reason']}")
    print(f"choice: {decision['choice'] or 'none'} ({decision['title']})")
    for reason in decision["reasons"]:
        print(f"  - {reason}")
    print(f"decision: {path}")
    if args.json:
        print(json.dumps(decision, default=str))
    return 3 if decision["choice"] is None else 1 if decision["choice"] == REVERT else 0


def cmd_lineage(args: argparse.Namespace) -> int:
    from .core.findings import Status
    from .rebuild.lineage import last_official_run, lineage_checks, load_lineage

    profile = load_profile(args.profile)
    lineage = profile.model.lineage
    build_dir = Path(str(lineage.build_log)).parent if lineage and lineage.build_log else None
    build_path = args.build or (build_dir / "lineage.json" if build_dir else None)
    rebuilt_path = args.rebuild or (build_path.parent / "reproduction.json" if build_path else None)
    run = official = None
    official_dir = args.official
    if args.run:
        run = json.loads(RunDir(args.run).report_json.read_text())
        if official_dir is None and lineage and lineage.base_profile:
            official_dir = last_official_run(args.run.resolve().parent, str(lineage.base_profile), exclude=args.run)
    if official_dir is not None:
        official = json.loads(RunDir(official_dir).report_json.read_text())
    checks = lineage_checks(profile.data, build=load_lineage(build_path), rebuilt=load_lineage(rebuilt_path),
                            rebuilt_path=str(rebuilt_path) if rebuilt_path else None, run=run, official=official,
                            official_path=str(official_dir) if official_dir else None)
    for finding in checks.values():
        print(f"{finding.status.value:>14}  {finding.check}  {finding.reason}")
    # A check that fails decides (1); else missing evidence (3); else the release scope itself (0 or 1).
    statuses = {f.status for k, f in checks.items() if k != "compat.lineage.release_scope"}
    if Status.FAIL in statuses:
        return 1
    if statuses & {Status.MISSING, Status.INCONCLUSIVE}:
        return 3
    return 0 if checks["compat.lineage.release_scope"].status in (Status.PASS, Status.NOT_APPLICABLE) else 1


def cmd_rebuild_manual(args: argparse.Namespace) -> int:
    from .rebuild.decision import DecisionInputError, record_manual_action

    try:
        data = record_manual_action(args.record, what=args.what, host=args.host, by=args.by, none=args.none)
    except DecisionInputError as exc:
        print(f"vllm-acceptance rebuild-manual: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"manual actions recorded: {len(data['manual_actions'])}")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    from .report.sign import sign_run
    from .report.signoff import SignRefused, parse_confirmations

    try:
        record = sign_run(args.run_dir, replace=args.replace, reviewer=args.reviewer, decision=args.decision,
                          limits=args.limit, note=args.note, override_reason=args.override_reason,
                          deployment_engineer=args.deployment_engineer, monitoring_owner=args.monitoring_owner,
                          confirmations=parse_confirmations(args.confirm))
    except SignRefused as exc:
        print(f"vllm-acceptance sign: refused: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if record["override"]:
        print(f"OVERRIDE: decision {record['decision']} over verdict {record['verdict']}: {record['override_reason']}")
    print(f"signed: {record['decision']} by {record['reviewer']} at {record['signed_at']} "
          f"(report.json sha256 {record['report_sha256'][:16]}...)")
    print(f"signoff: {RunDir(args.run_dir).report_file('signoff.json')}")
    print(f"report: {RunDir(args.run_dir).report_file('report.html')}")
    return 0


def parse_overrides(items: list[str]) -> dict[str, object]:
    import yaml

    out: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected FIELD=VALUE, e.g. load.ramp=[1,2]")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value)
    return out


def parse_pools(value: str | None) -> dict[str, list[dict[str, str]]]:
    """--pools: inline JSON or @FILE, the pools themselves or a serve record holding them under `pools`."""
    if not value:
        return {}
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--pools: not JSON ({exc}); give {{\"prefill\": [...], \"decode\": [...]}} "
                          "or @FILE") from exc
    pools = data.get("pools", data) if isinstance(data, dict) else None
    if not isinstance(pools, dict) or not all(isinstance(v, list) and all(isinstance(i, dict) and i.get("base_url")
                                                                          for i in v) for v in pools.values()):
        raise ConfigError("--pools: expected pool name -> list of instances, each with a base_url "
                          "(serve/pools.py serve_record)")
    return {str(k): [{str(a): str(b) for a, b in i.items()} for i in v] for k, v in pools.items()}


def cmd_probe(args: argparse.Namespace) -> int:
    from .probes.run import ProbeOptions, resolve_profile, run_probe

    opts = ProbeOptions(
        kind=args.kind, base_url=args.base_url, model=args.model, out_dir=args.out,
        profile=resolve_profile(args.profile), metrics_url=args.metrics_url, prometheus_url=args.prometheus_url,
        prometheus_instance=args.prometheus_instance, prometheus_selector=args.prometheus_selector,
        direct_url=getattr(args, "direct_url", None),
        api_key=os.environ.get(args.api_key_env) or None, server_pid=getattr(args, "server_pid", None),
        server_log=getattr(args, "server_log", None), restart_command=getattr(args, "restart_command", None),
        overrides=parse_overrides(args.set), reference_url=getattr(args, "reference_url", None),
        reference_model=getattr(args, "reference_model", None),
        reference_api_key=os.environ.get(getattr(args, "reference_api_key_env", "") or "") or None,
        under_load=getattr(args, "under_load", 0) or 0, pools=parse_pools(args.pools))
    status, findings, _ = run_probe(opts)
    for f in findings:
        print(f"{f.status.value:>14}  {f.check}" + (f"  [{f.layer}]" if f.layer else "") +
              (f"  {f.reason}" if f.reason else ""))
    print(f"{args.kind}: {status} -> {args.out / 'result.json'}")
    return exit_code(status)


def cmd_report(args: argparse.Namespace) -> int:
    from .report.build import build_report, point_latest
    from .report.judged_profile import run_profile
    from .report.write import write_reports

    profile = run_profile(args.run_dir, args.profile)
    report = build_report(args.run_dir, profile)
    write_reports(args.run_dir, report)
    point_latest(args.run_dir)
    print(f"verdict: {report['verdict']}")
    print(f"report: {RunDir(args.run_dir).report_file('report.html')}")
    return report_exit_code(report.get("verdict"))


def report_exit_code(verdict: object) -> int:
    """The same code per verdict as `run` (api.EXIT_CODES); a report without a known verdict is not a release."""
    from .api import EXIT_CODES

    return EXIT_CODES.get(str(verdict), EXIT_CODES["incomplete"])


def version_text() -> str:
    """`vllm-acceptance --version`: the package and the ansible-core beside it (the playbooks need both)."""
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    try:
        ansible = f"ansible-core {version('ansible-core')}"
    except PackageNotFoundError:
        ansible = "ansible-core not installed in this Python (pip install ansible-core)"
    return f"vllm-acceptance {__version__}\n{ansible}\npython {sys.version.split()[0]}"


def cmd_validate(args: argparse.Namespace) -> int:
    from .gate import validate  # the gate every entry point runs (gate.py)

    print(json.dumps(validate(args.profile, args.inventory, args.project, args.vllm_python).to_dict()))
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    from .runtime import process as server

    state: Path = args.state_dir
    if args.lab_command == "down":
        if (state / "pd" / "pd-plan.json").is_file():          # a lab P/D deployment (serve/pools.py)
            from .serve import pools

            print(f"lab P/D deployment stopped: {pools.down(pools.PdPlan.load(state / 'pd'))}")
        stopped = server.stop(state / "vllm.pid")
        print("lab server stopped" if stopped else "no lab server was running")
        return 0
    profile = load_profile(args.profile)
    if profile.model.pd is not None:
        return _lab_up_pd(args, profile, state)
    launch = profile.model.launch
    model_path = profile.model.model.path
    if not Path(args.python).is_file():
        raise ConfigError(f"lab python {args.python} not found: run `make lab-venv` first")
    if not model_path or not (Path(model_path) / "config.json").is_file():
        raise ConfigError(f"lab model {model_path} not built: run `make lab-model` first")
    spec = server.LaunchSpec(
        python=args.python, model_path=model_path, served_name=profile.model.model.served_name,
        # the lab's own address unless the profile states one: loopback, port 8011 (not the serve role's)
        host=launch.host if launch.stated("host") else "127.0.0.1",
        port=args.port or (launch.port if launch.stated("port") else 8011),
        args=list(launch.args) + args.extra_args.split(), env=dict(launch.env),
        log_path=state / "vllm.log", pid_path=state / "vllm.pid")
    pid = server.start(spec)
    print(f"lab vLLM starting (pid {pid}, log {spec.log_path}) ...", file=sys.stderr)
    try:
        seconds = server.wait_ready(spec.base_url, pid, float(launch.ready_timeout_s), spec.log_path)
    except server.LaunchError:
        server.stop(spec.pid_path)
        raise
    print(f"lab vLLM ready in {seconds:.1f} s", file=sys.stderr)
    print(spec.base_url)
    return 0


def _lab_up_pd(args: argparse.Namespace, profile: Profile, state: Path) -> int:
    """The lab P/D deployment (docs/lab.md "Disaggregated prefill/decode"): each pool's one server on this machine
    and the router, through serve/pools.py as accept.yml's serve stage runs them; prints the router's URL last."""
    from .serve import pools

    model_path = profile.model.model.path
    if not model_path or not (Path(model_path) / "config.json").is_file():
        raise ConfigError(f"lab model {model_path} not built: run `make lab-model` first")
    pd = profile.model.pd
    assert pd is not None
    hosts = {pool: [getattr(pd, pool).launch.host] for pool in pools.POOLS}
    launched = pools.plan(profile, hosts, pd.router.host, args.python, model_path, state / "pd",
                          router_prometheus_port=pools.prometheus_port(profile))
    print(f"lab P/D deployment starting ({', '.join(i.name for i in launched.instances)}, router; logs in "
          f"{state / 'pd'}) ...", file=sys.stderr)
    record = pools.up(launched)
    print(f"lab P/D deployment ready: {record['ready_s']}", file=sys.stderr)
    print(record["entry_point"])
    return 0


def cmd_checks(args: argparse.Namespace) -> int:
    from .rules import catalog_docs

    if args.format == "md":
        print(catalog_docs.as_markdown(), end="")
    else:
        render = catalog_docs.as_json if args.format == "json" else catalog_docs.as_table
        print(render(args.family), end="")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from .report.diff import RunNotFound, diff_runs, render_diff_text

    try:
        print(render_diff_text(diff_runs(args.run_a, args.run_b)))
    except RunNotFound as exc:
        print(f"vllm-acceptance: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def parse_extra_vars(items: list[str]) -> dict[str, object]:
    """ansible-playbook's -e forms: KEY=VALUE pairs (strings), @FILE (YAML/JSON), or inline JSON/YAML."""
    import shlex

    import yaml

    out: dict[str, object] = {}
    for item in items:
        if item.startswith("@"):
            data = yaml.safe_load(Path(item[1:]).read_text())
        elif item.lstrip().startswith("{"):
            data = yaml.safe_load(item)
        else:
            data = {}
            for pair in shlex.split(item):
                if "=" not in pair:
                    raise ConfigError(f"-e {item!r}: expected KEY=VALUE, @FILE or JSON")
                key, value = pair.split("=", 1)
                data[key] = value
        if not isinstance(data, dict):
            raise ConfigError(f"-e {item!r}: must give a mapping of variables")
        out.update(data)
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from .api import accept

    # The gate (gate.py) runs in accept.yml's validate play, on localhost, before any node: a refusal is exit 2 with
    # its message in the progress lines (and an inventory's YAML error is refused by accept() before Ansible starts).
    printed: list[str] = []

    def show(line: str) -> None:
        printed.append(line)
        print(line, flush=True)

    result = accept(args.inventory, check=args.check, extra_vars=parse_extra_vars(args.extra_vars),
                    playbook=args.playbook, project_dir=args.project_dir, reports_dir=args.reports_dir, on_line=show)
    # The summary agrees with the run's last line and repeats nothing it said (issue 43 item 6).
    print(f"verdict: {result.verdict or ('none (check mode: nothing was measured)' if result.check else 'none')}")
    print(f"run: {result.run_dir or ('none (check mode keeps nothing)' if result.check else '-')}")
    if result.reason and result.exit_code != 0 and not any(result.reason in line for line in printed):
        print(f"why: {result.reason}")
    print(f"exit: {result.exit_code}")
    if args.json:
        print(json.dumps(result.to_dict()))
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "probe":
            return cmd_probe(args)
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "diff":
            return cmd_diff(args)
        if args.command == "lab":
            return cmd_lab(args)
        if args.command == "checks":
            return cmd_checks(args)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "plan" and getattr(args, "recheck", False):
            from .recheck.run import print_recheck_plan  # a re-check's cost (docs/recheck.md)

            return print_recheck_plan(args)
        if args.command == "recheck":
            return cmd_recheck(args)
        if args.command == "plan":
            from .gate import print_plan  # the gate, then its plan (gate.py)

            return print_plan(args)
        if args.command == "sign":
            return cmd_sign(args)
        if args.command == "remediation-decision":
            return cmd_remediation_decision(args)
        if args.command == "rebuild-manual":
            return cmd_rebuild_manual(args)
        if args.command == "lineage":
            return cmd_lineage(args)
        if args.command in recipe_commands.COMMANDS:
            return recipe_commands.run(args)
    except (ConfigError, ServerUnreachable) as exc:
        print(f"vllm-acceptance: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - the user gets a message, not a traceback
        if os.environ.get("VLLM_ACCEPTANCE_DEBUG"):
            raise
        print(f"vllm-acceptance: {type(exc).__name__}: {exc} (set VLLM_ACCEPTANCE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
