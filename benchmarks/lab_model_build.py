"""Build the lab's tiny model, serve it with real vLLM on CPU, and check it over HTTP; print figures.

Usage (controller venv; the lab venv only builds the model and runs the server):

    .venv/bin/python benchmarks/lab_model_build.py [--lab-python /tmp/labtry/venv/bin/python]
        [--port 8031] [--workdir /tmp/lab-model-bench] [--variant hermes] [--keep-server]

Checks, each printed with its figures (nothing here is a timed test):
  tool_auto      chat + tools + tool_choice=auto at temperature 0, several tool sets, repeated:
                 finish_reason tool_calls, a declared name, arguments that validate (jsonschema)
  tool_stream    the same request streamed: the tool call assembled from deltas equals it
  plain          chat without tools: text content, finish_reason stop
  second_turn    assistant tool_calls + role tool result: a text answer that stops
  structured     response_format json_schema: content validates against the schema
  prefix_cache   ~1500-token system prompt twice: vllm:prefix_cache_hits_total rises by the
                 block-aligned prefix on the second request
Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema

ROOT = Path(__file__).resolve().parents[1]

NODE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_node_status",
        "description": "Status of one cluster node",
        "parameters": {
            "type": "object",
            "properties": {
                "node": {"type": "string", "description": "host name"},
                "include": {"type": "string", "enum": ["gpu", "memory", "network", "all"]},
            },
            "required": ["node", "include"],
        },
    },
}
TICKET_TOOL = {
    "type": "function",
    "function": {
        "name": "create_ticket",
        "description": "Open an incident ticket",
        "parameters": {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 3},
                "severity": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
                "labels": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                "details": {
                    "type": "object",
                    "properties": {
                        "host": {"type": "string"},
                        "gpu_index": {"type": "integer", "minimum": 0, "maximum": 7},
                        "ecc": {"type": "boolean"},
                    },
                    "required": ["host", "gpu_index", "ecc"],
                },
                "count": {"type": "integer", "minimum": 1},
                "ratio": {"type": "number"},
            },
            "required": ["title", "severity", "labels", "details", "count"],
        },
    },
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_SETS: dict[str, list[dict[str, Any]]] = {
    "node": [NODE_TOOL],
    "ticket": [TICKET_TOOL],
    "node+ticket+weather": [NODE_TOOL, TICKET_TOOL, WEATHER_TOOL],
}
MODEL = "tiny-agent"


def server_command(lab_python: str, model_dir: Path, port: int, parser: str = "hermes") -> list[str]:
    """The vLLM CPU launch line that works with the tiny model (docs/lab.md flags)."""
    return [
        lab_python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--enable-prefix-caching", "--max-model-len", "2048",
        "--enable-auto-tool-choice", "--tool-call-parser", parser, "--tool-strict-level", "parameter",
        "--enable-prompt-tokens-details", "--dtype", "float32", "--enforce-eager",
    ]


def rss_mib(pid: int) -> float:
    """Resident memory of a process and all its descendants (vLLM runs an engine core child)."""
    total = 0
    pids = [pid]
    while pids:
        p = pids.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        pids.extend(int(c) for c in children)
    return round(total / 1024, 1)


def metric(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def chat(base: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    r = httpx.post(base + "/v1/chat/completions", json={"model": MODEL, **body}, timeout=300)
    r.raise_for_status()
    return r.json(), time.monotonic() - t0


def check_tool_call(choice: dict[str, Any], tools: list[dict[str, Any]]) -> str | None:
    """None when the choice is a valid tool call against the declared tools, else why not."""
    if choice["finish_reason"] != "tool_calls":
        return f"finish_reason {choice['finish_reason']!r}, content {choice['message'].get('content')!r}"
    calls = choice["message"].get("tool_calls") or []
    if len(calls) != 1:
        return f"{len(calls)} tool calls"
    fn = calls[0]["function"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if fn["name"] not in schemas:
        return f"undeclared tool {fn['name']!r}"
    try:
        jsonschema.validate(json.loads(fn["arguments"]), schemas[fn["name"]])
    except (ValueError, jsonschema.ValidationError) as exc:
        return f"arguments {fn['arguments']!r}: {exc}"
    return None


def stream_tool_call(base: str, body: dict[str, Any]) -> tuple[dict[str, str], str | None, float]:
    """Stream a request and assemble tool call 0 from its deltas."""
    name, args, finish = "", "", None
    t0 = time.monotonic()
    with httpx.stream("POST", base + "/v1/chat/completions",
                      json={"model": MODEL, "stream": True, **body}, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            for tc in choice["delta"].get("tool_calls") or []:
                fn = tc.get("function") or {}
                name += fn.get("name") or ""
                args += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {"name": name, "arguments": args}, finish, time.monotonic() - t0


def run_checks(base: str, repeats: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    user = [{"role": "user", "content": "Check node gpu-node-3 and open a ticket if it is unhealthy."}]

    failures, lat, first, tokens = [], [], {}, {}
    for name, tools in TOOL_SETS.items():
        seen = set()
        for _ in range(repeats):
            out, dt = chat(base, {"messages": user, "tools": tools, "tool_choice": "auto",
                                  "temperature": 0, "max_tokens": 256})
            lat.append(dt)
            why = check_tool_call(out["choices"][0], tools)
            if why:
                failures.append(f"{name}: {why}")
                continue
            fn = out["choices"][0]["message"]["tool_calls"][0]["function"]
            seen.add((fn["name"], fn["arguments"]))
            first.setdefault(name, fn)
            tokens.setdefault(name, out["usage"]["completion_tokens"])
        if len(seen) > 1:
            failures.append(f"{name}: temperature 0 gave {len(seen)} different calls")
    res["tool_auto"] = {"ok": not failures, "failures": failures, "calls": first, "completion_tokens": tokens,
                        "requests": len(lat), "latency_s": _stats(lat)}

    body = {"messages": user, "tools": TOOL_SETS["ticket"], "tool_choice": "auto",
            "temperature": 0, "max_tokens": 256}
    streamed, finish, dt = stream_tool_call(base, body)
    ref = first.get("ticket", {})
    same = streamed["name"] == ref.get("name") and _json_eq(streamed["arguments"], ref.get("arguments"))
    res["tool_stream"] = {"ok": same and finish == "tool_calls", "finish_reason": finish,
                          "assembled": streamed, "latency_s": round(dt, 3)}

    for choice_name, tool_choice in (("required", "required"),
                                     ("named", {"type": "function", "function": {"name": "get_node_status"}})):
        out, dt = chat(base, {"messages": user, "tools": TOOL_SETS["node+ticket+weather"],
                              "tool_choice": tool_choice, "temperature": 0, "max_tokens": 256})
        ch = out["choices"][0]
        calls = ch["message"].get("tool_calls") or []
        res[f"tool_{choice_name}"] = {
            "ok": bool(calls) and check_tool_call({**ch, "finish_reason": "tool_calls"},
                                                  TOOL_SETS["node+ticket+weather"]) is None,
            "finish_reason": ch["finish_reason"], "calls": [c["function"] for c in calls],
            "latency_s": round(dt, 3)}

    out, dt = chat(base, {"messages": [{"role": "user", "content": "Hi, who are you?"}],
                          "temperature": 0, "max_tokens": 64})
    ch = out["choices"][0]
    res["plain"] = {"ok": ch["finish_reason"] == "stop" and bool(ch["message"]["content"]),
                    "content": ch["message"]["content"], "finish_reason": ch["finish_reason"],
                    "completion_tokens": out["usage"]["completion_tokens"], "latency_s": round(dt, 3)}

    call = first.get("node") or {"name": "get_node_status", "arguments": '{"node": "n1", "include": "gpu"}'}
    second = user + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"node": "gpu-node-3", "healthy": true}'},
    ]
    out, dt = chat(base, {"messages": second, "tools": TOOL_SETS["node"], "tool_choice": "auto",
                          "temperature": 0, "max_tokens": 64})
    ch = out["choices"][0]
    res["second_turn"] = {"ok": ch["finish_reason"] == "stop" and bool(ch["message"]["content"])
                          and not ch["message"].get("tool_calls"),
                          "content": ch["message"]["content"], "finish_reason": ch["finish_reason"],
                          "prompt_tokens": out["usage"]["prompt_tokens"], "latency_s": round(dt, 3)}

    schema = {"type": "object", "properties": {
        "verdict": {"type": "string", "enum": ["release", "limited_observation", "incomplete"]},
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "hosts": {"type": "array", "items": {"type": "string"}},
        "reason": {"type": "string", "minLength": 4}},
        "required": ["verdict", "score", "hosts", "reason"], "additionalProperties": False}
    out, dt = chat(base, {"messages": [{"role": "user", "content": "Give the verdict as JSON."}],
                          "response_format": {"type": "json_schema",
                                              "json_schema": {"name": "verdict", "schema": schema}},
                          "temperature": 0, "max_tokens": 128})
    ch = out["choices"][0]
    try:
        jsonschema.validate(json.loads(ch["message"]["content"]), schema)
        valid = True
    except (ValueError, TypeError, jsonschema.ValidationError):
        valid = False
    res["structured"] = {"ok": valid and ch["finish_reason"] == "stop", "content": ch["message"]["content"],
                         "finish_reason": ch["finish_reason"], "latency_s": round(dt, 3)}

    res["prefix_cache"] = prefix_cache(base)
    return res


def prefix_cache(base: str) -> dict[str, Any]:
    words = ["node", "gpu", "queue", "cache", "latency", "ticket", "driver", "image",
             "region", "host", "metrics", "token", "server", "request", "profile", "evidence"]
    system = " ".join(words[(i * 7) % len(words)] for i in range(1480))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Summarize."}]
    steps = []
    for label, m in (("cold", msgs), ("hot", msgs),
                     ("control", [{"role": "system", "content": "changed " + system}, msgs[1]])):
        before = metric(base, "vllm:prefix_cache_hits_total")
        out, dt = chat(base, {"messages": m, "temperature": 0, "max_tokens": 8})
        hits = metric(base, "vllm:prefix_cache_hits_total") - before
        details = out["usage"].get("prompt_tokens_details") or {}
        steps.append({"step": label, "prompt_tokens": out["usage"]["prompt_tokens"], "hits": hits,
                      "cached_tokens": details.get("cached_tokens"), "latency_s": round(dt, 3)})
    block = 128
    expect_hot = (steps[1]["prompt_tokens"] - 1) // block * block
    ok = steps[0]["hits"] == 0 and steps[1]["hits"] == expect_hot and steps[2]["hits"] == 0
    return {"ok": ok, "expected_hot_hits": expect_hot, "steps": steps}


def _json_eq(a: str | None, b: str | None) -> bool:
    try:
        return json.loads(a or "null") == json.loads(b or "null")
    except ValueError:
        return False


def _stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"n": len(s), "min": round(s[0], 3), "p50": round(s[len(s) // 2], 3), "max": round(s[-1], 3)} \
        if s else {"n": 0}


def main() -> int:
    ap = argparse.ArgumentParser(description="build + serve + check the lab tiny model")
    ap.add_argument("--lab-python", default=os.environ.get("LAB_PYTHON", "/tmp/labtry/venv/bin/python"))
    ap.add_argument("--port", type=int, default=8031)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/lab-model-bench"))
    ap.add_argument("--variant", default="hermes")
    ap.add_argument("--repeats", type=int, default=4, help="requests per tool set")
    ap.add_argument("--base-url", help="check an already running server instead of starting one")
    ap.add_argument("--keep-server", action="store_true")
    args = ap.parse_args()

    figures: dict[str, Any] = {}
    proc = None
    base = args.base_url
    if not base:
        model = args.workdir / f"model-{args.variant}"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        t0 = time.monotonic()
        subprocess.run([args.lab_python, "-m", "vllm_acceptance.lab.build_model", "--out", str(model),
                        "--variant", args.variant], check=True, env=env, stdout=subprocess.DEVNULL)
        figures["build_s"] = round(time.monotonic() - t0, 2)
        cmd = server_command(args.lab_python, model, args.port,
                             "hermes" if args.variant == "hermes" else args.variant)
        figures["server_command"] = " ".join(cmd)
        log = (args.workdir / "server.log").open("w")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{args.port}"
        while True:
            if proc.poll() is not None:
                print(json.dumps({"error": "server exited", "log": str(log.name)}))
                return 1
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 900:
                print(json.dumps({"error": "server not ready in 900 s"}))
                os.killpg(proc.pid, signal.SIGTERM)
                return 1
            time.sleep(1)
        figures["server_ready_s"] = round(time.monotonic() - t0, 1)
        figures["rss_mib_ready"] = rss_mib(proc.pid)
    try:
        results = run_checks(base, args.repeats)
        if proc:
            figures["rss_mib_after"] = rss_mib(proc.pid)
        info = httpx.get(base + "/metrics", timeout=30).text
        m = re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', info)
        figures["block_size"] = int(m.group(1)) if m else None
    finally:
        if proc and not args.keep_server:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    print(json.dumps({"figures": figures, "checks": results}, indent=1))
    return 0 if all(c["ok"] for c in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
