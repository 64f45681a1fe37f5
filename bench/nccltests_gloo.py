"""Make a calibration file the way a cluster engineer would with nccl-tests, but here: gloo
all-reduces between emulated nodes, written in all_reduce_perf's text format, so the parser
meets the format it reads in the field and the shipped examples are measured, not invented.

    flock /tmp/nsd-heavy.lock python bench/nccltests_gloo.py --nodes 2 --rate 1gbit \
        --out scenarios/calibrations/gloo-2nodes-1gbit.txt

One process per rank in each node's namespace runs every size (in-place float32 sum, 2 warm-up
iterations, then 20, or 8 above 1 MiB); the table prints the median of the slowest rank's time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric
from netsim_ddp.metrics import bus_bandwidth

# Runs in every node's namespace: one process per rank, every size in one process (a torchrun
# per size costs seconds of start-up on this host). Times the slowest rank, as nccl-tests does.
RANK_SCRIPT = """
import json, os, sys, time, torch, torch.distributed as dist
sizes, out = json.loads(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo")
rows = []
for size in sizes:
    buffer = torch.ones(size // 4, dtype=torch.float32)
    iterations = 20 if size <= 2**20 else 8
    seconds = []
    for i in range(2 + iterations):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buffer)
        if i >= 2:
            seconds.append(time.perf_counter() - start)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, seconds)
    rows.append([size, [max(column) for column in zip(*gathered)]])
if dist.get_rank() == 0:
    open(out, "w").write(json.dumps({"world_size": dist.get_world_size(), "rows": rows}))
dist.destroy_process_group()
"""


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
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    wanted = sizes(args.min_bytes, args.max_bytes, args.factor)
    with Fabric(scenario) as fabric, tempfile.TemporaryDirectory() as tmp:
        names = [node.name for node in fabric.nodes]
        out = Path(tmp) / "allreduce.json"
        processes = []
        for rank, node in enumerate(fabric.nodes):
            env = {**os.environ, "MASTER_ADDR": fabric.nodes[0].address, "MASTER_PORT": "29533",
                   "RANK": str(rank), "WORLD_SIZE": str(len(fabric.nodes)),
                   "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
            processes.append(node.popen([sys.executable, "-c", RANK_SCRIPT, json.dumps(wanted),
                                         str(out)], env=env))
        for process in processes:
            if process.wait(timeout=420) != 0:
                raise SystemExit(f"a rank failed (exit {process.returncode})")
        measured = json.loads(out.read_text())
        pids = [process.pid for process in processes]
    rows = [(size, statistics.median(seconds), measured["world_size"])
            for size, seconds in measured["rows"]]
    for size, seconds, _ in rows:
        print(f"{size:>12} B  {seconds * 1e6:10.1f} us", flush=True)
    world = rows[0][2]
    lines = [
        f"# netsim-ddp bench/nccltests_gloo.py, {started}: gloo all-reduce (float32 sum, in "
        f"place) between {args.nodes} emulated nodes on {args.rate} links (tbf), 2-core host.",
        "# Times are the median over iterations of the slowest rank; gloo all-reduces in place, "
        "so both column groups carry the same measurement.",
        f"# nThread 1 nGpus 1 minBytes {args.min_bytes} maxBytes {args.max_bytes} step: "
        f"{args.factor}(factor) warmup iters: 2 iters: 20 agg iters: 1 validation: 0 graph: 0",
        "#",
        "# Using devices",
    ]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {pids[rank]:6d} on {names[rank]:>10s} device  0 "
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
    average = statistics.mean(bus_bandwidth(s, t, w) / 8e9 for s, t, w in rows)
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {average:.5g} ", "#"]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
