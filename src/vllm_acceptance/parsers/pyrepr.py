"""Read the Python value reprs vLLM prints in its startup log, without evaluating anything.

vLLM logs its parsed arguments with ``%s`` (``non-default args: {...}``). Most values are literals,
but some are reprs that ``ast.literal_eval`` refuses, e.g. with ``--attention-config`` (vLLM 0.32):

    'attention_config': AttentionConfig(backend=None, ..., mla_prefill_backend=<MLAPrefillBackendEnum.FLASHINFER:
    'vllm.v1.attention.backends.mla.prefill.flashinfer.FlashInferPrefillBackend'>, use_prefill_query_quantization=True)

What this reader returns (JSON-serialisable, so it can go into stage details as is):
- a dataclass or call repr ``Name(k=v, ...)`` becomes a dict of its keyword fields plus ``"__repr__": "Name"``
  (positional arguments, as in ``PosixPath('/x')``, go under ``"__args__"``);
- an enum member ``<Enum.MEMBER: value>`` becomes the string ``"Enum.MEMBER"``;
- a bare or dotted name (``torch.float32``, ``inf``) becomes its text; tuples and sets become lists.
Anything else raises :class:`ReprError`: the caller reports the line as unreadable, never guesses.
"""

from __future__ import annotations

import ast
import re
from typing import Any

REPR_KEY = "__repr__"
ARGS_KEY = "__args__"
_ENUM_HEAD = re.compile(r"<([A-Za-z_][\w.]*\.[A-Za-z_]\w*): ")
_OPEN, _CLOSE = "([{<", ")]}>"


class ReprError(ValueError):
    """The text is not a repr this reader understands."""


def read_repr(text: str) -> Any:
    """The value of one printed Python repr (see the module docstring); ReprError when unreadable."""
    try:
        tree = ast.parse(_rewrite_enums(text.strip()), mode="eval")
        return _value(tree.body)
    except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        raise ReprError(str(exc)) from None


def _rewrite_enums(text: str) -> str:
    """``<Enum.MEMBER: value>`` -> ``'Enum.MEMBER'`` outside string literals."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char in "'\"":
            end = _string_end(text, index)
            out.append(text[index:end])
            index = end
            continue
        head = _ENUM_HEAD.match(text, index) if char == "<" else None
        if head:
            end = _bracket_end(text, index)
            out.append(repr(head.group(1)))
            index = end
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    quote, index = text[start], start + 1
    while index < len(text):
        if text[index] == "\\":
            index += 2
            continue
        if text[index] == quote:
            return index + 1
        index += 1
    raise ReprError(f"unterminated string at {start}")


def _bracket_end(text: str, start: int) -> int:
    """Index after the ``>`` closing the enum repr opened at ``start`` (nested brackets and strings skipped)."""
    depth, index = 0, start
    while index < len(text):
        char = text[index]
        if char in "'\"":
            index = _string_end(text, index)
            continue
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth -= 1
            if depth == 0:
                if char != ">":
                    raise ReprError(f"unbalanced enum repr at {start}")
                return index + 1
        index += 1
    raise ReprError(f"unterminated enum repr at {start}")


def _value(node: ast.expr) -> Any:  # noqa: C901 - one case per node type
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ReprError("dict unpacking in a repr")
        return {_key(_value(k)): _value(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(item) for item in node.elts]
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _dotted(node)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Call):
        fields: dict[str, Any] = {REPR_KEY: _dotted(node.func)}
        if node.args:
            fields[ARGS_KEY] = [_value(arg) for arg in node.args]
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ReprError("keyword unpacking in a repr")
            fields[keyword.arg] = _value(keyword.value)
        return fields
    raise ReprError(f"unsupported expression {type(node).__name__}")


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ReprError(f"unsupported name {type(node).__name__}")


def _key(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
