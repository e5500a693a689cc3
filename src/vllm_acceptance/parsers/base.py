"""Shared shape of every parser result: data plus the errors met while reading it.

Parsers are total: whatever text they get (empty, truncated, another tool's output), they
return a result whose `errors` say what could not be read. Rules turn a result with errors
into `missing` or `inconclusive`, never into `pass`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

VERSION_RE = re.compile(r"\d+(?:\.\d+){0,3}")


@dataclass
class Parsed:
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """'580.95.05' -> (580, 95, 5); '0.32.0+cpu' -> (0, 32, 0); None when no number leads."""
    if not text:
        return None
    match = VERSION_RE.match(text.strip().lstrip("vV"))
    if not match:
        return None
    return tuple(int(p) for p in match.group(0).split("."))


def version_at_least(observed: str | None, minimum: str | None) -> bool | None:
    """None when either side cannot be read (the caller decides: never a pass)."""
    have, need = version_tuple(observed), version_tuple(minimum)
    if have is None or need is None:
        return None
    width = max(len(have), len(need))
    return have + (0,) * (width - len(have)) >= need + (0,) * (width - len(need))


def cuda_major(text: str | None) -> int | None:
    """'13.0' / '13.0.1' / 'libcudart.so.13' / '12090' (CUDA API int) -> major."""
    if text is None:
        return None
    text = str(text).strip()
    soname = re.search(r"libcudart\.so\.(\d+)", text)
    if soname:
        return int(soname.group(1))
    if re.fullmatch(r"\d{4,5}", text):  # cudaRuntimeGetVersion style: 12090, 13000
        return int(text) // 1000
    version = version_tuple(text)
    return version[0] if version else None
