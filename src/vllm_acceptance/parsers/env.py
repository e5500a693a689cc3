"""`env` output -> mapping; the NCCL / UCX / CUDA subset that decides inter-node behaviour."""

from __future__ import annotations

import re

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
COMM_PREFIXES = ("NCCL_", "UCX_", "NVSHMEM_", "CUDA_", "VLLM_", "GLOO_", "TORCH_NCCL")


def parse_env(text: str) -> dict[str, str]:
    """Lines NAME=value; continuation lines of multi-line values are appended to the last name."""
    env: dict[str, str] = {}
    last: str | None = None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and _NAME.match(name):
            env[name] = value
            last = name
        elif last is not None:
            env[last] += "\n" + line
    return env


def comm_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(COMM_PREFIXES)}
