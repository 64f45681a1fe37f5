"""nccl-tests all_reduce_perf output for a cluster whose all-reduce follows a known line, for
tests of what reads such files: bus time S / busbw = latency + S / bandwidth."""

from __future__ import annotations

from collections.abc import Sequence


def all_reduce_perf(world_size: int, hosts: int, latency_s: float, bandwidth_bps: float,
                    sizes: Sequence[int]) -> str:
    """The text all_reduce_perf prints for `world_size` GPUs on `hosts` hosts whose bus time
    is latency_s + S x 8 / bandwidth_bps (bits/s)."""
    factor = 2 * (world_size - 1) / world_size
    per_host = world_size // hosts
    lines = ["# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 "
             "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {1000 + rank:6d} on {f'node{rank // per_host}':>10} "
              f"device {rank % per_host:2d} [0000:00:00] NVIDIA H100 80GB HBM3"
              for rank in range(world_size)]
    lines += ["#", "#                                                              out-of-place"
              "                       in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
              "          (us)  (GB/s)  (GB/s)       "]
    for size in sizes:
        bus_s = latency_s + size * 8 / bandwidth_bps
        time_us = bus_s * factor * 1e6
        algbw = size / (time_us * 1e-6) / 1e9
        busbw = algbw * factor
        cells = f"{time_us:8.1f} {algbw:7.2f} {busbw:7.2f}      0"
        lines.append(f"{size:12d} {size // 4:13d}     float     sum      -1 {cells} {cells}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.0 ", "#"]
    return "\n".join(lines) + "\n"
