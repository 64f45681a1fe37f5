"""The result file one mode's run writes (DIR/result-MODE.json), and the arithmetic behind it.

Per iteration, the slowest rank counts: in a synchronous job every rank waits for it. So the
job's iteration time is the max over ranks of each rank's synced step, its compute-only time the
max over ranks of each rank's no_sync step, and the exposed communication is their difference,
clamped at zero (a compute-only step can come out slower than the synced one through noise).

No torch here: the harness reads these files without importing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from netsim_ddp.common.files import write_whole
from netsim_ddp.workload.contract.intervals import union_length

SCHEMA_VERSION = 1
REPLAY_DIGEST = "replay"  # a replayed model's parameters are never written: nothing to hash


def result_path(out_dir: Path | str, mode: str) -> Path:
    return Path(out_dir) / f"result-{mode}.json"


def exposed_comm(iteration_s: Sequence[float], compute_s: Sequence[float]) -> list[float]:
    """comm = max(iteration - compute, 0), element-wise."""
    if len(iteration_s) != len(compute_s):
        raise ValueError(f"{len(iteration_s)} iteration samples but {len(compute_s)} compute")
    return [max(it - comp, 0.0) for it, comp in zip(iteration_s, compute_s, strict=True)]


def slowest(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Max over ranks for each iteration (per_rank[r][i] -> out[i])."""
    lengths = {len(samples) for samples in per_rank}
    if len(lengths) != 1:
        raise ValueError(f"ranks recorded different numbers of iterations: {sorted(lengths)}")
    return [max(column) for column in zip(*per_rank, strict=True)]


class RankSamples(BaseModel):
    """One rank's raw measurements for one mode, one entry per measured iteration."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    local_rank: int
    hostname: str
    node_rank: int | None = Field(
        default=None, description="The scenario's node this rank ran on (the harness says so "
        "in NETSIM_DDP_NODE_RANK); None in results written before it was recorded.")
    iteration_s: list[float] = Field(description="Wall time of the synced optimizer step.")
    compute_s: list[float] = Field(description="The same step under no_sync(), rolled back.")
    comm_s: list[float] = Field(description="max(iteration_s - compute_s, 0) on this rank.")
    sent_bytes: list[int] = Field(description="Bytes handed to all-reduce by the comm hook.")
    buckets: list[int] = Field(description="All-reduce calls (buckets) per synced step.")
    wire_dtypes: list[str] = Field(description="Dtypes the comm hook sent.")
    loss: list[float] = Field(description="Mean loss over the synced step's micro-batches.")
    skipped_steps: int = Field(description="Synced steps GradScaler skipped (inf/nan grads).")
    param_digest: str = Field(
        description="Hash of the parameters after the run: DDP keeps every rank's model "
        "identical, so any difference between ranks means a broken step."
    )
    profiler_allreduce_s: list[float] | None = Field(
        default=None,
        description="Summed duration of the profiler's all-reduce events inside each synced "
        "step (None unless profiled).",
    )
    link_marks: list[dict[str, float]] | None = Field(
        default=None,
        description="In an emulated node, local rank 0's link counters at the start and end "
        "of the measured window (monotonic_s, sent_bytes, sent_packets), with the node's TCP "
        "counters as tcp.NAME (fabric.tcp_counters).",
    )
    started_monotonic: list[float] | None = Field(
        default=None, description="When each synced step started (CLOCK_MONOTONIC, seconds).")
    bucket_intervals: list[list[tuple[float, float]]] | None = Field(
        default=None,
        description="Per synced step, each bucket's (hand-off to the collective, completion of "
        "its future), seconds from the step's start, in bucket order.",
    )

    replay_late_s: list[float] | None = Field(
        default=None,
        description="Compute replay: per synced step, how late (host seconds) this rank "
        "released its latest gradient against the replay's schedule.")
    step_tcp_loss: list[dict[str, int]] | None = Field(
        default=None,
        description="A node's local rank 0: per measured step, the node's TCP loss counters "
        "(RetransSegs, TCPTimeouts, TCPSpuriousRTOs, TCPLossProbes) that grew during it, by "
        "how much (empty: none grew); the evidence measure.attribution names.")

    @property
    def collective_s(self) -> list[float] | None:
        """Per step, the time during which at least one of its collectives was in flight."""
        if self.bucket_intervals is None:
            return None
        return [union_length(step) for step in self.bucket_intervals]

    @property
    def ready_monotonic(self) -> list[float] | None:
        """Per step, when this rank handed its last bucket over (its backward was done)."""
        if self.bucket_intervals is None or self.started_monotonic is None:
            return None
        return [start + max((handoff for handoff, _ in step), default=0.0)
                for start, step in zip(self.started_monotonic, self.bucket_intervals,
                                       strict=True)]


class Straggler(BaseModel):
    """The rank that made the others wait in one iteration: its last bucket reached the
    collective `wait_s` after the first rank's did (absolute times, so a rank that left the
    barrier late is not mistaken for one that computed slowly)."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    wait_s: float


def stragglers(ranks: Sequence[RankSamples]) -> list[Straggler] | None:
    ready = [r.ready_monotonic for r in ranks]
    if not ranks or any(times is None for times in ready):
        return None
    columns = zip(*[times for times in ready if times is not None], strict=True)
    result = []
    for column in columns:
        last = max(range(len(column)), key=column.__getitem__)
        result.append(Straggler(rank=ranks[last].rank, wait_s=column[last] - min(column)))
    return result


def bucket_maxima(ranks: Sequence[RankSamples]) -> list[list[float]] | None:
    """Per iteration, per bucket, the longest any rank saw."""
    if not ranks or any(r.bucket_intervals is None for r in ranks):
        return None
    per_rank = [[[end - start for start, end in step] for step in r.bucket_intervals or []]
                for r in ranks]
    return [[max(column) for column in zip(*steps, strict=True)]
            for steps in zip(*per_rank, strict=True)]


class ScriptFacts(BaseModel):
    """What a script's ranks learn of its framework and its replay: each rank records them
    (contract.steps.ScriptRankRecord), the run's result carries them (ScriptRun)."""

    model_config = ConfigDict(extra="forbid")

    framework_adjusted: list[str] = Field(
        default_factory=list, description="Device-dependent framework paths made to take the "
        "target's (GPU) branch on these CPU ranks (workload.framework_paths).")
    framework_differs: list[str] = Field(
        default_factory=list, description="Device-dependent framework paths that took the CPU "
        "branch where the target's GPUs would not: the run's framework check fails.")
    replay_compute_s: float | None = Field(
        default=None, description="A scale model's replayed compute: the target's forward + "
        "backward + optimizer per step (fp32 schedule, no noise), target seconds.")


class ScriptRun(ScriptFacts):
    """How a user's script ran (a ModeResult of a script's variant carries it)."""

    command: list[str]
    variant_args: list[str] = Field(default_factory=list)
    variant_env: dict[str, str] = Field(default_factory=dict)
    steps: str = Field(description="What ended a step: 'optimizer' or 'marker'.")
    ddp_models: int = Field(description="DDP models the script built (max over ranks).")
    comm_hooks: list[str] = Field(default_factory=list,
                                  description="The script's own DDP comm hooks.")
    optimizers: list[str] = Field(default_factory=list)
    step_wire_bytes: list[int] | None = Field(
        default=None,
        description="Per measured step, what every node's link sent between its local rank "
        "0's step boundaries (read without a barrier; background included), summed.")


class ModeResult(BaseModel):
    """What one mode cost on the network: rank 0 writes it after gathering every rank."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    mode: str
    model: str
    params: int = Field(description="Trainable parameters of the model actually built.")
    params_requested: int
    world_size: int
    local_world_size: int
    backend: str
    device: str
    socket_ifname: str | None
    batch_size: int
    grad_accumulation: int
    bucket_size: int
    warmup: int
    iterations: int
    profiled: bool
    iteration_s: list[float] = Field(description="Per iteration, the slowest rank's step.")
    compute_s: list[float] = Field(description="Per iteration, the slowest compute-only step.")
    comm_s: list[float] = Field(description="max(iteration_s - compute_s, 0) per iteration.")
    sent_bytes_per_iteration: int = Field(
        description="Gradient bytes one rank hands to all-reduce per optimizer step (max over "
        "ranks and iterations; DDP sends the same on every rank)."
    )
    profiler_allreduce_s: list[float] | None = Field(
        default=None, description="Per iteration, max over ranks of profiler all-reduce time."
    )
    collective_s: list[float] | None = Field(
        default=None,
        description="Per iteration, max over ranks of the time at least one gradient "
        "collective was in flight (the union of the bucket intervals).",
    )
    bucket_s: list[list[float]] | None = Field(
        default=None,
        description="Per iteration, each bucket's collective time (hand-off to completion), "
        "max over ranks, in bucket order.",
    )
    stragglers: list[Straggler] | None = Field(
        default=None, description="Per iteration, the rank whose backward finished last.")
    started_monotonic: list[float] | None = Field(
        default=None, description="Per iteration, when the first rank started its step.")
    script: ScriptRun | None = Field(
        default=None, description="A user's script's run (compute_s and comm_s are then "
        "empty: a script has no compute-only step to measure).")
    dilation: float = Field(
        default=1.0, description="Time dilation k of the run. The ranks write host time; "
        "measure.target_time.to_target_time divides every duration by k (then in_target_time).")
    in_target_time: bool = Field(
        default=False, description="Durations here have been divided by `dilation`.")
    compute_source: str = Field(
        default="real", description="'real' (the ranks computed) or 'replay' / 'replay "
        "(profile)' (compute replayed: see workload.ranks.replay).")
    host_s: dict[str, list[float]] | None = Field(
        default=None, description="A dilated run's durations as the host measured them "
        "(iteration_s, compute_s, comm_s, collective_s), before dividing by k.")
    ranks: list[RankSamples]

    @property
    def has_compute(self) -> bool:
        """Whether compute-only steps were measured (the built-in loop; never a script)."""
        return bool(self.compute_s)


def combine(ranks: Sequence[RankSamples], **meta: object) -> ModeResult:
    """Fold every rank's samples into the job's view (see the module docstring)."""
    ordered = sorted(ranks, key=lambda r: r.rank)
    iteration_s = slowest([r.iteration_s for r in ordered])
    # A script's ranks measure no compute-only step: no compute, so no exposed comm either.
    compute_s = (slowest([r.compute_s for r in ordered])
                 if any(r.compute_s for r in ordered) else [])
    profiled = [r.profiler_allreduce_s for r in ordered]
    collective = [r.collective_s for r in ordered]
    starts = [r.started_monotonic for r in ordered]
    return ModeResult(
        collective_s=(slowest([c for c in collective if c is not None])
                      if all(c is not None for c in collective) else None),
        bucket_s=bucket_maxima(ordered),
        stragglers=stragglers(ordered),
        started_monotonic=([min(column) for column in
                            zip(*[s for s in starts if s is not None], strict=True)]
                           if all(s is not None for s in starts) else None),
        iteration_s=iteration_s,
        compute_s=compute_s,
        comm_s=exposed_comm(iteration_s, compute_s) if compute_s else [],
        sent_bytes_per_iteration=max(max(r.sent_bytes) for r in ordered),
        profiler_allreduce_s=(
            slowest([p for p in profiled if p is not None])
            if all(p is not None for p in profiled)
            else None
        ),
        ranks=list(ordered),
        **meta,  # type: ignore[arg-type]
    )


def read_result(path: Path | str) -> ModeResult:
    return ModeResult.model_validate_json(Path(path).read_text())


def write_result(out_dir: Path | str, result: ModeResult) -> Path:
    """Write atomically (tmp + rename) so a reader never sees half a file."""
    return write_whole(result_path(out_dir, result.mode), result.model_dump_json(indent=1))
