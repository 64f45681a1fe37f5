"""[[link.schedule]] for real: a rate drop and a flap applied in place, while traffic flows."""

import threading
import time

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric
from netsim_ddp.fabric.fidelity import measure_goodput
from netsim_ddp.fabric.schedule import (
    LinkScheduler,
    counters_continuous,
    max_rate_near,
    plan_schedule,
)

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]

SCHEDULE = [{"at": "0.5s", "node": "n1", "rate": "250mbit"},
            {"at": "1.3s", "node": "n1", "down": "300ms"}]


def rate_between(samples, start, end):
    inside = [(t, b) for t, b in samples if start <= t <= end]
    (t0, b0), (t1, b1) = inside[0], inside[-1]
    return (b1 - b0) * 8 / (t1 - t0)


def tbf_rates(fabric, node):
    """Each tbf's rate (bits/s) and handle on the node's eth0, as the kernel reports them."""
    ipr = fabric._iproutes[fabric.node(node).netns]
    return [(msg["handle"], msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["rate"] * 8)
            for msg in ipr.get_qdiscs(index=2) if msg.get_attr("TCA_KIND") == "tbf"]


def wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_drop_and_flap_apply_in_place_under_traffic(tmp_path, measure_until):
    scenario = Scenario.from_dict({"name": "sched", "topology": {"nodes": 2},
                                   "link": {"rate": "1gbit", "schedule": SCHEDULE}})
    with Fabric(scenario) as fabric:
        plan = fabric.plan
        before = fabric.qdiscs("n1")
        assert tbf_rates(fabric, "n1")[0][1] == pytest.approx(1e9, rel=0.01)

        def one_window():
            signals = tmp_path / f"try{len(list(tmp_path.iterdir()))}"
            signals.mkdir()
            scheduler = LinkScheduler(plan.nodes, plan.switch_netns, plan_schedule(scenario),
                                      signals)
            with scheduler:
                flow = threading.Thread(target=measure_goodput, args=(
                    fabric.nodes[0], fabric.nodes[1], 2.0, 0.1))
                flow.start()
                (signals / "start-fp32").touch()
                wait_for(lambda: scheduler.windows and len(scheduler.windows[0].changes) == 3)
                mid = tbf_rates(fabric, "n1")
                flow.join()
                (signals / "end-fp32").touch()
                wait_for(lambda: scheduler.windows[0].end_monotonic is not None)
            return scheduler.windows[0], mid

        def on_time(got):
            return all(due <= change.offset_s < due + 0.05 for change, due in zip(
                got[0].changes, [0.5, 1.3, 1.6], strict=True))

        # A change the host's scheduler stalled lands late: the window is measured again
        # (measure_until); a scheduler late every time fails below.
        window, mid = measure_until(one_window, on_time)
        after = fabric.qdiscs("n1")
        restored = tbf_rates(fabric, "n1")
    # Logged in order, each applied when due.
    assert [c.label for c in window.changes] == ["n1 rate 250Mbit/s", "n1 down 300ms",
                                                 "n1 back up"]
    for change, due in zip(window.changes, [0.5, 1.3, 1.6], strict=True):
        assert due <= change.offset_s < due + 0.05
    # In place: the same qdiscs, counters that never restarted; the drop held through the flap's
    # end ("back up" returns to 250 Mbit/s), and the window's end restored 1 Gbit/s.
    assert [(q["kind"], q["handle"]) for q in after] == [(q["kind"], q["handle"]) for q in before]
    assert after[0]["bytes"] > before[0]["bytes"]
    assert mid[0][1] == pytest.approx(250e6, rel=0.01)
    assert restored[0][1] == pytest.approx(1e9, rel=0.01)
    received = window.counters["n1 receives"]
    assert counters_continuous(received) and counters_continuous(window.counters["n1 sends"])
    start = window.start_monotonic
    assert rate_between(received, start + 0.1, start + 0.45) > 600e6  # 1 Gbit/s at first
    assert rate_between(received, start + 0.6, start + 1.25) == pytest.approx(250e6, rel=0.1)
    assert rate_between(received, start + 1.35, start + 1.55) < 5e6  # down
    for change in window.changes:  # no burst above the higher cap around any change
        assert max_rate_near(received, change.monotonic_s) <= 1.05e9 + 8 * 500_000 / 0.05
    assert max_rate_near(received, start + 0.9, span_s=0.3) <= 1.05 * 250e6 + 8 * 127_000 / 0.05
