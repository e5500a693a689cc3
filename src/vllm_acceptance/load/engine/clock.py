"""The engine's clock: epoch seconds read from the monotonic clock plus one fixed offset.

Intervals never jump with NTP. Worker processes adopt the parent's offset
(:func:`vllm_acceptance.load.engine.multiprocess._child` sets :data:`_EPOCH_OFFSET` here), so
every module reads it as ``clock._EPOCH_OFFSET`` (never a copy taken at import).
"""

from __future__ import annotations

import time

# perf_counter is CLOCK_MONOTONIC on Linux (system-wide), so one offset maps it onto the epoch in
# every process; worker processes adopt the parent's offset so their times are comparable.
_EPOCH_OFFSET = time.time() - time.perf_counter()


def now() -> float:
    """Epoch seconds from the monotonic clock (immune to wall-clock steps during a run)."""
    return _EPOCH_OFFSET + time.perf_counter()
