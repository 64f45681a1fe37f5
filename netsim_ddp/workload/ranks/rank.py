"""Rank entry point, started by torchrun on every node:

    python -m netsim_ddp.workload.ranks.rank --spec SPEC.json --out DIR [--profile PROFDIR]

SPEC.json is a `RankSpec` (the WorkloadConfig plus which of its modes to run). The modes run in
sequence in one process group, each from a fresh model and DDP wrapper seeded the same way: one
rendezvous and one torch import for all modes (process start-up is seconds on a 2-core host,
more than a small scenario's measured run), and the modes run back to back under the same
conditions. A harness that wants a fresh process per mode writes one spec per mode.

For each mode, rank 0 gathers every rank's samples and writes DIR/result-MODE.json (results.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.hostfacts.gpus import local_device_index
from netsim_ddp.precision.hooks import SentBytes
from netsim_ddp.precision.modes import Mode, get_mode
from netsim_ddp.scenario.workload import RankSpec, WorkloadConfig
from netsim_ddp.workload.contract.mode_result import (
    REPLAY_DIGEST,
    RankSamples,
    combine,
    exposed_comm,
    write_result,
)
from netsim_ddp.workload.contract.window import NODE_RANK_ENV, measured_window, step_loss_reader
from netsim_ddp.workload.ranks.collective import run_gated_probe, run_probe
from netsim_ddp.workload.ranks.loop import Trainer, measure, param_digest
from netsim_ddp.workload.ranks.models import Batch, build_workload, count_params, make_batches
from netsim_ddp.workload.ranks.replay import ReplayTrainer, build_replay, replay_batches
from netsim_ddp.workload.ranks.timing import BucketTimer, register_timed
from netsim_ddp.workload.ranks.torch_trace import Profiler, trace_path

BATCH_POOL = 8  # distinct synthetic batches per rank, cycled; made before timing starts
LEARNING_RATE = 1e-3


def resolve_backend(requested: str, local_world_size: int) -> str:
    """'auto' -> nccl only with CUDA and one GPU per local rank; else gloo. The harness
    resolves the backend itself (hostfacts.placement) and hands the ranks 'gloo' or 'nccl';
    'auto' is for ranks started some other way."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= local_world_size and dist.is_nccl_available() else "gloo"
    if requested == "nccl" and (gpus == 0 or not dist.is_nccl_available()):
        raise RuntimeError(f"backend 'nccl' needs CUDA GPUs and NCCL; torch {torch.__version__} "
                           f"sees {gpus} GPU(s), NCCL available: {dist.is_nccl_available()}")
    return requested


def _replayed_trainer(config: WorkloadConfig, mode: Mode, dilation: float,
                      counter: SentBytes, timer: BucketTimer
                      ) -> tuple[ReplayTrainer, list[Batch], int]:
    """A replayed model in DDP (its buckets are the gradients' own memory: gradient_as_bucket
    _view; its parameters never change, so no start-up broadcast)."""
    node = int(os.environ.get(NODE_RANK_ENV) or dist.get_rank()
               // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # slow episodes name nodes
    model, clock = build_replay(config, mode, dilation, dist.get_rank(), node)
    ddp = DistributedDataParallel(model, bucket_cap_mb=config.bucket_size / 2**20,
                                  gradient_as_bucket_view=True, init_sync=False)
    register_timed(mode, ddp, counter, timer)
    return ReplayTrainer(ddp, mode, clock), replay_batches(BATCH_POOL), count_params(model)


def run_mode(
    config: WorkloadConfig,
    mode_name: str,
    device: torch.device,
    profile_dir: Path | None,
    dilation: float = 1.0,
) -> tuple[RankSamples, int]:
    """Train and measure one mode on this rank; returns its samples and the model's size."""
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    mode = get_mode(mode_name)
    counter = SentBytes()
    timer = BucketTimer(device)
    trainer: Trainer | ReplayTrainer
    if config.replayed:
        if device.type != "cpu":
            raise RuntimeError("compute replay keeps its model on the CPU (its parameters are "
                               "the zero page): run it on gloo (workload.backend = 'gloo')")
        trainer, batches, params = _replayed_trainer(config, mode, dilation, counter, timer)
        ddp = trainer.ddp
    else:
        workload = build_workload(config.model, config.params, config.seed)
        params = count_params(workload.model)
        batches = [
            (inputs.to(device), targets.to(device))
            for inputs, targets in make_batches(
                workload, config.batch_size, BATCH_POOL, config.seed, rank
            )
        ]
        ddp = DistributedDataParallel(
            workload.model.to(device),
            bucket_cap_mb=config.bucket_size / 2**20,
            device_ids=[device.index] if device.type == "cuda" else None,
            init_sync=not _same_on_every_rank(workload.model),
        )
        register_timed(mode, ddp, counter, timer)  # the mode's hook, its collectives timed
        trainer = Trainer(
            ddp=ddp,
            mode=mode,
            loss_fn=workload.loss_fn,
            optimizer=torch.optim.SGD(ddp.parameters(), lr=LEARNING_RATE, momentum=0.9),
            scaler=mode.grad_scaler(device.type),
            device=device,
        )
    profiler = (
        Profiler(trace_path(profile_dir, rank, mode_name), device, config.iterations)
        if profile_dir is not None
        else None
    )
    link_marks: list[dict[str, float]] = []
    samples = measure(
        trainer,
        batches,
        counter,
        warmup=config.warmup,
        iterations=config.iterations,
        grad_accumulation=config.grad_accumulation,
        barrier=dist.barrier,
        timer=timer,
        step_evidence=step_loss_reader(local_rank),
        around_measured=lambda: measured_window(
            mode_name, local_rank, dist.barrier,
            profiler() if profiler is not None else contextlib.nullcontext(), link_marks),
    )
    rank_samples = RankSamples(
        rank=rank,
        local_rank=local_rank,
        hostname=socket.gethostname(),
        node_rank=int(os.environ[NODE_RANK_ENV]) if os.environ.get(NODE_RANK_ENV) else None,
        iteration_s=samples.iteration_s,
        compute_s=samples.compute_s,
        comm_s=exposed_comm(samples.iteration_s, samples.compute_s),
        sent_bytes=samples.sent_bytes,
        buckets=samples.buckets,
        wire_dtypes=sorted(counter.dtypes),
        loss=samples.loss,
        skipped_steps=samples.skipped_steps,
        # A replayed model's parameters never change (and hashing them would read them all).
        param_digest=REPLAY_DIGEST if config.replayed else param_digest(ddp.module),
        replay_late_s=samples.replay_late_s if config.replayed else None,
        profiler_allreduce_s=profiler.allreduce_s if profiler is not None else None,
        link_marks=link_marks or None,
        started_monotonic=samples.started_monotonic,
        bucket_intervals=samples.bucket_intervals,
        step_tcp_loss=samples.step_tcp_loss or None,
    )
    return rank_samples, params


def _same_on_every_rank(model: torch.nn.Module) -> bool:
    """Whether every rank built the same initial parameters (the models here are seeded alike;
    a user's factory may not be). DDP's start-up broadcast of rank 0's parameters is then
    needless: 67 MB for the default model, 0.6 s per mode on a 1 Gbit/s link, against a
    16-byte digest from each rank. A factory that differs gets the broadcast, as in plain DDP."""
    digests: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, param_digest(model))
    return len(set(digests)) == 1


def run(spec: RankSpec, out_dir: Path, profile_dir: Path | None) -> None:
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = resolve_backend(spec.workload.backend, local_world_size)
    # The harness assigns GPUs across nodes (NETSIM_DDP_GPUS), not cuda:local_rank per node.
    device = (torch.device("cuda", local_device_index(local_rank)) if backend == "nccl"
              else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # gloo binds to GLOO_SOCKET_IFNAME by itself when it is set (the harness sets eth0); NCCL
    # follows the NCCL_* settings the harness gives each node. device_id binds NCCL to this
    # rank's GPU at once (its barriers then use it, and the transport is set up before
    # anything is measured).
    dist.init_process_group(backend, timeout=timedelta(seconds=spec.collective_timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        if spec.allreduce_probe is not None and spec.probe_gated:
            run_gated_probe(spec.allreduce_probe, out_dir, spec.collective_timeout_s)
        elif spec.allreduce_probe is not None:
            run_probe(spec.allreduce_probe, out_dir)
        modes = spec.selected_modes()
        if modes and spec.workload.is_script:  # never train the default model instead
            raise RuntimeError("this workload is a user's script: script_rank runs it, not the "
                               "built-in loop (workload.launcher.script_launch)")
        for index, mode_name in enumerate(modes):
            samples, params = run_mode(spec.workload, mode_name, device, profile_dir,
                                       spec.dilation)
            gathered: list[RankSamples | None] = [None] * dist.get_world_size()
            dist.gather_object(samples, gathered if dist.get_rank() == 0 else None, dst=0)
            if dist.get_rank() == 0:
                config = spec.workload
                result = combine(
                    [g for g in gathered if g is not None],
                    mode=mode_name,
                    model=config.model,
                    params=params,
                    params_requested=config.params,
                    world_size=dist.get_world_size(),
                    local_world_size=local_world_size,
                    backend=backend,
                    device=device.type,
                    socket_ifname=os.environ.get("GLOO_SOCKET_IFNAME"),
                    batch_size=config.batch_size,
                    grad_accumulation=config.grad_accumulation,
                    bucket_size=config.bucket_size,
                    warmup=config.warmup,
                    iterations=config.iterations,
                    profiled=profile_dir is not None,
                    dilation=spec.dilation,
                    compute_source=config.compute_source,
                )
                write_result(out_dir, result)
            if index + 1 < len(modes):  # a full collection takes ~0.2 s: only where one follows
                gc.collect()  # drop this mode's model and DDP buckets before the next
    finally:
        dist.destroy_process_group()


@record  # torchrun then reports this rank's traceback as the root cause
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m netsim_ddp.workload.ranks.rank")
    parser.add_argument("--spec", type=Path, required=True, help="RankSpec JSON file")
    parser.add_argument("--out", type=Path, required=True, help="directory for result-MODE.json")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="PROFDIR",
        help="profile measured iterations; chrome traces go here",
    )
    args = parser.parse_args(argv)
    spec = RankSpec.model_validate_json(args.spec.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    run(spec, args.out, args.profile)


def flush_all() -> None:
    """Flush Python's and C's stdio: what a rank printed reaches its log before os._exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    # C stdio too: NCCL writes its INFO lines (which the harness reads to verify the
    # transport) with fprintf to stdout, a block-buffered file under torchrun, and os._exit
    # would drop what is still buffered.
    ctypes.CDLL(None).fflush(None)


def forked_main(argv: list[str]) -> None:
    """A rank forked from netsim_ddp.workload.ranks.forking_torchrun: torch is imported already.
    The fork's end is os._exit, so no C++ static destructor runs (see below)."""
    main(argv)
    flush_all()


if __name__ == "__main__":
    main()
    # Leave without C++ static destructors: seen here once in ~50 runs, a rank whose results
    # were written and whose process group was destroyed still aborted at interpreter exit
    # ("terminate called without an active exception", SIGABRT), failing a finished run.
    flush_all()
    os._exit(0)
