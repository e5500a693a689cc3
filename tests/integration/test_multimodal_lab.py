"""agent.multimodal on a real server that takes images: real vLLM (CPU) serving the tiny Idefics3-style
lab model (`lab/build_vlm.py`, profile cpu-lab-vision). The image must reach the model: the request with
the probe's picture counts exactly the picture's 7 tokens more than the same request without it (vLLM's
own `prompt_tokens_details.multimodal_tokens` agrees); through a gateway that strips image parts the
counts are equal and the check fails on the gateway's layer.

Only the multimodal check is asserted: the vision model's text weights are random, so it calls no tools
(the tool-calling checks are the cpu-lab profile's; the probe runs them on few turns here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import REPO, LabServer, _skip_or_fail, lab_skip_reason, start_lab, stop_lab

pytestmark = pytest.mark.lab

LAB_MODEL_VLM = REPO / ".lab" / "models" / "tiny-vlm"
LAB_PROFILE_VISION = REPO / "profiles" / "cpu-lab-vision.yml"
IMAGE_TOKENS = 7  # profiles/cpu-lab-vision.yml agent.image_tokens; lab/build_vlm.py IMAGE_PROMPT_TOKENS
FEW_TURNS = ("--set", "agent.turn_budget=8")


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """The vision lab server, for this module only (~1 min to start, ~3 GB)."""
    reason = lab_skip_reason(LAB_MODEL_VLM)
    if reason:
        _skip_or_fail(reason.replace("no lab model", "no vision lab model"))
    port = int(os.environ.get("LAB_TEST_PORT_VISION", "8034")) + int(os.environ.get("LAB_PORT_OFFSET", "0"))
    server = start_lab(tmp_path_factory.mktemp("lab-vision"), port=port, profile=LAB_PROFILE_VISION)
    yield server
    stop_lab(server)


def probe(base_url: str, out: Path, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", "agent", "--base-url", base_url,
                           "--model", "tiny-agent", "--profile", str(LAB_PROFILE_VISION), "--out", str(out),
                           *FEW_TURNS, *extra], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert (out / "result.json").is_file(), proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    return next(f for f in result["findings"] if f["check"] == "agent.multimodal")


def test_the_image_reaches_the_vision_model(vision_server: LabServer, tmp_path: Path) -> None:
    mm = probe(vision_server.base_url, tmp_path)
    seen = mm["observed"]
    assert mm["status"] == "pass", mm
    assert seen["prompt_tokens_with_image"] - seen["prompt_tokens_without"] == seen["image_tokens"] == IMAGE_TOKENS
    # The server's own account agrees: the added tokens are the image's.
    assert seen["server_multimodal_tokens"] == {"image": IMAGE_TOKENS}
    with_image, without = (json.loads((tmp_path / ev).read_text())["response"] for ev in mm["evidence"])
    assert with_image["usage"]["prompt_tokens"] == seen["prompt_tokens_with_image"]
    assert without["usage"]["prompt_tokens_details"]["multimodal_tokens"] is None


@pytest.fixture
def stripping_gateway(vision_server: LabServer) -> Iterator[str]:
    port = int(os.environ.get("LAB_TEST_PORT_VISION_GATEWAY", "8035")) + int(os.environ.get("LAB_PORT_OFFSET", "0"))
    proc = subprocess.Popen([sys.executable, "-m", "vllm_acceptance.lab.gateway", "--upstream", vision_server.base_url,
                             "--port", str(port), "--mode", "strip_images"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"gateway exited: {proc.stdout.read() if proc.stdout else ''}"
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"gateway did not answer on {url} within 30 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_gateway_that_strips_the_image_fails_multimodal(vision_server: LabServer, stripping_gateway: str,
                                                          tmp_path: Path) -> None:
    mm = probe(stripping_gateway, tmp_path, "--direct-url", vision_server.base_url)
    seen = mm["observed"]
    assert mm["status"] == "fail" and mm["layer"] == "gateway", mm
    # Answered (HTTP 200), but the model saw the text alone.
    assert seen["status"] == 200 and seen["prompt_tokens_with_image"] == seen["prompt_tokens_without"]
    assert seen["image_tokens"] == 0 and seen["server_multimodal_tokens"] is None
    assert "never reached the model" in mm["reason"]
