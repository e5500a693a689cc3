"""The P/D path check: proof, from each pool's own counters, that the disaggregated path is the one that answered
(docs/checks.md `quality.pd_*`, docs/sources.md#pd-path).

Around the quality probe's parity pass (probes/quality/hooks.py) it reads every prefill and decode instance's
/metrics (runtime/metrics.py PoolCounters) and judges what each pool gained:
- the prefill pool served the prompts: every prompt sent through the entry point was a request on a prefill
  instance, and no prefill instance sat at 0 while the pass had enough requests for each (modelplane#175);
- the decode pool loaded the prompts through the connector and computed itself at most the tail a connector cannot
  carry (under one KV block per request); a decode that recomputed the prompts means the connector is not in the path;
- the connector's failures (NIXL's counters) and the decode's error-finished requests (a failed KV load under
  `kv_load_failure_policy: fail` ends as an error, vLLM v1/engine FinishReason.ERROR) are fatal under `fail`, a warn
  under `recompute`;
- optionally, one prefill instance stopped (its stop_command), requests through the entry point fail loudly, and
  after its start_command the decode pool answers again (pd_stop.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.evidence import EvidenceStore
from ...core.findings import Consequence, Finding, Status
from ...rules.registry import get as catalog_get
from ...runtime.metrics import DirectMetrics, MetricsError, PoolCounters
from ..options import ProbeOptions, setting
from .pd_stop import stop_prefill_findings

PREFILL, DECODE = "prefill", "decode"
POLICY_KEY = "quality.pd_kv_load_failure_policy"
STOP_KEY = "quality.pd_stop_prefill"
# vLLM 0.32 config/kv_transfer.py: KVTransferConfig.kv_load_failure_policy defaults to "fail".
DEFAULT_POLICY = "fail"


def option(opts: ProbeOptions, key: str) -> Any:
    """A P/D setting: the override (`--set`), else the profile's field where the profile model has one, else None."""
    if key in opts.overrides:
        return opts.overrides[key]
    try:
        return setting(opts, key)
    except (KeyError, AttributeError, ValueError, TypeError):
        return None


def failure_policy(opts: ProbeOptions) -> str:
    """`kv_load_failure_policy` of the decode pool: the setting, else what the decode instances state, else vLLM's
    default (`fail`, the stricter reading)."""
    stated = option(opts, POLICY_KEY) or next(
        (i.get("kv_load_failure_policy") for i in opts.pools.get(DECODE, []) if i.get("kv_load_failure_policy")), None)
    policy = str(stated or DEFAULT_POLICY)
    if policy not in ("fail", "recompute"):
        raise ValueError(f"{POLICY_KEY}: {policy!r} is not `fail` or `recompute` (vLLM's kv_load_failure_policy)")
    return policy


def instance_name(pool: str, index: int, instance: dict[str, str]) -> str:
    return f"{pool}[{index}] {instance.get('metrics_url') or instance.get('base_url', '?')}"


def metrics_url(instance: dict[str, str]) -> str:
    if instance.get("metrics_url"):
        return instance["metrics_url"]
    root = instance.get("base_url", "").rstrip("/")
    return (root[:-3] if root.endswith("/v1") else root) + "/metrics"


def read_pools(opts: ProbeOptions, store: EvidenceStore, label: str) -> dict[str, Any]:
    """Every instance's counters now: {pool: [{"name", "counters" | "error", "evidence"}]}; the raw /metrics of each
    is written as evidence."""
    out: dict[str, Any] = {}
    for pool in (PREFILL, DECODE):
        rows = []
        for index, instance in enumerate(opts.pools.get(pool, [])):
            row: dict[str, Any] = {"name": instance_name(pool, index, instance)}
            try:
                snap = DirectMetrics(metrics_url(instance)).snapshot()
            except MetricsError as exc:
                row["error"] = str(exc)
            else:
                row["evidence"] = store.write_text(f"pd_path/{label}-{pool}-{index}.metrics.txt", snap.raw)
                row["counters"] = PoolCounters.of(snap).to_dict()
            rows.append(row)
        out[pool] = rows
    return out


@dataclass
class Gain:
    """What one instance's counters gained over the pass, or why that cannot be read."""

    name: str
    gained: PoolCounters | None
    problem: str = ""
    evidence: tuple[str, ...] = ()


def gains(before: dict[str, Any], after: dict[str, Any], pool: str) -> list[Gain]:
    out = []
    for b, a in zip(before.get(pool, []), after.get(pool, []), strict=False):
        first, last = PoolCounters.from_dict(b.get("counters")), PoolCounters.from_dict(a.get("counters"))
        evidence = tuple(e for e in (b.get("evidence"), a.get("evidence")) if e)
        if first is None or last is None:
            out.append(Gain(a["name"], None, b.get("error") or a.get("error") or "no counters", evidence))
            continue
        gained = last.since(first)
        fell = [k for k, v in gained.to_dict().items() if k != "block_size" and v is not None and v < 0]
        if fell:   # a counter never falls in one process: the instance restarted during the pass
            out.append(Gain(a["name"], None, f"counters fell over the pass ({', '.join(fell)}): the instance "
                                             "restarted, what it served is unknown", evidence))
        else:
            out.append(Gain(a["name"], gained, evidence=evidence))
    return out


def requests_sent(parity: dict[str, Any] | None) -> int | None:
    """The prompts the parity pass sent through the entry point: its summary's `requests_sent`, else one per prompt of
    its test pass (`per_prompt`, else `prompts`). Never its `requests`: that counts the reference passes too (sent to
    the reference path, a prefill instance itself when no quality_reference_url is given, probes/quality/probe.py).
    None when it did not run or does not say."""
    if not parity:
        return None
    value = parity.get("requests_sent")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    for key in ("per_prompt", "prompts"):
        if isinstance(parity.get(key), dict | list):
            return len(parity[key])
    return None


def finding(check: str, status: Status, observed: Any, expected: Any, evidence: list[str], *,
            action: str = "", reason: str = "") -> Finding:
    entry = catalog_get(check)
    return Finding(check=check, status=status, observed=observed, expected=expected, evidence=evidence,
                   rule=entry.rule, title=entry.title, consequence=Consequence(entry.consequence.value),
                   action=action, reason=reason)


def _evidence(rows: list[Gain]) -> list[str]:
    return [e for g in rows for e in g.evidence]


def judge_prefill(rows: list[Gain], sent: int | None) -> Finding:
    check = "quality.pd_prefill_served"
    expected = "every prompt sent through the entry point is a prefill request (max_tokens 1) on a prefill instance; " \
               "each prefill instance served at least one when the pass sent at least one per instance"
    evidence = _evidence(rows)
    if not rows:
        return finding(check, Status.MISSING, "no prefill instance in the deployment's pools", expected, evidence,
                       action="record the prefill pool's instances (base_url, metrics_url) in the serve record")
    unreadable = [f"{g.name}: {g.problem or 'no vllm:request_params_max_tokens histogram'}" for g in rows
                  if g.gained is None or g.gained.prefill_side is None]
    if unreadable:
        return finding(check, Status.MISSING, {"unreadable": unreadable}, expected, evidence,
                       action="make each prefill instance's /metrics readable (vllm:request_params_max_tokens: the "
                              "prefill requests, max_tokens 1, told from the reference path's answers)")
    if sent is None or sent <= 0:
        return finding(check, Status.INCONCLUSIVE, "the parity pass sent no request (or did not say how many)",
                       expected, evidence)
    # the prefill requests (max_tokens 1): the reference passes may be sent to a prefill instance directly and must
    # not stand for the prefill the router skipped
    served = {g.name: g.gained.prefill_side for g in rows if g.gained is not None}
    total = sum(v or 0.0 for v in served.values())
    idle = [name for name, v in served.items() if not v]
    observed = {"requests_sent": sent, "served_per_prefill": served}
    if total < sent:
        return finding(check, Status.FAIL, observed, expected, evidence,
                       reason=f"the prefill pool served {total:g} requests for {sent} prompts: "
                              f"{sent - total:g} reached the decode without a prefill",
                       action="route every request through a prefill instance (the router's prefill list)")
    if idle and sent >= len(rows):
        return finding(check, Status.FAIL, observed, expected, evidence,
                       reason=f"{', '.join(idle)} served 0 requests without an error (modelplane#175)",
                       action="register the idle prefill instance with the router, or remove it from the pool")
    return finding(check, Status.PASS, observed, expected, evidence)


def judge_decode(rows: list[Gain], sent: int | None) -> Finding:
    check = "quality.pd_decode_loaded"
    expected = "the decode pool computed itself at most one KV block of prompt per request (the tail a connector " \
               "cannot carry); the rest came through the connector (external_kv_transfer) or its own prefix cache"
    evidence = _evidence(rows)
    if not rows:
        return finding(check, Status.MISSING, "no decode instance in the deployment's pools", expected, evidence,
                       action="record the decode pool's instances (base_url, metrics_url) in the serve record")
    lacking = [f"{g.name}: {g.problem or 'no vllm:prompt_tokens_by_source / request_success / block_size'}"
               for g in rows if g.gained is None or None in (g.gained.computed, g.gained.external,
                                                            g.gained.requests, g.gained.block_size)]
    if lacking:
        return finding(check, Status.MISSING, {"unreadable": lacking}, expected, evidence,
                       action="serve vLLM >= 0.11 (prompt_tokens_by_source) and make /metrics readable")
    if sent is None or sent <= 0:
        return finding(check, Status.INCONCLUSIVE, "the parity pass sent no request (or did not say how many)",
                       expected, evidence)
    per: dict[str, dict[str, float]] = {}
    failing: list[str] = []
    requests = provable = 0.0
    for g in rows:
        c = g.gained
        assert c is not None and c.requests is not None and c.computed is not None and c.block_size is not None
        allowance = c.requests * c.block_size
        # what the connector could have carried: the prompt tokens the decode did not find in its own cache
        beyond = (c.computed or 0.0) + (c.external or 0.0)
        per[g.name] = {"requests": c.requests, "computed": c.computed, "external": c.external or 0.0,
                       "local_cache_hit": c.local_hit or 0.0, "allowance": allowance}
        requests += c.requests
        provable += max(0.0, beyond - allowance)
        if c.computed > allowance:
            failing.append(f"{g.name} computed {c.computed:g} prompt tokens itself and loaded {c.external or 0:g} "
                           f"for {c.requests:g} requests (allowance {allowance:g}: one block of {c.block_size} each)")
    observed = {"requests_sent": sent, "per_decode": per}
    if failing:
        return finding(check, Status.FAIL, observed, expected, evidence, reason="; ".join(failing),
                       action="the decode recomputed the prompts: check its kv-transfer-config (connector, role, "
                              "the prefill it reads from)")
    if requests < sent:
        return finding(check, Status.FAIL, observed, expected, evidence,
                       reason=f"the decode pool finished {requests:g} requests for {sent} prompts",
                       action="route every request's decode through the decode pool")
    if provable <= 0:
        return finding(check, Status.INCONCLUSIVE, observed, expected, evidence,
                       reason="no prompt was longer than the tail the decode may compute itself (one block per "
                              "request) beyond its own prefix cache: the pass cannot tell loading from recomputing",
                       action="send prompts longer than a KV block (the parity set's long prompts)")
    return finding(check, Status.PASS, observed, expected, evidence)


def judge_failures(prefill: list[Gain], decode: list[Gain], policy: str) -> Finding:
    check = "quality.pd_transfer_failures"
    expected = f"no failed KV transfer (connector counters) and no decode request ended in error (policy {policy})"
    rows = prefill + decode
    evidence = _evidence(rows)
    unreadable = [f"{g.name}: {g.problem}" for g in rows if g.gained is None]
    if unreadable or not decode:
        return finding(check, Status.MISSING, {"unreadable": unreadable or ["no decode instance"]}, expected, evidence)
    connector = {g.name: g.gained.failed_transfers for g in rows if g.gained and g.gained.failed_transfers is not None}
    expired = {g.name: g.gained.expired for g in rows if g.gained and g.gained.expired}
    errors = {g.name: g.gained.errors for g in decode if g.gained}
    observed = {"policy": policy, "connector_failures": connector or "no connector failure counters (not NIXL)",
                "decode_error_requests": errors, "kv_expired": expired}
    failed = {n: v for n, v in connector.items() if v}
    erred = {n: v for n, v in errors.items() if v}
    if None in errors.values():
        return finding(check, Status.MISSING, observed, expected, evidence,
                       action="make the decode's vllm:request_success readable")
    if erred or (failed and policy == "fail"):
        return finding(check, Status.FAIL, observed, expected, evidence,
                       reason=f"failed transfers {failed or 0}, decode requests ended in error {erred or 0} under "
                              f"kv_load_failure_policy {policy}",
                       action="read the decode and prefill logs for the failed KV loads; fix the transport (UCX_TLS, "
                              "the NIXL side channel) before traffic")
    if failed:
        return finding(check, Status.WARN, observed, expected, evidence,
                       reason=f"failed transfers {failed} recomputed under kv_load_failure_policy recompute: answers "
                              "came at the decode's cost, not through the connector",
                       action="fix the transport; the recipe's policy is `fail`")
    if not connector and policy == "recompute":
        return finding(check, Status.INCONCLUSIVE, observed, expected, evidence,
                       reason="the connector exports no failure counter and policy recompute hides a failed load "
                              "behind a silent recomputation (quality.pd_decode_loaded judges the recomputed tokens)")
    return finding(check, Status.PASS, observed, expected, evidence)


class PdPathCheck:
    name = "pd_path"

    def applies(self, opts: ProbeOptions) -> bool:
        return bool(opts.pools.get(PREFILL)) and bool(opts.pools.get(DECODE))

    def before(self, opts: ProbeOptions, store: EvidenceStore) -> dict[str, Any]:
        return read_pools(opts, store, "before")

    def after(self, opts: ProbeOptions, before: dict[str, Any], parity: dict[str, Any] | None,
              store: EvidenceStore) -> list[Finding]:
        after = read_pools(opts, store, "after")
        store.write_json("pd_path/counters.json", {"before": before, "after": after, "parity": parity})
        sent = requests_sent(parity)
        prefill, decode = gains(before, after, PREFILL), gains(before, after, DECODE)
        findings = [judge_prefill(prefill, sent), judge_decode(decode, sent),
                    judge_failures(prefill, decode, failure_policy(opts))]
        findings.append(stop_prefill_findings(opts, store, option(opts, STOP_KEY)))
        return findings


CHECK = PdPathCheck()
