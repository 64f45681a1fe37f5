"""Change points in a short, noisy series of per-run numbers (a metric's history).

The method is E-divisive's (Matteson & James 2014; MongoDB's and Apache Otava's change-point
detection for performance CI): divide the series recursively, each time at the split that
lowers the segmentation cost most, and keep a split only if a permutation test says it is not
noise: the points are shuffled within the current segments, and the split is kept when fewer
than alpha of the shuffled series allow a split as good. The p-value says how sure.

The best split of a segment comes from ruptures' kernel change-point search (`KernelCPD`,
exact dynamic programming in C; Arlot, Celisse & Harchaoui 2019) with the linear kernel, i.e.
the within-segment sum of squares: a step in the level, which is what a performance regression
is. A segment is at least MIN_SEGMENT runs long: one run on a new level is not a change point
yet (the history gate judges the newest run on its own, see netsim_ddp.verdicts.history).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import ruptures

MIN_SEGMENT = 2
PERMUTATIONS = 199
DEFAULT_ALPHA = 0.05
# A shuffle that regroups the same values splits exactly as well; summed in another order its
# gain may differ in the last bits, and that must not decide significance.
SAME_GAIN = 1e-9


@dataclass(frozen=True)
class ChangePoint:
    """The level changes at `index`: the first point of the new segment."""

    index: int
    before: float  # median of the segment before
    after: float  # median of the segment after
    p_value: float  # of the permutation test that kept this split

    @property
    def change(self) -> float:
        """Relative change of the level, after / before - 1."""
        return self.after / self.before - 1 if self.before else float("inf")


@dataclass(frozen=True)
class Segmentation:
    """A series cut at its change points into segments of one level each."""

    values: tuple[float, ...]
    change_points: tuple[ChangePoint, ...]

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """Each segment as [start, stop) indices."""
        cuts = [0] + [point.index for point in self.change_points] + [len(self.values)]
        return list(zip(cuts[:-1], cuts[1:], strict=True))

    @property
    def levels(self) -> list[float]:
        """Each segment's median."""
        return [float(np.median(self.values[start:stop])) for start, stop in self.bounds]


def segment(values: Sequence[float], alpha: float = DEFAULT_ALPHA,
            permutations: int = PERMUTATIONS, seed: int = 0) -> Segmentation:
    """E-divisive: split while the best split is significant at `alpha`. Seeded, so the same
    history always gives the same answer."""
    series = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(series)):
        raise ValueError("a series with NaN or infinite values has no change points")
    rng = np.random.default_rng(seed)
    cuts: list[int] = []
    p_values: dict[int, float] = {}
    while True:
        split = _best_split(series, cuts)
        if split is None:
            break
        gain, index = split
        exceeded = 0
        for _ in range(permutations):
            shuffled = series.copy()
            for start, stop in _pieces(cuts, len(series)):
                rng.shuffle(shuffled[start:stop])
            found = _best_split(shuffled, cuts)
            exceeded += found is not None and found[0] >= gain * (1 - SAME_GAIN)
            if (exceeded + 1) / (permutations + 1) > alpha:
                break  # not significant whatever the remaining shuffles say
        p_value = (exceeded + 1) / (permutations + 1)
        if p_value > alpha:
            break
        cuts = sorted([*cuts, index])
        p_values[index] = p_value
    bounds = _pieces(cuts, len(series))
    medians = [float(np.median(series[start:stop])) for start, stop in bounds]
    points = tuple(ChangePoint(index, medians[i], medians[i + 1], p_values[index])
                   for i, index in enumerate(cuts))
    return Segmentation(tuple(float(v) for v in series), points)


def smallest_p_value(n: int, permutations: int = PERMUTATIONS) -> float:
    """The smallest p-value the permutation test can give a series of n values: of the
    C(n, k) ways to place the k values of one side among the n, two (this side first or last)
    split as well as a clean step, so p >= 2 / C(n, n // 2) at the most even split (and the
    shuffles' own resolution, 1 / (permutations + 1)). 6 runs: 0.1; 8 runs: 0.029."""
    if n < 2 * MIN_SEGMENT:
        return 1.0
    return max(2 / math.comb(n, n // 2), 1 / (permutations + 1))


def runs_to_reach(alpha: float, permutations: int = PERMUTATIONS) -> int:
    """The fewest runs with which a change point can be significant at `alpha`."""
    n = 2 * MIN_SEGMENT
    while smallest_p_value(n, permutations) > alpha and n < 1000:
        n += 1
    return n


def _pieces(cuts: list[int], n: int) -> list[tuple[int, int]]:
    edges = [0, *cuts, n]
    return list(zip(edges[:-1], edges[1:], strict=True))


def _best_split(series: np.ndarray, cuts: list[int]) -> tuple[float, int] | None:
    """(cost saved, index) of the best single split of any current segment, or None."""
    best: tuple[float, int] | None = None
    for start, stop in _pieces(cuts, len(series)):
        piece = series[start:stop]
        if len(piece) < 2 * MIN_SEGMENT or np.ptp(piece) == 0:
            continue
        search = ruptures.KernelCPD(kernel="linear", min_size=MIN_SEGMENT).fit(piece)
        ends = search.predict(n_bkps=1)
        gain = search.cost.error(0, len(piece)) - search.cost.sum_of_costs(ends)
        if best is None or gain > best[0]:
            best = (float(gain), start + ends[0])
    return best
