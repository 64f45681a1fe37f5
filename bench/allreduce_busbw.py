"""Benchmark: how close the gradient all-reduce comes to the emulated link.

For each link rate, side by side in one run:
- the bare gloo all-reduce's bus bandwidth (nccl-tests' busbw = algbw x 2(n-1)/n) over the raw
  link rate (target >= 0.95 at 1 Gbit/s; TCP/IP headers cap it near 1448/1514 = 0.956);
- DDP's exposed comm time per mode over the ideal ring all-reduce time 2(n-1)/n x S/B of the
  bytes that mode hands to all-reduce (1.0 = the network is used perfectly).

    python bench/allreduce_busbw.py [--rates 500mbit 1gbit] [--params 16.8M] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from netsim_ddp import Scenario
from netsim_ddp.run.runner import run_scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["500mbit", "1gbit"])
    parser.add_argument("--params", default="16.8M")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()

    table = Table(title=f"gradient all-reduce vs the link (2 nodes, mlp {args.params} params)")
    for column in ("link", "probe busbw / link", "target", "mode", "comm / ring bound",
                   "busbw from comm / link"):
        table.add_column(column, justify="right")
    rows = []
    for rate in args.rates:
        scenario = Scenario.from_dict({
            "name": f"bench-{rate}", "topology": {"nodes": 2}, "link": {"rate": rate},
            "workload": {"params": args.params, "iterations": args.iterations, "warmup": 2,
                         "modes": ["fp32", "amp-fp16"]}})
        with tempfile.TemporaryDirectory() as out:
            report = run_scenario(scenario, out_dir=Path(out), allow_untrusted=True)
        probe = report.fidelity.busbw_bps / scenario.link.rate
        for mode, result in report.modes.items():
            record = result.to_record()
            row = {"rate": rate, "probe_busbw_over_link": probe, "mode": mode,
                   "comm_over_ring_lower_bound": record.comm_over_ring_lower_bound,
                   "busbw_over_link": record.busbw_over_link}
            rows.append(row)
            table.add_row(rate, f"{probe:.3f}", ">= 0.95" if rate == "1gbit" else "",
                          mode, f"{row['comm_over_ring_lower_bound']:.2f}",
                          f"{row['busbw_over_link']:.2f}")
    Console().print(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"benchmark": "allreduce_busbw",
                                                   "results": rows}, indent=2))


if __name__ == "__main__":
    main()
