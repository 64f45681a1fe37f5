"""`[link] busbw_from`: the job's bucket sizes, the links planned from an nccl-tests file, and
the fidelity:busbw check on what a probe measured. No network (the ddp tier runs it)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.projection.busbw_links import (
    errors,
    next_delay,
    plan_target_busbw,
    trimmed,
    with_target_busbw,
)
from netsim_ddp.scenario.layouts import named_layout
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.target_busbw import (
    TOLERANCE,
    TRIM_GOAL,
    TRIM_PASSES,
    ddp_bucket_bytes,
    job_sizes,
)
from netsim_ddp.scenario.units import header_factor
from netsim_ddp.verdicts.busbw_checks import busbw_check, busbw_record

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nccl_tests_text import all_reduce_perf  # noqa: E402

SIZES = [2**i for i in range(16, 31)]  # 64 KiB .. 1 GiB, as nccl-tests -b 64K -e 1G -f 2


@pytest.mark.parametrize("layout", ["resnet50", "vgg16", "bert-base"])
def test_buckets_are_torchs_own_assignment(layout: str) -> None:
    """Witness: torch's own assignment (reducer.cpp, exposed as
    dist._compute_bucket_assignment_by_size), on meta tensors of the layout's shapes."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    shapes = [shape for layer in named_layout(layout).layers for shape in layer.shapes]
    tensors = [torch.empty(shape, device="meta") for shape in shapes]
    indices, _ = dist._compute_bucket_assignment_by_size(
        tensors, [dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 2**20], [False] * len(tensors))
    theirs = [sum(math.prod(shapes[i]) * 4 for i in bucket) for bucket in reversed(indices)]
    assert ddp_bucket_bytes([math.prod(shape) for shape in shapes], 25 * 2**20) == theirs


def _scenario(tmp_path: Path, text: str | None = None, **link) -> Scenario:
    (tmp_path / "cluster.txt").write_text(text or all_reduce_perf(16, 4, 300e-6, 6e9, SIZES))
    data = {"name": "t", "topology": {"nodes": 4, "ranks_per_node": 4},
            "link": {"rate": "10gbit", "busbw_from": "cluster.txt", **link},
            "emulation": {"dilation": 40},
            "workload": {"layout": "resnet50", "compute": "300ms", "iterations": 2,
                         "modes": ["fp32", "amp-fp16"]}}
    return Scenario.from_dict(data, tmp_path / "s.toml")


def test_job_sizes_are_the_buckets_in_each_wire_dtype(tmp_path: Path) -> None:
    workload = _scenario(tmp_path).workload
    sizes, how = job_sizes(workload)
    counts = [math.prod(s) for layer in named_layout("resnet50").layers for s in layer.shapes]
    buckets = ddp_bucket_bytes(counts, 25 * 2**20)
    assert set(sizes) == set(buckets) | {b // 2 for b in buckets}  # amp-fp16 sends float16
    assert sizes == sorted(sizes, reverse=True) and "resnet50" in how


def test_plan_recovers_the_files_line(tmp_path: Path) -> None:
    """The file was written from bus time = 300 us + S / 6 Gbit/s: the plan's bandwidth and
    latency are those, the rate carries 6 Gbit/s of TCP payload, the delay is the latency
    spread over the ring's 16 steps."""
    scenario = _scenario(tmp_path)
    plan = plan_target_busbw(scenario)
    assert plan.bandwidth_bps == pytest.approx(6e9, rel=0.01)
    assert plan.latency_s == pytest.approx(300e-6, rel=0.05)
    assert plan.rate_bps == pytest.approx(6e9 * header_factor(1500), rel=0.01)
    assert plan.delay_s == pytest.approx(300e-6 / 16, rel=0.05)
    for size, busbw in zip(plan.sizes, plan.busbw_bps, strict=True):
        assert busbw == pytest.approx(size * 8 / (300e-6 + size * 8 / 6e9), rel=0.01)
    host = with_target_busbw(scenario, plan)
    assert host.link.rate == pytest.approx(plan.rate_bps)
    assert host.link.delay == pytest.approx(plan.delay_s)
    assert host.link.busbw_from is None
    assert "cluster.txt (16 GPUs on 4 hosts)" in plan.summary


def test_negligible_latency_adds_no_delay(tmp_path: Path) -> None:
    plan = plan_target_busbw(_scenario(tmp_path, all_reduce_perf(16, 4, 1e-7, 6e9, SIZES)))
    assert plan.delay_s == 0 and plan.bandwidth_bps == pytest.approx(6e9, rel=0.01)


@pytest.mark.parametrize(("link", "text", "match"), [
    ({"override": [{"node": 1, "rate": "1gbit"}]}, None, "overrides"),
    ({"busbw_from": "nowhere.txt"}, None, "no such file"),
    ({}, "no table here\n", "link.busbw_from"),
])
def test_unusable_settings_name_the_field(tmp_path: Path, link, text, match) -> None:
    scenario = _scenario(tmp_path, text, **link)
    with pytest.raises(ScenarioError, match=match) as caught:
        plan_target_busbw(scenario)
    assert caught.value.field == "link.busbw_from"


def test_one_node_cannot_check_it(tmp_path: Path) -> None:
    scenario = _scenario(tmp_path)
    one = Scenario.from_dict({**scenario.model_dump(mode="json", exclude_none=True),
                              "topology": {"nodes": 1, "ranks_per_node": 4}}, scenario.path)
    with pytest.raises(ScenarioError, match="2 or more nodes"):
        plan_target_busbw(one)


def _probed(plan, ratio: float, k: float = 40.0) -> CollectiveFidelity:
    """A probe whose job-size all-reduces reached `ratio` x the file's (host units)."""
    fidelity = CollectiveFidelity(2**24, 16, [1e8], 1e8, 0.9)
    fidelity.job_size_bps.append({s: plan.target_at(s) * ratio / k for s in plan.sizes})
    return fidelity


@pytest.mark.parametrize(("ratio", "passed"), [(1.0, True), (1 - TOLERANCE / 2, True),
                                               (1 - 2 * TOLERANCE, False), (1.2, False)])
def test_check_compares_the_probe_in_target_time(tmp_path: Path, ratio, passed) -> None:
    plan = plan_target_busbw(_scenario(tmp_path))
    verdict = busbw_check(plan, _probed(plan, ratio), 40.0)
    assert verdict.passed is passed and verdict.name == "fidelity:busbw"
    assert f"{ratio - 1:+.1%}" in verdict.detail
    record = busbw_record(plan, _probed(plan, ratio), 40.0)
    assert record is not None
    assert record["sizes"][0]["measured_busbw_bps"] == pytest.approx(plan.busbw_bps[0] * ratio)


def test_check_fails_without_the_probes_sizes(tmp_path: Path) -> None:
    plan = plan_target_busbw(_scenario(tmp_path))
    fidelity = CollectiveFidelity(2**24, 16, [1e8], 1e8, 0.9)
    fidelity.job_size_bps.append({})
    assert not busbw_check(plan, fidelity, 40.0).passed
    assert not busbw_check(plan, None, 40.0).passed


def _path_with_convex_latency(plan, delay_s: float) -> dict[int, float]:
    """What a TCP path gives at this delay: the plan's bandwidth after a latency that grows
    with the square of the delay (as measured on 4 gloo nodes at x40: 100 / 200 / 400 us of
    delay, 272 / 950 / 2722 us of latency), not the ring's W x delay the plan assumes."""
    latency = delay_s**2 / 60e-6
    return {s: s * 8 / (latency + s * 8 / plan.bandwidth_bps) for s in plan.sizes}


def test_the_delay_search_finds_what_a_convex_path_needs(tmp_path: Path) -> None:
    plan = plan_target_busbw(_scenario(tmp_path))  # 300 us of latency over 16 ranks
    tried: list[tuple[float, list[float]]] = []
    delay: float | None = plan.delay_s
    while delay is not None and len(tried) < TRIM_PASSES:
        tried.append((delay, errors(plan, _path_with_convex_latency(plan, delay))))
        delay = next_delay(plan, tried)
    assert delay is None, "the search ends within TRIM_PASSES probe passes"
    assert max(abs(e) for e in tried[-1][1]) <= TRIM_GOAL
    # The plan's own delay (latency / W) is too short on such a path: the bus is too fast.
    assert tried[0][0] == plan.delay_s and max(tried[0][1]) > TRIM_GOAL
    chosen = trimmed(plan, tried)
    assert chosen.delay_s == tried[-1][0] == pytest.approx((300e-6 * 60e-6) ** 0.5, rel=0.1)
    assert chosen.trim is not None and len(chosen.trim.passes) == len(tried)
    assert chosen.as_dict()["trim"]["first_delay_s"] == plan.delay_s
    assert "probe passes" in chosen.summary


def test_the_search_stops_when_a_pass_timed_nothing(tmp_path: Path) -> None:
    plan = plan_target_busbw(_scenario(tmp_path))
    assert next_delay(plan, [(plan.delay_s, errors(plan, {}))]) is None
    assert trimmed(plan, [(plan.delay_s, errors(plan, {}))]).delay_s == plan.delay_s
