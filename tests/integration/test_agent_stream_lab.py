"""Streamed tool calls under concurrency, on the real lab vLLM (issue 44 item 1, agent.stream_tool_calls).

The kimi_k2 streaming parser returns empty `tool_calls` under concurrent load while the same request
non-streamed calls its tool (vllm-project/vllm#54701; docs/sources.md#stream-under-load). The lab gateway's
`empty_stream_tool_calls_under_load` mode does that to a real server's streams: every tool-call delta of a stream
emptied when its first arrives with 3 or more chat completions in flight; non-streamed answers, and streams served
two at a time, pass untouched. Before issue 44 the probe streamed one request, alone, and sent the case set under
load non-streamed only: this fault raised no alarm. Now the first call cases are also sent streamed, alone (two in
flight here) and mixed into the under-load pass (4 in flight): their streams lose the calls under load only.

* with --direct-url: the direct server, sent the same pass at the same concurrency, streams every twin whole ->
  agent.stream_tool_calls fails on the gateway, and nothing else fails;
* without it: the same failure on the parser's signature, the attribution stated open.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_agent_gateway_lab import FEW_TURNS, GATEWAY, failing
from test_agent_gateway_lab import probe as gateway_probe

from vllm_acceptance.core.findings import Finding, Status

pytestmark = pytest.mark.lab
ALONE = ("--set", "agent.concurrency=2")  # served alone: at most two in flight, below the gateway's three
FAULT = ("empty_stream_tool_calls_under_load", "--min-in-flight", "3")


def probe(base_url: str, model: str, out: Path, *extra: str) -> tuple[int, dict, list[Finding]]:
    """test_agent_gateway_lab.probe with room for the under-load pass and its direct re-send on a busy 2-core
    runner (the set, its repeats and both passes took over 240 s there)."""
    return gateway_probe(base_url, model, out, *extra, timeout_s=600)


def _stream_finding(findings):
    return next(f for f in findings if f.check == "agent.stream_tool_calls")


def test_streams_emptied_only_under_load_fail_on_the_gateway(lab_server, gateway, tmp_path: Path) -> None:  # noqa: F811
    url = gateway(*FAULT)
    rc, result, findings = probe(url, lab_server.model, tmp_path, *FEW_TURNS, *ALONE, "--under-load", "4",
                                 "--direct-url", lab_server.base_url)
    statuses = {f.check: f.status.value for f in findings}
    assert rc == 1 and failing(findings) == {"agent.stream_tool_calls": "gateway"}, statuses
    # Alone every streamed twin carried its call (the idle checks, agent.stream_consistency included, pass);
    # under load the streams lost them while the non-streamed answers stayed whole (agent.under_load passes).
    assert statuses["agent.stream_consistency"] == statuses["agent.under_load"] == "pass"
    stream = _stream_finding(findings)
    alone, loaded = stream.observed["alone"], stream.observed["under_load"]
    assert alone["compared"] >= 1 and alone["broken"] == 0 and alone["concurrency"] == 2
    assert loaded["concurrency"] == 4 and loaded["broken"] >= 1
    assert "empty tool_calls in the stream" in stream.reason and GATEWAY in stream.reason
    assert stream.observed["attribution"] == "gateway"
    direct = json.loads((tmp_path / "stream-twins-direct-under_load.json").read_text())
    assert direct["concurrency"] == 4 and not any(r["problems"] for r in direct["rows"])
    # The broken streams are kept raw: finish_reason tool_calls, tool-call deltas present but empty.
    kept = [json.loads((tmp_path / e).read_text()) for e in stream.evidence if "stream-twin-under_load" in e]
    assert kept and all(k["raw_stream"].startswith("data:") and '"tool_calls": []' in k["raw_stream"] for k in kept)


def test_without_a_direct_server_the_attribution_is_open(lab_server, gateway, tmp_path: Path) -> None:  # noqa: F811
    url = gateway(*FAULT)
    rc, _, findings = probe(url, lab_server.model, tmp_path, *FEW_TURNS, *ALONE, "--under-load", "4")
    statuses = {f.check: f.status.value for f in findings}
    assert rc == 1 and failing(findings) == {"agent.stream_tool_calls": "parser"}, statuses
    stream = _stream_finding(findings)
    assert stream.status == Status.FAIL and stream.observed["attribution"] == "open"
    assert "attribution open" in stream.reason and stream.observed["alone"]["broken"] == 0
