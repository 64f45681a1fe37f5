"""The kernel's evidence of loss in a real run: a lossy scale model reports its retransmissions
per mode and node, ran with its TCP clocks dilated, and says so in a check."""

import pytest

from netsim_ddp import Scenario
from netsim_ddp.report.tables import mode_table

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]


def test_a_lossy_scale_model_reports_its_retransmissions_on_a_dilated_clock(netsim_run):
    scenario = Scenario.from_dict({
        "name": "tcp-loss", "topology": {"nodes": 2},
        "link": {"rate": "400mbit", "delay": "1ms", "loss": "1%"},
        "emulation": {"dilation": 2}, "fidelity": {"enabled": False},
        "workload": {"params": "2M", "iterations": 3, "warmup": 1, "batch_size": 8,
                     "modes": ["fp32"]}})
    report = netsim_run(scenario)
    record = report.to_record()
    # The kernel held the target's 200 ms minimum RTO x 2 in every node.
    assert {node: settings["tcp_rto_min_us"] for node, settings in
            record.network.tcp.items()} == {"n0": "400000", "n1": "400000"}
    nodes = record.modes["fp32"].tcp_counters
    assert sorted(node.node_rank for node in nodes) == [0, 1]
    # 1% of ~6000 segments per iteration each way were dropped by the delay line: TCP resent.
    assert sum(node.counters["RetransSegs"] for node in nodes) > 0
    checks = {check.name: check for check in report.checks}
    assert checks["fidelity:tcp:fp32"].passed, checks["fidelity:tcp:fp32"].detail
    assert "RetransSegs" in checks["fidelity:tcp:fp32"].detail
    table = mode_table(report)
    assert "tcp loss in the window" in str(table.caption) and "fp32 retx" in str(table.caption)
    assert [column.header for column in table.columns][0] == "mode"
