"""torch.profiler around the measured iterations: a chrome trace per rank, and how long the
profiler saw all-reduces run inside each synced step (a cross-check on the exposed comm time).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from netsim_ddp.workload.ranks.loop import SYNC_SPAN


def trace_path(profile_dir: Path | str, rank: int, mode: str) -> Path:
    return Path(profile_dir) / f"trace-rank{rank}-{mode}.json"


def is_allreduce(name: str) -> bool:
    """Backend-level all-reduce events, e.g. gloo's 'gloo:all_reduce', NCCL's 'nccl:all_reduce'.

    'c10d::allreduce_' is left out: on gloo it only enqueues the work on the calling thread
    (microseconds), and counting both would count the same transfer twice.
    """
    lowered = name.lower()
    return ("all_reduce" in lowered or "allreduce" in lowered) and not lowered.startswith("c10d::")


def allreduce_seconds(events: Iterable[Any], iterations: int) -> list[float]:
    """Per measured synced step: summed duration of the all-reduce events that start in it."""
    spans: dict[int, tuple[float, float]] = {}
    reduces: list[tuple[float, float]] = []
    for event in events:
        start, end = event.time_range.start, event.time_range.end  # microseconds
        if event.name.startswith(SYNC_SPAN + "."):
            spans[int(event.name.rsplit(".", 1)[1])] = (start, end)
        elif is_allreduce(event.name):
            reduces.append((start, end))
    totals = [0.0] * iterations
    for index, (span_start, span_end) in spans.items():
        # Clipped to the step: the backend thread can close its event after the step has
        # already resumed (it is descheduled, or cleans up), which is not time the step waited.
        totals[index] = sum(
            (min(end, span_end) - start) * 1e-6
            for start, end in reduces
            if span_start <= start < span_end
        )
    return totals


class Profiler:
    """Context for `measure(around_measured=...)`; after it, `allreduce_s` and the trace exist."""

    def __init__(self, trace: Path, device: torch.device, iterations: int) -> None:
        self.trace = trace
        self.iterations = iterations
        self.activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(ProfilerActivity.CUDA)
        self.allreduce_s: list[float] | None = None

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with profile(activities=self.activities) as prof:
            yield
        prof.export_chrome_trace(str(self.trace))
        self.allreduce_s = allreduce_seconds(prof.events(), self.iterations)
