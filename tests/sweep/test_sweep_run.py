"""A real sweep, end to end: the shipped scenarios/sweep.toml (1-3 emulated nodes at 1 Gbit/s, two
model sizes, real DDP runs), its points, fit and held-out check, the JSON and the report with its
plots. Its own scenario item then reports this sweep rather than run it again."""

from pathlib import Path

import pytest

from netsim_ddp.verdicts.scenario_report import results_document

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]

SHIPPED = Path(__file__).resolve().parents[2] / "scenarios" / "sweep.toml"


@pytest.fixture(scope="module")
def shipped_sweep(netsim_run):
    sweep = netsim_run(SHIPPED)
    if sweep.status == "untrusted":
        pytest.skip("the shipped sweep was refused here: " + "; ".join(sweep.refusals))
    return sweep


def by_nodes(sweep, params: int):
    """The sweep's points of one model size, by node count."""
    return {point.values["nodes"]: point for point in sweep.points
            if point.values["params"] == params}


def test_points_measure_efficiency_throughput_and_bytes(shipped_sweep):
    assert len(shipped_sweep.points) == 6
    for point in shipped_sweep.points:
        assert point.report.status in ("passed", "failed"), point.report.error
        assert point.usable
        assert set(point.report.modes) == {"fp32", "amp-fp16"}
        batch = point.report.scenario.workload.batch_size
        for numbers in point.mode_numbers().values():
            assert 0 < numbers["scaling_efficiency"] <= 1.5
            assert numbers["throughput_samples_s"] == pytest.approx(
                point.world_size * batch / numbers["step_s"])
        if point.world_size > 1:
            # The checks that do not need many iterations to be conclusive must pass.
            checks = {check.name: check.passed for check in point.report.checks}
            assert checks["fidelity"] and checks["wire-bytes:amp-fp16/fp32"], checks
    for params in (2_000_000, 4_000_000):
        points = by_nodes(shipped_sweep, params)
        assert {nodes: point.world_size for nodes, point in points.items()} == {1: 1, 2: 2, 3: 3}
        single, double = points[1].mode_numbers(), points[2].mode_numbers()
        # One node sends nothing; two at 1 Gbit/s spend ~70 ms (2M) or more on the gradients.
        assert single["fp32"]["wire_bytes_per_iteration"] < 0.01 * double["fp32"][
            "wire_bytes_per_iteration"]
        assert double["fp32"]["scaling_efficiency"] < single["fp32"]["scaling_efficiency"]
        assert double["fp32"]["comm_s"] > 0.04
        ratio = (double["amp-fp16"]["wire_bytes_per_iteration"]
                 / double["fp32"]["wire_bytes_per_iteration"])
        assert ratio == pytest.approx(0.5, abs=0.03)
    # Twice the model, twice the bytes on the wire at the same node count.
    small, large = (by_nodes(shipped_sweep, params)[2].mode_numbers()["fp32"]
                    for params in (2_000_000, 4_000_000))
    assert (large["wire_bytes_per_iteration"] / small["wire_bytes_per_iteration"]
            == pytest.approx(2, rel=0.05))


def test_fit_hold_out_and_projection(shipped_sweep):
    # Fitted on the 1-2 node points, judged on the 3-node points it did not see.
    assert shipped_sweep.fit is not None and shipped_sweep.fit.identifiable
    assert 0.5 <= shipped_sweep.fit.model.bandwidth_efficiency <= 1.0
    held_out = shipped_sweep.held_out
    assert held_out is not None
    assert {point.world_size for point in held_out.held_out} == {3}
    assert len(held_out.errors) == 4  # 2 sizes x 2 modes
    projection = shipped_sweep.projection
    assert projection is not None and len(projection.rows) == 2 * 4 * 3  # modes x GPUs x rates


def test_report_from_the_json(shipped_sweep, tmp_path):
    from netsim_ddp.report.plots import report

    path = tmp_path / "results.json"
    path.write_text(results_document([], [shipped_sweep]).to_json())
    index = report(path, tmp_path / "report")
    text = index.read_text()
    # a jitter plot per point with a network: by the point's index in the sweep
    jitters = [f"jitter-sweep-{index}.png" for index, point in enumerate(shipped_sweep.points)
               if point.world_size > 1]
    assert len(jitters) == 4
    for name in ("scaling-sweep.png", "projection-sweep.png", "wire-bytes-sweep.png", *jitters):
        assert (tmp_path / "report" / name).stat().st_size > 5000
        assert f"]({name})" in text
    assert "PROJECTION" in text and "3 nodes" in text
