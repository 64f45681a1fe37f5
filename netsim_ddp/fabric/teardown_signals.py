"""The harness's own OS signals while it holds kernel objects: turned into exceptions while a
fabric or a shaped NIC lives (so teardown runs), and held back while teardown runs (so a second
Ctrl-C cannot cut it short)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Teardown runs to its end: a second Ctrl-C (or SIGTERM, SIGHUP) meanwhile is held back
    and raised once everything is removed, instead of cutting teardown short.

    By swapping the handlers, not by masking the signals: a mask holds them for this thread
    only, and the kernel hands a process-directed signal to any thread that does not block it
    (OpenBLAS's workers, which numpy starts on import), whose Python handler then runs here
    at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def defer(signum, _frame):
        received.append(signum)

    previous = {sig: signal.signal(sig, defer)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is defer:  # else teardown restored its own (signals_raise)
                signal.signal(sig, handler)
    if received:
        if received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + received[0])


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into exceptions while the fabric lives, so teardown runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
