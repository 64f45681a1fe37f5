"""What `[link] busbw_from` asks of a scenario's links: the job's all-reduce sizes (DDP's
buckets) and, once planned (projection.busbw_links), the bus bandwidth the user's nccl-tests
file measured at each and the rate and latency the links get for it. Pure data: the fit is the
projection's, the check (fidelity:busbw) the verdicts'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netsim_ddp.precision.modes import BYTES_PER_ELEMENT, get_mode
from netsim_ddp.scenario.layouts import GENERIC_LAYERS, generic_layout, named_layout
from netsim_ddp.scenario.workload import GENERIC_LAYOUT

FIELD = "link.busbw_from"
FIRST_BUCKET_BYTES = 2**20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
TOLERANCE = 0.05  # the probe's bus bandwidth at each size against the file's
LATENCY_NEGLIGIBLE = 0.01  # of the smallest size's bus time: below it, no delay is added
SAME_SIZE = 0.02  # sizes this close are one size to the probe
TRIM_GOAL = TOLERANCE / 2  # a probe pass this close ends the search for the delay
TRIM_PASSES = 4  # at most: each is a probe launch on freshly built links
MAX_STEP = 8.0  # the most one pass moves the delay, either way


def ddp_bucket_bytes(param_counts: Sequence[int], bucket_bytes: int,
                     element_bytes: int = 4) -> list[int]:
    """DDP's buckets for parameters of these element counts (registration order), as torch
    assigns them (reducer.cpp compute_bucket_assignment_by_size): in registration order, a
    bucket closed once it holds its limit, the first's 1 MiB (the first-defined parameters,
    whose gradients come last), then bucket_bytes; a tensor is never split. Listed in the
    order DDP all-reduces them (reversed)."""
    buckets, current = [], 0
    limit = FIRST_BUCKET_BYTES
    for count in param_counts:
        current += count * element_bytes
        if current >= limit:
            buckets.append(current)
            current, limit = 0, bucket_bytes
    if current:
        buckets.append(current)
    return buckets[::-1]


def _param_counts(workload) -> tuple[list[int], str]:
    """The job's parameter tensors (element counts, registration order) and where they came
    from: a replay's layout exactly, otherwise `params` in equal layers (a script's or a
    built-in model's tensors are only known inside a rank)."""
    if workload.layout not in (None, GENERIC_LAYOUT):
        layout = named_layout(workload.layout)
        how = f"layout {layout.name}"
    else:
        layout = generic_layout(workload.params)
        how = f"params {workload.params:,} in {GENERIC_LAYERS} equal layers"
    return [math.prod(shape) for layer in layout.layers for shape in layer.shapes], how


def job_sizes(workload) -> tuple[list[int], str]:
    """Every distinct message size the job's DDP all-reduces (its buckets, in each wire dtype
    its modes send), largest first, sizes within SAME_SIZE of a larger one merged."""
    counts, how = _param_counts(workload)
    bucket = workload.bucket_size if not workload.is_script else None
    float32 = ddp_bucket_bytes(counts, bucket or 25 * 2**20)
    dtypes = (["float32"] if workload.is_script
              else {get_mode(mode).wire_dtype for mode in workload.modes})
    sizes = sorted({size * BYTES_PER_ELEMENT[dtype] // 4 for size in float32 for dtype in dtypes},
                   reverse=True)
    merged: list[int] = []
    for size in sizes:
        if not merged or size < merged[-1] * (1 - SAME_SIZE):
            merged.append(size)
    if workload.is_script:
        how += "; a script's own bucket_cap_mb is not known: DDP's default 25 MiB"
    return merged, how


@dataclass(frozen=True)
class Trim:
    """The probe passes that chose the links' delay (target units): the delay each tried and
    the worst error of its bus bandwidth against the file's at the job's sizes. The first is
    the plan's latency / W; a real TCP path's latency grows faster than its delay (measured
    here, 4 gloo nodes at x40: 50 / 100 / 200 / 400 us of delay gave 30 / 272 / 950 / 2722 us
    of bus-time latency, where a ring's W x delay is 200 / 400 / 800 / 1600), so the passes
    search for the delay that delivers it."""

    passes: tuple[tuple[float, float], ...]  # (delay_s, worst relative error), in order
    first_delay_s: float

    def as_dict(self) -> dict[str, Any]:
        return {"first_delay_s": self.first_delay_s,
                "passes": [{"delay_s": d, "worst_error": e} for d, e in self.passes]}


@dataclass(frozen=True)
class TargetBusbw:
    """What `[link] busbw_from` asks of the links, and how they were set to deliver it."""

    file: str
    sha256: str
    file_world_size: int
    file_hosts: int
    world_size: int
    sizes: tuple[int, ...]  # bytes, largest first
    busbw_bps: tuple[float, ...]  # the file's bus bandwidth at each size, bits/s
    sizes_from: str
    latency_s: float  # the fitted line's bus-time intercept (0 when negligible)
    bandwidth_bps: float  # its bandwidth: the goodput the links are given
    rate_bps: float  # the link rate that carries it (target units)
    delay_s: float  # the one-way delay that adds the latency (target units)
    line_rate_bps: float  # the scenario's own link rate, for comparison
    trim: Trim | None = None  # set once a probe pass on the first plan's links corrected it

    def target_at(self, size: int) -> float:
        return self.busbw_bps[self.sizes.index(size)]

    @property
    def summary(self) -> str:
        """One line for tables and logs."""
        delay = f", delay {self.delay_s * 1e6:.0f} us" if self.delay_s else ""
        if self.trim is not None:
            delay += f" (chosen in {len(self.trim.passes)} probe passes)"
        low, high = min(self.busbw_bps), max(self.busbw_bps)
        return (f"bus bandwidth from {Path(self.file).name} ({self.file_world_size} GPUs on "
                f"{self.file_hosts} hosts): {low / 1e9:.2f}-{high / 1e9:.2f} Gbit/s at the job's "
                f"{len(self.sizes)} bucket sizes; links at {self.rate_bps / 1e9:.2f} Gbit/s"
                f"{delay} instead of {self.line_rate_bps / 1e9:.2f}")

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "sha256": self.sha256,
                "file_world_size": self.file_world_size, "file_hosts": self.file_hosts,
                "world_size": self.world_size, "sizes_from": self.sizes_from,
                "sizes": [{"size_bytes": s, "busbw_bps": b}
                          for s, b in zip(self.sizes, self.busbw_bps, strict=True)],
                "latency_s": self.latency_s, "bandwidth_bps": self.bandwidth_bps,
                "rate_bps": self.rate_bps, "delay_s": self.delay_s,
                "line_rate_bps": self.line_rate_bps, "tolerance": TOLERANCE,
                "trim": self.trim.as_dict() if self.trim is not None else None}


