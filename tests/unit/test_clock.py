"""The job's clock: offsets to node 0's clock, found as NTP finds them."""

from __future__ import annotations

import pytest

from netsim_ddp.common import clock


class FakeHosts:
    """Two clocks 1000 s apart; each exchange takes `delays[i]` out and back again."""

    def __init__(self, delays: list[float]):
        self.now = 50.0  # this host's clock
        self.delays = iter(delays)

    def local(self) -> float:
        return self.now

    def exchange(self) -> float:
        delay = next(self.delays)
        self.now += delay
        theirs = self.now + 1000.0
        self.now += delay
        return theirs


def test_offset_comes_from_the_fastest_round_trip() -> None:
    hosts = FakeHosts([0.2, 0.001, 0.05])
    offset, error = clock.estimate_offset(hosts.exchange, rounds=3, clock=hosts.local)
    assert offset == pytest.approx(1000.0)
    assert error == pytest.approx(0.001)


def test_an_asymmetric_trip_is_within_the_error_bound() -> None:
    now = [0.0]

    def exchange() -> float:  # 10 ms there, nothing back: the reference reads 7.0 + 0.01
        now[0] += 0.01
        return now[0] + 7.0

    offset, error = clock.estimate_offset(exchange, rounds=1, clock=lambda: now[0])
    assert abs(offset - 7.0) <= error + 1e-12
    assert error == pytest.approx(0.005)


def test_job_clock_adds_the_offset_it_was_given(monkeypatch) -> None:
    monkeypatch.setenv(clock.CLOCK_OFFSET_ENV, "12.5")
    clock._offset.cache_clear()
    try:
        assert clock.job_clock() - clock.time.monotonic() == pytest.approx(12.5, abs=0.01)
    finally:
        clock._offset.cache_clear()
