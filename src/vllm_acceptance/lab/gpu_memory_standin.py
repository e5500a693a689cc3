"""`nvidia-smi` for rehearsal nodes: the recorded outputs, plus a per-GPU memory stream.

`nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader,nounits -lms N` (what the
gpu_memory_sampler role runs) prints one line per GPU every N ms, in nvidia-smi's own format
(``2026/12/01 16:20:30.123, 0, 150000``), until killed. STATE/memory_mode chooses the stream:

- `flat` (default): every GPU holds its weights, constant;
- `rising`: GPU 0 grows with the work the node's server has done since the stream started (200 MiB per
  completed request, read from the server's own /metrics: a server reused from an earlier run starts low
  again), the leak a soak must catch; the other GPUs stay flat.

Anything else is answered by the node's recorded nvidia-smi (tests/fixtures/generated-nodes/<case>/bin).

    nvidia_smi.py --state DIR --recorded PATH [--] NVIDIA-SMI-ARGS...
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

from container_standin import metric, options  # type: ignore[import-not-found]  # run as a script

FLAT_MIB = 150_000
RISING_BASE_MIB = 20_000
RISING_PER_REQUEST_MIB = 200
TOTAL_MIB = 284_208
GPUS = 8


def served_port(state: Path) -> str | None:
    for box in sorted((state / "containers").glob("*")) if (state / "containers").is_dir() else []:
        try:
            serve = json.loads((box / "args.json").read_text())
        except (OSError, ValueError):
            continue
        if "--port" in serve:
            return str(serve[serve.index("--port") + 1])
    return None


def stream(state: Path, interval_ms: int) -> int:
    mode_file = state / "memory_mode"
    gpus = int((state / "gpus").read_text()) if (state / "gpus").is_file() else GPUS   # a 4-GPU tray writes 4
    first_done: float | None = None
    while True:
        mode = mode_file.read_text().strip() if mode_file.is_file() else "flat"
        rising = FLAT_MIB
        if mode == "rising":
            port = served_port(state)
            done = (metric(port, "vllm:request_success_total") if port else None) or 0.0
            first_done = done if first_done is None or done < first_done else first_done   # a restart resets it
            rising = min(TOTAL_MIB, RISING_BASE_MIB + RISING_PER_REQUEST_MIB * int(done - first_done))
        now = dt.datetime.now(dt.UTC).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        lines = [f"{now}, {i}, {rising if i == 0 else FLAT_MIB}" for i in range(gpus)]
        try:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            return 0
        time.sleep(interval_ms / 1000)


def main(argv: list[str]) -> int:
    opts, args = options(argv)
    if "-lms" in args:
        return stream(Path(opts["state"]), int(args[args.index("-lms") + 1]))
    return subprocess.call([opts["recorded"], *args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
