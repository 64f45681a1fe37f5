"""How busy the host's CPUs were over an interval, from /proc/stat.

A refused probe says why the host fell short: its own CPUs were saturated (too fast a link for
this host), or a hypervisor took time away from them (steal, the usual culprit on shared CI
VMs), or neither (look elsewhere). A training run records the same, since steal shifts absolute
times. Ten lines of /proc/stat need no library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# Steal above this share of all CPU time shifts absolute timings: comparisons between modes of
# one run still hold, comparisons with other runs (baselines, a sweep's other points) less so.
STEAL_NOTICEABLE = 0.05
# The aggregate "cpu" line: user nice system idle iowait irq softirq steal (guest time is
# already counted in user and nice).
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies per state since boot, summed over all CPUs."""

    values: dict[str, int]

    @classmethod
    def read(cls, path: Path = PROC_STAT) -> CpuTimes | None:
        """None where the file is missing or unreadable: the diagnosis is a courtesy."""
        try:
            line = path.read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        label, *numbers = line.split()
        if label != "cpu" or len(numbers) < len(_FIELDS):
            return None
        return cls(dict(zip(_FIELDS, map(int, numbers), strict=False)))


@dataclass(frozen=True)
class CpuLoad:
    """Fractions of all CPUs' time over an interval."""

    busy: float  # neither idle nor waiting for I/O nor stolen
    steal: float  # taken by the hypervisor for other guests
    softirq: float  # the kernel's packet processing, shaping included

    @classmethod
    def between(cls, before: CpuTimes | None, after: CpuTimes | None) -> CpuLoad | None:
        if before is None or after is None:
            return None
        delta = {name: after.values[name] - before.values[name] for name in _FIELDS}
        total = sum(delta.values())
        if total <= 0:
            return None
        idle = delta["idle"] + delta["iowait"] + delta["steal"]
        return cls(busy=(total - idle) / total, steal=delta["steal"] / total,
                   softirq=delta["softirq"] / total)

    def describe(self) -> str:
        return (f"host CPUs {self.busy:.0%} busy, {self.steal:.0%} stolen by the hypervisor, "
                f"{self.softirq:.0%} in softirq")

    def as_dict(self) -> dict[str, float]:
        return {"busy": self.busy, "steal": self.steal, "softirq": self.softirq}


def max_steal(loads: Iterable[CpuLoad | None]) -> float:
    return max((load.steal for load in loads if load is not None), default=0.0)


__all__ = ["STEAL_NOTICEABLE", "CpuLoad", "CpuTimes", "max_steal"]
