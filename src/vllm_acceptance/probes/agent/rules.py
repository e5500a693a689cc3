"""Judging one assistant message of an agent exchange, and the client-side executor harness.

Pure functions over response bodies: the agent probe feeds them real server responses, the unit
tests feed them recorded ones. Each problem names the layer at fault (docs/acceptance.md "Agent interface").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema

# Tool-call markup that a parser should have consumed; left in `content` it means the parser did
# not recognise the format (hermes, Kimi K2, Kimi K3 wire formats).
MARKUP_SIGNATURES = {
    "hermes": re.compile(r"</?tool_call>"),
    "kimi_k2": re.compile(r"<\|tool_calls?_section_begin\|>|<\|tool_call_begin\|>|<\|tool_call_argument_begin\|>"),
    "kimi_k3": re.compile(r"<\|open\|>(?:tools|call|argument)\b"),
}
REASONING_SIGNATURES = re.compile(r"<think>|</think>|<\|open\|>think<\|sep\|>|<\|close\|>think")


@dataclass
class CallCheck:
    """The verdict on one response that was expected to call a tool."""

    tool_calls: int = 0
    finish_reason: str | None = None
    names: list[str] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (layer, message)

    @property
    def valid(self) -> bool:
        return self.tool_calls > 0 and not self.problems


def message_of(body: dict[str, Any] | None) -> dict[str, Any]:
    try:
        return body["choices"][0]["message"] or {}
    except (KeyError, IndexError, TypeError):
        return {}


def finish_of(body: dict[str, Any] | None) -> str | None:
    try:
        return body["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def markup_in(text: str | None) -> list[str]:
    return [name for name, pattern in MARKUP_SIGNATURES.items() if text and pattern.search(text)]


def tool_schemas(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}


def check_tool_call(body: dict[str, Any] | None, tools: list[dict[str, Any]]) -> CallCheck:
    """tool_calls present, names from the schema, indexes consistent, arguments valid JSON per schema."""
    schemas = tool_schemas(tools)
    message = message_of(body)
    calls = message.get("tool_calls") or []
    result = CallCheck(tool_calls=len(calls), finish_reason=finish_of(body))
    content = message.get("content")
    leaked = markup_in(content)
    if leaked and not calls:
        result.problems.append(("parser", f"tool-call markup ({', '.join(leaked)}) in content, no tool_calls"))
    elif leaked:
        result.problems.append(("parser", f"tool-call markup ({', '.join(leaked)}) left in content"))
    if not calls and not leaked:
        result.problems.append(("model", "no tool call where one was required"))
    ids = [c.get("id") for c in calls]
    if len(set(ids)) != len(ids) or any(not i for i in ids):
        result.problems.append(("parser", f"tool call ids missing or repeated: {ids}"))
    for call in calls:
        fn = call.get("function") or {}
        name = fn.get("name")
        result.names.append(name)
        if name not in schemas:
            result.problems.append(("model", f"function name {name!r} is not in the schema"))
            continue
        try:
            args = json.loads(fn.get("arguments") or "")
        except (ValueError, TypeError):
            result.problems.append(("model", f"{name}: arguments are not valid JSON: {fn.get('arguments')!r:.120}"))
            continue
        errors = sorted(jsonschema.Draft202012Validator(schemas[name]).iter_errors(args), key=str)
        if errors:
            result.problems.append(("model", f"{name}: arguments violate the schema: {errors[0].message}"))
    return result


def check_separation(body: dict[str, Any] | None) -> list[tuple[str, str]]:
    """content, reasoning and tool_calls kept apart: nothing of one glued into another."""
    message = message_of(body)
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    problems = []
    if leaked := markup_in(content):
        # Name the format: it tells which --tool-call-parser the server should run.
        problems.append(("parser", f"tool-call markup ({', '.join(leaked)}) in content"))
    if REASONING_SIGNATURES.search(content):
        problems.append(("parser", "reasoning markup in content"))
    if reasoning and reasoning.strip() and reasoning.strip() in content:
        problems.append(("gateway", "reasoning text copied into content"))
    return problems


def call_signature(body: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The structure that streaming and non-streaming must share: names and parsed arguments."""
    out = []
    for call in message_of(body).get("tool_calls") or []:
        fn = call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "")
        except (ValueError, TypeError):
            args = fn.get("arguments")
        out.append((fn.get("name"), args))
    return out


def structure_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Keys present in `a` (direct) but absent or of another type in `b` (through a gateway/client)."""
    if isinstance(a, dict):
        if not isinstance(b, dict):
            return [f"{path or '/'}: object became {type(b).__name__}"]
        out = []
        for key, value in a.items():
            if key in ("id", "created", "system_fingerprint"):
                continue
            if key not in b:
                if value is not None:
                    out.append(f"{path}/{key}: missing")
                continue
            out += structure_diff(value, b[key], f"{path}/{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items became {len(b)}"]
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += structure_diff(x, y, f"{path}/{i}")
        return out
    if a is not None and b is not None and type(a) is not type(b):
        return [f"{path}: {type(a).__name__} became {type(b).__name__}"]
    return []


def arguments_diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """Tool-call arguments compared after JSON parsing: a type changed inside the argument string
    (which `structure_diff` sees only as str == str) is a reshaping too."""
    out = []
    for i, ((_, x), (_, y)) in enumerate(zip(call_signature(a), call_signature(b), strict=False)):
        out += structure_diff(x, y, f"/choices/0/message/tool_calls/{i}/function/arguments(parsed)")
    return out


def client_library_problems(body: dict[str, Any] | None) -> list[str] | None:
    """What the `openai` Python library does to a raw response: rejects it, or loses a field.

    The probe itself speaks raw HTTP; production agents usually parse through the library, so a
    field present in the raw JSON but absent after `ChatCompletion.model_validate` is the client
    layer's. Returns None when the library is not installed (the check cannot be made).
    """
    try:
        from openai.types.chat import ChatCompletion
    except ImportError:
        return None
    if not isinstance(body, dict):
        return ["no JSON object to parse"]
    try:
        parsed = ChatCompletion.model_validate(body)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        if callable(errors):
            return [f"rejected by openai ChatCompletion: {'.'.join(map(str, e['loc']))}: {e['msg']}"
                    for e in errors()[:5]]
        return [f"rejected by openai ChatCompletion: {exc}"]
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    return [f"lost by openai ChatCompletion: {d}" for d in structure_diff(body, dumped)]


class ToolExecutor:
    """The client-side harness a safe agent uses: validate before executing, dedupe writes by id.

    An invalid call never reaches a tool; the caller gets a predictable error object instead.
    A write tool runs at most once per request id, however often it is retried.
    """

    def __init__(self, tools: list[dict[str, Any]], write_tools: Mapping[str, str] | Iterable[str]) -> None:
        """`write_tools`: the write tools, each with the argument that is its idempotency key
        (a plain list of names means the key `request_id`)."""
        self.schemas = tool_schemas(tools)
        self.write_tools: dict[str, str] = dict(write_tools) if isinstance(write_tools, Mapping) else {
            name: "request_id" for name in write_tools}
        self.executed: list[tuple[str, dict[str, Any]]] = []
        self.seen_request_ids: dict[str, dict[str, Any]] = {}

    def execute(self, name: str, arguments: str) -> dict[str, Any]:
        if name not in self.schemas:
            return {"error": "unknown_tool", "tool": name, "executed": False}
        try:
            args = json.loads(arguments)
        except (ValueError, TypeError):
            return {"error": "invalid_json", "tool": name, "executed": False}
        errors = list(jsonschema.Draft202012Validator(self.schemas[name]).iter_errors(args))
        if errors:
            return {"error": "schema_violation", "tool": name, "detail": errors[0].message, "executed": False}
        if name in self.write_tools:
            request_id = args.get(self.write_tools[name]) if isinstance(args, dict) else None
            if not request_id:
                return {"error": "write_without_request_id", "tool": name, "key": self.write_tools[name],
                        "executed": False}
            if request_id in self.seen_request_ids:
                return {**self.seen_request_ids[request_id], "deduplicated": True}
        self.executed.append((name, args))
        result = {"ok": True, "tool": name, "executed": True}
        if name in self.write_tools:
            self.seen_request_ids[request_id] = result
        return result


# --- rates that resolve their threshold (one-sided 95 % Clopper-Pearson bounds) -------------------

CONFIDENCE = 0.95


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n up to tens of thousands)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
    return min(1.0, total)


def rate_upper_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided upper confidence bound of a rate seen k times in n (exact, Clopper-Pearson):
    the largest p for which seeing <= k events still has probability >= 1 - confidence.
    Zero in n gives about 3/n at 95 % (the "rule of three")."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    alpha = 1.0 - confidence
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _binom_cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


def rate_lower_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided lower bound of a proportion k/n (for accuracies): 1 - upper bound of the misses."""
    return 0.0 if n <= 0 else 1.0 - rate_upper_bound(n - k, n, confidence)


def turns_to_resolve(threshold: float, errors: int = 0, confidence: float = CONFIDENCE, limit: int = 100_000) -> int:
    """The fewest turns whose upper bound with `errors` events is <= threshold (zero errors at 1 %: 299)."""
    if threshold <= 0:
        return limit
    if errors == 0:
        return min(limit, math.ceil(math.log(1 - confidence) / math.log1p(-threshold)))
    lo, hi = errors + 1, limit
    if rate_upper_bound(errors, hi, confidence) > threshold:
        return limit
    while lo < hi:
        mid = (lo + hi) // 2
        if rate_upper_bound(errors, mid, confidence) <= threshold:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class Rate:
    """One observed rate with its bound, judged against a threshold."""

    name: str
    events: int
    n: int
    threshold: float
    kind: str = "max"  # "max": the rate must stay <= threshold; "min": an accuracy that must stay >= it

    @property
    def value(self) -> float | None:
        return self.events / self.n if self.n else None

    @property
    def bound(self) -> float:
        return rate_upper_bound(self.events, self.n) if self.kind == "max" else rate_lower_bound(self.events, self.n)

    @property
    def resolution(self) -> float:
        """The smallest rate these turns can tell from zero (the 95 % bound of zero events)."""
        return rate_upper_bound(0, self.n)

    def verdict(self) -> str:
        """'pass' (bound on the right side), 'fail' (the point estimate already on the wrong side),
        'unresolved' (the bound straddles the threshold: more turns needed)."""
        if not self.n:
            return "unresolved"
        value = self.value or 0.0
        if self.kind == "max":
            return "pass" if self.bound <= self.threshold else "fail" if value > self.threshold else "unresolved"
        return "pass" if self.bound >= self.threshold else "fail" if value < self.threshold else "unresolved"

    def to_dict(self) -> dict[str, Any]:
        return {"events": self.events, "n": self.n, "value": self.value, "threshold": self.threshold,
                "kind": self.kind, f"{'upper' if self.kind == 'max' else 'lower'}_95": round(self.bound, 5),
                "resolution_95": round(self.resolution, 5), "verdict": self.verdict()}


# --- streaming structure ------------------------------------------------------------------------

def stream_structure_problems(chunks: list[dict[str, Any]]) -> list[str]:
    """Tool-call deltas consistent across a stream: every delta names its index; indexes start at 0
    and rise by one; each call's id and name arrive once (on its first delta) and never change."""
    problems: list[str] = []
    seen: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    for n, chunk in enumerate(chunks):
        for choice in chunk.get("choices") or []:
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                index = call.get("index")
                fn = call.get("function") or {}
                if not isinstance(index, int):
                    problems.append(f"chunk {n}: tool-call delta without an integer index ({index!r})")
                    continue
                if index not in seen:
                    expected = len(order)
                    if index != expected:
                        problems.append(f"chunk {n}: new tool call at index {index}, expected {expected}")
                    seen[index] = {"id": call.get("id"), "name": fn.get("name")}
                    order.append(index)
                    if not call.get("id"):
                        problems.append(f"chunk {n}: the first delta of call {index} carries no id")
                    if not fn.get("name"):
                        problems.append(f"chunk {n}: the first delta of call {index} carries no name")
                    continue
                if order and index != order[-1]:
                    problems.append(f"chunk {n}: delta for call {index} after call {order[-1]} began")
                first = seen[index]
                if call.get("id") and call["id"] != first["id"]:
                    problems.append(f"chunk {n}: call {index} id changed {first['id']!r} -> {call['id']!r}")
                if fn.get("name") and fn["name"] != first["name"]:
                    problems.append(f"chunk {n}: call {index} name changed {first['name']!r} -> {fn['name']!r}")
    return problems


def channels(body: dict[str, Any] | None) -> dict[str, Any]:
    """What a reply carries on each channel: reasoning text, content text, tool calls (name, args)."""
    message = message_of(body)
    reasoning = message.get("reasoning_content") or message.get("reasoning") or None
    return {"reasoning": (reasoning or "").strip() or None, "content": (message.get("content") or "").strip() or None,
            "tool_calls": call_signature(body)}


def channel_diff(plain: dict[str, Any] | None, streamed: dict[str, Any] | None, reasoning: bool) -> list[str]:
    """The streamed reply, assembled, carries what the non-streamed one carries on every channel."""
    a, b = channels(plain), channels(streamed)
    names = ("reasoning", "content", "tool_calls") if reasoning else ("content", "tool_calls")
    return [f"{name}: non-streamed {a[name]!r:.120} vs streamed {b[name]!r:.120}"
            for name in names if a[name] != b[name]]


# --- the planned fallback after a failed or incomplete tool result ----------------------------------

@dataclass
class StepJudgement:
    kind: str
    ok: bool
    layer: str | None = None
    problems: list[str] = field(default_factory=list)
    call: dict[str, Any] | None = None


def judge_fallback_step(step: dict[str, Any], body: dict[str, Any] | None, tools: list[dict[str, Any]],
                        failed: dict[str, Any], driven_by: str) -> StepJudgement:
    """One answer of the deployment against one step of the pack's planned fallback.

    `retry`: a call of the failed tool with the same arguments; `ticket`: a schema-valid call of the
    step's tool with the step's required fields; `user_error`: a plain answer that says the tool failed
    (one of the step's `acknowledge` words, when the model drives the fallback) and states none of
    the data the tool never returned (`must_not_claim`)."""
    kind = step["kind"]
    message = message_of(body)
    calls = message.get("tool_calls") or []
    out = StepJudgement(kind=kind, ok=False)
    if not message:
        out.problems.append("no assistant message")
        out.layer = "client"
        return out
    if kind in ("retry", "ticket"):
        check = check_tool_call(body, tools)
        if not calls:
            out.layer = check.problems[0][0] if check.problems else "model"
            out.problems.append(f"{kind}: no tool call ({'; '.join(p for _, p in check.problems) or 'plain answer'})")
            return out
        call = calls[0]
        fn = call.get("function") or {}
        out.call = call
        want = failed["name"] if kind == "retry" else step["tool"]
        if fn.get("name") != want:
            name = fn.get("name")
            out.problems.append(f"{kind}: called {name!r}, the plan names {want!r}")
            out.layer = "model"
            return out
        problems = [p for layer, p in check.problems if layer != "model" or want in p]
        if problems:
            out.problems += problems
            out.layer = next((layer for layer, _ in check.problems), "model")
            return out
        args = json.loads(fn.get("arguments") or "{}")
        if kind == "retry" and args != failed["arguments"]:
            out.problems.append(f"retry: arguments {args} differ from the failed call's {failed['arguments']}")
        for key, value in (step.get("require") or {}).items():
            if args.get(key) != value:
                out.problems.append(f"{kind}: {key}={args.get(key)!r}, the plan requires {value!r}")
        out.layer = "model" if out.problems else None
        out.ok = not out.problems
        return out
    # user_error
    content = message.get("content") or ""
    if calls:
        names = [(c.get("function") or {}).get("name") for c in calls]
        again = failed["name"] in names
        out.problems.append(f"user_error: a tool call ({', '.join(map(str, names))}) instead of an answer"
                            + ("; the failed call is repeated past the plan's retries" if again else ""))
    if not content.strip():
        out.problems.append("user_error: empty content")
    low = content.lower()
    acknowledge = [w.lower() for w in step.get("acknowledge") or []]
    if driven_by == "model" and acknowledge and not any(w in low for w in acknowledge):
        out.problems.append(f"user_error: the answer ignores the failure (none of {acknowledge} in {content!r:.120})")
    claimed = [w for w in step.get("must_not_claim") or [] if w.lower() in low]
    if claimed:
        out.problems.append(f"user_error: the answer states data the tool never returned: {claimed}")
    if markup_in(content):
        out.problems.append("user_error: tool-call markup in content")
        out.layer = "parser"
    out.layer = out.layer or ("model" if out.problems else None)
    out.ok = not out.problems
    return out


# --- the reference client on the deployment's real calls ----------------------------------------------

def execute_real_calls(calls: list[dict[str, Any]], tools: list[dict[str, Any]],
                       write_tools: dict[str, dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Every tool call the deployment returned, through the reference client: validate -> execute or
    refuse. Each write is delivered twice (the client's retry of the same operation) and must run once.

    `calls`: [{"case", "call", "retry_group"?}] where calls sharing a `retry_group` are the deployment's
    answers to one logical write re-sent (a retry): their idempotency keys must agree or the write runs
    twice. Returns (per-call records, unsafe problems with layer executor, retry problems)."""
    executor = ToolExecutor(tools, {name: spec.get("idempotency_key", "request_id")
                                    for name, spec in write_tools.items()})
    schemas = tool_schemas(tools)
    records, unsafe, retry = [], [], []
    for item in calls:
        fn = item["call"].get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments")
        valid, why = True, ""
        try:
            args = json.loads(raw or "")
            errors = list(jsonschema.Draft202012Validator(schemas[name]).iter_errors(args)) if name in schemas else []
            if name not in schemas:
                valid, why = False, f"unknown tool {name!r}"
            elif errors:
                valid, why = False, errors[0].message
        except (ValueError, TypeError):
            valid, why = False, "arguments are not JSON"
        before = len(executor.executed)
        first = executor.execute(str(name), raw or "")
        again = executor.execute(str(name), raw or "") if name in write_tools else None
        runs = len(executor.executed) - before
        record = {"case": item["case"], "call": item["call"], "valid": valid, "validation": why or "valid",
                  "outcome": first, "retry_outcome": again, "executions": runs}
        records.append(record)
        if not valid and first.get("executed"):
            unsafe.append(f"{item['case']}: invalid call {name} ({why}) was executed")
        if valid and not first.get("executed") and name not in write_tools:
            unsafe.append(f"{item['case']}: a valid call was refused: {first}")
        if runs > 1:
            retry.append(f"{item['case']}: write {name} ran {runs} times for one request id")
    groups: dict[str, list[dict[str, Any]]] = {}
    for item, record in zip(calls, records, strict=True):
        if item.get("retry_group") and record["call"]["function"].get("name") in write_tools:
            groups.setdefault(item["retry_group"], []).append(record)
    for group, members in groups.items():
        runs = sum(r["executions"] for r in members)
        if runs > 1:
            key = write_tools[members[0]["call"]["function"]["name"]].get("idempotency_key", "request_id")
            keys = [_arg(r["call"], key) for r in members]
            retry.append(f"{group}: one write re-sent {len(members)} times ran {runs} times "
                         f"({key} values {keys}: the key came from the model, not from the client)")
    return records, unsafe, retry


def _arg(call: dict[str, Any], key: str) -> Any:
    try:
        return json.loads((call.get("function") or {}).get("arguments") or "").get(key)
    except (ValueError, TypeError, AttributeError):
        return None


# --- the case set -------------------------------------------------------------------------------

@dataclass
class CaseJudgement:
    """One case of the case set judged by its class (scenarios/cases.py): `problems` are defects of the
    deployment (each naming its layer); `misses` are what the case expected but the answer chose otherwise
    (another tool, one call of two): reported per case, judged by the rates that own them."""

    case: str
    cls: str
    status: int
    check: CallCheck
    separation: list[tuple[str, str]]
    problems: list[tuple[str, str]]
    misses: list[str]
    abstained: bool | None = None  # irrelevance: no call made (None for the other classes)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.separation

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "class": self.cls, "status": self.status, "ok": self.ok,
                "finish_reason": self.check.finish_reason, "calls": self.check.names,
                "problems": [list(p) for p in self.problems + self.separation], "misses": self.misses,
                "abstained": self.abstained}


def judge_case(case: str, cls: str, expect: list[str], schema: dict[str, Any] | None, status: int,
               body: dict[str, Any] | None, tools: list[dict[str, Any]], error: str | None = None) -> CaseJudgement:
    """A case's answer against its class: single/parallel must call (valid calls, schema tools);
    multi_turn must answer as the assistant (text, or valid calls); irrelevance must not call (a call made
    is still checked for format); structured content must validate against its schema."""
    check = check_tool_call(body if status == 200 else None, tools)
    sep = check_separation(body) if status == 200 else []
    if status != 200:
        layer = "gateway" if status >= 500 or status == 0 else "client"
        return CaseJudgement(case, cls, status, check, [], [(layer, f"HTTP {status}: {error or ''}".strip())], [])
    no_call = [p for p in check.problems if p[1].startswith("no tool call")]
    misses: list[str] = []
    abstained = None
    problems = list(check.problems)
    if cls == "parallel" or cls == "single":
        missing = [n for n in expect if n not in check.names]
        if missing and check.tool_calls:
            misses.append(f"expected {', '.join(expect)}, called {', '.join(map(str, check.names))}")
    elif cls == "multi_turn":
        message = message_of(body)
        problems = [p for p in problems if p not in no_call]
        if message.get("role") != "assistant" or not (message.get("content") or message.get("tool_calls")):
            problems.append(("model", "no assistant answer after the tool result"))
    elif cls == "irrelevance":
        problems = [p for p in problems if p not in no_call]
        abstained = check.tool_calls == 0 and not markup_in(message_of(body).get("content"))
        if not abstained:
            misses.append(f"no tool fits, called {', '.join(map(str, check.names)) or 'one (markup)'}")
    elif cls == "structured":
        problems = []
        content = message_of(body).get("content")
        try:
            jsonschema.validate(json.loads(content or ""), schema or {})
        except (ValueError, jsonschema.ValidationError) as exc:
            layer = "model" if finish_of(body) == "length" else "parser"
            problems.append((layer, f"structured answer rejected: {str(exc).splitlines()[0][:160]}"))
    return CaseJudgement(case, cls, status, check, sep, problems, misses, abstained)


BOUND_ASSUMPTIONS = (
    "one-sided 95 % Clopper-Pearson bounds over distinct cases, each sent once: the cases are treated as "
    "independent Bernoulli trials with one rate; they are a seeded sample of the scenario pack's tools, argument "
    "types, phrasings and context lengths, so the bound speaks for traffic like the pack, not for any traffic; "
    "repeats of a case measure consistency only and never enter a rate")


def class_rates(judged: list[CaseJudgement]) -> dict[str, dict[str, Any]]:
    """Per class of case: cases, cases without a defect, the rate of defects with its 95 % upper bound,
    the cases that chose otherwise than expected (misses), and the irrelevance class's abstentions."""
    out: dict[str, dict[str, Any]] = {}
    for cls in sorted({j.cls for j in judged}):
        mine = [j for j in judged if j.cls == cls]
        bad = [j for j in mine if not j.ok]
        out[cls] = {"cases": len(mine), "ok": len(mine) - len(bad), "defect_rate": len(bad) / len(mine),
                    "upper_95": round(rate_upper_bound(len(bad), len(mine)), 5),
                    "misses": sum(1 for j in mine if j.misses), "failed": [j.case for j in bad][:10]}
        if cls == "irrelevance":
            out[cls]["abstained"] = sum(1 for j in mine if j.abstained)
    return out


def reference_agreement(rows: list[dict[str, Any]], min_cases: int = 1) -> dict[str, Any]:
    """Tool-call F1 on triggering against a reference (the reference's calls are the positive class), as
    Moonshot's K2-Vendor-Verifier judges a vendor; argument agreement per case where both call, under
    ARGUMENT_COMPARISON (each row's `tools`: the schemas the case offered). Rows: {"case", "reference_status",
    "reference_calls", "calls", "tools"?} (calls: call_signature lists, None unanswered). `conclusive`: at least
    `min_cases` cases answered by both sides (below it no reference result counts)."""
    both = [r for r in rows if r["reference_status"] == 200 and r["calls"] is not None]
    tp = sum(1 for r in both if r["reference_calls"] and r["calls"])
    fp = sum(1 for r in both if not r["reference_calls"] and r["calls"])
    fn = sum(1 for r in both if r["reference_calls"] and not r["calls"])
    compared = []
    for r in both:
        if r["reference_calls"] and r["calls"]:
            hard, text = calls_differences(r["reference_calls"], r["calls"], r.get("tools") or [])
            compared.append({"case": r["case"], "agree": not hard and not text, "differences": (hard + text)[:5],
                             "reference": r["reference_calls"], "deployment": r["calls"]})
    agree = [c for c in compared if c["agree"]]
    f1 = 2 * tp / (2 * tp + fp + fn) if (tp + fp + fn) else None
    disagreeing = [{"case": r["case"], "reference": r["reference_calls"], "deployment": r["calls"]}
                   for r in both if bool(r["reference_calls"]) != bool(r["calls"])]
    disagreeing += [{k: c[k] for k in ("case", "reference", "deployment", "differences")}
                    for c in compared if not c["agree"]]
    return {"cases": len(rows), "answered": len(both), "min_cases": min_cases, "conclusive": len(both) >= min_cases,
            "tp": tp, "fp": fp, "fn": fn, "f1": f1,
            "arguments_agree": len(agree), "argument_agreement": len(agree) / tp if tp else None,
            "comparison": ARGUMENT_COMPARISON, "disagreeing": disagreeing}


# --- tool choice (agent.tool_choice; docs/checks.md) ------------------------------------------------

@dataclass
class ToolChoiceJudgement:
    """One case's tool choice: calls of tools the case does not expect (`wrong`; `severe` when such a
    tool writes), and the request's `tool_choice` not honoured (`violations`). `missing`: expected tools not
    called (a parallel set called in part), reported, never a wrong tool."""

    case: str
    cls: str
    wrong: list[str] = field(default_factory=list)
    severe: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "class": self.cls, "wrong": self.wrong, "severe": self.severe,
                "violations": self.violations, "missing": self.missing}


def named_choice(tool_choice: Any) -> str | None:
    """The function a named `tool_choice` forces ({"type": "function", "function": {"name": N}}), else None."""
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        return str(name) if name else None
    return None


def judge_tool_choice(case: str, cls: str, expect: list[str], tool_choice: Any, names: list[Any],
                      write_tools: Iterable[str]) -> ToolChoiceJudgement:
    """The tools a case's answer called against what the case expects and what `tool_choice` allows.

    single / parallel: every called name must be one the case expects; a parallel answer is judged as a set
    (a call of a tool outside the expected set is wrong; an expected tool left out is `missing`, and a tool
    called twice is reported as a violation of the set). irrelevance: no tool fits, so a call of a write tool
    is a wrong call (a read call stays with the abstention rate). multi_turn: any offered tool may follow a
    tool result. `tool_choice` (any class): "required" -> at least one call; "none" -> no call; named -> every
    call is that function (the OpenAI chat completions contract; docs/sources.md#kimi-vendor-verifier)."""
    writes = set(write_tools)
    called = [str(n) for n in names]
    out = ToolChoiceJudgement(case, cls)
    if cls in ("single", "parallel"):
        out.wrong = [n for n in called if n not in expect]
        out.missing = [n for n in expect if n not in called] if called else []
        if cls == "parallel":
            twice = sorted({n for n in called if called.count(n) > 1 and expect.count(n) < called.count(n)})
            out.violations += [f"parallel set: {n} called more than the case asks" for n in twice]
    elif cls == "irrelevance":
        out.wrong = [n for n in called if n in writes]
    out.severe = [n for n in out.wrong if n in writes]
    forced = named_choice(tool_choice)
    if tool_choice == "required" and not called:
        out.violations.append("tool_choice required: no tool called")
    elif tool_choice == "none" and called:
        out.violations.append(f"tool_choice none: called {', '.join(called)}")
    elif forced and (not called or any(n != forced for n in called)):
        out.violations.append(f"tool_choice names {forced}: called {', '.join(called) or 'nothing'}")
    return out


# --- argument comparison (agent.reference_arguments, agent.trigger_consistency) ---------------------

ID_KEY = re.compile(r"(^|_)(id|ids|key|uuid)$", re.IGNORECASE)
ARGUMENT_COMPARISON = (
    "arguments compared per value by its schema: enum values, ids (a key named id / *_id / *_key, or a string "
    "with a pattern or format) and booleans exact; numbers as numbers (1 == 1.0); free text (any other string) "
    "after collapsing whitespace; objects key by key, arrays item by item; semantic equality (two phrasings of "
    "one meaning) is left out: a different phrasing is a different argument")


def value_role(schema: dict[str, Any] | None, key: str = "") -> str:
    """How a value is compared: 'exact' (enum, id, boolean), 'number', 'text' (free text), 'object', 'array',
    'any' (no schema: compared exactly)."""
    schema = schema if isinstance(schema, dict) else {}
    kind = schema.get("type")
    if "enum" in schema or "const" in schema or kind == "boolean":
        return "exact"
    if kind in ("integer", "number"):
        return "number"
    if kind == "object" or "properties" in schema:
        return "object"
    if kind == "array":
        return "array"
    if kind == "string":
        return "exact" if (ID_KEY.search(key) or "pattern" in schema or "format" in schema) else "text"
    return "any"


def _norm_text(value: str) -> str:
    return " ".join(value.split())


def argument_differences(a: Any, b: Any, schema: dict[str, Any] | None, path: str = "",
                         key: str = "") -> tuple[list[str], list[str]]:
    """(hard, text): where two argument values differ under ARGUMENT_COMPARISON. `hard`: tool structure, keys,
    enum / id / boolean / number values; `text`: free-text values that differ after whitespace is collapsed."""
    role = value_role(schema, key)
    here = path or "/"
    if role == "object" or (role == "any" and isinstance(a, dict)):
        if not isinstance(a, dict) or not isinstance(b, dict):
            return [f"{here}: {type(a).__name__} vs {type(b).__name__}"], []
        props = (schema or {}).get("properties") or {}
        hard: list[str] = []
        text: list[str] = []
        if set(a) != set(b):
            hard.append(f"{here}: keys {sorted(a)} vs {sorted(b)}")
        for k in sorted(set(a) & set(b)):
            h, t = argument_differences(a[k], b[k], props.get(k), f"{path}/{k}", k)
            hard += h
            text += t
        return hard, text
    if role == "array" or (role == "any" and isinstance(a, list)):
        if not isinstance(a, list) or not isinstance(b, list):
            return [f"{here}: {type(a).__name__} vs {type(b).__name__}"], []
        if len(a) != len(b):
            return [f"{here}: {len(a)} items vs {len(b)}"], []
        hard, text = [], []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            h, t = argument_differences(x, y, (schema or {}).get("items"), f"{path}/{i}", key)
            hard += h
            text += t
        return hard, text
    if role == "number":
        same = (isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool)
                and not isinstance(b, bool) and float(a) == float(b))
        return ([] if same else [f"{here}: {a!r} vs {b!r}"]), []
    if role == "text" and isinstance(a, str) and isinstance(b, str):
        return [], ([] if _norm_text(a) == _norm_text(b) else [f"{here}: {a!r:.80} vs {b!r:.80}"])
    return ([] if a == b and type(a) is type(b) else [f"{here}: {a!r:.80} vs {b!r:.80}"]), []


def calls_differences(a: list[tuple[str, Any]] | None, b: list[tuple[str, Any]] | None,
                      tools: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Two answers' calls (call_signature lists) compared under ARGUMENT_COMPARISON: the tool names as a set
    in order of their names (parallel calls are a set), then each call's arguments by the tool's schema."""
    schemas = tool_schemas(tools)
    a, b = sorted(a or [], key=lambda c: str(c[0])), sorted(b or [], key=lambda c: str(c[0]))
    names_a, names_b = [c[0] for c in a], [c[0] for c in b]
    if names_a != names_b:
        return [f"tools {names_a} vs {names_b}"], []
    hard, text = [], []
    for i, ((name, x), (_, y)) in enumerate(zip(a, b, strict=True)):
        h, t = argument_differences(x, y, schemas.get(str(name)), f"{name}[{i}]")
        hard += h
        text += t
    return hard, text


# --- the vendor verifier's measures (docs/sources.md#k2-vendor-verifier) ----------------------------

def verifier_measures(judged: list[CaseJudgement]) -> dict[str, Any]:
    """The case set's results in K2-Vendor-Verifier terms: ToolCall-Trigger F1 with the case set's own
    expectation as the positive class (single and parallel cases must call, irrelevance cases must not;
    the verifier takes the official API's finish_reason instead), and ToolCall-Schema Accuracy
    (count_successful_tool_call / count_finish_reason_tool_calls)."""
    scored = [j for j in judged if j.cls in ("single", "parallel", "irrelevance") and j.status == 200]
    tp = sum(1 for j in scored if j.cls != "irrelevance" and j.check.finish_reason == "tool_calls")
    fn = sum(1 for j in scored if j.cls != "irrelevance" and j.check.finish_reason != "tool_calls")
    fp = sum(1 for j in scored if j.cls == "irrelevance" and j.check.finish_reason == "tool_calls")
    tn = sum(1 for j in scored if j.cls == "irrelevance" and j.check.finish_reason != "tool_calls")
    by_finish = [j for j in judged if j.check.finish_reason == "tool_calls" and j.cls != "structured"]
    ok = [j for j in by_finish if not j.check.problems]
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None
    return {"positive_class": "the case set's expectation (single, parallel: call; irrelevance: no call)",
            "tp": tp, "fp": fp, "fn": fn, "tn": tn, "tool_call_precision": precision, "tool_call_recall": recall,
            "tool_call_f1": f1, "count_finish_reason_tool_calls": len(by_finish),
            "count_successful_tool_call": len(ok),
            "schema_accuracy": len(ok) / len(by_finish) if by_finish else None}


# --- consistency over repeats (agent.trigger_consistency) ---------------------------------------------

CONSISTENCY_RULE = (
    "repeats of one case compared on the call's structure: the tools called (a set), each call's argument keys, "
    "and its enum, id and boolean values; numbers and free text are compared loosely: a difference is reported, "
    "never failed. Why: GPU serving is not batch-invariant by default (vLLM docs 'Batch Invariance', "
    "docs/sources.md#vllm-batch-invariance): the same greedy request batched with different neighbours can take "
    "another token where two are near-tied, which rewrites a phrase or a digit but does not turn a correct call "
    "into another tool, another key set or another enum / id without the model being unsure of the call itself")


def _structure(value: Any, schema: dict[str, Any] | None, key: str = "") -> Any:
    role = value_role(schema, key)
    if isinstance(value, dict) and role in ("object", "any"):
        props = (schema or {}).get("properties") or {}
        return {k: _structure(v, props.get(k), k) for k, v in sorted(value.items())}
    if isinstance(value, list) and role in ("array", "any"):
        return [_structure(v, (schema or {}).get("items"), key) for v in value]
    if role == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return "<number>"
    if role == "text" and isinstance(value, str):
        return "<text>"
    return value


def call_structure(signature: list[tuple[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The part of an answer's calls that repeats must share (CONSISTENCY_RULE), as a comparable string."""
    schemas = tool_schemas(tools)
    calls = sorted(((str(name), _structure(args, schemas.get(str(name)))) for name, args in signature),
                   key=lambda c: json.dumps(c, sort_keys=True))
    return json.dumps(calls, sort_keys=True)


# --- streamed twins (agent.stream_tool_calls) -----------------------------------------------------------

def stream_twin_problems(plain: dict[str, Any] | None, streamed: dict[str, Any] | None) -> list[str]:
    """A streamed answer (assembled from its deltas) against its non-streamed twin, the same request. Where the
    twin calls a tool, the stream must carry as many calls, each with its name and arguments that parse as
    JSON: an empty `tool_calls` (vLLM #54701: every tool-call delta empty, finish_reason still tool_calls) or a
    partial one (a call lost, a call without its name, arguments cut) is a problem. Argument values that differ
    are not judged here: concurrent GPU serving is not batch-invariant (repeats judge consistency)."""
    want = message_of(plain).get("tool_calls") or []
    if not want:
        return []
    message = message_of(streamed)
    got = message.get("tool_calls") or []
    finish = finish_of(streamed)
    if not got:
        leaked = markup_in(message.get("content"))
        where = f"; tool-call markup ({', '.join(leaked)}) in the streamed content" if leaked else ""
        return [f"empty tool_calls in the stream (finish_reason {finish!r}), its non-streamed twin calls "
                f"{len(want)}{where}"]
    problems = []
    if len(got) < len(want):
        problems.append(f"partial tool_calls in the stream: {len(got)} of the twin's {len(want)} calls")
    for i, call in enumerate(got):
        fn = call.get("function") or {}
        if not fn.get("name"):
            problems.append(f"partial tool_calls in the stream: call {i} has no name")
        try:
            json.loads(fn.get("arguments") or "")
        except (ValueError, TypeError):
            problems.append(f"partial tool_calls in the stream: call {i} ({fn.get('name')!r}) arguments are not "
                            f"whole JSON: {fn.get('arguments')!r:.80}")
    return problems
