"""Benchmark: a scenario through `netsim-ddp host` on simulated hosts, against `netsim-ddp run`
of the same scenario on one host, side by side in one session.

The hosts are the multi-host tests' (tests/multihost/simhosts.py): one network namespace per
host with its own unshaped veth into a bridge, one agent per namespace started as a scheduler
would. Prints, per mode, the medians of iteration, exposed comm and collective time, and the
wire bytes per iteration, for both, with each run's status and all-reduce probe.

    python bench/multihost_compare.py [--scenario scenarios/default.toml] [--iterations N]
                                      [--first host|run] [--json OUT]
Run it under the heavy lock (it trains twice).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from netsim_ddp import Scenario

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "multihost"))
from simhosts import simulated_hosts  # noqa: E402  (the tests' simulated hosts)

PORT = 29561


def netsim_ddp(*args) -> list[str]:
    return [sys.executable, "-m", "netsim_ddp.cli", *map(str, args)]


def single_host(scenario: Path, iterations: list[str], out: Path) -> dict:
    subprocess.run(netsim_ddp("run", scenario, "--json", out / "run.json", "--out",
                              out / "run", *iterations), check=False)
    (report,) = json.loads((out / "run.json").read_text())["scenarios"]
    return report


def multi_host(scenario: Path, nodes: int, iterations: list[str], out: Path) -> dict:
    with simulated_hosts(nodes) as hosts:
        agents = [host.popen(netsim_ddp(
            "host", scenario, "--node-rank", host.index, "--nnodes", nodes, "--master-addr",
            hosts[0].address, "--master-port", PORT, "--nic", host.nic, "--out",
            out / f"host{host.index}", "--json", out / "host.json", *iterations))
            for host in hosts]
        for agent in agents:
            agent.wait()
    (report,) = json.loads((out / "host.json").read_text())["scenarios"]
    return report


def table(run: dict, host: dict) -> Table:
    out = Table(title=f"{run['name']}: host / run (medians)")
    for column in ("mode", "iteration ms", "comm ms", "collective ms", "wire MB/iter"):
        out.add_column(column, justify="left" if column == "mode" else "right")
    for mode in run["modes"]:
        a, b = host["modes"][mode], run["modes"][mode]

        def ms(report: dict, metric: str) -> str:
            summary = report["summary"].get(metric)
            return f"{summary['median'] * 1e3:.1f}" if summary else "-"

        out.add_row(mode, *(f"{ms(a, metric)} / {ms(b, metric)}"
                            for metric in ("iteration_s", "comm_s", "collective_s")),
                    f"{a['wire_bytes_per_iteration'] / 1e6:.2f} / "
                    f"{b['wire_bytes_per_iteration'] / 1e6:.2f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "default.toml")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--first", choices=("host", "run"), default="run")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    nodes = Scenario.load(args.scenario).topology.nodes
    iterations = ["--iterations", str(args.iterations)] if args.iterations else []
    out = Path(tempfile.mkdtemp(prefix="netsim-ddp-multihost-compare-"))
    reports, seconds = {}, {}
    for kind in ((args.first, "host" if args.first == "run" else "run")):
        started = time.monotonic()
        reports[kind] = (single_host(args.scenario, iterations, out) if kind == "run"
                         else multi_host(args.scenario, nodes, iterations, out))
        seconds[kind] = time.monotonic() - started
    console = Console(width=120)
    console.print(table(reports["run"], reports["host"]))
    for kind, report in reports.items():
        fidelity = report["fidelity"] or {}
        console.print(f"{kind}: {report['status']} in {seconds[kind]:.0f} s, all-reduce probe "
                      f"{fidelity.get('fraction', 0):.0%} of the link, checks "
                      + ", ".join(f"{c['name']} {'ok' if c['passed'] else 'FAILED'}"
                                  for c in report["checks"]))
    if args.json:
        args.json.write_text(json.dumps({"run": reports["run"], "host": reports["host"],
                                         "seconds": seconds}, indent=1))


if __name__ == "__main__":
    main()
