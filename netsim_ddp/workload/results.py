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

SCHEMA_VERSION = 1


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
        "of the measured window (monotonic_s, sent_bytes, sent_packets).",
    )


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
    ranks: list[RankSamples]


def combine(ranks: Sequence[RankSamples], **meta: object) -> ModeResult:
    """Fold every rank's samples into the job's view (see the module docstring)."""
    ordered = sorted(ranks, key=lambda r: r.rank)
    iteration_s = slowest([r.iteration_s for r in ordered])
    compute_s = slowest([r.compute_s for r in ordered])
    profiled = [r.profiler_allreduce_s for r in ordered]
    return ModeResult(
        iteration_s=iteration_s,
        compute_s=compute_s,
        comm_s=exposed_comm(iteration_s, compute_s),
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
    path = result_path(out_dir, result.mode)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(result.model_dump_json(indent=1))
    tmp.replace(path)
    return path
