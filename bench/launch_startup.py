"""Benchmark: one launch of gloo ranks, forked from each node's agent vs started by torchrun.

Both launch the same spec (2 nodes x 1 rank on loopback, a tiny model, one mode) through
`launch`, rounds interleaved so both see the same machine; the torchrun side is the same launch
with `agent_module` answering torchrun itself (what NCCL runs get). Prints, per side, the
median time from launch to the first result file (start-up: agent, imports, rendezvous, DDP
wrapper) and from there to the launch's return (the agents' exit), and their ratios. Target:
the forked launch, start to return, in at most 0.75 x torchrun's time.

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
from netsim_ddp.workload.results import result_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "workload"))
from conftest import LoopbackNode  # noqa: E402  (the launch tests' node on loopback)

# the module (the package exports its function `launch` under the same name)
launch_module = importlib.import_module("netsim_ddp.workload.launch")

SPEC = RankSpec(workload=WorkloadConfig(params="200k", batch_size=8, iterations=2, warmup=1,
                                        modes=["fp32"], backend="gloo"))


def one_launch(forked: bool) -> tuple[float, float]:
    """(seconds to the first result, seconds from it to the launch's return)."""
    original = launch_module.agent_module
    if not forked:
        launch_module.agent_module = lambda spec: "torch.distributed.run"
    try:
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "out"
            start = time.time()
            launch([LoopbackNode("n0"), LoopbackNode("n1")], SPEC, out, 120, socket_ifname="lo")
            end = time.time()
            result = result_path(out, "fp32").stat().st_mtime
    finally:
        launch_module.agent_module = original
    return result - start, end - result


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
    medians = {side: (statistics.median(s[0] for s in runs), statistics.median(s[1] for s in runs))
               for side, runs in samples.items()}
    table = Table(title=f"2 nodes x 1 gloo rank on loopback, {args.rounds} rounds (medians)")
    for column in ("launch", "to first result", "result to return", "in all"):
        table.add_column(column, justify="right")
    for side, (ready, tail) in medians.items():
        table.add_row(side, f"{ready:.2f} s", f"{tail:.2f} s", f"{ready + tail:.2f} s")
    (f_ready, f_tail), (t_ready, t_tail) = medians["forked"], medians["torchrun"]
    table.add_row("forked / torchrun", f"{f_ready / t_ready:.2f} x", f"{f_tail / t_tail:.2f} x",
                  f"{(f_ready + f_tail) / (t_ready + t_tail):.2f} x")
    console.print(table)
    met = (f_ready + f_tail) / (t_ready + t_tail) <= 0.75
    console.print(f"target (in all <= 0.75 x torchrun's): {'met' if met else 'MISSED'}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rounds": args.rounds, "samples": samples,
                                                   "target_met": met}, indent=1))
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
