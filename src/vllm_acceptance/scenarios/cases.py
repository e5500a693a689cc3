"""The agent case set: a seeded, reproducible generator of distinct tool-call requests over a scenario pack.

One request repeated at temperature 0 is one observation; rates over agent traffic need distinct cases.
From the pack's tools (and its optional `case_set.extra_tools`, tools used only here) the generator
writes argument values of every type the schemas declare (strings, enums, bounded integers and numbers,
booleans, nested objects, arrays, optional and required fields), phrases the request in several ways,
varies the context length (earlier turns, a notes block), and builds five classes of case:

* ``single``      -- one tool fits; one call expected (tool_choice auto);
* ``parallel``    -- two tools fit; two calls expected in one answer;
* ``multi_turn``  -- a continuation after a tool result: an assistant answer (text or a valid call);
* ``irrelevance`` -- no tool fits; no call may be made (tool_choice auto);
* ``structured``  -- the pack's structured task under ``response_format`` json_schema, phrased anew.

Beside the set, `choice_cases` writes one seeded case per `tool_choice` the OpenAI chat completions contract
defines besides auto (TOOL_CHOICES): "required" and a named function (single cases: the asked tool expected),
and "none" (an irrelevance case asking for a tool by name: no call may be made), so agent.tool_choice
(probes/agent/rules.py judge_tool_choice) judges each on every run.

The same (pack, seed) gives the same cases in the same order, and a longer set starts with the shorter
one (the probe can extend it). Every body is distinct (checked): a repeated body is skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema

CLASSES = ("single", "parallel", "multi_turn", "irrelevance", "structured")
CALL_CLASSES = ("single", "parallel")
TOOL_CHOICES = ("required", "named", "none")  # choice_cases: one case each, beside the case set
OFFERS = ("sample", "pack")  # a tool call is required: the format-error rate's denominator

PHRASINGS = (
    "Please use {name} now: {prose}.",
    "Call {name} with these arguments: {json}",
    "{description} I need it for {prose}.",
    "Can you run {name}? Parameters -- {prose}.",
    "Quick one: {prose}. Use the {name} tool.",
    "I am on call and need this done with {name}: {json}",
)
PARALLEL_PHRASINGS = (
    "Do two things at once, in parallel: call {a_name} ({a_prose}) and call {b_name} ({b_prose}).",
    "Run both tools together: {a_name} with {a_json} and {b_name} with {b_json}",
)
FOLLOW_UPS = ("Thanks. What does that result mean?", "Summarise that result in one sentence.",
              "Good. Anything else I should look at?", "Is that expected?")
IRRELEVANT = ("What is the capital of Portugal?", "Write a two-line poem about autumn rain.",
              "How many minutes are in a day?", "Translate 'good morning' into Spanish.",
              "Explain what a haiku is in one sentence.", "What colour do you get mixing blue and yellow?",
              "Tell me a short joke about cats.", "Which is larger, 7 or 12?")
STRUCTURED = ("{user}", "{user} Only the JSON object, please.", "Answer as JSON: {user}",
              "{user} Keep it to the schema.")
NOTE_LINES = ("Note {i}: the weekly review is on Thursday; bring the open items.",
              "Note {i}: the team rotates on-call duty every Monday at 09:00 UTC.",
              "Note {i}: dashboards refresh every five minutes; older panels lag.",
              "Note {i}: keep answers short and cite the tool result you used.")
WORDS = ("alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "sierra", "tango", "zulu")


@dataclass
class Case:
    """One request of the case set: its class, its body (without model and sampling) and what it expects."""

    id: str
    cls: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    expect: list[str] = field(default_factory=list)  # tool names expected (none: no call may be made)
    tool_choice: Any = "auto"  # "auto", "required", "none" or {"type": "function", "function": {"name": N}}
    response_format: dict[str, Any] | None = None
    schema: dict[str, Any] | None = None  # structured: the schema the content must follow
    context_turns: int = 0
    note_lines: int = 0
    turn_messages: int = 2  # messages per earlier turn (the pack's shared history)
    fixed_tools: bool = False  # offers exactly the pack's tools (agent.case_tools: pack): never trimmed

    def body(self, model: str, max_tokens: int, temperature: float) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": self.messages, "max_tokens": max_tokens,
                                "temperature": temperature}
        if self.response_format is not None:
            body["response_format"] = self.response_format
        else:
            body["tools"] = self.tools
            body["tool_choice"] = self.tool_choice
            if self.cls == "parallel":
                body["parallel_tool_calls"] = True
        return body

    def trimmed(self) -> Case | None:
        """The same request with less context (the notes block, then one earlier turn, then one offered tool
        that the case does not need): for a server whose context cannot hold it. None: nothing left to trim."""
        system = self.messages[0]
        if self.note_lines:
            head = system["content"].split("\nNote 1:")[0]
            return _replace(self, [{**system, "content": head}, *self.messages[1:]], note_lines=0)
        if self.context_turns:
            return _replace(self, [system, *self.messages[1 + self.turn_messages:]],
                            context_turns=self.context_turns - 1)
        used = set(self.expect) | {c["function"]["name"] for m in self.messages for c in m.get("tool_calls") or []}
        spare = [t for t in self.tools if t["function"]["name"] not in used]
        if len(spare) > (0 if self.expect else 1) and self.response_format is None and not self.fixed_tools:
            tools = list(self.tools)
            tools.remove(spare[-1])
            return _replace(self, self.messages, tools=tools)
        return None

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "class": self.cls, "expect": self.expect, "context_turns": self.context_turns,
                "note_lines": self.note_lines}


def _replace(case: Case, messages: list[dict[str, Any]], **changes: Any) -> Case:
    return dataclasses.replace(case, messages=messages, **changes)


# --- values per schema -------------------------------------------------------------------------

_CLASS = re.compile(r"\[([^\]]+)\]\{(\d+)\}|\[([^\]]+)\]|\\d\{(\d+)\}|(\\.|[^\[\\^$])")


def _from_pattern(pattern: str, rng: random.Random) -> str | None:
    """A string matching a simple anchored pattern (literals, [a-z0-9]{n}, \\d{n}); None when too complex."""
    if any(c in pattern for c in "()|*+?"):
        return None
    out = []
    for m in _CLASS.finditer(pattern.strip("^$")):
        chars, count, single, digits, literal = m.groups()
        if chars or single:
            spec = chars or single
            pool = [chr(c) for a, b in re.findall(r"(.)-(.)", spec) for c in range(ord(a), ord(b) + 1)]
            pool += [c for c in re.sub(r".-.", "", spec)]
            out.append("".join(rng.choice(pool) for _ in range(int(count or 1))))
        elif digits:
            out.append("".join(rng.choice("0123456789") for _ in range(int(digits))))
        else:
            out.append(literal[-1])
    text = "".join(out)
    return text if re.fullmatch(pattern.strip("^$"), text) else None


def value_for(schema: dict[str, Any], rng: random.Random, name: str = "value") -> Any:
    """A value valid against `schema` (the JSON Schema subset tool parameters use)."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type", "string")
    if kind == "object":
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        keep = [k for k in props if k in required or rng.random() < 0.5]
        return {k: value_for(props[k], rng, k) for k in keep}
    if kind == "array":
        low, high = int(schema.get("minItems", 0)), int(schema.get("maxItems", 3))
        count = rng.randint(low, max(low, min(high, 3)))
        return [value_for(schema.get("items") or {}, rng, name) for _ in range(count)]
    if kind == "integer":
        low, high = int(schema.get("minimum", 0)), int(schema.get("maximum", 10_000))
        return rng.randint(low, high)
    if kind == "number":
        low, high = float(schema.get("minimum", 0.0)), float(schema.get("maximum", 1000.0))
        return round(rng.uniform(low, high), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if "pattern" in schema:
        text = _from_pattern(schema["pattern"], rng)
        if text is not None:
            return text
    words = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    text = f"{name.replace('_', '-')}-{'-'.join(words)}-{rng.randint(10, 99)}"
    return text[:int(schema.get("maxLength", 10_000))].ljust(int(schema.get("minLength", 0)), "x")


def arguments_for(tool: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Schema-valid arguments of one tool (validated: a value the subset cannot produce raises)."""
    schema = tool["function"].get("parameters") or {"type": "object"}
    args = value_for(schema, rng)
    error = jsonschema.exceptions.best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(args))
    if error is not None:
        raise ValueError(f"{tool['function']['name']}: the generator wrote invalid arguments: {error.message}")
    return args


@functools.lru_cache(maxsize=64)
def _validator(schema: str) -> Any:
    return jsonschema.Draft202012Validator(json.loads(schema))


def _prose(args: dict[str, Any]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {json.dumps(v) if not isinstance(v, str) else v}"
                     for k, v in args.items()) or "no arguments"


def _ask(tool: dict[str, Any], args: dict[str, Any], rng: random.Random) -> str:
    fn = tool["function"]
    return rng.choice(PHRASINGS).format(name=fn["name"], prose=_prose(args), json=json.dumps(args),
                                        description=fn.get("description", ""))


# --- the set -----------------------------------------------------------------------------------

def case_tools(pack: dict[str, Any]) -> list[dict[str, Any]]:
    """The pack's tools, then the ones it adds for the case set only (`case_set.extra_tools`)."""
    return list(pack["tools"]) + list((pack.get("case_set") or {}).get("extra_tools") or [])


class CaseSet:
    """The generator: `take(n)` the first n cases of class mix `shares`, reproducibly from `seed`."""

    def __init__(self, pack: dict[str, Any], seed: int = 0, system: str | None = None, offer: str = "sample") -> None:
        """`offer`: "sample" (the pack's tools and its case_set extras; each case offers the tools it needs and
        a random share of the others) or "pack" (every case offers exactly the pack's `tools`)."""
        if offer not in OFFERS:
            raise ValueError(f"agent.case_tools {offer!r}: choose one of {', '.join(OFFERS)}")
        self.pack, self.seed, self.offer = pack, seed, offer
        self.tools = case_tools(pack) if offer == "sample" else list(pack["tools"])
        self.system = system or pack["system_prompt"].format(session_id="agent-cases",
                                                             environment=pack["default_environment"])
        extra = pack.get("case_set") or {}
        self.irrelevant = tuple(extra.get("irrelevant") or ()) + IRRELEVANT
        self.history = list(pack.get("shared_history") or [])

    def _context(self, rng: random.Random) -> tuple[list[dict[str, Any]], int, int]:
        turns = rng.choice((0, 0, 1, 2))
        notes = rng.choice((0, 0, 2, 4, 12, 30))
        msgs = [{"role": "system", "content": self.system + ("\n" + "\n".join(
            rng.choice(NOTE_LINES).format(i=i + 1) for i in range(notes)) if notes else "")}]
        for _ in range(turns):
            msgs += [dict(m) for m in self.history] or [{"role": "user", "content": "Hello."},
                                                         {"role": "assistant", "content": "Hello. How can I help?"}]
        return msgs, turns, notes

    def _offer(self, needed: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
        """The tools a case offers: the ones it needs and a random share of the others (at least one tool),
        in the pack's order."""
        if self.offer == "pack":
            return list(self.tools)
        others = [t for t in self.tools if t not in needed]
        keep = rng.sample(others, rng.randint(0 if needed else 1, len(others)))
        return [t for t in self.tools if t in needed or t in keep]

    def _one(self, cls: str, i: int, rng: random.Random) -> Case:
        msgs, turns, notes = self._context(rng)
        cid = f"{cls}-{i:04d}"
        case = self._build(cls, cid, msgs, rng)
        return dataclasses.replace(case, context_turns=turns, note_lines=notes, fixed_tools=self.offer == "pack",
                                   turn_messages=max(1, len(self.history)) if self.history else 2)

    def _build(self, cls: str, cid: str, msgs: list[dict[str, Any]], rng: random.Random) -> Case:
        i = int(cid.rsplit("-", 1)[1])
        if cls == "single":
            tool = rng.choice(self.tools)
            args = arguments_for(tool, rng)
            msgs.append({"role": "user", "content": _ask(tool, args, rng)})
            return Case(cid, cls, msgs, self._offer([tool], rng), [tool["function"]["name"]])
        if cls == "parallel":
            a, b = rng.sample(self.tools, 2)
            aa, ba = arguments_for(a, rng), arguments_for(b, rng)
            msgs.append({"role": "user", "content": rng.choice(PARALLEL_PHRASINGS).format(
                a_name=a["function"]["name"], a_prose=_prose(aa), a_json=json.dumps(aa),
                b_name=b["function"]["name"], b_prose=_prose(ba), b_json=json.dumps(ba))})
            return Case(cid, cls, msgs, self._offer([a, b], rng), [a["function"]["name"], b["function"]["name"]])
        if cls == "multi_turn":
            tool = rng.choice(self.tools)
            args = arguments_for(tool, rng)
            call_id = f"call_{i:04d}"
            msgs += [{"role": "user", "content": _ask(tool, args, rng)},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": call_id, "type": "function",
                          "function": {"name": tool["function"]["name"], "arguments": json.dumps(args)}}]},
                     {"role": "tool", "tool_call_id": call_id,
                      "content": json.dumps({"ok": True, "tool": tool["function"]["name"],
                                             "result": rng.randint(1, 99)})},
                     {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
            return Case(cid, cls, msgs, self._offer([tool], rng))
        if cls == "irrelevance":
            msgs.append({"role": "user", "content": f"{rng.choice(self.irrelevant)} (question {i})"
                         if rng.random() < 0.5 else rng.choice(self.irrelevant)})
            return Case(cid, cls, msgs, self._offer([], rng), [])
        task = self.pack["tasks"]["structured"]
        msgs.append({"role": "user", "content": rng.choice(STRUCTURED).format(user=task["user"])})
        fmt = {"type": "json_schema", "json_schema": {"name": task.get("name", "structured"),
                                                      "schema": task["schema"], "strict": True}}
        return Case(cid, cls, msgs, [], response_format=fmt, schema=task["schema"])

    def iterate(self, cls: str) -> Iterator[Case]:
        """Cases of one class, each body new (a repeat is skipped; a pack too small to vary stops)."""
        rng = random.Random(f"{self.seed}:{cls}")
        seen: set[str] = set()
        misses = 0
        while misses < 1000:
            case = self._one(cls, len(seen) + 1, rng)
            key = json.dumps(case.body("m", 0, 0.0), sort_keys=True)
            if key in seen:
                misses += 1
                continue
            seen.add(key)
            yield case

    def take(self, cls: str, n: int) -> list[Case]:
        out: list[Case] = []
        for case in self.iterate(cls):
            if len(out) >= n:
                break
            out.append(case)
        return out


def class_counts(calls: int, others: int) -> dict[str, int]:
    """`calls` cases that require a call (single and parallel, 5:1) and `others` split over the rest."""
    parallel = calls // 6
    rest = {"multi_turn": others * 2 // 5, "irrelevance": others * 2 // 5}
    rest["structured"] = others - sum(rest.values())
    return {"single": calls - parallel, "parallel": parallel, **rest}


def build_cases(pack: dict[str, Any], calls: int, others: int, seed: int = 0,
                system: str | None = None, offer: str = "sample") -> list[Case]:
    """The case set: `calls` call-requiring cases and `others` of the other classes, distinct bodies.
    Each class has its own seeded stream, so a larger set starts with the smaller one, class by class."""
    gen = CaseSet(pack, seed, system, offer)
    return [case for cls, n in class_counts(calls, others).items() for case in gen.take(cls, n)]


def choice_cases(pack: dict[str, Any], seed: int = 0, system: str | None = None, offer: str = "sample") -> list[Case]:
    """One case per TOOL_CHOICES kind, from its own seeded stream (the case set's streams are untouched):
    "required" and named (class single, the asked tool expected; named forces that tool among the offered ones),
    "none" (class irrelevance: the request asks for a tool by name, yet no call may be made). The contract:
    docs/sources.md#tool-choice-contract."""
    gen = CaseSet(pack, seed, system, offer)
    rng = random.Random(f"{seed}:tool_choice")
    out = []
    for n, kind in enumerate(TOOL_CHOICES, start=1):
        msgs, turns, notes = gen._context(rng)
        tool = rng.choice(gen.tools)
        name = tool["function"]["name"]
        msgs.append({"role": "user", "content": _ask(tool, arguments_for(tool, rng), rng)})
        if kind == "none":
            msgs[-1]["content"] += " If you cannot use tools right now, just tell me what you would do."
        choice: Any = {"type": "function", "function": {"name": name}} if kind == "named" else kind
        out.append(Case(f"choice-{kind}-{n:04d}", "irrelevance" if kind == "none" else "single", msgs,
                        gen._offer([tool], rng), [] if kind == "none" else [name], tool_choice=choice,
                        context_turns=turns, note_lines=notes, fixed_tools=offer == "pack",
                        turn_messages=max(1, len(gen.history)) if gen.history else 2))
    return out
