"""Direct timing of the gradient collectives: when each bucket was handed to the all-reduce and
when its future completed, per synced step.

The comm hook a mode registers is wrapped (outermost, so any compression and decompression
around the all-reduce is inside the interval): the wrapper stamps the hand-off, and a
`future.then` callback stamps the completion. On CPU (gloo) the stamps are
`time.perf_counter()` readings; the callback runs on gloo's thread as soon as the work is done.
Under NCCL a future completes when the work is *enqueued*, so a wall-clock stamp would be too
early: the wrapper records CUDA events instead (the callback runs on a stream that waits for
the all-reduce), and the times are read after the step's device sync.

`collective_s` is the union of a step's bucket intervals: the time during which at least one
gradient collective was in flight.

No `from __future__ import annotations` here: DDP checks hook annotations at registration and
rejects string annotations.
"""

import threading
import time
from typing import Any, cast

import torch
from torch.distributed import GradBucket  # type: ignore[attr-defined]  # missing from stubs
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.precision.hooks import Hook
from netsim_ddp.workload.contract.intervals import Interval


class BucketTimer:
    """Per synced step: (hand-off, completion) of every bucket, seconds from the step's start."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._lock = threading.Lock()
        self._origin = 0.0
        self._origin_event: Any = None
        self._open: dict[int, Any] = {}  # bucket index -> start stamp (float or CUDA event)
        self._done: list[tuple[int, Any, Any]] = []

    def start_step(self) -> None:
        """Call right before the step: every stamp is relative to this moment."""
        with self._lock:
            self._open.clear()
            self._done.clear()
        self._origin = time.perf_counter()
        if self.cuda:
            self._origin_event = self._event()

    def intervals(self) -> list[Interval]:
        """The finished step's bucket intervals, ordered by bucket index. Call after the step
        (and, under CUDA, after the device sync); a bucket that never completed is an error."""
        with self._lock:
            if self._open:
                raise RuntimeError(f"buckets {sorted(self._open)} were handed to the "
                                   "collective but their futures never completed")
            done = sorted(self._done, key=lambda item: item[0])
        if not self.cuda:
            return [(start - self._origin, end - self._origin) for _, start, end in done]
        origin = self._origin_event
        return [(origin.elapsed_time(start) / 1e3, origin.elapsed_time(end) / 1e3)
                for _, start, end in done]

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _stamp(self) -> Any:
        return self._event() if self.cuda else time.perf_counter()

    def wrap(self, hook: Hook) -> Hook:
        """`hook`, timed from the call to its future's completion."""

        def timed_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
            index = bucket.index()
            with self._lock:
                self._open[index] = self._stamp()

            def completed(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
                end = self._stamp()
                with self._lock:
                    start = self._open.pop(index)
                    self._done.append((index, start, end))
                return fut.value()

            timed: torch.futures.Future[torch.Tensor] = hook(state, bucket).then(completed)
            return timed

        return timed_hook


class _TimedRegistrar:
    """Stands in for the DDP model while a mode registers its hook, wrapping that hook."""

    def __init__(self, ddp: DistributedDataParallel, timer: BucketTimer) -> None:
        self._ddp = ddp
        self._timer = timer

    def register_comm_hook(self, state: object, hook: Hook) -> None:
        self._ddp.register_comm_hook(state, self._timer.wrap(hook))


def register_timed(mode: Any, ddp: DistributedDataParallel, counter: Any,
                   timer: BucketTimer) -> None:
    """`mode.register_comm_hook(ddp, counter)`, with the registered hook timed by `timer`."""
    mode.register_comm_hook(cast(DistributedDataParallel, _TimedRegistrar(ddp, timer)), counter)
