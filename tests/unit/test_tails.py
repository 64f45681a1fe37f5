"""Tails in every result (common.tails, the summaries, claims and gates on them) and the
attribution of the slow iterations (measure.attribution)."""

from __future__ import annotations

import pytest

from netsim_ddp.common.metrics import statistic, summarize
from netsim_ddp.common.tails import percentile, slow_iterations, slow_share
from netsim_ddp.measure.attribution import CounterSeries, attribute
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.scenario.compute_noise import ComputeNoise, Stalls
from netsim_ddp.scenario.expectations import Expectation, MetricName
from netsim_ddp.verdicts.gate import Tolerance, evaluate, regression_verdict
from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples, combine
from netsim_ddp.workload.contract.noise_draws import NoiseModel

STEPS, RANKS, COMPUTE_S, COMM_S = 200, 8, 0.2, 0.05
META = dict(model="mlp", params=100, params_requested=100, local_world_size=1,
            backend="gloo", device="cpu", socket_ifname="lo", batch_size=4,
            grad_accumulation=1, bucket_size=1024, warmup=3, profiled=False)


def _result(noise: NoiseModel, *, network_s: dict[int, float] | None = None,
            mode: str = "fp32", comm_s: float = COMM_S) -> ModeResult:
    """A replayed run without the network's own noise: each rank's step is its drawn compute
    plus the collective, which waits for the slowest rank (plus any network delay)."""
    network_s = network_s or {}
    compute = [[noise.compute_s(COMPUTE_S, rank, rank // 4, META["warmup"] + step)
                for step in range(STEPS)] for rank in range(RANKS)]
    slowest = [max(column) for column in zip(*compute, strict=True)]
    iteration = [slow + comm_s + network_s.get(step, 0.0) for step, slow in enumerate(slowest)]
    ranks = [RankSamples(rank=rank, local_rank=0, hostname="h", node_rank=rank // 4,
                         iteration_s=iteration, compute_s=compute[rank],
                         comm_s=[i - c for i, c in zip(iteration, compute[rank], strict=True)],
                         sent_bytes=[400] * STEPS, buckets=[1] * STEPS,
                         wire_dtypes=["float32"], loss=[1.0] * STEPS, skipped_steps=0,
                         param_digest="0" * 16) for rank in range(RANKS)]
    return combine(ranks, mode=mode, world_size=RANKS, iterations=STEPS, **META)


def test_tail_statistics() -> None:
    samples = [1.0] * 90 + [1.05] * 5 + [2.0] * 5
    assert slow_iterations(samples) == list(range(95, 100))  # 1.05 is within 10%
    assert slow_share(samples) == pytest.approx(0.05)
    assert percentile(samples, 99) == 2.0
    summary = summarize(samples)
    assert summary.p99 == 2.0 and summary.slow_share == pytest.approx(0.05)
    assert summary.cv == pytest.approx(summary.std / summary.mean)
    assert statistic(samples, "slow_share") == pytest.approx(0.05)


def test_claims_and_gates_name_tail_statistics() -> None:
    assert MetricName.parse("iteration_s.p99").stat == "p99"
    assert MetricName.parse("collective_s.cv").is_tail
    assert str(Tolerance.parse("iteration_s.slow_share:50%").metric) == "iteration_s.slow_share"
    with pytest.raises(ValueError, match="unknown statistic 'p98'"):
        MetricName.parse("iteration_s.p98")


def _report(result: ModeResult, noise: NoiseModel | None = None) -> ModeReport:
    return ModeReport(result, 1000.0, 0.0, 1e9, noise=noise)


def test_a_p99_claim_sees_the_stalls() -> None:
    stalls = NoiseModel(ComputeNoise(spread=0.02, seed=5, stalls=Stalls(
        probability=0.02, scale="100ms")))
    light = NoiseModel(ComputeNoise(spread=0.02, seed=5))
    modes = {"fp32": _report(_result(stalls)),
             "amp-fp16": _report(_result(light, mode="amp-fp16"))}
    claim = Expectation(metric="iteration_s.p99", mode="amp-fp16", vs="fp32", max_ratio=0.8)
    verdict = evaluate(claim, modes)
    assert verdict.passed, verdict.detail
    reverse = Expectation(metric="iteration_s.p99", mode="fp32", vs="amp-fp16", max_ratio=0.8)
    assert not evaluate(reverse, modes).passed
    baseline = modes["amp-fp16"].iteration.p99
    gate = regression_verdict("s", "fp32", Tolerance.parse("iteration_s.p99:20%"),
                              modes["fp32"], baseline, modes["amp-fp16"].result.iteration_s)
    assert not gate.passed, gate.detail  # the baseline gate catches a tail that grew


def test_attribution_names_stalls_when_only_stalls_were_injected() -> None:
    noise = NoiseModel(ComputeNoise(spread=0.02, seed=2, stalls=Stalls(
        probability=0.01, scale="60ms")))
    report = _report(_result(noise), noise)
    table = report.attribution()
    assert table.slow, "stalls at p = 1% over 8 ranks and 200 steps must make slow steps"
    assert {row.cause for row in table.slow} == {"stall"}
    assert [share.cause for share in table.shares] == ["stall"]
    for row in table.slow:  # the rank named is the one whose stall was drawn
        assert noise.step(row.rank, row.rank // 4, 3 + row.iteration).stall_s > 0
    assert report.to_record().attribution == table


def test_attribution_names_the_network_when_only_the_network_was_slow() -> None:
    noise = NoiseModel(ComputeNoise(spread=0.02, seed=2))
    delays = {17: 0.08, 90: 0.12, 150: 0.05}
    result = _result(noise, network_s=delays)
    table = attribute(result, noise=noise)
    assert [row.iteration for row in table.slow] == sorted(delays)
    assert {row.cause for row in table.slow} == {"network"}
    assert "by elimination" in table.slow[0].detail
    assert table.shares[0].share == pytest.approx(1.0)


def test_network_evidence_from_counters_in_the_iterations_window() -> None:
    noise = NoiseModel(ComputeNoise(spread=0.0, seed=2))
    result = _result(noise, network_s={4: 0.1}).model_copy(
        update={"started_monotonic": [100.0 + step for step in range(STEPS)]})
    retransmits = CounterSeries("TCP retransmissions", 1,
                                [(100.0, 0), (104.1, 0), (104.2, 7), (200.0, 7)])
    table = attribute(result, counters=[retransmits])
    assert table.slow[0].detail == "collective slow; node 1 TCP retransmissions +7"
    assert retransmits.growth(100.0, 104.0) == 0


def test_network_evidence_from_each_nodes_tcp_losses_in_the_step() -> None:
    noise = NoiseModel(ComputeNoise(spread=0.0, seed=2))
    result = _result(noise, network_s={4: 0.1, 9: 0.1})
    losses = [{} for _ in range(STEPS)]
    losses[4] = {"RetransSegs": 12, "TCPTimeouts": 1}
    leader = result.ranks[4].model_copy(update={"step_tcp_loss": losses})  # node 1's rank 0
    result = result.model_copy(update={"ranks": [*result.ranks[:4], leader, *result.ranks[5:]]})
    table = attribute(result)
    assert table.slow[0].detail == "collective slow; node 1 RetransSegs +12, TCPTimeouts +1"
    assert table.slow[0].evidenced
    # No connection sampled (no neighbour shares the nodes): a node's timeout is the job's.
    assert [row.cause for row in table.slow] == ["timeout", "network"]
    # recorded, but nothing grew in step 9: by elimination, and it says what was read
    assert "no node's TCP loss counters grew: by elimination" in table.slow[1].detail
    assert not table.slow[1].evidenced


def test_a_timeout_is_the_jobs_own_connections_not_the_neighbours() -> None:
    noise = NoiseModel(ComputeNoise(spread=0.0, seed=2))
    result = _result(noise, network_s={4: 0.2, 9: 0.05}).model_copy(
        update={"started_monotonic": [100.0 + step for step in range(STEPS)]})
    losses = [{} for _ in range(STEPS)]
    losses[4] = losses[9] = {"TCPTimeouts": 1}  # the node's counters: job and neighbour alike
    leader = result.ranks[4].model_copy(update={"step_tcp_loss": losses})
    result = result.model_copy(update={"ranks": [*result.ranks[:4], leader, *result.ranks[5:]]})
    job = CounterSeries("job n1->n0 timeouts", None, [(100.0, 0), (104.1, 0), (104.2, 1),
                                                      (200.0, 1)])
    neighbour = CounterSeries("neighbour n1->n0 timeouts", None,
                              [(100.0, 0), (109.1, 0), (109.2, 1), (200.0, 1)])
    table = attribute(result, counters=[job, neighbour])
    assert [(row.iteration, row.cause) for row in table.slow] == [(4, "timeout"), (9, "network")]
    assert "job n1->n0 timeouts +1" in table.slow[0].detail
    assert "neighbour n1->n0 timeouts +1" in table.slow[1].detail
    assert [share.cause for share in table.shares] == ["timeout", "network"]


def test_mixed_causes_split_the_tail() -> None:
    noise = NoiseModel(ComputeNoise(spread=0.02, seed=9, stalls=Stalls(
        probability=0.01, scale="60ms", distribution="lognormal", shape=0.01)))
    clean = [s for s in range(STEPS) if not any(
        noise.step(r, r // 4, 3 + s).stall_s for r in range(RANKS))]
    table = attribute(_result(noise, network_s={clean[0]: 0.06, clean[1]: 0.06}), noise=noise)
    shares = {share.cause: share for share in table.shares}
    assert shares["network"].iterations == 2
    assert shares["stall"].iterations == len(table.slow) - 2
    assert sum(share.share for share in table.shares) == pytest.approx(1.0)


def test_a_link_change_in_force_is_network_evidence_and_the_initial_state_is_not() -> None:
    noise = NoiseModel(ComputeNoise(spread=0.0, seed=2))
    result = _result(noise, network_s={4: 0.1, 9: 0.1})
    states = ["initial"] * STEPS
    states[9] = "1 -> 2"
    table = attribute(result, link_states=states)
    assert "by elimination" in table.slow[0].detail
    assert table.slow[1].detail == "collective slow; link schedule: 1 -> 2"


def test_the_tail_table_shows_percentiles_slow_share_and_causes() -> None:
    from rich.console import Console

    from netsim_ddp import Scenario
    from netsim_ddp.report.tail_tables import tail_table
    from netsim_ddp.verdicts.scenario_report import ScenarioReport

    noise = NoiseModel(ComputeNoise(spread=0.02, seed=2, stalls=Stalls(
        probability=0.01, scale="60ms")))
    report = ScenarioReport(Scenario.from_dict({
        "name": "tails", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
        "workload": {"params": "1M", "modes": ["fp32"]}}))
    report.modes = {"fp32": _report(_result(noise), noise)}
    console = Console(width=200, record=True)
    console.print(tail_table(report))
    text = console.export_text()
    iteration = report.modes["fp32"].iteration
    assert f"{iteration.p99 * 1e3:.1f}" in text
    assert f"{iteration.slow_share:.0%}" in text and "100%" in text  # stall explains it all
    assert "*" not in text.split("ms; slow")[0]  # every slow step had its evidence


def test_the_tail_table_marks_a_network_share_named_by_elimination() -> None:
    from rich.console import Console

    from netsim_ddp import Scenario
    from netsim_ddp.report.tail_tables import tail_table
    from netsim_ddp.verdicts.scenario_report import ScenarioReport

    report = ScenarioReport(Scenario.from_dict({
        "name": "tails", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
        "workload": {"params": "1M", "modes": ["fp32"]}}))
    noise = NoiseModel(ComputeNoise(spread=0.0, seed=2))
    report.modes = {"fp32": _report(_result(noise, network_s={4: 0.1}))}
    console = Console(width=200, record=True)
    console.print(tail_table(report))
    assert "100%*" in console.export_text()


def test_a_mode_report_hands_its_sampled_counters_to_the_attribution() -> None:
    # The runner samples the racks' uplink drops while the ranks train (fabric.uplink_sampler)
    # and every mode's report names those inside a slow step's window.
    from netsim_ddp.measure.mode_report import ModeReport

    noise = NoiseModel(ComputeNoise(spread=0.0, seed=2))
    result = _result(noise, network_s={4: 0.1}).model_copy(
        update={"started_monotonic": [100.0 + step for step in range(STEPS)]})
    drops = CounterSeries("uplink r0 up drops", None, [(100.0, 0), (104.05, 35), (200.0, 35)])
    (slow,) = ModeReport(result, 1.0, 0.0, 1e9, counters=[drops]).attribution().slow
    assert (slow.iteration, slow.detail, slow.evidenced) == (
        4, "collective slow; uplink r0 up drops +35", True)
    (bare,) = ModeReport(result, 1.0, 0.0, 1e9).attribution().slow
    assert "by elimination" in bare.detail and not bare.evidenced
