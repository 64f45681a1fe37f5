"""The all-reduce probe's verdict on the host: can it move the workload's traffic at the
emulated rate? A run whose probe is not trusted is refused before it trains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from netsim_ddp.hostfacts.hostload import CpuLoad
from netsim_ddp.measure.document import FidelityRecord
from netsim_ddp.precision.modes import BYTES_PER_ELEMENT


@dataclass
class CollectiveFidelity:
    """The bare all-reduce probe: its bus bandwidth against what the slowest link allows.

    Each attempt all-reduces every dtype the modes send (float32, and float16 or bfloat16 for
    the compressing hooks) and scores by the slowest: a run is only as faithful as its slowest
    mode. The probe may run several attempts (fidelity.attempts); the verdict uses the best,
    since the link's cap keeps any attempt from overstating what the host can do. For the same
    reason a probe well above the cap is no measurement of the emulated network: its traffic
    went around the shaped links, and so would the training's."""

    # TBF's burst and the goodput estimate's rounding let a faithful probe read a few percent
    # over the cap; this much over it means the traffic did not cross the shaped links.
    max_fraction: ClassVar[float] = 1.25

    size_bytes: int  # the float32 all-reduce; 16-bit dtypes send the same elements in half
    world_size: int
    attempts_bps: list[float]  # per attempt, the slowest dtype's median bus bandwidth
    expected_bps: float  # the slowest link's TCP goodput
    min_fraction: float
    host_load: CpuLoad | None = None  # CPU use during the last attempt's timed all-reduces
    dtype_bps: list[dict[str, float]] = field(default_factory=list)  # per attempt, per dtype
    # per attempt, float32 at each of the job's bucket sizes ([link] busbw_from), host units
    job_size_bps: list[dict[int, float]] = field(default_factory=list)

    @property
    def busbw_bps(self) -> float:
        return max(self.attempts_bps)

    @property
    def fraction(self) -> float:
        return self.busbw_bps / self.expected_bps

    @property
    def trusted(self) -> bool:
        return self.min_fraction <= self.fraction <= self.max_fraction

    @property
    def best_by_dtype(self) -> dict[str, float]:
        """Each dtype's bus bandwidth in the best attempt (empty for a float32-only record)."""
        if not self.dtype_bps:
            return {}
        return self.dtype_bps[self.attempts_bps.index(self.busbw_bps)]

    @property
    def best_job_sizes(self) -> dict[int, float]:
        """The job sizes' bus bandwidths in the best attempt (empty without busbw_from)."""
        if not self.job_size_bps:
            return {}
        return self.job_size_bps[self.attempts_bps.index(self.busbw_bps)]

    @property
    def reason(self) -> str:
        mib = self.size_bytes / 2**20
        by_dtype = self.best_by_dtype
        if len(by_dtype) > 1:
            slowest = min(by_dtype, key=by_dtype.__getitem__)
            sizes = ", ".join(f"{dtype} {mib * BYTES_PER_ELEMENT[dtype] / 4:.0f} MiB"
                              for dtype in by_dtype)
            text = (f"all-reduces of the gradients ({sizes}) over {self.world_size} ranks: "
                    f"the slowest, {slowest}, reached")
        else:
            text = f"an all-reduce of {mib:.0f} MiB over {self.world_size} ranks reached"
        text += (f" a bus bandwidth of {self.busbw_bps / 1e6:.0f} Mbit/s, "
                 f"{self.fraction:.0%} of the {self.expected_bps / 1e6:.0f} Mbit/s the slowest "
                 f"link allows (needs >= {self.min_fraction:.0%})")
        if len(self.attempts_bps) > 1:
            text += (f"; best of {len(self.attempts_bps)} attempts: "
                     + ", ".join(f"{bps / 1e6:.0f}" for bps in self.attempts_bps) + " Mbit/s")
        if self.trusted:
            return text
        if self.fraction > self.max_fraction:
            return (text + f": faster than the emulated link can carry (more than "
                    f"{self.max_fraction:.0%}), so the probe's traffic went around the shaped "
                    "links and the training's would too. Check that the ranks use the nodes' "
                    "addresses (MASTER_ADDR, GLOO_SOCKET_IFNAME) and that nothing routes "
                    "between namespaces outside the switch")
        float32 = by_dtype.get("float32", 0.0) / self.expected_bps
        if len(by_dtype) > 1 and float32 >= self.min_fraction:
            text += f" (float32 {float32:.0%}: gloo sums 16-bit floats on the CPU, slower)"
        if self.host_load is not None:
            text += f"; {self.host_load.describe()}"
        return (text + ": this host cannot move the workload's traffic at the emulated rate, so "
                "its results would measure the CPU, not the network. Run it on a faster host, "
                "lower the link rate, or pass --allow-untrusted to run it anyway")

    def to_record(self) -> FidelityRecord:
        return FidelityRecord.model_validate(
            {"size_bytes": self.size_bytes, "world_size": self.world_size,
             "busbw_bps": self.busbw_bps, "attempts_bps": self.attempts_bps,
             "dtype_bps": self.dtype_bps, "expected_bps": self.expected_bps,
             "fraction": self.fraction, "min_fraction": self.min_fraction,
             "trusted": self.trusted,
             "host_load": self.host_load.as_dict() if self.host_load else None,
             "reason": self.reason}, strict=False)
