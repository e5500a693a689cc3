"""A stopped prefill instance (docs/checks.md `quality.pd_prefill_stopped`): requests through the entry point must
fail loudly -- an HTTP error or an error body -- and never answer with text (the decode would have answered without
the prefill's KV: garbage on a corrupt path, vllm#52627, or a silent recomputation); the decode pool survives (its
/health while the prefill is down and after it is back, and one request answered after the restart).

`quality.pd_stop_prefill`: true stops the first prefill instance that has a stop_command and a start_command; false
skips (not_applicable); unset (the default) stops one only when the serve record gave the commands, i.e. this run
launched the pools -- an attached deployment is never stopped unless asked, and asked without commands it is
`missing`.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import httpx

from ...core.evidence import EvidenceStore
from ...core.findings import Consequence, Finding, Status
from ...rules.registry import get as catalog_get
from ...runtime.client import OpenAIClient
from ..options import ProbeOptions, request_timeout_s

CHECK_ID = "quality.pd_prefill_stopped"
STOPPED_REQUESTS = 3
PROMPT = "Name three primary colours, separated by commas."
HEALTH_WAIT_S = 120.0
RESTART_WAIT_S = 900.0
# How long a router may take to readmit a restarted prefill instance (its health-check interval and more: the lab
# router checks every 5 s; vllm-router defaults to 60 s), answering 503 meanwhile.
READMIT_S = 180.0


def _finding(status: Status, observed: Any, evidence: list[str], *, reason: str = "", action: str = "") -> Finding:
    entry = catalog_get(CHECK_ID)
    expected = (f"with one prefill instance stopped, each of {STOPPED_REQUESTS} requests through the entry point ends "
                "in an HTTP error or an error body (never text); every decode instance answers /health during the "
                "stop and after the restart, and a request after the restart answers")
    return Finding(check=CHECK_ID, status=status, observed=observed, expected=expected, evidence=evidence,
                   rule=entry.rule, title=entry.title, consequence=Consequence(entry.consequence.value),
                   reason=reason, action=action)


def healthy(base_url: str, timeout_s: float = 5.0) -> bool:
    root = base_url.rstrip("/")
    root = root[:-3] if root.endswith("/v1") else root
    try:
        return httpx.get(f"{root}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_health(base_url: str, want: bool, limit_s: float) -> bool:
    began = time.time()
    while healthy(base_url) != want:
        if time.time() - began > limit_s:
            return False
        time.sleep(1.0)
    return True


def run_command(command: str, limit_s: float) -> tuple[int | None, str]:
    try:
        proc = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=limit_s)  # noqa: S602
    except subprocess.TimeoutExpired:
        return None, f"$ {command}\ntimed out after {limit_s:g} s\n"
    return proc.returncode, f"$ {command}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}\n"


def answer_text(body: Any) -> str:
    """The text (or tool calls) a chat completion answered with; "" when it carries none or is an error body."""
    if not isinstance(body, dict) or "error" in body:
        return ""
    parts = []
    for choice in body.get("choices") or []:
        message = (choice or {}).get("message") or {}
        parts.append(str(message.get("content") or "") + str(message.get("tool_calls") or ""))
    return "".join(parts).strip()


def classify(status: int, body: Any, error: str | None, timed_out: bool) -> str:
    """`loud` (HTTP error, error body, refused connection), `text` (an answer), `hang` (no answer in time) or
    `empty` (HTTP 200 without an error and without text: not loud)."""
    if timed_out:
        return "hang"
    if error or status >= 400:
        return "loud"
    if isinstance(body, dict) and "error" in body:
        return "loud"
    return "text" if answer_text(body) else "empty"


def send(client: OpenAIClient, model: str) -> dict[str, Any]:
    ex = client.chat({"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16,
                      "temperature": 0.0})
    return {"status": ex.status, "error": ex.error, "timed_out": ex.timed_out,
            "text": answer_text(ex.body)[:200], "outcome": classify(ex.status, ex.body, ex.error, ex.timed_out)}


def send_readmitted(client: OpenAIClient, model: str, limit_s: float | None = None) -> tuple[dict[str, Any], float]:
    """The request after the restart, and how long the entry point took to take the instance back. A router answers
    503 while its health check has not yet readmitted a restarted worker (vllm-router: "No available workers";
    docs/lab.md "Disaggregated prefill/decode"): a 503 is sent again every 2 s for at most READMIT_S; any other
    answer, or a 503 past that, is judged as it is."""
    limit = READMIT_S if limit_s is None else limit_s
    started = time.monotonic()
    while True:
        answer = send(client, model)
        waited = round(time.monotonic() - started, 1)
        if answer["status"] != 503 or waited >= limit:
            return answer, waited
        time.sleep(2.0)


def pick(opts: ProbeOptions) -> dict[str, str] | None:
    return next((i for i in opts.pools.get("prefill", []) if i.get("stop_command") and i.get("start_command")), None)


def stop_prefill_findings(opts: ProbeOptions, store: EvidenceStore, wanted: Any) -> Finding:
    instance = pick(opts)
    if wanted is False or (wanted is None and instance is None):
        return _finding(Status.NOT_APPLICABLE, "quality.pd_stop_prefill is false" if wanted is False else
                        "no prefill instance has a stop_command and start_command (an attached deployment) and "
                        "quality.pd_stop_prefill is unset", [])
    if instance is None:
        return _finding(Status.MISSING, "quality.pd_stop_prefill is true but no prefill instance has a stop_command "
                        "and a start_command", [],
                        action="give the prefill instances stop_command and start_command in the serve record, or "
                               "set quality.pd_stop_prefill false")
    return run_stop(opts, store, instance)


def timeout_of(opts: ProbeOptions) -> float:
    """The probe's request timeout (options.request_timeout_s), at most 120 s: a stopped prefill must not hold a
    request for long; 120 s where the profile names none for this probe."""
    try:
        return min(float(request_timeout_s(opts)), 120.0)
    except (KeyError, AttributeError, ValueError, TypeError):
        return 120.0


def run_stop(opts: ProbeOptions, store: EvidenceStore, instance: dict[str, str]) -> Finding:
    log: list[str] = []
    record: dict[str, Any] = {"instance": instance.get("base_url"), "during": [], "after": None}
    decodes = [i.get("base_url", "") for i in opts.pools.get("decode", [])]
    client = OpenAIClient(opts.base_url, api_key=opts.api_key, timeout_s=timeout_of(opts))
    try:
        rc, out = run_command(instance["stop_command"], HEALTH_WAIT_S)
        log.append(out)
        if rc != 0 or not wait_health(instance["base_url"], False, HEALTH_WAIT_S):
            # a stop that exited 0 but left the instance up is started again (a no-op when it still runs); after a
            # failed stop command nothing is started: what state it left is for the operator to see in the log
            restored = _restore(instance, log) if rc == 0 else None
            ev = store.write_text("pd_path/stop-prefill.log", "".join(log))
            return _finding(Status.INCONCLUSIVE, {"stop_exit": rc, "restored": restored}, [ev],
                            reason="the prefill instance could not be stopped (its stop_command failed or it still "
                                   "answers /health)", action="fix the prefill instance's stop_command")
        record["during"] = [send(client, opts.model) for _ in range(STOPPED_REQUESTS)]
        record["decode_health_during"] = {d: healthy(d) for d in decodes}
        record["restored"] = _restore(instance, log)
        if record["restored"]:
            record["decode_health_after"] = {d: healthy(d) for d in decodes}
            record["after"], record["readmit_s"] = send_readmitted(client, opts.model)
    finally:
        client.close()
    evidence = [store.write_text("pd_path/stop-prefill.log", "".join(log)),
                store.write_json("pd_path/stop-prefill.json", record)]
    return judge_stop(record, evidence)


def _restore(instance: dict[str, str], log: list[str]) -> bool:
    rc, out = run_command(instance["start_command"], RESTART_WAIT_S)
    log.append(out)
    return rc == 0 and wait_health(instance["base_url"], True, RESTART_WAIT_S)


def judge_stop(record: dict[str, Any], evidence: list[str]) -> Finding:
    """Judge a stop record (run_stop's shape; a unit test hands recorded ones)."""
    outcomes = [r["outcome"] for r in record.get("during", [])]
    quiet = [r for r in record.get("during", []) if r["outcome"] != "loud"]
    down_during = [d for d, ok in (record.get("decode_health_during") or {}).items() if not ok]
    if quiet:
        kinds = sorted({r["outcome"] for r in quiet})
        return _finding(Status.FAIL, record, evidence,
                        reason=f"{len(quiet)} of {len(outcomes)} requests with the prefill stopped did not fail "
                               f"loudly ({', '.join(kinds)}): the entry point answered without the prefill's KV",
                        action="make the router fail a request whose prefill is unavailable (an HTTP 5xx), never "
                               "send it to the decode alone")
    if down_during:
        return _finding(Status.FAIL, record, evidence,
                        reason=f"decode instances stopped answering /health while a prefill was down: {down_during}",
                        action="the decode pool must survive a prefill's loss: read the decode's log")
    if not record.get("restored"):
        return _finding(Status.INCONCLUSIVE, record, evidence,
                        reason="the prefill instance did not come back after its start_command: the decode pool's "
                               "survival after the restart is not proven",
                        action="restart the prefill instance by hand and fix its start_command")
    down_after = [d for d, ok in (record.get("decode_health_after") or {}).items() if not ok]
    after = record.get("after") or {}
    if down_after or after.get("outcome") != "text":
        return _finding(Status.FAIL, record, evidence,
                        reason=f"after the prefill came back: decode /health down {down_after or 'none'}, the request "
                               f"through the entry point {after.get('outcome', 'not sent')} "
                               f"(HTTP {after.get('status')})",
                        action="the decode pool must serve again once its prefill is back: read the decode's log")
    return _finding(Status.PASS, record, evidence)
