"""Collective timing arithmetic: union of bucket intervals, the per-bucket maxima, the
straggler view, and collective_s as a metric in expectations and baselines (no torch)."""

import random

import pytest

from netsim_ddp import Scenario
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.scenario.expectations import Expectation
from netsim_ddp.verdicts.baseline import Baseline, BaselineError, save
from netsim_ddp.verdicts.gate import Metric, Tolerance, evaluate
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload.contract.intervals import union_length
from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples, combine, exposed_comm

SCENARIO = {"name": "timing", "topology": {"nodes": 2, "names": ["a", "b"]},
            "link": {"rate": "1gbit"}, "workload": {"params": "1M", "modes": ["fp32", "amp-fp16"]}}


def test_union_counts_overlaps_once():
    assert union_length([]) == 0.0
    assert union_length([(0.0, 1.0)]) == 1.0
    assert union_length([(0.0, 1.0), (0.5, 2.0)]) == pytest.approx(2.0)  # overlap
    assert union_length([(3.0, 4.0), (0.0, 1.0)]) == pytest.approx(2.0)  # gap, unsorted
    assert union_length([(0.0, 5.0), (1.0, 2.0), (4.0, 6.0)]) == pytest.approx(6.0)  # nested


def rank(index, started, intervals):
    n = len(started)
    return RankSamples(
        rank=index, local_rank=0, hostname="h", iteration_s=[1.0] * n, compute_s=[0.5] * n,
        comm_s=exposed_comm([1.0] * n, [0.5] * n), sent_bytes=[8] * n, buckets=[2] * n,
        wire_dtypes=["float32"], loss=[1.0] * n, skipped_steps=0, param_digest="0" * 16,
        started_monotonic=started, bucket_intervals=intervals)


META = dict(mode="fp32", model="mlp", params=100, params_requested=100, world_size=2,
            local_world_size=1, backend="gloo", device="cpu", socket_ifname="eth0",
            batch_size=4, grad_accumulation=1, bucket_size=1024, warmup=0, iterations=2,
            profiled=False)


def test_combine_takes_the_slowest_rank_and_names_the_straggler():
    r0 = rank(0, [100.0, 200.0], [[(0.1, 0.3), (0.2, 0.5)], [(0.1, 0.2), (0.15, 0.25)]])
    # Rank 1 left the barrier 50 ms later in step 0, handing over its last bucket at
    # 100.05 + 0.3 = 100.35 > rank 0's 100.2: it straggled by 150 ms. In step 1 rank 0 did.
    r1 = rank(1, [100.05, 200.0], [[(0.1, 0.4), (0.3, 0.45)], [(0.05, 0.1), (0.1, 0.2)]])
    result = combine([r1, r0], **META)
    assert r0.collective_s == pytest.approx([0.4, 0.15])
    assert r1.collective_s == pytest.approx([0.35, 0.15])
    assert result.collective_s == pytest.approx([0.4, 0.15])
    assert result.bucket_s is not None
    assert [row == pytest.approx(expected) for row, expected in
            zip(result.bucket_s, [[0.3, 0.3], [0.1, 0.1]], strict=True)] == [True, True]
    assert result.stragglers is not None
    assert [s.rank for s in result.stragglers] == [1, 0]
    assert [s.wait_s for s in result.stragglers] == pytest.approx([0.15, 0.05])
    assert result.started_monotonic == [100.0, 200.0]
    report = ModeReport(result, 1.0, 0.0, 1e9, node_names=["a", "b"], ranks_per_node=1)
    assert [row.node for row in report.straggler_rows()] == ["b", "a"]
    assert report.straggler_summary().of == 2
    document = report.to_record().dump()
    assert document["collective_s"] == result.collective_s
    assert document["summary"]["collective_s"]["median"] == pytest.approx(0.275)


def test_a_result_without_timing_has_none_and_metrics_say_so():
    r = rank(0, [1.0], [[(0.0, 0.1)]]).model_copy(update={"bucket_intervals": None})
    result = combine([r], **{**META, "world_size": 1, "iterations": 1})
    assert result.collective_s is None and result.stragglers is None
    report = ModeReport(result, 1.0, 0.0, 1e9)
    assert report.collective is None and "collective_s" not in report.to_record().dump()["summary"]
    with pytest.raises(ValueError, match="no collective timing"):
        Metric.parse("collective_s.std").value(report)


def mode(name, collective, spread, seed, n=20):
    draw = random.Random(seed)
    series = [collective + draw.gauss(0, spread) for _ in range(n)]
    result = ModeResult.model_construct(
        mode=name, iteration_s=[c + 0.1 for c in series], compute_s=[0.1] * n,
        comm_s=series, collective_s=series, sent_bytes_per_iteration=1000, world_size=2,
        iterations=n, params=250, ranks=[], profiler_allreduce_s=None)
    return ModeReport(result, 1000.0, 0.0, 1e9)


def test_busbw_is_from_the_time_the_collectives_were_in_flight_never_the_exposed_time():
    """nccl-tests' busbw: 2(n-1)/n x bytes / the collectives' time. The 16-GPU replay case:
    backward hides most of the all-reduce, so exposed comm (20 ms) is a sliver of the
    collectives' 214 ms, and bytes over it would read as 5.6x the link."""
    n, sent, link = 16, 102.2e6, 10e9
    collective = [0.2138, 0.2120, 0.2150]
    result = ModeResult.model_construct(
        mode="fp32", iteration_s=[0.40] * 3, compute_s=[0.38] * 3, comm_s=[0.02] * 3,
        collective_s=collective, sent_bytes_per_iteration=int(sent), world_size=n,
        iterations=3, params=25_000_000, ranks=[], profiler_allreduce_s=None, batch_size=32,
        grad_accumulation=1)
    report = ModeReport(result, sent * n, 0.0, link)
    expected = 2 * (n - 1) / n * sent * 8 / 0.2138
    assert report.busbw_bps == pytest.approx(expected)
    assert report.busbw_bps / link == pytest.approx(0.717, abs=0.005)  # not 5.6
    record = report.to_record().dump()
    assert record["busbw_over_link"] == pytest.approx(expected / link)
    untimed = ModeReport(result.model_copy(update={"collective_s": None}), sent * n, 0.0, link)
    assert untimed.busbw_bps is None  # no collective timing: no figure, not a bound
    assert untimed.to_record().dump().get("busbw_over_link") is None


def test_collective_spread_is_an_expectation():
    claim = Expectation(metric="collective_s.std", mode="amp-fp16", vs="fp32", max_ratio=1.0)
    calm = {"fp32": mode("fp32", 0.5, 0.1, 1), "amp-fp16": mode("amp-fp16", 0.25, 0.02, 2)}
    assert evaluate(claim, calm).passed
    noisy = {"fp32": mode("fp32", 0.5, 0.02, 1), "amp-fp16": mode("amp-fp16", 0.25, 0.1, 2)}
    verdict = evaluate(claim, noisy)
    assert not verdict.passed and "collective_s" in verdict.detail


def test_collective_s_in_baselines(tmp_path):
    def report(modes):
        r = ScenarioReport(Scenario.from_dict(SCENARIO))
        r.modes = modes
        return r

    path = save([report({"fp32": mode("fp32", 0.5, 0.02, 1)})], tmp_path / "b.json")
    baseline = Baseline(path)
    tolerance = [Tolerance.parse("collective_s.median:10%")]
    same = baseline.compare(report({"fp32": mode("fp32", 0.5, 0.02, 2)}), tolerance, 0.05)
    assert len(same) == 1 and same[0].passed
    slower = baseline.compare(report({"fp32": mode("fp32", 0.8, 0.02, 3)}), tolerance, 0.05)
    assert not slower[0].passed and "REGRESSION" in slower[0].detail
    old = tmp_path / "old.json"
    old.write_text(path.read_text().replace('"collective_s"', '"ignored_s"'))
    with pytest.raises(BaselineError, match="no collective_s"):
        Baseline(old).compare(report({"fp32": mode("fp32", 0.5, 0.02, 2)}), tolerance, 0.05)


def test_stragglers_are_named_by_the_node_each_rank_ran_on_not_by_rank_order():
    """torchrun's c10d numbers nodes by their addresses sorted as strings: hosts .9, .10, .11
    (node ranks 0, 1, 2) get group ranks 2, 0, 1. Rank 0 ran on node 1."""
    node_of_rank = {0: 1, 1: 2, 2: 0}
    ranks = [rank(index, [100.0 + (0.2 if index == 0 else 0.0)], [[(0.1, 0.3)]])
             for index in range(3)]
    ranks = [r.model_copy(update={"node_rank": node_of_rank[r.rank]}) for r in ranks]
    result = combine(ranks, **(META | {"world_size": 3, "iterations": 1}))
    assert [s.rank for s in result.stragglers] == [0]
    report = ModeReport(result, 1.0, 0.0, 1e9, node_names=["gpu0", "gpu1", "gpu2"])
    assert [row.node for row in report.straggler_rows()] == ["gpu1"]
    assert report.straggler_summary().node == "gpu1"
