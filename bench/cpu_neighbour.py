"""A bursty CPU neighbour: a process busy `busy_ms` of every `period_ms` on one core, as a CI
runner's other tenants are (a build, a test suite, a second job). Used by the false-alarm bench
and for trying the project's own CI beside one.

    python bench/cpu_neighbour.py [--busy-ms 30] [--period-ms 100] [--core 1] [--seconds S]

It stops by itself after --seconds (default: never), on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def burn(busy_s: float, period_s: float, seconds: float | None) -> None:
    """Busy-loop `busy_s` at the start of every `period_s`, sleep the rest; until `seconds`."""
    end = None if seconds is None else time.monotonic() + seconds
    while end is None or time.monotonic() < end:
        start = time.monotonic()
        while time.monotonic() - start < busy_s:
            pass
        time.sleep(max(0.0, period_s - (time.monotonic() - start)))


@contextlib.contextmanager
def cpu_neighbour(busy_ms: float = 30, period_ms: float = 100, core: int = 1) -> Iterator[None]:
    """The neighbour as a child process for the `with` block's duration (killed after it)."""
    process = subprocess.Popen([sys.executable, str(Path(__file__)), "--busy-ms", str(busy_ms),
                                "--period-ms", str(period_ms), "--core", str(core)])
    try:
        yield
    finally:
        process.terminate()
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-ms", type=float, default=30)
    parser.add_argument("--period-ms", type=float, default=100)
    parser.add_argument("--core", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=None)
    args = parser.parse_args()
    if args.core < os.cpu_count():
        os.sched_setaffinity(0, {args.core})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        burn(args.busy_ms / 1e3, args.period_ms / 1e3, args.seconds)


if __name__ == "__main__":
    main()
