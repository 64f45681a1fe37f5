"""A bare all-reduce benchmark across the emulated nodes: the workload's traffic, without the
model. It tells whether this host can move an all-reduce at the emulated link's rate (if not,
a run would measure the CPU, not the network) and what bus bandwidth the gradient all-reduce
reaches (nccl-tests' definition: algbw x 2(n-1)/n).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from netsim_ddp.hostload import CpuLoad, CpuTimes

RESULT_FILE = "allreduce.json"


class AllreduceProbe(BaseModel):
    """Asked for in a RankSpec: all-reduce `size_bytes` of float32, `iterations` times."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size_bytes: int = Field(gt=0)
    iterations: int = Field(5, gt=0)
    warmup: int = Field(1, ge=0)


class AllreduceResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size_bytes: int
    world_size: int
    seconds: list[float] = Field(description="Per iteration, the slowest rank's all-reduce.")
    host_load: dict[str, float] | None = Field(
        None, description="The host's CPU use over the timed iterations (hostload.CpuLoad).")


def run_probe(probe: AllreduceProbe, out_dir: Path) -> None:
    """Rank side: time the all-reduces, gather to rank 0, which writes the result file."""
    import torch
    import torch.distributed as dist

    buffer = torch.ones(probe.size_bytes // 4, dtype=torch.float32)
    seconds = []
    cpu_before = None
    for iteration in range(probe.warmup + probe.iterations):
        dist.barrier()
        if iteration == probe.warmup:
            cpu_before = CpuTimes.read()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        if iteration >= probe.warmup:
            seconds.append(time.perf_counter() - start)
    load = CpuLoad.between(cpu_before, CpuTimes.read())
    gathered: list[list[float] | None] = [None] * dist.get_world_size()
    dist.gather_object(seconds, gathered if dist.get_rank() == 0 else None, dst=0)
    if dist.get_rank() == 0:
        ranks = [g for g in gathered if g is not None]
        slowest = [max(column) for column in zip(*ranks, strict=True)]
        result = AllreduceResult(size_bytes=buffer.numel() * 4,
                                 world_size=dist.get_world_size(), seconds=slowest,
                                 host_load=load.as_dict() if load else None)
        (out_dir / RESULT_FILE).write_text(result.model_dump_json())


def read_probe(out_dir: Path | str) -> AllreduceResult:
    return AllreduceResult.model_validate(json.loads((Path(out_dir) / RESULT_FILE).read_text()))


def busbw_samples(result: AllreduceResult) -> Sequence[float]:
    """Bus bandwidth of each iteration, bits/s."""
    from netsim_ddp.metrics import bus_bandwidth

    return [bus_bandwidth(result.size_bytes, s, result.world_size) for s in result.seconds]
