"""Benchmark: build and remove N shaped nodes, netsim-ddp vs the same topology by `ip`/`tc`.

The shell version is what Mininet-style tools do: one `ip`/`tc` command per step. Both build
the same thing (a switch namespace with a bridge, a namespace per node, a veth per node with the
peer moved in, an address, tbf on both ends) and remove it, side by side in one run, rounds
interleaved so both see the same machine. Target: netsim-ddp at most half the shell's time.

    python bench/fabric_build.py [--rounds 7] [--nodes 2 8] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from rich.console import Console
from rich.table import Table

from netsim_ddp import Fabric, Scenario
from netsim_ddp.fabric import naming
from netsim_ddp.fabric.plan import tbf_burst


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def shell_build_and_remove(nodes: int) -> float:
    rid = naming.new_run_id()
    switch = f"nsd{rid}-sw"
    names = [f"nsd{rid}-n{i}" for i in range(nodes)]
    burst = tbf_burst(1e9, 1500)
    start = time.perf_counter()
    try:
        run("ip", "netns", "add", switch)
        run("ip", "-n", switch, "link", "add", "nsd-br", "type", "bridge")
        run("ip", "-n", switch, "link", "set", "nsd-br", "up")
        for i, name in enumerate(names):
            run("ip", "netns", "add", name)
            run("ip", "-n", switch, "link", "add", f"nsd-n{i}", "type", "veth",
                "peer", "name", "eth0", "netns", name)
            run("ip", "-n", switch, "link", "set", f"nsd-n{i}", "master", "nsd-br", "up")
            run("tc", "-n", switch, "qdisc", "add", "dev", f"nsd-n{i}", "root", "tbf",
                "rate", "1gbit", "burst", str(burst), "limit", "1514000")
            run("ip", "-n", name, "addr", "add", f"10.250.0.{i + 1}/24", "dev", "eth0")
            run("tc", "-n", name, "qdisc", "add", "dev", "eth0", "root", "tbf",
                "rate", "1gbit", "burst", str(burst), "limit", "1514000")
            run("ip", "-n", name, "link", "set", "eth0", "up")
            run("ip", "-n", name, "link", "set", "lo", "up")
    finally:
        for name in [switch, *names]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return time.perf_counter() - start


def project_build_and_remove(nodes: int) -> float:
    scenario = Scenario.from_dict({"name": "bench", "topology": {"nodes": nodes},
                                   "link": {"rate": "1gbit"}})
    start = time.perf_counter()
    with Fabric(scenario):
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()

    project_build_and_remove(2)  # warm imports and the capability probe
    table = Table(title="build + remove shaped nodes: median of "
                        f"{args.rounds} interleaved rounds")
    for column in ("nodes", "ip/tc shell (s)", "netsim-ddp (s)", "netsim-ddp / shell", "target"):
        table.add_column(column, justify="right")
    results = []
    for nodes in args.nodes:
        shell, project = [], []
        for _ in range(args.rounds):
            shell.append(shell_build_and_remove(nodes))
            project.append(project_build_and_remove(nodes))
        row = {"nodes": nodes, "shell_s": statistics.median(shell),
               "project_s": statistics.median(project)}
        row["ratio"] = row["project_s"] / row["shell_s"]
        results.append(row)
        table.add_row(str(nodes), f"{row['shell_s']:.3f}", f"{row['project_s']:.3f}",
                      f"{row['ratio']:.2f}",
                      "<= 0.50" + (" ok" if row["ratio"] <= 0.5 else " MISSED"))
    Console().print(table)
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"benchmark": "fabric_build", "results": results}, out, indent=2)


if __name__ == "__main__":
    main()
