"""A thread that samples counters while the ranks train: every `every_s` of host time for
the block, into (CLOCK_MONOTONIC s, value) series by name. Each sampler opens its own netlink
sockets in the thread (the fabric's are the main thread's) and keeps what it read when a
namespace goes away under it, saying why in `error`."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

SAMPLE_S = 0.05  # host seconds between rounds: at a scale model's k, SAMPLE_S / k of the target's


class SamplingThread(contextlib.AbstractContextManager):
    thread_name = "netsim-ddp-sampler"

    def __init__(self, every_s: float = SAMPLE_S):
        self.every_s = every_s
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self.error: str | None = None  # why sampling stopped early, if it did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    @property
    def active(self) -> bool:
        """Whether there is anything to sample (else the thread never starts)."""
        return True

    def opened(self) -> contextlib.AbstractContextManager[Any]:
        """The sockets a sampling round reads, opened in the thread."""
        raise NotImplementedError

    def sample(self, sockets: Any, now: float) -> None:
        """One round: read the counters through `sockets`, add them to `samples`."""
        raise NotImplementedError

    def __enter__(self) -> SamplingThread:
        if self.active:
            self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            with self.opened() as sockets:
                while True:
                    self.sample(sockets, time.monotonic())
                    if self._stop.wait(self.every_s):
                        return
        except Exception as exc:  # a namespace went away under us: keep what was read
            self.error = f"{type(exc).__name__}: {exc}"


__all__ = ["SAMPLE_S", "SamplingThread"]
