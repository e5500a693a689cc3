"""Issue 45 item 3: the quality probe (the real CLI) on the real lab vLLM.

The session's lab server is the reference path; the corrupting gateway in front of it is the path under test.
Passing everything through raises no alarm; corrupting every answer after its 3rd token (corrupt_after_tokens,
streamed and not) fails quality.parity naming the first divergent token: position 3, both tokens, the prompt.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
# Fewer prompts than the default and no long one: the comparison, not the contract's context, is under test here.
SMALL = ("--set", "quality.short_prompts=3", "--set", "quality.long_prompt_tokens=0", "--set", "quality.max_tokens=16",
         "--set", "quality.concurrency=4")


def probe(base_url: str, reference: str, model: str, out: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "quality", "--base-url", base_url,
                           "--model", model, "--reference-url", reference, "--out", str(out), *SMALL],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert (out / "result.json").is_file(), proc.stdout + proc.stderr
    return proc.returncode, json.loads((out / "result.json").read_text())


def statuses(result: dict) -> dict[str, str]:
    return {f["check"]: f["status"] for f in result["findings"]}


def test_passthrough_passes_and_corrupt_after_tokens_fails_naming_the_first_divergent_token(
        lab_server, gateway, tmp_path: Path) -> None:
    clean = gateway("passthrough")
    rc, result = probe(clean, lab_server.base_url, lab_server.model, tmp_path / "clean")
    assert rc == 0 and statuses(result)["quality.parity"] == "pass", result
    assert statuses(result)["quality.reference"] == "pass"
    # every answer written as collected, both passes of the reference and the path under test
    rows = [json.loads(line) for line in (tmp_path / "clean" / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and {r["streamed"] for r in rows} == {True, False} and all(r["tokens"] for r in rows)

    bad = gateway("corrupt_after_tokens", "--after-tokens", "3")
    rc, result = probe(bad, lab_server.base_url, lab_server.model, tmp_path / "bad")
    parity = next(f for f in result["findings"] if f["check"] == "quality.parity")
    assert rc == 1 and parity["status"] == "fail", parity
    first = parity["observed"]["first_divergence"]
    assert first["first_divergence"] == 3 and first["reference_token"] != first["test_token"]
    assert f"prompt {first['prompt']}" in parity["reason"] and "position 3" in parity["reason"]
    # both wire shapes were corrupted and caught
    assert all(not p["identical"] for p in parity["observed"]["prompts"].values())
