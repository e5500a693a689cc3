"""The serving process as it runs (serve/live.py): a real process listening on a port, found with the real
`ss -ltnp`, its argv and environment read from the real /proc, secrets redacted, compared with a plan."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from vllm_acceptance.core.redact import REDACTED
from vllm_acceptance.serve.live import (
    LiveError,
    compare_launch,
    listeners_on,
    parse_ss_listeners,
    read_live_process,
)

SERVE = ("import socket, sys, time\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
         "print(s.getsockname()[1], flush=True)\n"
         "time.sleep(120)\n")


@pytest.fixture
def serving() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A real process listening on a port, started as a server is: argv with flags, an environment with a
    communication variable and two secrets."""
    env = {**os.environ, "NCCL_IB_HCA": "mlx5_0,mlx5_1", "HF_TOKEN": "hf_livesecret123456", "VLLM_API_KEY": "sk-x9"}
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "--all2all-backend", "deepep_low_latency",
                             "--api-key", "sk-livekey-987", "--max-num-seqs", "8"],
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    try:
        yield proc, port
    finally:
        proc.kill()
        proc.wait()


def test_the_process_listening_on_the_port_is_read_as_it_runs_secrets_redacted(serving) -> None:
    proc, port = serving
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = listeners_on(ss, port)
    assert [x.pid for x in found] == [proc.pid] and found[0].process and found[0].address == "127.0.0.1"
    live = read_live_process(proc.pid)
    assert "--all2all-backend" in live.argv and "sk-livekey-987" not in live.argv and REDACTED in live.argv
    assert live.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert live.env["HF_TOKEN"] == REDACTED and live.env["VLLM_API_KEY"] == REDACTED
    assert "hf_livesecret123456" not in repr(live.to_dict())

    same = compare_launch(live, ["--all2all-backend", "deepep_low_latency"], {"NCCL_IB_HCA": "mlx5_0,mlx5_1"})
    assert same["matches"] and same["args_extra"]["--max-num-seqs"] == "8"
    other = compare_launch(live, ["--all2all-backend", "pplx"], {"NCCL_IB_HCA": "mlx5_2", "NCCL_DEBUG": "INFO"})
    assert not other["matches"]
    assert other["args_differ"] == {"--all2all-backend": {"planned": "pplx", "live": "deepep_low_latency"}}
    assert set(other["env_differ"]) == {"NCCL_IB_HCA", "NCCL_DEBUG"}


def test_a_port_nobody_listens_on_and_a_gone_process_are_no_evidence(serving) -> None:
    proc, _ = serving
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    ss = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    assert listeners_on(ss, free) == []
    assert parse_ss_listeners("State Recv-Q Send-Q Local Address:Port Peer Address:Port Process\n") == []
    proc.kill()
    proc.wait()
    with pytest.raises(LiveError):
        read_live_process(proc.pid)
