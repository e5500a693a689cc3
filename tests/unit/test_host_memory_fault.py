"""The rehearsal's host-memory fault (issue 42 item 4): container_standin.py's `host_memory_leak_mib_per_request=N`
starts the lab API server with a thread in its own process that keeps N MiB of resident memory per request the
server completed, read from the server's own /metrics. Here the api_server module is a small stand-in HTTP server
(its /metrics counts completed requests as vLLM names them), so that what is tested is the fault's thread: the
process's RSS rises with the completed requests, and the server's argv carries the fault only when it is armed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src" / "vllm_acceptance" / "lab"))
import container_standin as standin  # noqa: E402 - the stand-in runs as a script on the nodes

FAKE_SERVER = '''
import http.server, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
started = time.time()
class Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        done = int((time.time() - started) * 10)          # ten completed requests a second
        body = ('vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} %d.0\\n' % done).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Metrics).serve_forever()
'''


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_the_armed_fault_leaks_resident_memory_per_completed_request(tmp_path: Path) -> None:
    package = tmp_path / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (tmp_path / "vllm", tmp_path / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_SERVER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", standin.LEAKY_API_SERVER, "4", "--model", "m", "--port", str(port)],
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 60
        first = None
        while time.monotonic() < deadline and proc.poll() is None:
            now = rss_kib(proc.pid)
            first = now if first is None else first
            if now - first > 40 * 1024:         # ten requests' worth of 4 MiB kept resident
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the server died"
        assert rss_kib(proc.pid) - first > 40 * 1024
    finally:
        proc.kill()
        proc.wait()


def test_the_server_argv_carries_the_fault_only_when_armed(tmp_path: Path) -> None:
    node = standin.Node({"state": str(tmp_path / "state"), "recorded": "/bin/false", "lab-python": "/lab/python"})
    box = node.box("vllm-acceptance")
    box.mkdir(parents=True)
    (box / "args.json").write_text(json.dumps(["tiny-agent", "--port", "8000"]))
    (box / "mounts.json").write_text(json.dumps({}))
    assert standin.server_argv(node, box)[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    (node.state / "fault").write_text("host_memory_leak_mib_per_request=4\n")
    assert standin.server_argv(node, box)[1:4] == ["-c", standin.LEAKY_API_SERVER, "4"]
    assert standin.fault(node) is None                   # not an OOM/crash fault
    (node.state / "fault").write_text("oom_at_running=2\n")
    assert standin.host_leak(node) is None and standin.fault(node) == ("oom", 2)
