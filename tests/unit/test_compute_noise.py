"""The compute noise real GPUs have (workload.compute_noise): seeded draws, their laws, and the
one fact the issue rests on: rare stalls make spread grow with the rank count, light noise
does not."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from pydantic import ValidationError

from netsim_ddp.common.tails import slow_share
from netsim_ddp.scenario.compute_noise import ComputeNoise, GpuSpeed, Stalls
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.noise_draws import (
    NoiseModel,
    gpu_factor,
    read_trace,
    resolved_trace,
    stall_s,
)

COMPUTE_S = 0.2


def _iterations(model: NoiseModel, ranks: int, steps: int) -> list[float]:
    """Each step's time in a synchronous job with no network: the slowest rank's compute."""
    return [max(model.compute_s(COMPUTE_S, rank, 0, step) for rank in range(ranks))
            for step in range(steps)]


def _wilson(successes: int, n: int, z: float) -> tuple[float, float]:
    share = successes / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.parametrize("ranks", [2, 4, 8, 16])
def test_slow_share_follows_one_minus_one_minus_p_to_the_n(ranks: int) -> None:
    """Stalls alone (p = 1% per rank and step, each longer than the slow threshold): the share
    of slow steps is 1 - (1 - p)^N within its binomial (Wilson, 99.9%) interval."""
    p, steps = 0.01, 4000
    model = NoiseModel(ComputeNoise(spread=0.0, seed=7, stalls=Stalls(
        probability=p, scale="50ms", shape=1.5)))
    share = slow_share(_iterations(model, ranks, steps))
    low, high = _wilson(round(share * steps), steps, 3.29)
    expected = 1 - (1 - p) ** ranks
    assert low <= expected <= high, (ranks, share, expected)


def test_stalls_make_spread_grow_with_ranks_and_light_noise_does_not() -> None:
    """The sd of the step time from 2 to 16 ranks: up with stalls (theory ~2.5x at p = 1%),
    down with 2% lognormal noise alone (the max of more light draws varies less)."""
    stalls = NoiseModel(ComputeNoise(spread=0.0, seed=1, stalls=Stalls(
        probability=0.01, scale="50ms", distribution="lognormal", shape=0.01)))
    light = NoiseModel(ComputeNoise(spread=0.02, seed=1))
    ratio = (statistics.stdev(_iterations(stalls, 16, 4000))
             / statistics.stdev(_iterations(stalls, 2, 4000)))
    assert 2.0 < ratio < 3.1
    assert (statistics.stdev(_iterations(light, 16, 2000))
            < statistics.stdev(_iterations(light, 2, 2000)))


def test_draws_are_seeded_per_rank_and_step() -> None:
    noise = ComputeNoise(seed=3, stalls=Stalls(probability=0.5, scale="10ms"),
                         gpu_speed=GpuSpeed(outlier_probability=0.1))
    model = NoiseModel(noise)
    first = [model.step(rank, 0, step) for rank in range(4) for step in range(50)]
    assert first == [NoiseModel(noise).step(rank, 0, step) for rank in range(4)
                     for step in range(50)]  # the same in every mode and run
    assert [model.step(0, 0, s) for s in range(50)] != [model.step(1, 0, s) for s in range(50)]
    other = NoiseModel(noise.model_copy(update={"seed": 4}))
    assert first != [other.step(rank, 0, step) for rank in range(4) for step in range(50)]


def test_pareto_stalls_are_at_least_scale_and_cut_at_max() -> None:
    stalls = Stalls(probability=1.0, scale="50ms", shape=0.5, max="500ms")
    draws = [stall_s(stalls, 0, 0, step) for step in range(2000)]
    assert min(draws) >= 0.05
    assert max(draws) == 0.5  # shape 0.5 is heavy enough to reach the cut often
    assert stall_s(Stalls(probability=0.0, scale="50ms"), 0, 0, 0) == 0.0


def test_gpu_speed_is_fixed_per_rank_with_the_published_spread() -> None:
    speed = GpuSpeed(spread=0.08, max=0.22, outlier_probability=0.02)
    factors = [gpu_factor(speed, 0, rank) for rank in range(5000)]
    ordinary = [f for f in factors if f != 1.5]
    assert 0.07 < statistics.fmean(ordinary) - 1 < 0.09  # ~8% on average
    assert max(ordinary) <= 1.22  # up to 22%
    assert 0.01 < factors.count(1.5) / len(factors) < 0.03  # occasional 1.5x outliers
    model = NoiseModel(ComputeNoise(spread=0.0, gpu_speed=speed))
    assert {model.step(3, 0, step).factor for step in range(20)} == {gpu_factor(speed, 0, 3)}


def test_an_episode_slows_its_node_for_its_steps_only() -> None:
    noise = ComputeNoise.model_validate(
        {"spread": 0.0, "episode": [{"at": 10, "steps": 5, "node": 1, "slowdown": 0.3}]})
    model = NoiseModel(noise)
    assert [model.step(0, 1, step).factor for step in (9, 10, 14, 15)] == [1.0, 1.3, 1.3, 1.0]
    assert model.step(0, 0, 12).factor == 1.0  # another node


def test_a_trace_replays_its_shape_per_rank_or_sampled(tmp_path: Path) -> None:
    trace = tmp_path / "steps.csv"
    trace.write_text("rank0,rank1\n0.1,0.2\n0.3,0.2 # a slow step\n")
    assert read_trace(trace) == [[0.1, 0.3], [0.2, 0.2]]
    noise = resolved_trace(ComputeNoise.model_validate(
        {"spread": 0.0, "trace": {"file": "steps.csv"}}), tmp_path)
    assert noise is not None and noise.trace is not None and noise.trace.file == str(trace)
    model = NoiseModel.load(noise)
    assert [round(model.step(0, 0, s).factor, 6) for s in range(3)] == [0.5, 1.5, 0.5]
    assert round(model.step(1, 0, 1).factor, 6) == 1.0
    sampled = NoiseModel.load(noise.model_copy(update={"trace": noise.trace.model_copy(
        update={"columns": "sampled"})}))
    assert {round(sampled.step(5, 0, s).factor, 6) for s in range(50)} == {0.5, 1.0, 1.5}


def test_bad_traces_name_the_field_the_line_and_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("0.1,0.2\n0.3\n")
    with pytest.raises(ValueError, match=r"trace.file: .*bad.csv:2: 1 columns"):
        read_trace(bad)
    with pytest.raises(ValueError, match="trace.file: cannot read"):
        read_trace(tmp_path / "missing.csv")


def test_noise_fields_are_validated_in_the_scenario() -> None:
    base = {"params": 1000, "compute": "100ms"}
    config = WorkloadConfig.model_validate({**base, "noise": {"stalls": {
        "probability": 0.01, "scale": "50ms", "shape": 1.5}}})
    assert config.noise is not None and config.noise.stalls is not None
    assert config.noise.stalls.scale == pytest.approx(0.05)
    with pytest.raises(ValidationError, match="probability"):
        WorkloadConfig.model_validate({**base, "noise": {"stalls": {
            "probability": 2, "scale": "50ms"}}})
    with pytest.raises(ValidationError, match="max .* is below scale"):
        WorkloadConfig.model_validate({**base, "noise": {"stalls": {
            "probability": 0.1, "scale": "2s", "max": "1s"}}})
    with pytest.raises(ValidationError, match="noise: only used by compute replay"):
        WorkloadConfig.model_validate({"params": 1000, "noise": {"spread": 0.1}})


def test_an_episode_must_name_a_node_of_the_topology() -> None:
    from netsim_ddp import Scenario
    from netsim_ddp.scenario.spec import ScenarioError

    data = {"name": "s", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
            "workload": {"params": 1000, "compute": "100ms", "noise": {
                "episode": [{"at": 0, "steps": 3, "node": 2, "slowdown": 0.5}]}}}
    with pytest.raises(ScenarioError, match=r"workload.noise.episode.0.node: 2 but the "
                                            r"topology has 2 nodes"):
        Scenario.from_dict(data)


def test_a_profile_compute_file_is_a_one_column_trace(tmp_path: Path) -> None:
    import json

    profile = {"model": "mlp", "params": 1000, "batch_size": 4, "mode": "fp32", "device": "cpu",
               "timer": "perf_counter",
               "forward_s": [0.1, 0.2], "backward_s": [0.2, 0.4], "optimizer_s": [0.01, 0.01],
               "layers": [{"name": "l", "backward_s": 0.3}]}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(profile))
    assert read_trace(path) == [pytest.approx([0.3, 0.6])]
    path.write_text("{}")
    with pytest.raises(ValueError, match="trace.file: compute profile .* not a profile"):
        read_trace(path)
