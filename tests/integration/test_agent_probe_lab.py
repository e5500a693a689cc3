"""The agent probe straight against the real lab vLLM: every check passes (hermes parser, strict
tool grammar); an image request to this text-only model fails and is attributed, never passed."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from vllm_acceptance.probes.agent import solid_png_base64

REPO = Path(__file__).resolve().parents[2]


def run_agent(server, out: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "agent", "--base-url",
                           server.base_url, "--model", "tiny-agent", "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    return proc.returncode, json.loads((out / "result.json").read_text())


@pytest.mark.lab
def test_every_agent_check_passes_on_the_lab(lab_server, tmp_path: Path) -> None:
    rc, result = run_agent(lab_server, tmp_path)
    statuses = {f["check"]: f["status"] for f in result["findings"]}
    assert rc == 0 and result["status"] == "pass", statuses
    assert statuses["agent.multimodal"] == "not_applicable"  # cpu-lab: agent.images false, said so
    rates = result["details"]["rates"]
    assert rates["schema_accuracy"] == 1.0 and rates["format_error_rate"] == 0.0


@pytest.mark.lab
def test_image_request_to_a_text_model_fails_with_a_layer(lab_server, tmp_path: Path) -> None:
    rc, result = run_agent(lab_server, tmp_path, "--set", "agent.images=true", "--set", "agent.repeats=1")
    mm = next(f for f in result["findings"] if f["check"] == "agent.multimodal")
    assert rc == 1 and mm["status"] == "fail" and mm["layer"] == "model"
    assert mm["evidence"] and (tmp_path / mm["evidence"][0]).is_file()


def test_the_probe_image_is_a_real_png() -> None:
    image = Image.open(io.BytesIO(base64.b64decode(solid_png_base64(8, (1, 2, 3)))))
    assert image.size == (8, 8) and image.getpixel((4, 4)) == (1, 2, 3)
