"""The answer of serve/vllm_argcheck.py (vLLM's own argument checks): one line `MARK JSON` on its standard output,
among whatever vLLM itself logs there. Read by serve/vllm_check.py on the controller and by rules/launch_args.py
from preflight's `launch_args_check` evidence (run inside the image on the head node)."""

from __future__ import annotations

import json
from typing import Any

MARK = "@@vllm-argcheck@@"         # the same literal as serve/vllm_argcheck.py (standalone: it imports nothing)


def parse_answer(stdout: str) -> tuple[dict[str, Any] | None, str]:
    """(the answer, "") or (None, why there is none): no MARK line (the script did not run to its end), or a
    line that is not a JSON object."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARK)), None)
    if line is None:
        return None, "no answer line (the check did not run to its end)"
    try:
        answer = json.loads(line[len(MARK):])
    except ValueError as exc:
        return None, f"unreadable answer line: {exc}"
    if not isinstance(answer, dict):
        return None, "unreadable answer line: not a JSON object"
    return answer, ""
