"""Checks a link schedule adds, on synthetic runs: the slowdown the rates predict, and no burst
above the cap while a change happens."""

from types import SimpleNamespace

import pytest

from netsim_ddp import Scenario
from netsim_ddp.common.metrics import ring_allreduce_lower_bound
from netsim_ddp.fabric.fidelity import expected_goodput
from netsim_ddp.fabric.schedule import AppliedChange, ModeWindow
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.verdicts.schedule_checks import attach_link_states, schedule_checks
from netsim_ddp.workload.contract.mode_result import ModeResult

SCENARIO = Scenario.from_dict({
    "name": "drop", "topology": {"nodes": 2}, "link": {"rate": "1gbit", "schedule": [
        {"at": "1s", "node": "n1", "rate": "250mbit"}]},
    "workload": {"params": "2M", "modes": ["fp32"]}})
BYTES = 8_000_000
EXTRA = (ring_allreduce_lower_bound(BYTES, 2, expected_goodput(250e6, 1500))
         - ring_allreduce_lower_bound(BYTES, 2, expected_goodput(1e9, 1500)))


def run(after_s, n_before=5, n_after=5, burst_bps=None):
    before = [0.1] * n_before
    after = [after_s] * n_after
    series = before + after
    starts, t = [], 100.0
    for value in series:
        starts.append(t)
        t += value + 0.05
    change_at = starts[n_before] - 0.01  # between the two groups
    result = ModeResult.model_construct(
        mode="fp32", iteration_s=series, compute_s=[0.02] * len(series), comm_s=series,
        collective_s=series, started_monotonic=starts, sent_bytes_per_iteration=BYTES,
        world_size=2, iterations=len(series), params=2_000_000, ranks=[],
        profiler_allreduce_s=None)
    window = ModeWindow("fp32", 100.0, t, [AppliedChange("fp32", "n1 rate 250Mbit/s", 1.0,
                                                          change_at - 100.0, change_at)])
    rate = burst_bps or 240e6
    samples = [(change_at - 0.3 + i * 0.01, int(i * 0.01 * rate / 8)) for i in range(61)]
    window.counters = {"n1 receives": samples}
    mode = ModeReport(result, 1.0, 0.0, 1e9)
    return {"fp32": mode}, SimpleNamespace(windows=[window])


def by_name(checks):
    return {check.name: check for check in checks}


def test_the_predicted_slowdown_passes_and_a_wrong_one_fails():
    modes, scheduler = run(0.1 + EXTRA)
    attach_link_states(modes, scheduler)
    assert modes["fp32"].link_states[:6] == ["initial"] * 5 + ["1: n1 rate 250Mbit/s"]
    checks = by_name(schedule_checks(SCENARIO, modes, scheduler))
    slowdown = checks["schedule:slowdown:fp32:1"]
    assert slowdown.passed, slowdown.detail
    assert "predict" in slowdown.detail
    assert checks["schedule:shaping:fp32"].passed
    modes, scheduler = run(0.1)  # the drop changed nothing: the rate was not applied
    assert not by_name(schedule_checks(SCENARIO, modes, scheduler))[
        "schedule:slowdown:fp32:1"].passed


def test_too_few_iterations_after_the_change_fail():
    modes, scheduler = run(0.1 + EXTRA, n_after=2)
    check = by_name(schedule_checks(SCENARIO, modes, scheduler))["schedule:slowdown:fp32:1"]
    assert not check.passed and "only 2 iterations" in check.detail


def test_a_burst_above_the_cap_fails_the_shaping_check():
    modes, scheduler = run(0.1 + EXTRA, burst_bps=2e9)
    check = by_name(schedule_checks(SCENARIO, modes, scheduler))["schedule:shaping:fp32"]
    assert not check.passed and "2000 Mbit/s" in check.detail
    assert EXTRA == pytest.approx(0.20, rel=0.02)  # 64 Mbit at 239 minus at 957 Mbit/s
