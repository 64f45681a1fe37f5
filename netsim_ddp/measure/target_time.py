"""From the dilated world's clock to the target's: every duration of a mode's result divided
by the dilation k (scenario.dilation), with the host's own figures kept beside them.

Absolute clock readings (when each step started, the link counters' marks) stay on the host's
clock: they place the measured window against the background flows and the link schedule,
which ran on that clock too. Byte counts are not times and do not change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples, Straggler

if TYPE_CHECKING:
    from netsim_ddp.measure.mode_report import ModeReport


def _scaled(series: list[float] | None, k: float) -> list[float] | None:
    return None if series is None else [value / k for value in series]


def _rank(rank: RankSamples, k: float) -> RankSamples:
    return rank.model_copy(update={
        "iteration_s": _scaled(rank.iteration_s, k),
        "compute_s": _scaled(rank.compute_s, k),
        "comm_s": _scaled(rank.comm_s, k),
        "profiler_allreduce_s": _scaled(rank.profiler_allreduce_s, k),
        "replay_late_s": _scaled(rank.replay_late_s, k),
        "bucket_intervals": (None if rank.bucket_intervals is None else
                             [[(start / k, end / k) for start, end in step]
                              for step in rank.bucket_intervals]),
    })


def to_target_time(result: ModeResult, k: float) -> ModeResult:
    """`result` (host time, as the ranks wrote it) in the target's time. Idempotent: a result
    already in target time is returned as it is."""
    if result.in_target_time:
        return result
    if result.dilation != k:
        raise ValueError(f"mode {result.mode}: the ranks ran at dilation {result.dilation:g}, "
                         f"the run at {k:g}")
    host = {name: list(series) for name in ("iteration_s", "compute_s", "comm_s",
                                              "collective_s")
            if (series := getattr(result, name)) is not None}
    return result.model_copy(update={
        "iteration_s": _scaled(result.iteration_s, k),
        "compute_s": _scaled(result.compute_s, k),
        "comm_s": _scaled(result.comm_s, k),
        "collective_s": _scaled(result.collective_s, k),
        "profiler_allreduce_s": _scaled(result.profiler_allreduce_s, k),
        "bucket_s": (None if result.bucket_s is None else
                     [[value / k for value in step] for step in result.bucket_s]),
        "stragglers": (None if result.stragglers is None else
                       [Straggler(rank=s.rank, wait_s=s.wait_s / k) for s in result.stragglers]),
        "ranks": [_rank(rank, k) for rank in result.ranks],
        "host_s": host if k != 1 else None,
        "in_target_time": True,
    })


def replay_late_s(result: ModeResult) -> list[float] | None:
    """Per iteration, the latest any rank released a gradient against the replay's schedule
    (None: compute was not replayed)."""
    series = [rank.replay_late_s for rank in result.ranks]
    if not series or any(s is None for s in series):
        return None
    return [max(column) for column in zip(*[s for s in series if s is not None], strict=True)]


def replayed_compute_s(mode: ModeReport) -> float | None:
    """The replayed compute a mode's lateness is judged against (target seconds): the
    built-in loop's compute-only median, or a script's scheduled step (None: not replayed)."""
    if mode.compute is not None:
        return mode.compute.median
    script = mode.result.script
    return script.replay_compute_s if script is not None else None


def notice(dilation: float, compute_source: str, machines: int = 1) -> str | None:
    """The one line every table and document of a scale-model run carries (None: a plain
    run, real time and real compute, on one machine)."""
    if dilation == 1 and compute_source == "real" and machines == 1:
        return None
    parts = []
    if machines != 1:
        parts.append(f"spread over {machines} machines (their switches joined by VXLAN)")
    if dilation != 1:
        parts.append(f"time-dilated x{dilation:g} (links ran at rate/{dilation:g}; times are "
                     "the target's, host times / k)")
    if compute_source != "real":
        parts.append(f"compute {compute_source}ed: ranks did not compute, gradients released "
                     "on the target's schedule" if compute_source == "replay" else
                     f"compute {compute_source}: gradients released on the profiled schedule")
    return "scale model: " + "; ".join(parts)


REAL_TIME = "real time, real compute"


def emulation_label(dilation: float, compute_source: str) -> str:
    """What kind of run made a series' numbers: they compare only with the same kind
    (baselines and history keep them apart)."""
    if dilation == 1 and compute_source == "real":
        return REAL_TIME
    return f"dilation x{dilation:g}, compute {compute_source}"
