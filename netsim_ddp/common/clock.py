"""The job's clock: CLOCK_MONOTONIC, shifted onto node 0's on a multi-host run.

Timestamps from different nodes are compared (a mode's measured window against the background
flows' byte series, one rank's backward against another's for the straggler view). On one host
every namespace shares CLOCK_MONOTONIC; across hosts each counts from its own boot, so every
`netsim-ddp host` agent measures its offset to node 0's clock over the job's store and hands it
to what it starts in NETSIM_DDP_CLOCK_OFFSET. Intervals (durations) keep using time.monotonic().
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import cache

CLOCK_OFFSET_ENV = "NETSIM_DDP_CLOCK_OFFSET"


@cache
def _offset() -> float:
    return float(os.environ.get(CLOCK_OFFSET_ENV) or 0.0)


def job_clock() -> float:
    """Now on the job's clock (node 0's CLOCK_MONOTONIC; this host's on one host)."""
    return time.monotonic() + _offset()


def estimate_offset(exchange: Callable[[], float], rounds: int = 8,
                    clock: Callable[[], float] = time.monotonic) -> tuple[float, float]:
    """(offset to add to `clock` to get the reference clock, its error bound), as NTP does:
    `exchange()` asks the reference for its clock and returns its answer; the round trip with
    the shortest delay bounds the error by half that delay."""
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        sent = clock()
        theirs = exchange()
        received = clock()
        sample = (theirs - (sent + received) / 2, (received - sent) / 2)
        if best is None or sample[1] < best[1]:
            best = sample
    assert best is not None, "rounds must be >= 1"
    return best

