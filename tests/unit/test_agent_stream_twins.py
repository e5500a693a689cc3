"""agent.stream_tool_calls (probes/agent/streaming.py, rules.py stream_twin_problems) and the lab gateway's
empty_stream_tool_calls_under_load mode, on a real vLLM tool-call stream (tests/fixtures/agent-streams/README.md).

The faulty streams are the real capture rewritten by the gateway's own code (every tool-call delta emptied, as
vllm-project/vllm#54701 reports) or cut; the non-streamed twin is the capture assembled. The fault-only-under-load
behaviour against a real server is tests/integration/test_agent_stream_lab.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from vllm_acceptance.core.evidence import EvidenceStore
from vllm_acceptance.core.findings import Status
from vllm_acceptance.lab.gateway import Corruptor
from vllm_acceptance.probes.agent import AgentProbe, AgentProbeConfig
from vllm_acceptance.probes.agent.rules import stream_structure_problems, stream_twin_problems
from vllm_acceptance.runtime.client import Exchange, assemble_stream
from vllm_acceptance.scenarios import load_scenario
from vllm_acceptance.scenarios.cases import CALL_CLASSES, build_cases

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests/fixtures/agent-streams/vllm-run-command-tool-call.sse"
OPS = load_scenario("ops-agent")


def real_chunks() -> list[dict]:
    lines = [line[5:].strip() for line in CAPTURE.read_text().splitlines() if line.startswith("data:")]
    return [json.loads(p) for p in lines if p != "[DONE]"]


def emptied(chunks: list[dict], in_flight: int) -> list[dict]:
    """The capture through the gateway's mode with `in_flight` chat completions at the gateway."""
    rewriter = Corruptor("empty_stream_tool_calls_under_load", in_flight=in_flight, min_in_flight=3).stream()
    return [rewriter.rewrite(c) for c in chunks]


def test_the_real_capture_is_a_whole_streamed_call_equal_to_its_twin() -> None:
    chunks = real_chunks()
    streamed = assemble_stream(chunks)
    assert streamed["choices"][0]["message"]["tool_calls"][0]["function"] == {
        "name": "run_command", "arguments": '{"command": "ls"}'}
    assert stream_structure_problems(chunks) == []
    assert stream_twin_problems(assemble_stream(chunks), streamed) == []


def test_the_gateway_empties_every_tool_call_delta_only_at_its_in_flight_threshold() -> None:
    chunks = real_chunks()
    assert emptied(chunks, in_flight=2) == chunks  # two at a time: untouched
    faulty = emptied(chunks, in_flight=3)
    # As vllm#54701: tool-call deltas still there but empty, finish_reason still tool_calls.
    deltas = [c["choices"][0]["delta"] for c in faulty]
    assert [d["tool_calls"] for d in deltas if "tool_calls" in d] == [[], [], [], []]
    assert faulty[-1]["choices"][0]["finish_reason"] == "tool_calls"
    problems = stream_twin_problems(assemble_stream(chunks), assemble_stream(faulty))
    assert problems == ["empty tool_calls in the stream (finish_reason 'tool_calls'), its non-streamed twin calls 1"]


def test_non_streamed_answers_pass_the_mode_untouched_even_under_load() -> None:
    body = assemble_stream(real_chunks())
    assert Corruptor("empty_stream_tool_calls_under_load", in_flight=9).rewrite_body(body) == body


def test_a_cut_or_nameless_stream_is_partial_and_other_argument_values_are_not_judged() -> None:
    chunks = real_chunks()
    plain = assemble_stream(chunks)
    cut = assemble_stream(chunks[:4] + chunks[5:])  # the last argument delta lost
    assert stream_twin_problems(plain, cut) == [
        "partial tool_calls in the stream: call 0 ('run_command') arguments are not whole JSON: '{\"command\": \"ls'"]
    nameless = assemble_stream([chunks[0]] + [json.loads(json.dumps(chunks[1]).replace('"run_command"', '""'))]
                               + chunks[2:])
    assert stream_twin_problems(plain, nameless) == ["partial tool_calls in the stream: call 0 has no name"]
    other = json.loads(json.dumps(plain).replace('\\"ls\\"', '\\"pwd\\"'))  # batch variance: another value
    assert other != plain
    assert stream_twin_problems(plain, other) == []
    # A twin that calls no tool gives the stream nothing to be judged against.
    assert stream_twin_problems({"choices": [{"message": {"content": "hi"}}]}, cut) == []


class Server:
    """The real capture as a server: non-streamed the assembled call, streamed its chunks, through the gateway's
    mode while `loaded` (set by the test around the under-load pass: no timing decides it). Records every send."""

    def __init__(self, loaded: bool = False) -> None:
        self.loaded = loaded
        self.sent: list[tuple[bool, dict]] = []
        self.lock = threading.Lock()

    def chat(self, body: dict) -> Exchange:
        with self.lock:
            self.sent.append((False, body))
        return Exchange(request=body, status=200, body=assemble_stream(real_chunks()))

    def chat_stream(self, body: dict) -> Exchange:
        with self.lock:
            self.sent.append((True, body))
        chunks = emptied(real_chunks(), 4) if self.loaded else real_chunks()
        return Exchange(request={**body, "stream": True}, status=200, body=assemble_stream(chunks), chunks=chunks,
                        raw="\n".join("data: " + json.dumps(c) for c in chunks))


def probe_with_rows(tmp_path: Path, client: Server, direct: Server | None = None, stream_cases: int | None = 3,
                    under_load: int = 4) -> AgentProbe:
    """A probe whose rate run has happened: the case set answered alone (the capture's call each)."""
    cfg = AgentProbeConfig(model="m", scenario=OPS, concurrency=2, under_load=under_load, stream_cases=stream_cases)
    probe = AgentProbe(client, cfg, EvidenceStore(tmp_path), direct=direct)
    probe.cases = build_cases(OPS, 8, 2, 0, probe.system)
    plain = assemble_stream(real_chunks())
    probe.case_rows = [{"case": c.id, "class": c.cls, "request": probe._case_body(c), "status": 200,
                        "response": plain, "error": None, "ok": True} for c in probe.cases]
    return probe


def test_the_under_load_pass_mixes_each_sampled_case_with_its_streamed_twin(tmp_path: Path) -> None:
    server = Server()
    probe = probe_with_rows(tmp_path, server)
    loaded = probe.send_under_load(probe.cases, 4)
    assert [j.case for j, _ in loaded] == [c.id for c in probe.cases]  # agent.under_load judges the plain ones
    calls = [c.id for c in probe.cases if c.cls in CALL_CLASSES][:3]
    streamed = [body for is_stream, body in server.sent if is_stream]
    plain = {json.dumps(body, sort_keys=True) for is_stream, body in server.sent if not is_stream}
    # One pool, both kinds; each twin the very body of its non-streamed send (the same seed and messages).
    assert len(streamed) == 3 and len(server.sent) == len(probe.cases) + 3
    assert all(json.dumps(b, sort_keys=True) in plain for b in streamed)
    assert [p[0].id for p in probe.twins_under_load] == calls


def test_healthy_streams_pass_in_every_pass(tmp_path: Path) -> None:
    probe = probe_with_rows(tmp_path, Server())
    probe.send_under_load(probe.cases, 4)
    finding = probe.stream_twins()
    assert finding.status == Status.PASS, finding.reason
    assert finding.observed["alone"]["compared"] == finding.observed["under_load"]["compared"] == 3
    assert finding.observed["sample"] == "the first 3 call cases (agent.stream_cases)"


def test_every_call_case_is_twinned_by_default_and_without_under_load_only_alone_is_judged(tmp_path: Path) -> None:
    probe = probe_with_rows(tmp_path, Server(), stream_cases=None, under_load=0)
    finding = probe.stream_twins()
    calls = sum(1 for c in probe.cases if c.cls in CALL_CLASSES)
    assert finding.status == Status.PASS and finding.observed["alone"]["compared"] == calls
    assert "under_load" not in finding.observed and "under load not measured" in finding.reason


@pytest.mark.parametrize(("direct", "layer", "attribution"), [
    (Server(), "gateway", "gateway"),           # the direct server streams the same pass whole
    (Server(loaded=True), "parser", "parser"),  # the direct server loses them too
    (None, "parser", "open"),                   # no direct server: said open, on the parser's signature
], ids=["direct-clean", "direct-same-defect", "no-direct"])
def test_streams_emptied_under_load_fail_with_the_layer_the_direct_server_shows(tmp_path: Path, direct, layer,
                                                                                 attribution) -> None:
    server = Server(loaded=True)
    probe = probe_with_rows(tmp_path, server, direct=direct)
    probe.send_under_load(probe.cases, 4)
    server.loaded = False  # served alone afterwards: healthy
    finding = probe.stream_twins()
    assert (finding.status, finding.layer) == (Status.FAIL, layer), finding.reason
    assert finding.observed["alone"]["broken"] == 0 and finding.observed["under_load"]["broken"] == 3
    assert finding.observed["attribution"] == attribution
    assert "empty tool_calls in the stream" in finding.reason
    kept = [json.loads((tmp_path / e).read_text()) for e in finding.evidence if "stream-twin-under_load" in e]
    assert len(kept) == 3 and all('"tool_calls": []' in k["raw_stream"] for k in kept)
    if direct is not None:
        # The direct server got the whole pass again, mixed, not only the broken cases.
        assert sum(1 for s, _ in direct.sent if not s) == len(probe.cases)
        assert sum(1 for s, _ in direct.sent if s) == 3


def test_no_calling_twin_is_not_applicable_never_a_pass(tmp_path: Path) -> None:
    probe = probe_with_rows(tmp_path, Server(), under_load=0)
    for row in probe.case_rows:
        row["response"] = {"choices": [{"message": {"role": "assistant", "content": "no call"}}]}
    finding = probe.stream_twins()
    assert finding.status == Status.NOT_APPLICABLE and "agent.tool_call" in finding.reason
