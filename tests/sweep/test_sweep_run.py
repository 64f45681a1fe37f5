"""A real sweep, end to end: 1 and 2 emulated nodes at 500 Mbit/s, real DDP runs, the JSON and
the report with its plots."""


import pytest

from netsim_ddp import Scenario
from netsim_ddp.runner import results_document
from netsim_ddp.sweep import SweepConfig, run_sweep

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]


@pytest.fixture(scope="module")
def tiny_sweep():
    scenario = Scenario.from_dict({
        "name": "tiny", "topology": {"nodes": 2}, "link": {"rate": "500mbit"},
        "workload": {"params": "1M", "iterations": 3, "warmup": 1, "batch_size": 8,
                     "modes": ["fp32", "amp-fp16"]}})
    return run_sweep(scenario, SweepConfig(nodes=[1, 2]))


def test_points_measure_efficiency_throughput_and_bytes(tiny_sweep):
    one, two = tiny_sweep.points
    for point in (one, two):
        assert point.report.status in ("passed", "failed"), point.report.error
        assert point.usable
    # The checks that do not need many iterations to be conclusive must pass.
    checks = {check.name: check.passed for check in two.report.checks}
    assert checks["fidelity"] and checks["wire-bytes:amp-fp16/fp32"], checks
    assert one.world_size == 1 and two.world_size == 2
    for point in (one, two):
        assert set(point.report.modes) == {"fp32", "amp-fp16"}
        for numbers in point.mode_numbers().values():
            assert 0 < numbers["scaling_efficiency"] <= 1.5
            assert numbers["throughput_samples_s"] == pytest.approx(
                point.world_size * 8 / numbers["step_s"])
    single, double = one.mode_numbers(), two.mode_numbers()
    # One node sends nothing; two nodes at 500 Mbit/s spend ~70 ms on 4 MB of gradients.
    assert single["fp32"]["wire_bytes_per_iteration"] < 0.01 * double["fp32"][
        "wire_bytes_per_iteration"]
    assert double["fp32"]["scaling_efficiency"] < single["fp32"]["scaling_efficiency"]
    assert double["fp32"]["comm_s"] > 0.04
    ratio = (double["amp-fp16"]["wire_bytes_per_iteration"]
             / double["fp32"]["wire_bytes_per_iteration"])
    assert ratio == pytest.approx(0.5, abs=0.03)


def test_model_and_its_limits_are_reported(tiny_sweep):
    # Two multi-rank points (one per mode) for three parameters: fitted, but flagged; and no
    # held-out check, since the only smaller point (1 node) has no communication to fit.
    assert tiny_sweep.fit is not None and not tiny_sweep.fit.identifiable
    assert tiny_sweep.holdout is None
    assert any("no held-out check" in note for note in tiny_sweep.notes)
    assert any("separate" in note for note in tiny_sweep.notes)
    # What it fitted still reproduces the 2-node points it saw.
    assert tiny_sweep.fit.rms_relative_error < 0.05
    assert 0.5 <= tiny_sweep.fit.model.bandwidth_efficiency <= 1.0
    assert tiny_sweep.projection is not None and len(tiny_sweep.projection.rows) == 2 * 4 * 3


def test_report_from_the_json(tiny_sweep, tmp_path):
    from netsim_ddp.plots import report

    path = tmp_path / "results.json"
    path.write_text(results_document([], [tiny_sweep]).to_json())
    index = report(path, tmp_path / "report")
    text = index.read_text()
    for name in ("scaling-tiny.png", "projection-tiny.png", "wire-bytes-tiny.png",
                 "jitter-tiny-1.png"):
        assert (tmp_path / "report" / name).stat().st_size > 5000
        assert f"]({name})" in text
    assert "PROJECTION" in text and "2 nodes" in text
