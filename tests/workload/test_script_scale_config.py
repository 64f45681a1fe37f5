"""A user's script in a scale model: what `launch` keeps of a scale model's workload, what is
refused before anything is built, and how the ranks' replay records reach the results (target
time, the replay check's compute, a series apart from real-time runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.target_time import (
    REAL_TIME,
    emulation_label,
    replayed_compute_s,
    to_target_time,
)
from netsim_ddp.measure.target_time import replay_late_s as late_series
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.steps import ScriptRankRecord
from netsim_ddp.workload.launcher.script_launch import combine_script

ROOT = Path(__file__).resolve().parents[2]
BASE = {"name": "s", "topology": {"nodes": 2}, "link": {"rate": "10gbit"},
        "emulation": {"dilation": 40}}


def test_launch_keeps_a_scale_models_compute_and_drops_its_layout() -> None:
    scale = Scenario.load(ROOT / "scenarios" / "scale" / "10gbe-16gpu.toml")
    script = scale.with_command(["/abs/train.py"])
    workload = script.workload
    assert workload is not None and workload.is_script and workload.replayed
    assert (workload.compute, workload.compute_amp) == (0.375, 0.234)
    assert workload.noise is not None and workload.noise.spread == 0.02
    assert workload.layout is None and workload.modes == ["script"]
    assert script.emulation.dilation == 40


@pytest.mark.parametrize(("workload", "words"), [
    ({"command": ["t.py"]}, "computes on the host's CPU"),
    ({"command": ["t.py"], "compute": "100ms", "layout": "resnet50"}, "remove layout"),
    ({"command": ["t.py"], "compute": "100ms", "backend": "nccl"}, "gloo"),
])
def test_what_a_scale_model_cannot_stand_in_for_is_refused(workload, words) -> None:
    with pytest.raises(ScenarioError, match=words):
        Scenario.from_dict({**BASE, "workload": workload}, "s.toml")


def test_a_real_time_script_needs_no_compute() -> None:
    data = {**BASE, "emulation": {"dilation": 1}, "workload": {"command": ["t.py"]}}
    assert not Scenario.from_dict(data, "s.toml").workload.replayed


def _records() -> list[ScriptRankRecord]:
    return [ScriptRankRecord(rank=rank, local_rank=0, hostname=f"n{rank}", boundaries=3,
                             step_s=[4.0, 4.4], started_monotonic=[1.0, 5.0],
                             hook_bytes=[400, 400], ddp_models=1, optimizers=["SGD"],
                             replay_late_s=[0.04 * (rank + 1), 0.0],
                             replay_compute_s=0.1)
            for rank in range(2)]


def test_replay_records_reach_the_result_in_target_time() -> None:
    workload = WorkloadConfig.model_validate({"command": ["t.py"], "iterations": 2,
                                             "compute": "100ms"})
    result = combine_script(_records(), run="script", command=["t.py"], variant_args=[],
                            variant_env={}, workload=workload, local_world_size=1,
                            socket_ifname="eth0", dilation=40)
    assert (result.dilation, result.compute_source) == (40, "replay")
    target = to_target_time(result, 40)
    assert target.iteration_s == pytest.approx([0.1, 0.11])
    assert late_series(target) == pytest.approx([0.002, 0.0])  # the latest rank, / k
    mode = ModeReport(target, 400.0, 0.0, 10e9)
    assert replayed_compute_s(mode) == 0.1  # what the replay check's bound is made from
    # Baselines and history keep a script's scale-model runs apart from its real-time runs.
    assert emulation_label(target.dilation, target.compute_source) != REAL_TIME
