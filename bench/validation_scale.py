"""Benchmark: validating a scenario, and asking every node's link as planning does, against
the node count. It must stay linear (it was cubic with per-node overrides).

Measured on this project's 2-core VM (shared, so noisy), one override per 10 nodes:
    before: 250 nodes 0.05 s, 500 0.38 s, 1000 3.9 s, 2000 45.6 s, 4000 352 s
    after:  250 nodes 1.2 ms, 500 1.7 ms, 1000 5.0 ms (1023 is the most a bridge holds;
            10 000 nodes are refused in 12 ms)

    python bench/validation_scale.py [NODES...]
"""

from __future__ import annotations

import sys
import time

from netsim_ddp.scenario.spec import Scenario, ScenarioError


def scenario_data(nodes: int) -> dict:
    return {"name": "big",
            "topology": {"nodes": nodes, "names": [f"h{i}" for i in range(nodes)],
                         "subnet": "10.0.0.0/16"},
            "link": {"rate": "1gbit", "delay": "1ms",
                     "override": [{"node": f"h{i}", "rate": "100mbit"}
                                  for i in range(0, nodes, 10)]}}


def main(counts: list[int]) -> None:
    for nodes in counts:
        started = time.perf_counter()
        try:
            scenario = Scenario.from_dict(scenario_data(nodes), "big.toml")
            for index in range(nodes):
                scenario.link_for(index)
            outcome = "valid"
        except ScenarioError as exc:
            outcome = f"refused: {exc.field}: {exc.reason[:60]}"
        print(f"{nodes:6d} nodes: {(time.perf_counter() - started) * 1e3:8.1f} ms ({outcome})")


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]] or [250, 500, 1000, 10_000])
