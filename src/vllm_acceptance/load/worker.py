"""One load generator host's share of a distributed load stage (docs/acceptance.md "Capacity under load").

Every host of the inventory group ``loadgen`` runs this at once (playbooks/loadgen.yml), each
writing its own records as JSONL; the controller merges them (:mod:`vllm_acceptance.probes.loadmerge`).

    python -m vllm_acceptance.load.worker run --base-url URL --model M --concurrency C \
        --requests N --prompt-tokens P --output-tokens O --out FILE.jsonl [--start-at EPOCH]

Why a shared ``--start-at``: the hosts must load the server together, not one after the other as
SSH happens to reach them. Each host sleeps until that epoch second on its own clock, so the
merge checks the clocks agreed (every host's first request near ``start_at``). The API key is
read from ``VLLM_API_KEY`` only: a command line is visible to every user of the node.

``agent`` serves the controller's load probe instead (``load/agent.py``: the ramp, mixed stream and
soak of an acceptance run from every loadgen host at once) until ``stop`` or an idle timeout:

    python -m vllm_acceptance.load.worker agent --port 29600 --host NAME --pid-file F
    python -m vllm_acceptance.load.worker stop --pid-file F

Next to ``FILE.jsonl`` it writes ``FILE.meta.json``: host, parameters (no key), the planned and
actual start, the counts, and this host's client self-check (CPU and event-loop lag per worker
process, read cost; ``rules/loadgen.py`` judges it in the merge), so the merge can tell a host
that sent less from one that never ran, and a saturated host from a slow server. Exit status:
0 ran (request failures are data, not an exit status), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

META_SUFFIX = ".meta.json"
MAX_START_WAIT_S = 600.0  # a start further ahead is a planning error, not something to wait for


def meta_path(out: Path) -> Path:
    """``x.jsonl`` -> ``x.meta.json`` (the sidecar the merge reads)."""
    return out.with_name(out.name.removesuffix(".jsonl") + META_SUFFIX)


def host_seed(host: str) -> int:
    """Per-host seed base: different hosts send different prompts, so one host's requests never
    hit another host's prefix cache entries (that would flatter the merged latencies)."""
    return zlib.crc32(host.encode()) % 1_000_000 * 1000


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vllm_acceptance.load.worker",
                                     description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="send this host's share of the load, records to --out")
    run.add_argument("--base-url", required=True, help="OpenAI base URL as this host reaches it")
    run.add_argument("--model", required=True, help="served model name")
    run.add_argument("--concurrency", type=int, required=True, help="requests in flight on this host")
    run.add_argument("--requests", type=int, required=True, help="requests this host sends")
    run.add_argument("--prompt-tokens", type=int, default=256)
    run.add_argument("--output-tokens", type=int, default=32)
    run.add_argument("--out", type=Path, required=True, help="records JSONL (replaced)")
    run.add_argument("--start-at", type=float, default=None, help="epoch seconds; all hosts start together")
    run.add_argument("--host", default=None, help="name in the records (default: this host's name)")
    run.add_argument("--request-timeout-s", type=float, default=60.0)
    run.add_argument("--stage-timeout-s", type=float, default=300.0)
    run.add_argument("--processes", type=int, default=1, help="worker processes on this host (one core each)")
    agent = sub.add_parser("agent", help="serve the controller's load probe (token in VLLM_ACCEPTANCE_AGENT_TOKEN)")
    agent.add_argument("--listen", default="0.0.0.0", help="address to listen on")
    agent.add_argument("--port", type=int, default=29600)
    agent.add_argument("--host", default=None, help="name in the records (default: this host's name)")
    agent.add_argument("--pid-file", type=Path, default=None)
    agent.add_argument("--idle-timeout-s", type=float, default=1800.0, help="exit after this long without a call")
    stop = sub.add_parser("stop", help="stop the agent whose pid file this is")
    stop.add_argument("--pid-file", type=Path, required=True)
    return parser


def validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, or None."""
    if args.command != "run":
        return None
    for name in ("concurrency", "requests", "prompt_tokens", "output_tokens", "processes"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
    if args.start_at is not None and args.start_at - time.time() > MAX_START_WAIT_S:
        return (f"--start-at {args.start_at:.3f} is {args.start_at - time.time():.0f} s ahead (more than "
                f"{MAX_START_WAIT_S:.0f} s): check the controller's and this host's clocks")
    return None


def wait_until(epoch: float) -> None:
    """Sleep until `epoch` on this host's wall clock (coarse sleep, then a short fine one)."""
    while True:
        left = epoch - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.5) if left > 0.01 else left)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Send the load; returns the meta written beside the records."""
    from vllm_acceptance.core.redact import redact_obj
    from vllm_acceptance.load.engine.clock import now
    from vllm_acceptance.load.engine.multiprocess import run_load
    from vllm_acceptance.load.engine.records import RecordSink
    from vllm_acceptance.load.prompts import spec

    host = args.host or socket.gethostname()
    base = host_seed(host)
    specs = [spec(args.prompt_tokens, args.output_tokens, base + i, "dist") for i in range(args.requests)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.unlink(missing_ok=True)  # RecordSink appends: a rerun must not mix two runs
    launched = time.time()
    if args.start_at is not None:
        wait_until(args.start_at)
    started = now()
    checks: list[dict[str, Any]] = []
    with RecordSink(args.out) as sink:
        records = run_load(
            args.base_url, args.model, specs, mode="closed", concurrency=args.concurrency,
            processes=args.processes, timeout_s=args.request_timeout_s, stage_deadline_s=args.stage_timeout_s,
            api_key=os.environ.get("VLLM_API_KEY") or None, on_record=sink, run_id=f"{host}", selfcheck=checks)
    meta = {"host": host, "base_url": args.base_url, "model": args.model, "concurrency": args.concurrency,
            "requests": args.requests, "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
            "launched": launched, "start_at": args.start_at, "started": started, "finished": now(),
            "records": len(records), "ok": sum(r.status == "ok" for r in records),
            "selfcheck": [{**c, "host": host} for c in checks]}
    # the server URL may carry credentials or a query key (core/redact.py): never written as it is
    meta_path(args.out).write_text(json.dumps(redact_obj(meta), indent=2) + "\n")
    return meta


def stop_agent(pid_file: Path) -> int:
    """SIGTERM the agent of this pid file and wait (bounded) for it to go; 0 also when it was gone."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return 0
    try:
        os.kill(pid, 15)
    except OSError:
        return 0
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except OSError:
            break
        time.sleep(0.1)
    pid_file.unlink(missing_ok=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = validate(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.command == "agent":
        from vllm_acceptance.load.agent import TOKEN_ENV, serve

        try:
            serve(args.listen, args.port, args.host or socket.gethostname(), os.environ.get(TOKEN_ENV, ""),
                  idle_timeout_s=args.idle_timeout_s, pid_file=args.pid_file)
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "stop":
        return stop_agent(args.pid_file)
    meta = run(args)
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
