"""Lab helpers for the P/D path (tests/integration/test_pd_path_lab.py, and how tests/fixtures/pd_path/ was captured):
the pair's kv-transfer-config (vLLM 0.32's ExampleConnector, docs/sources.md#pd-path), prompts longer than the CPU
build's 128-token KV block, and a pass of them through an entry point.

Capture (tests/fixtures/pd_path/README.md):
`python tests/support/pd_lab.py PREFILL_URL DECODE_URL ROUTER_PORT OUT_PREFIX` writes
OUT_PREFIX-{before,after}-{prefill,decode}.prom around a pass of PROMPTS through a PdRouter on ROUTER_PORT.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

PROMPTS = [" ".join(f"Item {i} of list {n} is a small {c} box on shelf {i % 5}." for i in range(14))
           + f" Which item of list {n} is on shelf three?" for n, c in enumerate(("red", "blue", "green", "grey"))]


def kv_config(role: str, path: str, policy: str = "fail") -> str:
    """--kv-transfer-config for one side of the pair: role kv_producer (prefill) or kv_consumer (decode)."""
    config = {"kv_connector": "ExampleConnector", "kv_role": role,
              "kv_connector_extra_config": {"shared_storage_path": path}}
    if role == "kv_consumer":
        config["kv_load_failure_policy"] = policy
    return "--kv-transfer-config " + json.dumps(config, separators=(",", ":"))


def metrics_text(base_url: str) -> str:
    root = base_url.rstrip("/").removesuffix("/v1")
    return httpx.get(root + "/metrics", timeout=30).text


def send_prompts(base_url: str, model: str = "tiny-agent", prompts: list[str] | None = None) -> list[dict]:
    out = []
    for prompt in prompts or PROMPTS:
        r = httpx.post(base_url.rstrip("/") + "/chat/completions", timeout=300,
                       json={"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8,
                             "temperature": 0.0})
        out.append({"status": r.status_code, "body": r.json() if r.headers.get("content-type", "").startswith(
            "application/json") else r.text})
    return out


def main(prefill: str, decode: str, port: int, prefix: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support.pd_router import PdRouter

    for label in ("before",):
        Path(f"{prefix}-{label}-prefill.prom").write_text(metrics_text(prefill))
        Path(f"{prefix}-{label}-decode.prom").write_text(metrics_text(decode))
    with PdRouter(prefill, decode, port) as router:
        answers = send_prompts(router.base_url)
    Path(f"{prefix}-after-prefill.prom").write_text(metrics_text(prefill))
    Path(f"{prefix}-after-decode.prom").write_text(metrics_text(decode))
    print(json.dumps([a["status"] for a in answers]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
