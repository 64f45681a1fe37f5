"""The delay line's health, without namespaces: its counters judged against the bounds, a
dead forwarder named with its exit status and stderr, and launch's watchdog ending a run."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from netsim_ddp.fabric.delayline import DelayLineError
from netsim_ddp.fabric.delayline.health import (
    LATE_FLOOR_S,
    ForwarderMonitor,
    judge,
    judge_final,
    judge_window,
    late_bound_s,
)
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.verdicts import run_checks
from netsim_ddp.workload import RankSpec, WorkloadConfig, launch


def counters(t_s: float, received: int, late: int = 0, **extra: int) -> dict[str, float]:
    return {"monotonic_ns": t_s * 1e9, "received": received, "forwarded": received,
            "late_over_bound": late, "late_bound_us": 500.0, "dropped_queue_full": 0,
            "dropped_socket": 0, "dropped_truncated": 0, "tx_errors": 0, **extra}


def test_late_bound_is_a_floor_or_a_quarter_of_the_delay() -> None:
    assert late_bound_s(0.0001) == LATE_FLOOR_S
    assert late_bound_s(0.010) == pytest.approx(0.0025)


def test_a_clean_window_passes_with_its_numbers() -> None:
    health = judge("n0", counters(1, 100), counters(2, 50_100, late=400), expect_traffic=True)
    assert health.passed
    assert health.detail == "n0: 50000 frames, 0 dropped unasked, 400 more than 500 us late"


def test_drops_beyond_the_bound_fail_with_the_numbers() -> None:
    health = judge("n0", counters(1, 0), counters(2, 10_000, dropped_queue_full=3,
                                                  dropped_socket=2), expect_traffic=True)
    assert not health.passed
    assert "dropped 5 of 10000 frames unasked (queue_full 3, socket 2" in health.detail


def test_any_transmit_error_fails() -> None:
    health = judge("n1", counters(1, 0), counters(2, 10_000, tx_errors=1), expect_traffic=True)
    assert not health.passed and "1 frames failed to send" in health.detail


def test_lateness_beyond_the_p98_fails() -> None:
    health = judge("n0", counters(1, 0), counters(2, 1000, late=21), expect_traffic=True)
    assert not health.passed
    assert "21 of 1000 frames (2.1%) left more than 500 us after their due time" in health.detail
    assert judge("n0", counters(1, 0), counters(2, 1000, late=20), expect_traffic=True).passed


def test_reordering_on_a_link_without_jitter_fails() -> None:
    """Issue 21: netem keeps order without jitter, and TCP reads reordering as loss."""
    health = judge("n0", counters(1, 0), counters(2, 10_000, reordered=1, jitter_us=0),
                   expect_traffic=True)
    assert not health.passed
    assert "1 frames left after a frame that arrived after them, on a link without jitter" \
        in health.detail
    # Counted before the window: not this window's.
    assert judge("n0", counters(1, 0, reordered=4), counters(2, 10_000, reordered=4),
                 expect_traffic=True).passed


def test_reordering_by_jitter_is_reported_not_failed() -> None:
    health = judge("n0", counters(1, 0), counters(2, 10_000, reordered=250, jitter_us=100),
                   expect_traffic=True)
    assert health.passed
    assert health.detail.endswith("0 more than 500 us late, 250 reordered by jitter")


def test_runner_fails_a_run_whose_line_reordered_without_jitter() -> None:
    monitor = SimpleNamespace(snapshots=[
        {"monotonic_ns": 0}, counters(2.0, 5000), counters(4.0, 9000, reordered=2)])
    final = {"n0": {**counters(5, 9000, reordered=2), "jitter_us": 0.0, "late_p99_us": 80}}
    checks = run_checks.delay_line_checks({"n0": monitor}, final,
                                      {"fp32": _mode_result(2.1, 3.9)}, multi_node=True)
    assert [(check.name, check.passed) for check in checks] == [
        ("delay-line:fp32", False), ("delay-line", False)]
    assert all("2 frames left after a frame that arrived after them" in check.detail
               for check in checks)


def test_a_line_that_saw_nothing_while_ranks_trained_fails() -> None:
    health = judge("n0", counters(1, 500), counters(2, 500), expect_traffic=True)
    assert not health.passed and "received no frame" in health.detail
    assert judge("n0", counters(1, 500), counters(2, 500), expect_traffic=False).passed


def test_window_uses_the_counters_around_it() -> None:
    """Drops before the window belong to another mode; only its own growth is judged."""
    monitor = SimpleNamespace(snapshots=[
        {"monotonic_ns": 0}, counters(1.0, 1000, dropped_socket=50),
        counters(1.5, 2000, dropped_socket=50), counters(3.0, 9000, dropped_socket=50),
        counters(3.5, 9500, dropped_socket=90)])
    (inside,) = judge_window({"n0": monitor}, 1.2, 2.9, expect_traffic=True)
    assert inside.passed and inside.detail.startswith("n0: 8000 frames, 0 dropped")
    (later,) = judge_window({"n0": monitor}, 3.1, 3.4, expect_traffic=True)
    assert not later.passed and "dropped 40 of 500" in later.detail
    (unreported,) = judge_window({"n0": monitor}, 3.1, 4.0, expect_traffic=True)
    assert not unreported.passed and "no counters reported after the window" in unreported.detail


def test_final_check_turns_a_recorded_death_into_a_failure() -> None:
    dead, fine = judge_final({"n0": {"error": "the delay line of node n0 died: exit code 2"},
                              "n1": {**counters(9, 100), "late_p99_us": 40}})
    assert not dead.passed and "exit code 2" in dead.detail
    assert fine.passed and fine.detail.endswith("late p99 40 us")


def _mode_result(start_s: float, end_s: float) -> Any:
    marks = [{"monotonic_s": start_s, "sent_bytes": 0}, {"monotonic_s": end_s, "sent_bytes": 1}]
    return SimpleNamespace(ranks=[SimpleNamespace(link_marks=marks)])


def test_runner_judges_each_mode_and_the_whole_run() -> None:
    monitor = SimpleNamespace(snapshots=[
        {"monotonic_ns": 0}, counters(2.0, 5000), counters(4.0, 9000, dropped_queue_full=30)])
    final = {"n0": {**counters(5, 9000, dropped_queue_full=30), "late_p99_us": 80}}
    checks = run_checks.delay_line_checks(
        {"n0": monitor}, final, {"fp32": _mode_result(0.5, 1.9), "amp": _mode_result(2.1, 3.9)},
        multi_node=True)
    by_name = {check.name: check for check in checks}
    assert list(by_name) == ["delay-line:fp32", "delay-line:amp", "delay-line"]
    assert by_name["delay-line:fp32"].passed
    assert not by_name["delay-line:amp"].passed
    assert "dropped 30 of 4000 frames unasked (queue_full 30" in by_name["delay-line:amp"].detail
    assert not by_name["delay-line"].passed and "late p99 80 us" in by_name["delay-line"].detail
    assert run_checks.delay_line_checks({}, {}, {"fp32": _mode_result(0, 1)}, True) == []


# -- a forwarder that dies -------------------------------------------------------------------

def _fake_forwarder(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_dead_forwarder_is_named_with_its_exit_and_stderr() -> None:
    process = _fake_forwarder(
        "import sys; sys.stderr.write('nsd-delayline: recvmmsg: Network is down\\n'); "
        "sys.exit(2)")
    monitor = ForwarderMonitor("n0", process)
    process.wait()
    with pytest.raises(DelayLineError) as caught:
        monitor.check_alive()
    message = str(caught.value)
    assert "delay line of node n0" in message and "exit code 2" in message
    assert "recvmmsg: Network is down" in message
    assert isinstance(caught.value, FabricError)  # a run records it as an error and goes on
    with pytest.raises(DelayLineError, match="had died before the run ended"):
        monitor.stop(grace_s=1)


def test_a_forwarder_that_reports_nothing_at_stop_is_an_error() -> None:
    process = _fake_forwarder("import signal, sys; signal.signal(signal.SIGTERM, "
                              "lambda *a: sys.exit(0)); print('{\"event\": \"ready\"}', "
                              "flush=True); signal.pause()")
    process.stdout.readline()  # ready: what wait_ready consumes
    monitor = ForwarderMonitor("n1", process)
    with pytest.raises(DelayLineError, match="exited without reporting its counters"):
        monitor.stop(grace_s=5)


# -- launch's watchdog -----------------------------------------------------------------------

@dataclass
class SleepingNode:
    """A node whose "torchrun" just sleeps: the watchdog, not the ranks, must end the launch."""

    name: str
    address: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        process = subprocess.Popen(["sleep", "60"], **kwargs)
        self.started.append(process)
        return process


def test_watchdog_ends_the_launch_at_once_and_kills_the_ranks(tmp_path) -> None:
    nodes = [SleepingNode("n0"), SleepingNode("n1")]
    calls = []

    def watchdog() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise DelayLineError("the delay line of node n0 died")

    start = time.monotonic()
    with pytest.raises(DelayLineError, match="node n0 died"):
        launch(nodes, RankSpec(workload=WorkloadConfig(params="10k")), tmp_path, timeout_s=60,
               watchdog=watchdog)
    assert time.monotonic() - start < 5
    assert [len(node.started) for node in nodes] == [1, 1]  # each node's "torchrun", killed
    assert all(p.poll() is not None for node in nodes for p in node.started)
