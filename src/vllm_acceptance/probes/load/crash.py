"""A server that died under load: the log lines that mark an OOM and capacity.crash judged from the crash
record (LoadRun.crash_record, probes/load/run.py)."""

from __future__ import annotations

from typing import Any

from ...core.findings import Finding
from ...parsers.causal import causal_line
from ...rules import registry

OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "killed process",
               "oom-kill", "cannot allocate memory")


def crash_finding(record: dict[str, Any], evidence: list[str]) -> Finding:
    """capacity.crash from the crash record: an OOM is a capacity failure (expand_capacity, the OOM line
    quoted); a death without a capacity signature decides nothing about capacity (inconclusive, the
    causal line of the log or of the failed requests named), so the run is incomplete, never a release."""
    check = registry.get("capacity.crash")
    stage = record.get("probe_stage") or record.get("stage")
    observed = {k: record.get(k) for k in ("probe_stage", "stage", "kind", "process_state", "model_loaded",
                                           "stage_evidence")}
    if record.get("oom_lines"):
        return check.fail(observed=observed, expected="the server survives every stage", evidence=evidence,
                          reason=f"OOM in stage {stage}: " + "; ".join(record["oom_lines"][-2:]),
                          action=record.get("action") or "read the OOM record: at load -> weights/parallel "
                          "layout/topology; under KV growth -> context, concurrency, retention, prefill/decode "
                          "balance; adjust limits before adding GPUs")
    # The log's telling line, else the first failed request's error (the later ones only find the port closed).
    cause = causal_line("\n".join(record.get("log_tail") or [])) or causal_line(
        "\n".join(str(e) for e in (record.get("errors") or [])[:1]))
    return check.inconclusive(
        observed=observed, expected="the server survives every stage", evidence=evidence,
        reason=f"the server died in stage {stage} without an OOM signature: "
               + (cause or "no log line says why (give the server log)"),
        action="read the crash record and the server log: a crash that is not capacity (a bug, a killed process, "
               "a lost node) is fixed and the run repeated; it proves nothing about capacity")
