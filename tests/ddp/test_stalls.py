"""Stalls end to end: the replayed ranks serve the stalls the seeded generator draws, and the
tail's attribution names them (docs/jitter.md)."""

from __future__ import annotations

import pytest

from netsim_ddp import Scenario
from netsim_ddp.run.runner import run_scenario
from netsim_ddp.workload.contract.noise_draws import NoiseModel

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]


def test_replayed_stalls_are_the_drawn_ones_and_the_tail_names_them(tmp_path):
    scenario = Scenario.from_dict({
        "name": "stalls", "topology": {"nodes": 2}, "link": {"rate": "10gbit"},
        "emulation": {"dilation": 10},
        "workload": {"layout": "generic", "params": "1M", "compute": "50ms", "iterations": 30,
                     "warmup": 2, "modes": ["fp32"], "noise": {
                         "spread": 0.0, "seed": 4, "stalls": {
                             "probability": 0.15, "scale": "60ms",
                             "distribution": "lognormal", "shape": 0.01}}}})
    report = run_scenario(scenario, out_dir=tmp_path)
    assert report.status == "passed", [c.to_record() for c in report.checks if not c.passed]
    mode = report.modes["fp32"]
    noise = NoiseModel(scenario.workload.noise)
    drawn: set[int] = set()
    for rank in mode.result.ranks:  # each rank's compute is the schedule plus its own stall
        stalls = [noise.step(rank.rank, rank.node_rank or 0, 2 + i).stall_s for i in range(30)]
        assert rank.compute_s == pytest.approx([0.05 + s for s in stalls], rel=1e-3)
        drawn |= {i for i, s in enumerate(stalls) if s}
    assert drawn, "p = 0.15 over 2 ranks and 30 steps draws stalls for seed 4"
    table = mode.attribution()
    named = {row.iteration for row in table.slow if row.cause == "stall"}
    assert named == drawn  # every stalled step is slow and named, and no other is called one
    assert report.to_record().modes["fp32"].summary.iteration_s.slow_share > 0
