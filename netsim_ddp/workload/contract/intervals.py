"""Interval arithmetic for collective timing (no torch: the harness reads results with it)."""

from __future__ import annotations

from collections.abc import Sequence

Interval = tuple[float, float]


def union_length(intervals: Sequence[Interval]) -> float:
    """Total length covered by the intervals, overlaps counted once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total
