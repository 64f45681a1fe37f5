"""A bare all-reduce benchmark across the emulated nodes: the workload's traffic, without the
model. It tells whether this host can move an all-reduce at the emulated link's rate (if not,
a run would measure the CPU, not the network) and what bus bandwidth the gradient all-reduce
reaches (nccl-tests' definition: algbw x 2(n-1)/n).

It all-reduces every dtype the modes' comm hooks send (workload.modes: each mode's wire dtype),
the same number of elements each: gloo sums 16-bit floats on the CPU element by element, so a
host that moves a float32 all-reduce at the link's rate may move the float16 one of the same
gradients no faster, and amp-fp16 would then measure the CPU, not the link.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from netsim_ddp.common.files import write_whole
from netsim_ddp.hostfacts.hostload import CpuLoad, CpuTimes
from netsim_ddp.precision.modes import WireDtype
from netsim_ddp.scenario.workload import AllreduceProbe

RESULT_FILE = "allreduce.json"
# The probe inside the training launch (RankSpec.probe_gated): after each attempt the ranks wait
# for the harness's verdict on it, a file in the attempt's folder: train, or probe again. A
# refusal needs no word: the harness ends the launch.
VERDICT_FILE = "verdict"
TRAIN, AGAIN = "train", "again"
VERDICT_POLL_S = 0.01


class AllreduceResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dtype: WireDtype = "float32"
    size_bytes: int
    world_size: int
    seconds: list[float] = Field(description="Per iteration, the slowest rank's all-reduce.")
    host_load: dict[str, float] | None = Field(
        None, description="The host's CPU use over the timed iterations (hostload.CpuLoad).")
    at_job_size: bool = Field(False, description="One of AllreduceProbe.job_sizes, not the "
                              "fidelity probe's own size.")


def run_probe(probe: AllreduceProbe, out_dir: Path) -> None:
    """Rank side: time the all-reduces of each dtype, gather to rank 0, which writes the
    results file (one AllreduceResult per dtype, then one per job size)."""
    import torch
    import torch.distributed as dist

    # Under NCCL the buffers live on this rank's GPU and each all-reduce is timed to its end
    # on the device (NCCL calls return once the work is queued).
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    def finished() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    def timed(dtype: str, elements: int, at_job_size: bool = False) -> AllreduceResult:
        buffer = torch.ones(elements, dtype=getattr(torch, dtype), device=device)
        seconds = []
        cpu_before = None
        for iteration in range(probe.warmup + probe.iterations):
            dist.barrier()
            if iteration == probe.warmup:
                cpu_before = CpuTimes.read()
            finished()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            finished()
            if iteration >= probe.warmup:
                seconds.append(time.perf_counter() - start)
        load = CpuLoad.between(cpu_before, CpuTimes.read())
        gathered: list[list[float] | None] = [None] * dist.get_world_size()
        dist.gather_object(seconds, gathered if dist.get_rank() == 0 else None, dst=0)
        ranks = [g for g in gathered if g is not None]
        return AllreduceResult(
            dtype=dtype, size_bytes=buffer.numel() * buffer.element_size(),
            world_size=dist.get_world_size(),
            seconds=[max(column) for column in zip(*ranks, strict=True)],
            host_load=load.as_dict() if load else None, at_job_size=at_job_size)

    results = [timed(dtype, probe.size_bytes // 4) for dtype in probe.dtypes]
    results += [timed("float32", size // 4, at_job_size=True) for size in probe.job_sizes]
    if dist.get_rank() == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_whole(out_dir / RESULT_FILE, _RESULTS.dump_json(results))  # the harness polls


def attempt_dir(out_dir: Path | str, attempt: int) -> Path:
    """Where attempt `attempt` of a gated probe writes its results and gets its verdict."""
    return Path(out_dir) / f"probe{attempt}"


def give_verdict(folder: Path, verdict: str) -> None:
    """Harness side: tell the ranks waiting after this attempt to probe again or to train (in
    one step: rank 0 never reads half a word)."""
    write_whole(folder / VERDICT_FILE, verdict)


def run_gated_probe(probe: AllreduceProbe, out_dir: Path, timeout_s: float) -> None:
    """Rank side of the probe inside the training launch: attempt after attempt until the
    harness says train (it ends the launch instead when the host cannot drive the links)."""
    attempt = 0
    while True:
        folder = attempt_dir(out_dir, attempt)
        run_probe(probe, folder)
        if await_verdict(folder / VERDICT_FILE, timeout_s) == TRAIN:
            return
        attempt += 1


def await_verdict(path: Path, timeout_s: float) -> str:
    """Rank 0 waits for the harness's verdict file and hands it to every rank."""
    import torch.distributed as dist

    verdict: list[str | None] = [None]
    if dist.get_rank() == 0:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no verdict on the all-reduce probe in {path} within "
                                   f"{timeout_s:g} s: is the harness that launched this alive?")
            time.sleep(VERDICT_POLL_S)
        verdict[0] = path.read_text().strip()
        if verdict[0] not in (TRAIN, AGAIN):
            raise RuntimeError(f"{path}: {verdict[0]!r} is no verdict ({TRAIN} or {AGAIN})")
    dist.broadcast_object_list(verdict, src=0)
    return str(verdict[0])


_RESULTS = TypeAdapter(list[AllreduceResult])


def read_probe(out_dir: Path | str) -> list[AllreduceResult]:
    return _RESULTS.validate_json((Path(out_dir) / RESULT_FILE).read_bytes())


def busbw_samples(result: AllreduceResult) -> Sequence[float]:
    """Bus bandwidth of each iteration, bits/s."""
    from netsim_ddp.common.metrics import bus_bandwidth

    return [bus_bandwidth(result.size_bytes, s, result.world_size) for s in result.seconds]
