"""The engine configuration vLLM prints at start-up, read field by field without evaluating anything.

Every vLLM from 0.2 on logs the configuration its engine was built with, values as resolved (defaults
included, unlike the ``non-default args`` line)::

    Initializing a V1 LLM engine (v0.32.0) with config: model='.lab/models/tiny-agent', ..., dtype=torch.float32,
    max_seq_len=2048, load_format=auto, ..., enforce_eager=True, kv_cache_dtype=auto, ...,
    kernel_config=KernelConfig(..., enable_flashinfer_autotune=True, moe_backend='auto', ...)

The text is ``key=value`` pairs joined by ``, ``; a value is a repr (parsers/pyrepr.py) or a bare word
(``served_model_name=tiny-agent``, kept as its text). Lines get cut by log shippers: a last field whose
value is not closed (an open bracket or quote, or a scalar without the closing ``)`` older vLLMs print)
is dropped, never read as a shorter value.
"""

from __future__ import annotations

import re
from typing import Any

from .pyrepr import ReprError, read_repr

MARKER = re.compile(r"Initializing an? (?:V[01] )?LLM engine (?:\(v[^)]*\) )?with config: ")
_KEY = re.compile(r"([A-Za-z_]\w*)=")
_NEXT = re.compile(r",\s+(?=[A-Za-z_]\w*=)")           # ", " (0.8 prints ",  " once) before the next key
_OPENERS, _CLOSERS = "([{", ")]}"


def engine_config(message: str) -> dict[str, Any] | None:
    """The fields of one "Initializing ... LLM engine ... with config: ..." message; None if it is not one."""
    found = MARKER.search(message)
    if found is None:
        return None
    fields, closed = _split(message[found.end():])
    if fields and not closed:
        fields.pop()
    return {key: _value(raw) for key, raw in fields}


def _split(text: str) -> tuple[list[tuple[str, str]], bool]:
    """``key=value`` pairs at bracket depth 0; ``closed``: the last value ended on a closed structure or on
    the stray ``)`` that ends older lines (otherwise the line may have been cut inside it)."""
    fields: list[tuple[str, str]] = []
    depth, index, start, quote_open = 0, 0, 0, False
    while index < len(text):
        char = text[index]
        if char in "'\"":
            end = text.find(char, index + 1)
            if end < 0:
                quote_open = True
                break
            index = end + 1
            continue
        if char in _OPENERS:
            depth += 1
        elif char in _CLOSERS:
            depth -= 1
            if depth < 0:                       # the stray ")" closing older vLLMs' line
                _add(fields, text[start:index])
                return fields, True
        elif depth == 0 and (following := _NEXT.match(text, index)):
            _add(fields, text[start:index])
            start = following.end()
        index += 1
    _add(fields, text[start:index])
    last = text[start:].rstrip()
    return fields, not quote_open and depth == 0 and last.endswith((")", "}", "]"))


def _add(fields: list[tuple[str, str]], part: str) -> None:
    key = _KEY.match(part.strip())
    if key:
        fields.append((key.group(1), part.strip()[key.end():].strip()))


def _value(raw: str) -> Any:
    try:
        return read_repr(raw)
    except ReprError:
        return raw
