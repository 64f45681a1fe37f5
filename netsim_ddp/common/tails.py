"""The tail of a series of step times: what a user asking "will our p99 blow up at 32 GPUs?"
reads.

A slow iteration is one more than SLOW_THRESHOLD above the series' own median. 10% sits well
beyond what light per-rank noise does to the slowest of N ranks (2% lognormal noise: the max
of 16 draws is about 4% above the mean) and well below a real stall or a retransmission
timeout, which cost a large part of a step or more: the share of slow iterations counts the
rare, large events that make spread grow with the GPU count (docs/jitter.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

SLOW_THRESHOLD = 0.10  # slower than the median by more than this fraction of it


def percentile(samples: Sequence[float], q: int) -> float:
    """The q-th percentile, 'inclusive' (the sample's own min and max bound it, as numpy's
    default): with fewer than 100 samples p99 lies between the two largest."""
    values = sorted(samples)
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def coefficient_of_variation(samples: Sequence[float]) -> float:
    """sd / mean (0 for one sample or a zero mean)."""
    if len(samples) < 2:
        return 0.0
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / mean if mean else 0.0


def slow_iterations(samples: Sequence[float], threshold: float = SLOW_THRESHOLD) -> list[int]:
    """Indices of the iterations slower than the median by more than `threshold` of it."""
    if not samples:
        return []
    limit = statistics.median(samples) * (1 + threshold)
    return [index for index, value in enumerate(samples) if value > limit]


def slow_share(samples: Sequence[float], threshold: float = SLOW_THRESHOLD) -> float:
    """The share of slow iterations (0..1)."""
    return len(slow_iterations(samples, threshold)) / len(samples) if samples else 0.0


TAIL_STATISTICS = ("p99", "cv", "slow_share")
BOOTSTRAP_RESAMPLES = 2000


def _per_row(values, name: str):  # type: ignore[no-untyped-def]
    """The tail statistic of each row of a 2-D numpy array of samples."""
    import numpy as np

    if name == "p99":
        return np.percentile(values, 99, axis=1)  # numpy's linear: the 'inclusive' method
    if name == "cv":
        return values.std(axis=1, ddof=1) / values.mean(axis=1)
    limit = np.median(values, axis=1, keepdims=True) * (1 + SLOW_THRESHOLD)
    return (values > limit).mean(axis=1)


def tail_test(x: Sequence[float], y: Sequence[float], name: str, bound: float,
              alternative: str, seed: int = 0) -> float:
    """One-sided bootstrap p-value that stat(x) <= bound x stat(y) ('less'), or >= ('greater'),
    for a tail statistic: the share of paired resamples (seeded: a verdict is reproducible) on
    the other side. A rank test would judge the bulk of the samples, which a tail leaves alone."""
    import numpy as np

    if name not in TAIL_STATISTICS:
        raise ValueError(f"{name!r} is not a tail statistic ({', '.join(TAIL_STATISTICS)})")
    if len(x) < 2 or len(y) < 2:
        return 1.0
    draw = np.random.default_rng(seed)
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    x_stat = _per_row(xs[draw.integers(0, len(xs), (BOOTSTRAP_RESAMPLES, len(xs)))], name)
    y_stat = _per_row(ys[draw.integers(0, len(ys), (BOOTSTRAP_RESAMPLES, len(ys)))], name)
    if alternative == "less":
        wrong = np.count_nonzero(x_stat > bound * y_stat)
    else:
        wrong = np.count_nonzero(x_stat < bound * y_stat)
    return float((wrong + 1) / (BOOTSTRAP_RESAMPLES + 1))


__all__ = ["BOOTSTRAP_RESAMPLES", "SLOW_THRESHOLD", "TAIL_STATISTICS", "coefficient_of_variation",
           "percentile", "slow_iterations", "slow_share", "tail_test"]
