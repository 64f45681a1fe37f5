"""Leave one file out: with several nccl-tests runs of one cluster at different scales, each
multi-host all_reduce run predicted from the others, never from itself.

The projection is the one a sweep uses (`cluster.allreduce_time`): the cluster is built from the
other runs as `cluster.load_cluster` would (the largest other multi-host all_reduce is the
network; the servers are the held-out run's), then one all-reduce of each size the held-out run
measured, from `from_bytes` up, is projected to its GPU count. The errors are projected /
measured - 1, on in-place times. Runs at the same world size as the calibration predict nothing
(the curve would be read back) and are skipped.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from netsim_ddp.projection.calibrate import Calibration
from netsim_ddp.projection.cluster import allreduce_time, build

FROM_BYTES = 64 * 2**20  # the size the projection targets are quoted from (issue 35)


class HeldOutErrors:
    """The worst and the median of a set of held-out relative errors (`errors`)."""

    errors: list[float]

    @property
    def worst(self) -> float:
        return max(self.errors, key=abs)

    @property
    def median(self) -> float:
        return statistics.median(abs(e) for e in self.errors)


@dataclass
class FileHeldOut(HeldOutErrors):
    """One held-out run, predicted from the others."""

    calibration: Calibration  # the network the prediction calibrated on
    target: Calibration  # the held-out run
    sizes: list[int] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    algorithms: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"calibrated_on": self.calibration.label, "held_out": self.target.label,
                "sizes": self.sizes, "errors": self.errors, "algorithms": self.algorithms,
                "worst": self.worst, "median_abs": self.median, "flags": self.flags}


def leave_one_file_out(calibrations: Sequence[Calibration], *, nics_per_server: int | None = None,
                       nic_bandwidth_bps: float | None = None,
                       from_bytes: int = FROM_BYTES) -> list[FileHeldOut]:
    """Each multi-host all_reduce run predicted from the others (see the module doc); empty
    with fewer than two such runs at different world sizes."""
    networks = [c for c in calibrations if c.collective == "all_reduce" and c.hosts > 1]
    out = []
    for target in networks:
        others = [c for c in networks if c is not target and c.world_size != target.world_size]
        if not others:
            continue
        network = max(others, key=lambda c: c.world_size)
        # One-server runs give NVLink for servers of their size only.
        rest = [c for c in calibrations if c is not target and c is not network
                and (c.hosts > 1 or c.world_size == target.gpus_per_host)]
        cluster = build(network, rest, gpus_per_server=target.gpus_per_host,
                        nics_per_server=nics_per_server, nic_bandwidth_bps=nic_bandwidth_bps,
                        where="--calibration")
        held = FileHeldOut(network, target, flags=cluster.flags)
        for size, measured in zip(*target.measured_points(), strict=True):
            if size < from_bytes:
                continue
            projected = allreduce_time(cluster, target.world_size, float(size))
            held.sizes.append(int(size))
            held.errors.append(projected.seconds / float(measured) - 1)
            held.algorithms.append(projected.algorithm)
        if held.sizes:
            out.append(held)
    return out


def held_out_file_lines(held: Sequence[FileHeldOut]) -> list[str]:
    """The leave-one-file-out errors in words, one line per held-out run."""
    if not held:
        return []
    lines = [f"leave one file out (each multi-host all_reduce run projected from the largest "
             f"other, sizes from {FROM_BYTES >> 20} MiB up; same cluster assumed):"]
    for h in held:
        flagged = " [calibration FLAGGED, see above]" if h.flags else ""
        lines.append(f"  {h.target.world_size} GPUs ({h.target.hosts} x "
                     f"{h.target.gpus_per_host}) from {h.calibration.world_size} "
                     f"({h.calibration.hosts} x {h.calibration.gpus_per_host}): worst "
                     f"{h.worst:+.1%}, median |error| {h.median:.1%}{flagged}")
    return lines


__all__ = ["FROM_BYTES", "FileHeldOut", "held_out_file_lines", "leave_one_file_out"]
