"""A probe that breaks inside (here: a profile value its code cannot use) is a `missing` stage with the
traceback kept as evidence -- exit 3, never a pass, and no traceback on the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


class ModelsOnly(BaseHTTPRequestHandler):
    """Answers /v1/models like a server that is up; the probe breaks before sending anything else."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def up() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ModelsOnly)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("kind", "bad"), [("agent", "agent.repeats=many"), ("cache", "cache.sessions=many")])
def test_a_probe_that_breaks_is_a_missing_stage_with_its_traceback_kept(up: str, tmp_path: Path, kind: str,
                                                                        bad: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "vllm_acceptance.cli", "probe", kind, "--base-url", up,
                           "--model", "m", "--out", str(tmp_path), "--set", bad],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "inconclusive"
    (finding,) = result["findings"]
    assert finding["check"] == f"{kind}.probe" and finding["status"] == "missing"
    assert "ValueError" in finding["reason"] and finding["evidence"] == ["probe-error.txt"]
    assert "Traceback" in (tmp_path / "probe-error.txt").read_text()
