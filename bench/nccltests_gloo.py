"""Make a calibration file the way a cluster engineer would with nccl-tests, but here: gloo
all-reduces between emulated nodes, written in all_reduce_perf's text format, so the parser
meets the format it reads in the field and the shipped examples are measured, not invented.

    flock /tmp/nsd-heavy.lock python bench/nccltests_gloo.py --nodes 2 --rate 1gbit \
        --out scenarios/calibrations/gloo-2nodes-1gbit.txt

Each size is one launch of the harness's all-reduce probe (torchrun in every node's namespace,
in-place float32 sum, the slowest rank's time per iteration); the table prints the median.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric
from netsim_ddp.metrics import bus_bandwidth
from netsim_ddp.workload.collective import AllreduceProbe, read_probe
from netsim_ddp.workload.config import RankSpec
from netsim_ddp.workload.launch import launch


def sizes(low: int, high: int, factor: int) -> list[int]:
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= factor
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=64 * 2**20)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    scenario = Scenario.from_dict({
        "name": "calibrate", "topology": {"nodes": args.nodes}, "link": {"rate": args.rate},
        "workload": {"params": "1M", "iterations": 1, "warmup": 0, "modes": ["fp32"]}})
    assert scenario.workload is not None
    rows = []
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    with Fabric(scenario) as fabric, tempfile.TemporaryDirectory() as tmp:
        names = [node.name for node in fabric.nodes]
        for size in sizes(args.min_bytes, args.max_bytes, args.factor):
            iterations = 20 if size <= 2**20 else 8
            probe = AllreduceProbe(size_bytes=size, iterations=iterations, warmup=2)
            spec = RankSpec(workload=scenario.workload, modes=[], allreduce_probe=probe)
            out = Path(tmp) / str(size)
            launch(fabric.nodes, spec, out, 300)
            (result,) = read_probe(out)
            seconds = statistics.median(result.seconds)
            rows.append((size, seconds, result.world_size))
            print(f"{size:>12} B  {seconds * 1e6:10.1f} us", flush=True)
    world = rows[0][2]
    lines = [
        f"# netsim-ddp bench/nccltests_gloo.py, {started}: gloo all-reduce (float32 sum, in "
        f"place) between {args.nodes} emulated nodes on {args.rate} links (tbf), 2-core host.",
        "# Times are the median over iterations of the slowest rank; gloo all-reduces in place, "
        "so both column groups carry the same measurement. Pids are not recorded (0).",
        f"# nThread 1 nGpus 1 minBytes {args.min_bytes} maxBytes {args.max_bytes} step: "
        f"{args.factor}(factor) warmup iters: 2 iters: 20 agg iters: 1 validation: 0 graph: 0",
        "#",
        "# Using devices",
    ]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {0:6d} on {names[rank]:>10s} device  0 "
              f"[0000:00:00] CPU (gloo over emulated {args.rate})" for rank in range(world)]
    lines += [
        "#",
        "#                                                              out-of-place"
        "                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)      "
        "      (us)  (GB/s)  (GB/s)       ",
    ]
    for size, seconds, world_size in rows:
        algbw = size / seconds / 1e9
        busbw = bus_bandwidth(size, seconds, world_size) / 8e9
        body = f"  {seconds * 1e6:7.1f}  {algbw:6.2f}  {busbw:6.2f}  {0:6d}"
        lines.append(f"{size:12d}  {size // 4:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}"
                     + body + body)
    lines += ["# Out of bounds values : 0 OK",
              f"# Avg bus bandwidth    : {statistics.mean(bus_bandwidth(s, t, w) / 8e9 for s, t, w in rows):.5g} ",
              "#"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
