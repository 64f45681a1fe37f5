"""Real forwarders inside a real fabric: their counters read while they run, and one that dies
mid-run ending the launch at once with its exit status and stderr."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest
from pyroute2 import IPRoute

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric
from netsim_ddp.fabric.delayline import DelayLineError
from netsim_ddp.fabric.delayline.health import judge_final, judge_window
from netsim_ddp.fabric.delayline.probes import ProbePath, tcp_bulk
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.run import emulated_site, runner
from netsim_ddp.workload import RankSpec, WorkloadConfig, launch

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]


def scenario(**extra: Any) -> Scenario:
    return Scenario.from_dict({
        "name": "dl-health", "topology": {"nodes": 2},
        "link": {"rate": "500mbit", "delay_backend": "delay-line",
                 "override": [{"node": "n0", "delay": "1ms"}]}, **extra})


def test_counters_are_read_while_it_runs_and_judged_per_window(measure_until) -> None:
    with Fabric(scenario()) as fabric:
        monitor = fabric.delay_lines["n0"]

        def window():
            start = time.monotonic()
            monitor.snapshot_now()
            tcp_bulk(ProbePath.between(fabric.nodes[0], fabric.nodes[1]), seconds=0.5)
            end = time.monotonic()
            during = monitor.snapshot_now()
            (health,) = judge_window({"n0": monitor}, start, end, expect_traffic=True)
            return end, during, health

        # A window a stall made late is measured again (measure_until), as the harness's
        # verdict on its run would say untrusted: a forwarder that is late every time fails.
        end, during, health = measure_until(window, lambda got: got[2].passed)
        assert during["received"] > 1000 and during["monotonic_ns"] >= end * 1e9
        assert health.passed, health.detail
    (final,) = judge_final(fabric.delay_line_stats)
    assert final.passed or "late" in final.detail, final.detail  # whole life: stalls included
    assert fabric.delay_line_stats["n0"]["received"] >= during["received"]


class SleepingRanks:
    """Stands in for a node's torchrun: sleeps inside the node, so only the watchdog can end
    the launch before its timeout."""

    def __init__(self, node: Any) -> None:
        self.node, self.name, self.address = node, node.name, node.address

    def popen(self, argv: Sequence[str], **kwargs: Any):
        return self.node.popen(["sleep", "60"], **kwargs)


def test_a_forwarder_that_dies_mid_run_ends_the_launch_at_once(tmp_path) -> None:
    with Fabric(scenario()) as fabric:
        delay_ns = fabric.plan.nodes[0].delay_netns
        guard = emulated_site.watchdog(fabric)
        calls = []

        def watchdog() -> None:
            calls.append(time.monotonic())
            if len(calls) == 2:  # the ranks run: pull the forwarder's interface from under it
                with netns.entered(delay_ns), IPRoute() as ipr:
                    ipr.link("del", index=ipr.link_lookup(ifname="in")[0])
            guard()

        start = time.monotonic()
        with pytest.raises(DelayLineError) as caught:
            launch([SleepingRanks(node) for node in fabric.nodes],
                   RankSpec(workload=WorkloadConfig(params="10k")), tmp_path, timeout_s=60,
                   watchdog=watchdog)
        elapsed = time.monotonic() - start
    message = str(caught.value)
    assert elapsed < 5, f"took {elapsed:.1f} s to notice"
    assert "the delay line of node n0" in message and "died while the run needed it" in message
    assert "exit code 2" in message and "nsd-delayline: recvmmsg" in message
    assert "error" in fabric.delay_line_stats["n0"]  # and the final check says so
    (dead,) = judge_final(fabric.delay_line_stats)
    assert not dead.passed and "exit code 2" in dead.detail


def _run_killing(tmp_path, monkeypatch, kill) -> tuple[Exception, float]:
    """run_scenario with ranks that only sleep; `kill(fabric, traffic)` runs at the watchdog's
    second call. Returns what run_scenario raised and how long it took."""
    from netsim_ddp.fabric import background

    traffics = []
    real_enter = background.BackgroundTraffic.__enter__

    def enter(self):
        traffics.append(self)
        return real_enter(self)

    def sleeping_launch(nodes, spec, out_dir, timeout_s, *, watchdog=None, **kwargs):
        fabric = nodes[0]._fabric
        calls = []

        def killing_watchdog() -> None:
            calls.append(1)
            if len(calls) == 2:
                kill(fabric, traffics[0])
            assert watchdog is not None, "the runner passed launch no watchdog"
            watchdog()

        return launch([SleepingRanks(node) for node in nodes], spec, out_dir, 60,
                      watchdog=killing_watchdog, **kwargs)

    monkeypatch.setattr(background.BackgroundTraffic, "__enter__", enter)
    monkeypatch.setattr(emulated_site, "launch", sleeping_launch)
    sc = scenario(fidelity={"enabled": False},
                  background=[{"source": "n0", "destination": "n1"}],
                  workload={"params": "10k", "iterations": 2, "warmup": 1})
    start = time.monotonic()
    with pytest.raises(Exception) as caught:
        runner.run_scenario(sc, out_dir=tmp_path)
    return caught.value, time.monotonic() - start


def test_run_ends_at_once_when_its_forwarder_dies(tmp_path, monkeypatch) -> None:
    def kill(fabric, traffic) -> None:
        fabric.delay_lines["n0"].process.kill()

    error, elapsed = _run_killing(tmp_path, monkeypatch, kill)
    assert isinstance(error, DelayLineError) and elapsed < 20
    assert "delay line of node n0" in str(error) and "killed by SIGKILL" in str(error)


def test_run_ends_at_once_when_a_background_sender_dies(tmp_path, monkeypatch) -> None:
    from netsim_ddp.fabric.background import BackgroundError

    def kill(fabric, traffic) -> None:
        sender = next(end for end in traffic._running if end.kind == "sender")
        sender.process.kill()
        sender.process.wait()

    error, elapsed = _run_killing(tmp_path, monkeypatch, kill)
    assert isinstance(error, BackgroundError) and elapsed < 20
    assert "sender in n0 (killed by signal 9" in str(error)
