"""The sweep pipeline without a network: a stand-in runner returns what a known cost model says
each point costs, so run_sweep, the fit, the held-out check, the projection, the JSON and the
report can be checked against known answers in a second."""

import json
import math
import random

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.projection.costmodel import CostModel, StepPoint
from netsim_ddp.run.sweep import point_scenario, run_sweep, split_largest
from netsim_ddp.scenario.sweep_spec import SweepConfig
from netsim_ddp.verdicts.scenario_report import ScenarioReport, results_document
from netsim_ddp.workload import ModeResult, RankSamples

TRUE = CostModel(alpha_s=0.003, bandwidth_efficiency=0.93, overlap=0.2)
BYTES_PER_PARAM = {"fp32": 4, "amp": 4, "amp-fp16": 2}
COMPUTE_PER_PARAM = {"fp32": 15e-9, "amp": 12e-9, "amp-fp16": 12e-9}


def base(**workload):
    return Scenario.from_dict({
        "name": "synthetic", "topology": {"nodes": 2, "names": ["a", "b"]},
        "link": {"rate": "1gbit"},
        "workload": {"params": "4M", "iterations": 5, "warmup": 1, "batch_size": 16,
                     "modes": ["fp32", "amp", "amp-fp16"], **workload}})


def fake_runner(model=TRUE, noise=0.0, seed=0, calls=None):
    rng = random.Random(seed)

    def run(scenario, **kwargs):
        if calls is not None:
            calls.append(scenario)
        workload = scenario.workload
        world = scenario.topology.nodes * scenario.topology.ranks_per_node
        link, _ = slowest_link_goodput(scenario)
        report = ScenarioReport(scenario, run_id="fake")
        buckets = math.ceil(workload.params * 4 / workload.bucket_size)
        for mode in workload.modes:
            sent = workload.params * BYTES_PER_PARAM[mode]
            compute = 0.01 + workload.params * COMPUTE_PER_PARAM[mode]
            point = StepPoint(mode, world, link, sent, buckets, compute)
            steps = [model.step_s(point) * (1 + noise * rng.gauss(0, 1))
                     for _ in range(workload.iterations)]
            computes = [compute] * workload.iterations
            rank = RankSamples(rank=0, local_rank=0, hostname="h", iteration_s=steps,
                               compute_s=computes, comm_s=[s - compute for s in steps],
                               sent_bytes=[sent] * len(steps), buckets=[buckets] * len(steps),
                               wire_dtypes=[], loss=[], skipped_steps=0, param_digest="x")
            result = ModeResult(
                mode=mode, model="mlp", params=workload.params,
                params_requested=workload.params, world_size=world, local_world_size=1,
                backend="gloo", device="cpu", socket_ifname=None,
                batch_size=workload.batch_size, grad_accumulation=1,
                bucket_size=workload.bucket_size, warmup=1, iterations=len(steps),
                profiled=False, iteration_s=steps, compute_s=computes,
                comm_s=[max(0.0, s - compute) for s in steps], sent_bytes_per_iteration=sent,
                ranks=[rank])
            wire = 2 * (world - 1) / world * sent * world * 1514 / 1448 if world > 1 else 0.0
            report.modes[mode] = ModeReport(result, wire, 0.0, link)
        return report

    return run


def test_sweep_points_are_the_cross_product_and_valid_scenarios():
    config = SweepConfig(nodes=[1, 2, 4], rate=["500mbit", "1gbit"])
    points = config.points()
    assert len(points) == 6 and points[0] == {"nodes": 1, "rate": 500e6}
    scenario = point_scenario(base(), {"nodes": 4, "rate": 500e6, "params": 2_000_000})
    assert scenario.topology.nodes == 4 and scenario.topology.names is None  # names dropped
    assert scenario.link.rate == 500e6 and scenario.workload.params == 2_000_000
    assert scenario.name == "synthetic[4 nodes, 500mbit, 2M]"
    with pytest.raises(ValueError, match="at least one"):
        SweepConfig().points()
    with pytest.raises(ValueError):
        SweepConfig(nodes=[0, 2])


def test_run_sweep_fits_checks_and_projects_known_costs(tmp_path):
    calls = []
    config = SweepConfig(nodes=[1, 2, 3, 4], params=["2M", "4M"])
    sweep = run_sweep(base(), config, runner=fake_runner(calls=calls))
    # A single node runs one mode at a time (runner divides by fp32's wire bytes, 0 there).
    single = [s for s in calls if s.topology.nodes == 1]
    assert len(single) == 6 and all(len(s.workload.modes) == 1 for s in single)
    assert len(sweep.points) == 8 and all(p.usable for p in sweep.points)
    assert set(sweep.points[0].report.modes) == {"fp32", "amp", "amp-fp16"}
    model = sweep.fit.model
    assert model.alpha_s == pytest.approx(TRUE.alpha_s, rel=1e-3)
    assert model.bandwidth_efficiency == pytest.approx(TRUE.bandwidth_efficiency, rel=1e-3)
    assert model.overlap == pytest.approx(TRUE.overlap, abs=1e-3)
    # Held out: the 4-node points (both model sizes), every mode, predicted from 1-3 nodes.
    held = sweep.held_out.held_out
    assert {p.world_size for p in held} == {4} and len(held) == 6
    assert sweep.held_out.max_abs_error < 1e-3 and sweep.passed
    # Efficiency and throughput per mode per point.
    one, four = sweep.points[0].mode_numbers(), sweep.points[-1].mode_numbers()
    assert one["fp32"]["scaling_efficiency"] == pytest.approx(1.0)
    assert four["amp-fp16"]["scaling_efficiency"] > four["fp32"]["scaling_efficiency"]
    assert four["fp32"]["throughput_samples_s"] == pytest.approx(
        4 * 16 / four["fp32"]["step_s"])
    # Projection: every mode x GPUs x rate, from the 4M model's bytes.
    projection = sweep.projection
    assert len(projection.rows) == 3 * 4 * 3
    assert projection.bytes_per_rank["amp-fp16"] == 8_000_000
    assert projection.efficiency("fp32", 16, 100e9) > projection.efficiency("fp32", 16, 10e9)


def test_a_noisy_sweep_that_misses_the_target_says_so():
    # A host that adds 30% to the 4-node points only: the model cannot know, the check fails.
    def runner(scenario, **kwargs):
        report = fake_runner()(scenario, **kwargs)
        if scenario.topology.nodes == 4:
            for mode in report.modes.values():
                mode.result.iteration_s = [s * 1.3 for s in mode.result.iteration_s]
                mode.__post_init__()
        return report

    sweep = run_sweep(base(), SweepConfig(nodes=[2, 3, 4], params=["2M", "4M"]), runner=runner)
    assert not sweep.held_out.met and sweep.status == "failed"
    assert sweep.held_out.max_abs_error > 0.15


def slowed_runner(factor, steal):
    """fake_runner, with the 4-node points slowed by `factor` and the hypervisor taking
    `steal` of the CPU while every point trained."""
    from netsim_ddp.hostfacts.hostload import CpuLoad

    def run(scenario, **kwargs):
        report = fake_runner()(scenario, **kwargs)
        report.host_load = CpuLoad(busy=0.8, steal=steal, softirq=0.01)
        if scenario.topology.nodes == 4:
            for mode in report.modes.values():
                mode.result.iteration_s = [s * factor for s in mode.result.iteration_s]
                mode.__post_init__()
        return report

    return run


def test_a_held_out_missed_while_the_hypervisor_stole_cpu_is_not_judged():
    config = SweepConfig(nodes=[2, 3, 4], params=["2M", "4M"])
    sweep = run_sweep(base(), config, runner=slowed_runner(1.3, steal=0.2))
    assert sweep.status == "untrusted" and sweep.steal == 0.2
    (reason,) = sweep.refusals
    assert "missed the held-out points" in reason and "took up to 20%" in reason
    assert results_document([], [sweep]).dump()["sweeps"][0]["refusals"] == [reason]
    # Steal alone does not refuse a sweep whose model held, nor a little steal excuse a miss.
    assert run_sweep(base(), config, runner=slowed_runner(1.0, steal=0.2)).status == "passed"
    assert run_sweep(base(), config, runner=slowed_runner(1.3, steal=0.01)).status == "failed"


def test_split_and_notes_when_there_is_nothing_to_hold_out():
    sweep = run_sweep(base(), SweepConfig(rate=["1gbit"]), runner=fake_runner())
    assert sweep.held_out is None and any("one size" in n for n in sweep.notes)
    train, held = split_largest(sweep.points)
    assert held == [] and train == sweep.points


def test_user_compute_time_and_model_size_drive_the_projection():
    config = SweepConfig(nodes=[2, 3, 4], params=["2M", "4M"],
                         projection={"compute": "200ms", "params": "100M", "gpus": [16],
                                     "rates": ["100gbit"]})
    sweep = run_sweep(base(), config, runner=fake_runner())
    p = sweep.projection
    assert p.compute_s == {"fp32": 0.2, "amp": 0.2, "amp-fp16": 0.2}
    assert p.bytes_per_rank["fp32"] == pytest.approx(400e6)
    assert p.buckets["fp32"] == math.ceil(400e6 / (25 * 2**20))
    (row,) = [r for r in p.rows if r["mode"] == "fp32"]
    point = StepPoint("fp32", 16, 100e9, 400e6, p.buckets["fp32"], 0.2)
    assert row["efficiency"] == pytest.approx(sweep.fit.model.efficiency(point))
    # The target cluster's latency instead of this host's: said so, and used.
    fast = run_sweep(base(), config.model_copy(update={"projection": config.projection.model_copy(
        update={"alpha": 20e-6})}), runner=fake_runner()).projection
    assert fast.model.alpha_s == 20e-6 and "as given" in " ".join(fast.assumptions())
    assert fast.efficiency("fp32", 16, 100e9) > p.efficiency("fp32", 16, 100e9)


def test_json_document_and_report(tmp_path):
    sweep = run_sweep(base(), SweepConfig(nodes=[1, 2, 3, 4]), runner=fake_runner(noise=0.02))
    document = json.loads(results_document([sweep.points[1].report], [sweep]).to_json())
    assert document["scenarios"][0]["name"] == "synthetic[2 nodes]"
    (entry,) = document["sweeps"]
    assert entry["axes"] == {"nodes": [1, 2, 3, 4]}
    point = entry["points"][2]
    assert point["values"] == {"nodes": 3} and point["world_size"] == 3
    assert set(point["modes"]["fp32"]) >= {"step_s", "compute_s", "comm_s",
                                           "scaling_efficiency", "throughput_samples_s",
                                           "wire_bytes_per_iteration", "buckets"}
    assert point["scenario"]["modes"]["fp32"]["iteration_s"]  # the per-scenario dict, whole
    assert set(entry["held_out"]) >= {"fit", "held_out", "errors_by_mode", "max_abs_error",
                                     "target", "within_target"}
    assert "not measured" in entry["projection"]["label"]
    assert entry["projection"]["assumptions"]
    # A document saved before `holdout` was spelled `held_out` reads the same check.
    from netsim_ddp.measure.document import parse_document

    old = json.loads(json.dumps(document))
    old["sweeps"][0]["holdout"] = old["sweeps"][0].pop("held_out")
    (read,) = parse_document(old).sweeps
    assert read.held_out is not None and read.held_out.max_abs_error == entry["held_out"][
        "max_abs_error"]
    assert "holdout" not in json.loads(read.model_dump_json())

    from netsim_ddp.report.plots import report

    path = tmp_path / "out.json"
    path.write_text(json.dumps(document))
    index = report(path, tmp_path / "report")
    text = index.read_text()
    pngs = sorted(p.name for p in (tmp_path / "report").glob("*.png"))
    assert {"scaling-synthetic.png", "projection-synthetic.png", "wire-bytes.png",
            "wire-bytes-synthetic.png"} <= set(pngs)
    assert any(name.startswith("jitter-") for name in pngs)
    for name in pngs:
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name})" in text  # every plot is embedded
    assert "PROJECTION" in text and "held-out" in text
    assert (tmp_path / "report" / "report.html").read_text().count("<img") == len(pngs)


def test_sweep_file_loads(tmp_path):
    from pathlib import Path

    from netsim_ddp import ScenarioError

    root = Path(__file__).resolve().parents[2]
    scenario = Scenario.load(root / "scenarios" / "sweep.toml")
    config = scenario.sweep
    assert config.nodes == [1, 2, 3] and scenario.name == "sweep"
    assert config.projection.rates == [10e9, 25e9, 100e9]  # above tbf's ceiling: never built
    bad = tmp_path / "bad.toml"
    bad.write_text((root / "scenarios" / "sweep.toml").read_text().replace(
        "target_error = 0.15", "target_eror = 0.15"))
    with pytest.raises(ScenarioError, match="sweep.target_eror"):
        Scenario.load(bad)
    old = tmp_path / "old.toml"  # the field's earlier spelling still reads
    old.write_text((root / "scenarios" / "sweep.toml").read_text().replace(
        'held_out = "largest"', 'holdout = "none"'))
    assert Scenario.load(old).sweep.held_out == "none"


def refusing_runner(refuse_nodes, fail_nodes=()):
    """fake_runner, but points at `refuse_nodes` are refused and those at `fail_nodes` fail."""
    from netsim_ddp.verdicts.gate import Verdict

    def run(scenario, **kwargs):
        nodes = scenario.topology.nodes
        if nodes in refuse_nodes:
            return ScenarioReport(scenario, run_id="fake", refused=f"slow host at {nodes} nodes")
        report = fake_runner()(scenario, **kwargs)
        if nodes in fail_nodes:
            report.checks.append(Verdict("wire-bytes", False, "did not compress"))
        return report

    return run


def test_untrusted_points_make_an_untrusted_sweep_not_a_failed_one():
    sweep = run_sweep(base(), SweepConfig(nodes=[1, 2, 3, 4]), runner=refusing_runner({2}))
    assert sweep.status == "untrusted" and not sweep.passed
    assert sweep.refusals == ["point 2 nodes: slow host at 2 nodes"]
    assert "point 2 nodes: untrusted (slow host at 2 nodes), left out of the model" in sweep.notes
    assert sweep.fit is not None  # the other points are still fitted
    assert results_document([], [sweep]).dump()["sweeps"][0]["status"] == "untrusted"


def test_a_refused_point_leaves_the_hold_out_unjudged():
    # With 2 nodes refused, the fit sees 1 and 3 nodes only; the 4-node prediction misses
    # because of what this host could not measure, which is no verdict on the network.
    def runner(scenario, **kwargs):
        report = refusing_runner({2})(scenario, **kwargs)
        if scenario.topology.nodes == 4:
            for mode in report.modes.values():
                mode.result.iteration_s = [s * 1.3 for s in mode.result.iteration_s]
                mode.__post_init__()
        return report

    sweep = run_sweep(base(), SweepConfig(nodes=[1, 2, 3, 4], params=["2M", "4M"]),
                      runner=runner)
    assert not sweep.held_out.met and sweep.status == "untrusted"


def test_a_failed_point_outweighs_a_refused_one():
    sweep = run_sweep(base(), SweepConfig(nodes=[2, 3]), runner=refusing_runner({2}, {3}))
    assert sweep.status == "failed"


def test_a_sweep_of_one_and_two_nodes_fits_but_says_what_it_cannot_tell():
    # One size on 1 and 2 nodes: the 1-node points carry no communication, so the two 2-node
    # points (one per mode) are all the fit has for three parameters, and nothing is left to
    # hold out. The model is fitted and flagged, and still reproduces what it saw.
    sweep = run_sweep(base(modes=["fp32", "amp-fp16"]), SweepConfig(nodes=[1, 2]),
                      runner=fake_runner())
    assert sweep.fit is not None and not sweep.fit.identifiable
    assert sweep.held_out is None
    assert any("no held-out check" in note for note in sweep.notes)
    assert any("separate" in note for note in sweep.notes)
    assert sweep.fit.rms_relative_error < 0.05
    assert sweep.projection is not None
