"""Benchmark: one launch of gloo ranks, forked from each node's agent vs started by torchrun.

Both launch the same spec (2 nodes x 1 rank on loopback, a tiny model, one mode) through
`launch`, rounds interleaved so both see the same machine; the torchrun side is the same launch
with `torchrun_module` answering torchrun itself (what NCCL runs get). Prints, per side, the
median time from launch to the first result file (start-up: agent, imports, rendezvous, DDP
wrapper), from there to the launch's return (the agents' exit), and of whole launches, start to
return, and their ratios. Target: the forked side's median whole launch in at most 0.75 x
torchrun's (the median of whole launches, not the sum of the two parts' medians, which need not
be any launch's time).

    python bench/launch_startup.py [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from netsim_ddp.workload import RankSpec, WorkloadConfig, launch
from netsim_ddp.workload.contract.mode_result import result_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "workload"))
from conftest import LoopbackNode  # noqa: E402  (the launch tests' node on loopback)

# the module (the package exports its function `launch` under the same name)
launch_module = importlib.import_module("netsim_ddp.workload.launcher.launch")

SPEC = RankSpec(workload=WorkloadConfig(params="200k", batch_size=8, iterations=2, warmup=1,
                                        modes=["fp32"], backend="gloo"))


def one_launch(forked: bool) -> tuple[float, float]:
    """(seconds to the first result, seconds from it to the launch's return)."""
    original = launch_module.torchrun_module
    if not forked:
        launch_module.torchrun_module = lambda spec: "torch.distributed.run"
    try:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "out"
            start = time.time()
            launch([LoopbackNode("n0"), LoopbackNode("n1")], SPEC, out, 120, socket_ifname="lo")
            end = time.time()
            result = result_path(out, "fp32").stat().st_mtime
    finally:
        launch_module.torchrun_module = original
    return result - start, end - result


def medians(runs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(median to first result, median from it to return, median whole launch)."""
    return (statistics.median(ready for ready, _ in runs),
            statistics.median(tail for _, tail in runs),
            statistics.median(ready + tail for ready, tail in runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    console = Console()
    samples: dict[str, list[tuple[float, float]]] = {"forked": [], "torchrun": []}
    for round_index in range(args.rounds):
        console.print(f"  round {round_index + 1} of {args.rounds}", highlight=False)
        for side in samples:
            samples[side].append(one_launch(side == "forked"))
    summary = {side: medians(runs) for side, runs in samples.items()}
    table = Table(title=f"2 nodes x 1 gloo rank on loopback, {args.rounds} rounds (medians)")
    for column in ("launch", "to first result", "result to return", "whole launch"):
        table.add_column(column, justify="right")
    for side, values in summary.items():
        table.add_row(side, *(f"{value:.2f} s" for value in values))
    ratios = [f / t for f, t in zip(summary["forked"], summary["torchrun"], strict=True)]
    table.add_row("forked / torchrun", *(f"{ratio:.2f} x" for ratio in ratios))
    console.print(table)
    met = ratios[2] <= 0.75
    console.print(f"target (whole launch <= 0.75 x torchrun's): {'met' if met else 'MISSED'}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rounds": args.rounds, "samples": samples,
                                                   "whole_launch_ratio": ratios[2],
                                                   "target_met": met}, indent=1))
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
