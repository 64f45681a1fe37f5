import math
import statistics

import pytest

from netsim_ddp.common.metrics import (
    bus_bandwidth,
    ring_allreduce_lower_bound,
    ring_factor,
    summarize,
)


def test_summary_of_known_samples():
    summary = summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (summary.n, summary.min, summary.max, summary.median) == (5, 1.0, 5.0, 3.0)
    assert summary.mean == 3.0
    assert math.isclose(summary.std, statistics.stdev([1, 2, 3, 4, 5]))
    assert summary.iqr == 2.0  # inclusive quartiles 2 and 4
    assert summary.p5 == pytest.approx(1.2) and summary.p95 == pytest.approx(4.8)


def test_summary_edge_cases():
    assert summarize([7.0]).std == 0.0
    with pytest.raises(ValueError):
        summarize([])


@pytest.mark.parametrize("n, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_ring_factor(n, factor):
    assert ring_factor(n) == factor


def test_ring_lower_bound_and_bus_bandwidth_agree():
    size, link = 64 * 2**20, 1e9
    t = ring_allreduce_lower_bound(size, 4, link)
    assert t == pytest.approx(1.5 * size * 8 / link)
    # An all-reduce that takes exactly the ideal time runs at the link's rate.
    assert bus_bandwidth(size, t, 4) == pytest.approx(link)
    assert ring_allreduce_lower_bound(size, 4, link, latency_s=1e-3) == pytest.approx(t + 6e-3)


def test_median_interval_is_the_order_statistics_interval():
    from netsim_ddp.common.metrics import median_interval

    # Distribution-free: with 6 samples the 95% interval spans them all; with 10 it drops the
    # extremes (P(median outside [x(2), x(9)]) = 2 x 11/1024 < 5%).
    assert median_interval([3, 1, 2, 6, 5, 4]) == (1, 6)
    assert median_interval(list(range(10, 0, -1))) == (2, 9)
    assert median_interval([0.5]) == (0.5, 0.5)
