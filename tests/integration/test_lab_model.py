"""The lab's tiny model: built for real (lab venv: torch, transformers, tokenizers), served by real vLLM.

Three layers, cheapest first:
* the chat template, rendered by jinja2 in the controller venv (no torch);
* the build itself: deterministic bytes, and the programmed behaviour under transformers' greedy
  decoding (no grammar, no server);
* the real lab vLLM server (`lab` marker): tool calls that validate, streaming, plain text, a second
  turn after a tool result, structured output.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import jinja2
import jsonschema
import pytest
from conftest import LAB_PYTHON, REPO

from vllm_acceptance.lab import build_model as bm

NODE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_node_status",
        "description": "Status of one cluster node",
        "parameters": {
            "type": "object",
            "properties": {
                "node": {"type": "string"},
                "include": {"type": "string", "enum": ["gpu", "memory", "network", "all"]},
            },
            "required": ["node", "include"],
        },
    },
}
TICKET_TOOL: dict[str, Any] = {
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
            },
            "required": ["title", "severity", "labels", "details", "count"],
        },
    },
}
USER = [{"role": "user", "content": "Check node gpu-node-3 and open a ticket if it is unhealthy."}]


# --------------------------------------------------------------------------- template (no torch)


def _render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    # transformers' chat-template tojson: plain json.dumps, no HTML escaping (jinja2's escapes <>&).
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    return env.from_string(bm.chat_template("hermes")).render(
        messages=messages, tools=tools, add_generation_prompt=True
    )


def test_template_marks_tools_only_when_tools_are_given() -> None:
    with_tools = _render(USER, [NODE_TOOL])
    without = _render(USER)
    # The programmed attention head keys on this marker: it must appear exactly when tools do.
    assert "<tools>" in with_tools and '"name": "get_node_status"' in with_tools
    assert "<tools>" not in without and "<tool_response>" not in without
    assert with_tools.endswith("<|im_start|>assistant\n") and without.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("arguments", ['{"node": "n1", "include": "gpu"}', {"node": "n1", "include": "gpu"}])
def test_template_renders_assistant_tool_calls_and_tool_results(arguments: Any) -> None:
    text = _render(USER + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_node_status", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"healthy": true}'},
    ], [NODE_TOOL])
    call = text.split("<|im_start|>assistant\n<tool_call>\n", 1)[1].split("\n</tool_call><|im_end|>", 1)[0]
    assert json.loads(call) == {"name": "get_node_status", "arguments": {"node": "n1", "include": "gpu"}}
    assert "<|im_start|>user\n<tool_response>\n{\"healthy\": true}\n</tool_response><|im_end|>\n" in text


# --------------------------------------------------------------------------- build (lab venv)


def _lab_python() -> Path:
    if not LAB_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no lab venv at {LAB_PYTHON}: run `make lab-venv`")
        pytest.skip(f"no lab venv at {LAB_PYTHON}: run `make lab-venv`")
    return LAB_PYTHON


def _build_variant(out: Path, variant: str, seed: int = 0) -> dict[str, str]:
    subprocess.run([str(_lab_python()), "-m", "vllm_acceptance.lab.build_model", "--out", str(out),
                    "--variant", variant, "--seed", str(seed)], check=True, cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True, timeout=600)
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


def _build(out: Path, seed: int = 0) -> dict[str, str]:
    return _build_variant(out, "hermes", seed)


def test_build_is_byte_identical_for_a_seed_and_the_seed_moves_only_weights(tmp_path: Path) -> None:
    a, b, c = _build(tmp_path / "a"), _build(tmp_path / "b"), _build(tmp_path / "c", seed=1)
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["head_dim"]) == (
        128, 2, 4, 32)
    assert cfg["vocab_size"] == 4096
    added = {t["content"]: t["special"] for t in json.loads((tmp_path / "a" / "tokenizer.json").read_text())[
        "added_tokens"]}
    assert added["<tool_call>"] is False and added["</tool_call>"] is False and added["<|im_end|>"] is True


_GREEDY = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d, cases = sys.argv[1], json.loads(sys.argv[2])
tok = AutoTokenizer.from_pretrained(d)
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
out = {}
for name, c in cases.items():
    ids = tok.apply_chat_template(c["messages"], tools=c.get("tools"), add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    gen = m.generate(ids, max_new_tokens=24, do_sample=False)
    out[name] = tok.decode(gen[0, ids.shape[1]:])
print(json.dumps(out))
"""


def test_programmed_weights_choose_call_text_or_answer_from_the_prompt(tmp_path: Path) -> None:
    """Greedy decoding with no grammar: the gates alone decide what the model starts with."""
    _build(tmp_path / "m", seed=3)
    after = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_node_status", "arguments": {"node": "n1", "include": "gpu"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    cases = {"plain": {"messages": USER}, "tools": {"messages": USER, "tools": [NODE_TOOL]},
             "after_tool": {"messages": after, "tools": [NODE_TOOL]}}
    proc = subprocess.run([str(_lab_python()), "-c", _GREEDY, str(tmp_path / "m"), json.dumps(cases)],
                          check=True, capture_output=True, text=True, timeout=600)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"plain": bm.HERMES.plain_answer + bm.EOS, "tools": "<tool_call>" + bm.EOS,
                   "after_tool": bm.HERMES.tool_answer + bm.EOS}


# --------------------------------------------------------------------------- real vLLM (lab server)


def _chat(server: Any, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(server.base_url + "/chat/completions", json={"model": server.model, "temperature": 0, **body},
                   timeout=300)
    r.raise_for_status()
    return r.json()


def _valid_call(choice: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, schemas[call["function"]["name"]])
    return {"name": call["function"]["name"], "arguments": args}


@pytest.mark.lab
@pytest.mark.parametrize("tools", [[NODE_TOOL], [TICKET_TOOL], [NODE_TOOL, TICKET_TOOL]],
                         ids=["node", "ticket", "both"])
def test_vllm_auto_tool_choice_returns_schema_valid_calls(lab_server: Any, tools: list[dict[str, Any]]) -> None:
    calls = [_valid_call(_chat(lab_server, {"messages": USER, "tools": tools, "tool_choice": "auto",
                                            "max_tokens": 256})["choices"][0], tools) for _ in range(3)]
    assert calls[0] == calls[1] == calls[2]  # temperature 0


@pytest.mark.lab
def test_vllm_streamed_tool_call_assembles_to_the_same_call(lab_server: Any) -> None:
    body = {"messages": USER, "tools": [TICKET_TOOL], "tool_choice": "auto", "max_tokens": 256}
    whole = _valid_call(_chat(lab_server, body)["choices"][0], [TICKET_TOOL])
    name, args, finish = "", "", None
    with httpx.stream("POST", lab_server.base_url + "/chat/completions",
                      json={"model": lab_server.model, "temperature": 0, "stream": True, **body}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                for tc in choice["delta"].get("tool_calls") or []:
                    name += (tc.get("function") or {}).get("name") or ""
                    args += (tc.get("function") or {}).get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    # The streamed argument text is the model's own bytes; the non-streamed one is re-serialised
    # by vLLM (json.dumps): compare parsed values, not strings.
    assert (finish, name, json.loads(args)) == ("tool_calls", whole["name"], whole["arguments"])


@pytest.mark.lab
def test_vllm_plain_chat_and_second_turn_answer_in_text(lab_server: Any) -> None:
    plain = _chat(lab_server, {"messages": USER, "max_tokens": 64})["choices"][0]
    assert (plain["finish_reason"], plain["message"]["content"]) == ("stop", bm.HERMES.plain_answer)
    second = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_node_status", "arguments": '{"node": "gpu-node-3", "include": "gpu"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"healthy": true}'},
    ]
    answer = _chat(lab_server, {"messages": second, "tools": [NODE_TOOL], "tool_choice": "auto",
                                "max_tokens": 64})["choices"][0]
    assert (answer["finish_reason"], answer["message"]["content"]) == ("stop", bm.HERMES.tool_answer)
    assert not answer["message"].get("tool_calls")


@pytest.mark.lab
def test_vllm_structured_output_validates(lab_server: Any) -> None:
    schema = {"type": "object", "additionalProperties": False,
              "properties": {"verdict": {"type": "string", "enum": ["release", "incomplete"]},
                             "score": {"type": "integer", "minimum": 1, "maximum": 5},
                             "reason": {"type": "string", "minLength": 4}},
              "required": ["verdict", "score", "reason"]}
    choice = _chat(lab_server, {"messages": USER, "max_tokens": 96, "response_format": {
        "type": "json_schema", "json_schema": {"name": "v", "schema": schema}}})["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), schema)


# --------------------------------------------------------------------------- Kimi K3 variant


def _render_k3(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    return env.from_string(bm.chat_template("kimi_k3")).render(
        messages=messages, tools=tools, add_generation_prompt=True)


def test_k3_template_renders_xtml_channels_the_parsers_read() -> None:
    after = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "create_ticket", "arguments": {"title": "gpu", "details": {"host": "n1"}, "count": 2}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"id": 7}'},
    ]
    text = _render_k3(after, [TICKET_TOOL])
    # The programmed flag heads key on these markers: tools declared, tool result present.
    assert text.count("tool_declare") == 2 and "<|open|>tool_result<|sep|>{\"id\": 7}<|close|>tool_result" in text
    assert ('<|open|>call tool="create_ticket" index="1"<|sep|><|open|>argument key="title" type="string"<|sep|>gpu'
            '<|close|>argument<|sep|><|open|>argument key="details" type="object"<|sep|>{"host": "n1"}'
            '<|close|>argument<|sep|><|open|>argument key="count" type="number"<|sep|>2<|close|>argument<|sep|>'
            '<|close|>call<|sep|><|close|>tools<|sep|>') in text
    assert text.endswith(bm.K3_GENERATION_TAIL)
    plain = _render_k3(USER)
    assert "tool_declare" not in plain and "tool_result" not in plain


_GREEDY_K3 = _GREEDY.replace("max_new_tokens=24", "max_new_tokens=120")


def test_k3_build_is_deterministic_and_writes_the_canned_xtml_by_itself(tmp_path: Path) -> None:
    """Greedy decoding without any grammar: the n-gram program alone writes the whole XTML call."""
    a, b = (_build_variant(tmp_path / name, "kimi_k3") for name in ("a", "b"))
    assert a == b
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]) == (512, 8, 64)
    after = USER + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_node_status", "arguments": {"node": "node-07", "include": "gpus"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    cases = {"plain": {"messages": USER}, "tools": {"messages": USER, "tools": [NODE_TOOL]},
             "after_tool": {"messages": after, "tools": [NODE_TOOL]}}
    proc = subprocess.run([str(_lab_python()), "-c", _GREEDY_K3, str(tmp_path / "a"), json.dumps(cases)],
                          check=True, capture_output=True, text=True, timeout=600)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    close = "<|close|>response<|sep|>" + bm.EOS
    assert out == {"plain": bm.K3_THINK + bm.KIMI_K3.plain_answer + close,
                   "tools": bm.K3_THINK + bm.K3_CALL + bm.EOS,
                   "after_tool": bm.K3_THINK + bm.KIMI_K3.tool_answer + close}


def test_vision_build_is_deterministic_and_states_its_image_tokens(tmp_path: Path) -> None:
    """The tiny vision model (lab/build_vlm.py, profile cpu-lab-vision): the same seed gives the same bytes; the
    image tokens follow the agent tokenizer's vocabulary; one picture is 4 image embeddings + 3 wrapping tokens."""
    def build(out: Path) -> dict[str, str]:
        subprocess.run([str(_lab_python()), "-m", "vllm_acceptance.lab.build_vlm", "--out", str(out)], check=True,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, capture_output=True, timeout=600)
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}

    a, b = build(tmp_path / "a"), build(tmp_path / "b")
    assert a == b and "model.safetensors" in a and "processor_config.json" in a
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["architectures"] == ["Idefics3ForConditionalGeneration"] and cfg["image_token_id"] == bm.VOCAB_SIZE + 1
    added = {t["content"]: t["id"] for t in json.loads((tmp_path / "a" / "tokenizer.json").read_text())["added_tokens"]}
    assert [added[t] for t in ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")] == [
        bm.VOCAB_SIZE, bm.VOCAB_SIZE + 1, bm.VOCAB_SIZE + 2, bm.VOCAB_SIZE + 3]
    facts = json.loads((tmp_path / "a" / "lab_model.json").read_text())
    assert (facts["image_seq_len"], facts["image_prompt_tokens"]) == (4, 7)
    processor = json.loads((tmp_path / "a" / "processor_config.json").read_text())
    assert processor["image_processor"]["do_image_splitting"] is False and processor["image_seq_len"] == 4
