"""Benchmark: what the harness's hooks cost a user's script per step.

Two gloo ranks on loopback (no emulated network: the hooks' own cost, not the link's) train the
same DDP model in one process group, in blocks that rotate between plain (DDP's built-in C++
all-reduce, no hooks), python (torch's Python allreduce_hook, nothing else) and hooked
(script_rank's DdpProbe: that hook with its timing and byte count, the optimizer post-step hook
and the StepRecorder, with a link counter read at every step as node leaders do). Prints each
side's median step, their ratios, and the time of one link-counter read (a netlink qdisc dump
on `lo`, read-only). Target: hooked steps within 1.05 x plain ones for a step of tens of
milliseconds.

    python bench/script_hooks.py [--steps 40] [--blocks 6] [--width 1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

from netsim_ddp.fabric.counters.own_link import LinkCounter
from netsim_ddp.workload.contract import steps
from netsim_ddp.workload.ranks import script_rank


def train(model: nn.Module, optimizer: torch.optim.Optimizer, count: int, width: int,
          after_step) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        model(torch.randn(8, width)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        after_step()
        times.append(time.perf_counter() - start)
    return times


def rank_main(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(4)])

    plain = nn.parallel.DistributedDataParallel(model())
    plain_opt = torch.optim.SGD(plain.parameters(), lr=1e-3)
    # torch's own Python all-reduce hook, untimed: the part of the cost the hook's language is
    python = nn.parallel.DistributedDataParallel(model())
    python.register_comm_hook(None, allreduce_hook)
    python_opt = torch.optim.SGD(python.parameters(), lr=1e-3)
    # The hooks, installed as script_rank installs them (DDP wrapped before the model is made).
    probe = script_rank.DdpProbe()
    script_rank.install_ddp_probe(probe)
    spec = steps.ScriptSpec(run="bench", warmup=1, iterations=10**9, steps="optimizer",
                            after_measured="finish", out=out, barrier_timeout_s=60)
    counter = LinkCounter("lo")
    recorder = steps.StepRecorder(
        spec=spec, record=steps.ScriptRankRecord(rank=rank, local_rank=0, hostname="h",
                                                 boundaries=0),
        edges=steps.Edges(barrier=lambda name: None, read_link=counter.read,
                          signal=lambda edge: None),
        collectives=probe)
    hooked = nn.parallel.DistributedDataParallel(model())
    hooked_opt = torch.optim.SGD(hooked.parameters(), lr=1e-3)
    active = {"on": False}

    def post_hook(optimizer, *_):
        if active["on"] and optimizer is hooked_opt:
            recorder.optimizer_stepped(optimizer)

    register_optimizer_step_post_hook(post_hook)
    sides = {"plain": (plain, plain_opt), "python": (python, python_opt),
             "hooked": (hooked, hooked_opt)}
    results: dict[str, list[float]] = {side: [] for side in sides}
    for ddp, opt in sides.values():  # warm every side up
        train(ddp, opt, 3, args.width, lambda: None)
    for block in range(args.blocks):
        order = list(sides)[block % 3:] + list(sides)[:block % 3]  # rotate: same conditions
        for side in order:
            dist.barrier()
            active["on"] = side == "hooked"
            ddp, opt = sides[side]
            results[side] += train(ddp, opt, args.steps, args.width, lambda: None)
    reads = []
    for _ in range(200):
        start = time.perf_counter()
        counter.read()
        reads.append(time.perf_counter() - start)
    if rank == 0:
        Path(out, "result").write_text(repr({**results, "read": reads}))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()
    from netsim_ddp.workload.launcher.launch import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(args, free_port(), out), nprocs=2)
        results = eval(Path(out, "result").read_text())  # our own repr, written above
    plain, python, hooked = (statistics.median(results[k]) for k in ("plain", "python",
                                                                      "hooked"))
    table = Table(title=f"per-step cost of the harness's hooks (2 gloo ranks on loopback, "
                        f"4 x {args.width}-wide linear layers, {args.blocks} blocks of "
                        f"{args.steps} steps each side)")
    for column in ("plain step ms", "python hook ms", "hooked step ms", "python / plain",
                   "hooked / python", "hooked / plain", "link read ms"):
        table.add_column(column, justify="right")
    table.add_row(f"{plain * 1e3:.2f}", f"{python * 1e3:.2f}", f"{hooked * 1e3:.2f}",
                  f"{python / plain:.3f}", f"{hooked / python:.3f}", f"{hooked / plain:.3f}",
                  f"{statistics.median(results['read']) * 1e3:.3f}")
    Console().print(table)


if __name__ == "__main__":
    main()
