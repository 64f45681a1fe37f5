"""Make a calibration file the way a cluster engineer would with nccl-tests, but here: gloo
collectives between emulated nodes, written in nccl-tests' text format (all_reduce_perf,
reduce_scatter_perf, all_gather_perf), so the parser meets the format it reads in the field and
the shipped examples are measured, not invented.

    flock /tmp/nsd-heavy.lock python bench/nccltests_gloo.py --nodes 2 --rate 1gbit \
        --out scenarios/calibrations/gloo-2nodes-1gbit.txt
    # one "server" of 2 ranks: the intra-node level (loopback inside a namespace stands in
    # for NVLink), all three collectives a hierarchical projection can use
    flock /tmp/nsd-heavy.lock python bench/nccltests_gloo.py --nodes 1 --ranks-per-node 2 \
        --collectives all_reduce,reduce_scatter,all_gather \
        --out scenarios/calibrations/gloo-1node-2ranks.txt

One process per rank in each node's namespace runs every size (float32 sum, 2 warm-up
iterations, then 20, or 8 above 1 MiB); the table prints the median of the slowest rank's time.
Sizes are nccl-tests': the whole buffer (reduce_scatter's input, all_gather's output).
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
from netsim_ddp.projection.calibrate import bus_factor

# Runs in every node's namespace: one process per rank, every size in one process (a torchrun
# per size costs seconds of start-up on this host). Times the slowest rank, as nccl-tests does.
RANK_SCRIPT = """
import json, os, sys, time, torch, torch.distributed as dist
sizes, collective, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo")
n = dist.get_world_size()
rows = []
for size in sizes:
    whole = torch.ones(size // 4, dtype=torch.float32)  # nccl-tests' size: the whole buffer
    share = torch.ones(size // 4 // n, dtype=torch.float32)
    call = {"all_reduce": lambda: dist.all_reduce(whole),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(share, whole),
            "all_gather": lambda: dist.all_gather_into_tensor(whole, share)}[collective]
    iterations = 20 if size <= 2**20 else 8
    seconds = []
    for i in range(2 + iterations):
        dist.barrier()
        start = time.perf_counter()
        call()
        if i >= 2:
            seconds.append(time.perf_counter() - start)
    gathered = [None] * n
    dist.all_gather_object(gathered, seconds)
    rows.append([size, [max(column) for column in zip(*gathered)]])
if dist.get_rank() == 0:
    open(out, "w").write(json.dumps({"world_size": n, "rows": rows}))
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
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--min-bytes", type=int, default=8)
    parser.add_argument("--max-bytes", type=int, default=64 * 2**20)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--collectives", default="all_reduce",
                        help="comma-separated: all_reduce, reduce_scatter, all_gather")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    collectives = args.collectives.split(",")
    unknown = set(collectives) - set(COLLECTIVES)
    if unknown:
        raise SystemExit(f"--collectives: unknown {sorted(unknown)}; choose from {COLLECTIVES}")
    scenario = Scenario.from_dict({
        "name": "calibrate", "link": {"rate": args.rate},
        "topology": {"nodes": args.nodes, "ranks_per_node": args.ranks_per_node},
        "workload": {"params": "1M", "iterations": 1, "warmup": 0, "modes": ["fp32"]}})
    world = args.nodes * args.ranks_per_node
    # nccl-tests rounds each size down to a whole number of elements per rank, so do we.
    wanted = sorted({size - size % (4 * world)
                     for size in sizes(args.min_bytes, args.max_bytes, args.factor)} - {0})
    lines: list[str] = []
    with Fabric(scenario) as fabric:
        for collective in collectives:
            started = time.strftime("%Y-%m-%d %H:%M:%S")
            rows, hosts, pids = measure(fabric, args.ranks_per_node, collective, wanted)
            lines += table(args, collective, started, rows, hosts, pids)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")


def measure(fabric: Fabric, ranks_per_node: int, collective: str,
            wanted: list[int]) -> tuple[list[tuple[int, float]], list[str], list[int]]:
    """(size, median seconds) per size, the host of each rank, the pid of each rank."""
    world = len(fabric.nodes) * ranks_per_node
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        processes, hosts = [], []
        for rank in range(world):
            node = fabric.nodes[rank // ranks_per_node]
            env = {**os.environ, "MASTER_ADDR": fabric.nodes[0].address,
                   "MASTER_PORT": "29533", "RANK": str(rank), "WORLD_SIZE": str(world),
                   "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
            processes.append(node.popen([sys.executable, "-c", RANK_SCRIPT, json.dumps(wanted),
                                         collective, str(out)], env=env))
            hosts.append(node.name)
        for process in processes:
            if process.wait(timeout=420) != 0:
                raise SystemExit(f"a rank failed (exit {process.returncode})")
        measured = json.loads(out.read_text())
    rows = [(size, statistics.median(seconds)) for size, seconds in measured["rows"]]
    for size, seconds in rows:
        print(f"{collective:>14} {size:>12} B  {seconds * 1e6:10.1f} us", flush=True)
    return rows, hosts, [process.pid for process in processes]


def table(args: argparse.Namespace, collective: str, started: str,
          rows: list[tuple[int, float]], hosts: list[str], pids: list[int]) -> list[str]:
    """One run in nccl-tests' text format (v2.19+: the collective line, Group, root, #wrong)."""
    world = len(hosts)
    factor = bus_factor(collective, world)  # nccl-tests' busbw / algbw
    where = (f"{args.nodes} emulated nodes on {args.rate} links (tbf)" if args.nodes > 1
             else "one emulated node (loopback inside its namespace, unshaped)")
    lines = [
        f"# netsim-ddp bench/nccltests_gloo.py, {started}: gloo {collective} (float32 sum) "
        f"between {world} ranks, {args.ranks_per_node} per node, {where}, 2-core host.",
        "# Times are the median over iterations of the slowest rank; gloo's collective is timed "
        "once, so both column groups carry the same measurement.",
        f"# Collective test starting: {collective}_perf",
        f"# nThread 1 nGpus 1 minBytes {args.min_bytes} maxBytes {args.max_bytes} step: "
        f"{args.factor}(factor) warmup iters: 2 iters: 20 agg iters: 1 validation: 0 graph: 0",
        "#",
        "# Using devices",
    ]
    lines += [f"#  Rank {rank:2d} Group  0 Pid {pids[rank]:6d} on {hosts[rank]:>10s} device "
              f"{rank % args.ranks_per_node:2d} [0000:00:00] CPU (gloo)" for rank in range(world)]
    lines += [
        "#",
        "#                                                              out-of-place"
        "                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)      "
        "      (us)  (GB/s)  (GB/s)       ",
    ]
    busbws = []
    for size, seconds in rows:
        algbw = size / seconds / 1e9
        busbws.append(algbw * factor)
        count = size // 4 if collective == "all_reduce" else size // 4 // world
        # Nothing is validated (validation: 0): nccl-tests prints N/A as #wrong then, not 0.
        body = f"  {seconds * 1e6:7.1f}  {algbw:6.2f}  {algbw * factor:6.2f}  {'N/A':>6s}"
        lines.append(f"{size:12d}  {count:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}"
                     + body + body)
    lines += ["# Out of bounds values : N/A (validation: 0, no result was checked)",
              f"# Avg bus bandwidth    : {statistics.mean(busbws):.5g} ", "#"]
    return lines


if __name__ == "__main__":
    main()
