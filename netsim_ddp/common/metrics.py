"""Samples to summaries, and the all-reduce arithmetic the results are judged against.

Vocabulary (README): iteration time is the slowest rank's optimizer step; comm time is the
exposed communication (iteration minus compute-only); bus bandwidth follows nccl-tests:
busbw = algbw x 2(n-1)/n, and an ideal ring all-reduce of S bytes over links of B bytes/s takes
2(n-1)/n x S/B plus 2(n-1) latencies.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from netsim_ddp.common.tails import coefficient_of_variation, slow_share


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    median: float
    std: float
    p5: float
    p95: float
    iqr: float
    min: float
    max: float
    p99: float = 0.0  # the tail (common.tails)
    cv: float = 0.0
    slow_share: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(samples: Sequence[float]) -> Summary:
    if not samples:
        raise ValueError("no samples to summarize")
    values = sorted(samples)
    if len(values) == 1:
        (only,) = values
        return Summary(1, only, only, 0.0, only, only, 0.0, only, only, only, 0.0, 0.0)
    # 'inclusive' quantiles: the sample's own min and max bound them, as numpy's default does.
    percentiles = statistics.quantiles(values, n=100, method="inclusive")
    quartiles = statistics.quantiles(values, n=4, method="inclusive")
    return Summary(
        n=len(values),
        mean=statistics.fmean(values),
        median=statistics.median(values),
        std=statistics.stdev(values),
        p5=percentiles[4],
        p95=percentiles[94],
        iqr=quartiles[2] - quartiles[0],
        min=values[0],
        max=values[-1],
        p99=percentiles[98],
        cv=coefficient_of_variation(values),
        slow_share=slow_share(values),
    )


def median_interval(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median (order statistics, scipy's
    quantile_test): with 6-8 samples it spans them all, from 10 on it drops the extremes."""
    from scipy.stats import quantile_test

    if len(samples) < 2:
        value = samples[0] if samples else float("nan")
        return value, value
    interval = quantile_test(list(samples), q=0, p=0.5).confidence_interval(confidence)
    return float(interval.low), float(interval.high)


def ring_factor(world_size: int) -> float:
    """2(n-1)/n: the share of the buffer each rank sends (and receives) in a ring all-reduce."""
    return 2 * (world_size - 1) / world_size if world_size > 1 else 0.0


def ring_allreduce_lower_bound(size_bytes: float, world_size: int, link_bps: float,
                               latency_s: float = 0.0) -> float:
    """Seconds an ideal ring all-reduce of `size_bytes` takes over links of `link_bps` bits/s."""
    return ring_factor(world_size) * size_bytes * 8 / link_bps + 2 * (world_size - 1) * latency_s


def bus_bandwidth(size_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth in bits/s: algbw (size/time) x 2(n-1)/n."""
    if seconds <= 0:
        return float("inf")
    return size_bytes * 8 / seconds * ring_factor(world_size)


# -- comparing noisy samples ----------------------------------------------------------------

STATISTICS = ("median", "mean", "p95", "p99", "std", "iqr", "min", "max", "cv", "slow_share")
SPREAD_STATISTICS = ("std", "iqr")  # tested on deviations from the median
# p99, cv and the share of slow iterations: tested by a bootstrap (common.tails.tail_test)


def statistic(samples: Sequence[float], name: str) -> float:
    if name not in STATISTICS:
        raise ValueError(f"unknown statistic {name!r}; use one of {', '.join(STATISTICS)}")
    return float(getattr(summarize(samples), name))


def deviations(samples: Sequence[float]) -> list[float]:
    """Absolute deviations from the median: a spread test on these is Brown-Forsythe's idea,
    robust to the outliers a noisy network produces."""
    center = statistics.median(samples)
    return [abs(value - center) for value in samples]


@dataclass(frozen=True)
class ShiftTest:
    """Is `x` smaller than `y` (or larger), beyond noise? A one-sided Mann-Whitney U test."""

    p_value: float
    effect: float  # probability that a draw of x is below a draw of y (0.5: no difference)

    @property
    def effect_text(self) -> str:
        return f"P(x < y) = {self.effect:.2f}"


def shift_test(x: Sequence[float], y: Sequence[float], alternative: str) -> ShiftTest:
    """alternative 'less': x tends to be smaller than y; 'greater': larger."""
    from scipy.stats import mannwhitneyu  # only verdicts need scipy; keep imports light

    if len(x) < 2 or len(y) < 2:
        raise ValueError("a significance test needs at least 2 samples on each side")
    result = mannwhitneyu(x, y, alternative=alternative, method="auto")
    below = 1.0 - result.statistic / (len(x) * len(y))  # U counts pairs with x above y
    return ShiftTest(float(result.pvalue), float(below))
