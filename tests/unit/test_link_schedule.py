"""[[link.schedule]]: validation, the steps it plans, and how a run is read against it
(pure: no namespaces)."""

import ipaddress

import pytest

from netsim_ddp import Scenario, ScenarioError
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.plan import plan_fabric
from netsim_ddp.fabric.schedule import (
    FLAP_RATE_BPS,
    AppliedChange,
    check_applicable,
    counters_continuous,
    iteration_states,
    max_rate_near,
    plan_schedule,
    qdisc_changes,
    state_label,
    state_links,
)

BASE = {"name": "sched", "topology": {"nodes": 3}, "link": {"rate": "1gbit"}}


def scenario(schedule, **link):
    return Scenario.from_dict({**BASE, "link": {"rate": "1gbit", **link, "schedule": schedule}},
                              "s.toml")


def test_a_drop_and_a_flap_become_steps_in_time_order():
    s = scenario([{"at": "1s", "node": "n1", "rate": "250mbit"},
                  {"at": "1.6s", "queue_limit": 50},
                  {"at": "1.7s", "node": 2, "down": "300ms"}])
    steps = plan_schedule(s)
    assert [step.node for step in steps] == [1, 0, 1, 2, 2, 2]
    assert [step.at for step in steps] == pytest.approx([1.0, 1.6, 1.6, 1.6, 1.7, 2.0])
    assert steps[0].link.rate == 250e6 and steps[0].label == "n1 rate 250Mbit/s"
    assert steps[2].link.rate == 250e6  # n1 keeps its drop when its queue changes
    assert steps[2].link.queue_limit_bytes == 50 * 1514
    assert steps[4].link.rate == FLAP_RATE_BPS and steps[4].label == "n2 down 300ms"
    assert steps[-1].label == "n2 back up"  # to the link it had, the queue change included
    assert steps[-1].link == steps[3].link
    states = state_links(s, steps)
    assert len(states) == len(steps) + 1
    assert [link.rate for link in states[1]] == [1e9, 250e6, 1e9]


@pytest.mark.parametrize(("schedule", "field", "reason"), [
    ([{"at": "2s", "rate": "1mbit"}, {"at": "1s", "rate": "2mbit"}], "link.schedule.1.at",
     "in order"),
    ([{"at": "1s", "node": "n9", "rate": "1mbit"}], "link.schedule.0.node", "no node named"),
    ([{"at": "1s", "node": 3, "rate": "1mbit"}], "link.schedule.0.node", "out of range"),
    ([{"at": "1s"}], "link.schedule.0", "at least one"),
    ([{"at": "1s", "rate": "1mbit", "down": "1s"}], "link.schedule.0", "separate entry"),
    ([{"at": "1s", "delay": "5ms"}], "link.schedule.0.delay", "no delay stage"),
    ([{"at": "1s", "node": 0, "down": "1s"}, {"at": "1.5s", "rate": "1mbit"}],
     "link.schedule.1.at", "is down until 2s"),
    ([{"at": "-1s", "rate": "1mbit"}], "link.schedule.0.at", ""),
    ([{"at": "1s", "ratе": "1mbit"}], "link.schedule.0", "unknown key"),
])
def test_bad_schedules_name_the_field(schedule, field, reason):
    with pytest.raises(ScenarioError) as error:
        scenario(schedule)
    assert error.value.path == "s.toml"
    assert error.value.field.startswith(field), error.value
    assert reason in error.value.reason


def plan(s, netem=False):
    return plan_fabric(s, "r1", ipaddress.IPv4Network("10.9.0.0/24"), netem)


def test_changes_reuse_the_built_qdiscs_handles():
    s = scenario([{"at": "1s", "node": "n1", "rate": "250mbit"}])
    node = plan(s).nodes[1]
    changes = qdisc_changes(node, plan_schedule(s)[0].link)
    built = [("node", q) for q in node.egress] + [("switch", q) for q in node.ingress]
    assert [(role, q.kind, q.handle, q.parent) for role, q in changes] == \
        [(role, q.kind, q.handle, q.parent) for role, q in built]
    assert {q.params["rate"] for _, q in changes} == {"250000000bit"}
    check_applicable(plan_schedule(s), plan(s).nodes)  # a rate change applies anywhere


def test_delay_changes_need_netem():
    s = scenario([{"at": "1s", "delay": "5ms"}], delay="1ms")
    check_applicable(plan_schedule(s), plan(s, netem=True).nodes)
    with pytest.raises(FabricError, match="needs netem"):
        check_applicable(plan_schedule(s), plan(s, netem=False).nodes)


def test_iterations_are_labelled_with_their_link_state():
    changes = [AppliedChange("fp32", "n1 rate 250Mbit/s", 1.0, 1.001, 101.0)]
    states = iteration_states([99.0, 100.5, 101.5], [0.4, 0.6, 0.4], changes)
    assert states == [(0, 0), (0, 1), (1, 1)]
    assert state_label(0, changes) == "initial"
    assert state_label(1, changes) == "1: n1 rate 250Mbit/s"


def test_rate_near_a_change_and_counter_restarts():
    # 10 ms samples of a steady 100 Mbit/s, then one 20 ms burst at 1 Gbit/s.
    samples, total = [], 0
    for i in range(100):
        total += 2_500_000 // 8 * 10 // 25 if not 50 <= i < 52 else 1_250_000
        samples.append((i * 0.01, total))
    steady = max_rate_near(samples[:40], 0.2)
    assert steady == pytest.approx(100e6, rel=0.05)
    assert max_rate_near(samples, 0.5) > 400e6
    assert max_rate_near(samples[:3], 0.01) == 0.0  # too few samples to say
    assert counters_continuous(samples)
    assert not counters_continuous(samples + [(1.1, 5)])


class RecordingScheduler:
    """LinkScheduler's thread with netlink replaced by a log of what it would change."""

    @staticmethod
    def make(s, signals):
        import contextlib

        from netsim_ddp.fabric.schedule import LinkScheduler

        class Recording(LinkScheduler):
            applied: list = []

            @contextlib.contextmanager
            def _sockets(self):
                yield {}

            def _apply(self, sockets, index, link):
                self.applied.append((index, link.rate))

            def _sample(self, sockets, window):
                window.counters.setdefault("n1 sends", []).append((0.0, 0))

        p = plan(s)
        return Recording(p.nodes, p.switch_netns, plan_schedule(s), signals)


def wait_for(condition, timeout_s=5.0):
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_each_window_replays_the_schedule_and_restores_the_links(tmp_path):
    s = scenario([{"at": "20ms", "node": "n1", "rate": "250mbit"},
                  {"at": "40ms", "node": "n2", "down": "20ms"}])
    scheduler = RecordingScheduler.make(s, tmp_path)
    with scheduler:
        for count, mode in enumerate(("fp32", "amp"), start=1):
            (tmp_path / f"start-{mode}").touch()
            wait_for(lambda n=count: len(scheduler.windows) == n
                     and len(scheduler.windows[-1].changes) == 3)
            (tmp_path / f"end-{mode}").touch()
            wait_for(lambda: scheduler.windows[-1].end_monotonic is not None)
    one_window = [(1, 250e6), (2, FLAP_RATE_BPS), (2, 1e9), (1, 1e9), (2, 1e9)]  # + restore
    assert scheduler.applied == one_window * 2
    assert [w.mode for w in scheduler.windows] == ["fp32", "amp"]
    for window in scheduler.windows:
        assert [c.at_s for c in window.changes] == pytest.approx([0.02, 0.04, 0.06])
        assert all(c.offset_s >= c.at_s for c in window.changes)


def test_a_failing_change_is_raised_by_stop(tmp_path):
    s = scenario([{"at": "0s", "node": "n1", "rate": "250mbit"}])
    scheduler = RecordingScheduler.make(s, tmp_path)

    def broken(*_args):
        raise OSError("netlink said no")

    scheduler._apply = broken
    scheduler.__enter__()
    (tmp_path / "start-fp32").touch()
    wait_for(lambda: not scheduler._thread.is_alive())
    with pytest.raises(FabricError, match="netlink said no"):
        scheduler.stop()
