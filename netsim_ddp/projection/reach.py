"""How far a calibration reaches: what a projection to other GPU counts takes from the
measurement, and what it models beyond it, said in the projection's notes.

A calibration measured one shape of job: n0 GPUs on h0 hosts of g0 GPUs, the NICs those GPUs
drive, the (algorithm, protocol) pairs NCCL ran at each size, sizes up to its largest. A
projection outside that shape is a model's, not a measurement's, and each way it leaves the
shape gets one line starting "OUTSIDE THE CALIBRATION":

- another GPUs-per-server count: the NVLink level (and, for the hierarchical all-reduce, the
  phases inside a server) come from where `cluster.NvlinkLevel.source` says, not from the
  calibrated hosts;
- another count of NICs in use: the network's bandwidth is scaled by the NICs' ratio
  (`Cluster.nic_scale`), a line rate the calibration never carried;
- more hosts than the real series in `bench/projection_scales.py` checked (up to 4x the
  calibrated hosts, `CHECKED_HOST_FACTOR`): the ring's latency carried over more steps,
  unchecked, and the calibrated bus bandwidth taken to hold, which large fabrics do not
  promise (`FABRIC_AT_SCALE`: the two collected lost 12-54% of it at 256-540 servers);
- an algorithm NCCL's tuner would run at the target (`nccl_model.nccl_choice` on the target's
  topology) for sizes where, at the calibrated shape, it ran another: that algorithm's time at
  the target is the projection's model of it, not a scaled measurement;
- sizes above the largest measured: the top regime's line, extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from netsim_ddp.projection.calibrate import MIB
from netsim_ddp.projection.nccl_model import Topology, nccl_choice
from netsim_ddp.scenario.units import format_size

if TYPE_CHECKING:  # cluster.py calls reach_notes for its projections' notes
    from netsim_ddp.projection.cluster import Cluster

CHECKED_HOST_FACTOR = 4  # bench/projection_scales.py's real series: 2 -> 8 hosts at most
OUTSIDE = "OUTSIDE THE CALIBRATION"
# What the collected series (docs/sweeps.md) say of that assumption at hundreds of servers.
FABRIC_AT_SCALE = ("Both fabrics collected at hundreds of servers broke it (bus bandwidth from "
                   "the time per byte between the two largest sizes): ALCF Polaris 36.4 GB/s "
                   "on 8 servers, 32.1 on 256, 30.1 on 540 (NCCL 2.21; 19.0 with 2.18); CSCS "
                   "Alps 92-94 GB/s on 4 to 64 servers, 43-80 on 512")
SIZES = [float(2**k) for k in range(20, 34)]  # 1 MiB to 8 GiB, nccl-tests' usual range


def topology(cluster: Cluster, gpus: int, gpus_per_server: int) -> Topology:
    """NCCL's view of a job of `gpus` GPUs on the cluster's servers of `gpus_per_server`."""
    hosts = max(1, math.ceil(gpus / gpus_per_server))
    nics = cluster.nics.carrying(min(gpus, gpus_per_server),
                                 max(gpus_per_server, cluster.network.gpus_per_host))
    rate = (cluster.nics.bits_per_s or 400e9) / 8
    return Topology(gpus, hosts, nics, rate, cluster.nvlink.busbw_bytes_per_s)


def _algorithms(topo: Topology, sizes: Sequence[float]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for size in sizes:
        found.setdefault(nccl_choice(topo, size).algorithm, []).append(size)
    return found


def _span(sizes: Sequence[float]) -> str:
    low, high = min(sizes), max(sizes)
    return format_size(int(low)) if low == high else (f"{format_size(int(low))} to "
                                                       f"{format_size(int(high))}")


def _algorithm_notes(cluster: Cluster, gpus: Sequence[int], wanted: list[float]) -> list[str]:
    """Where NCCL's tuner model runs, at a projected GPU count, an algorithm it did not run at
    the same sizes on the calibrated shape; GPU counts with the same finding share a line."""
    cal, g = cluster.network, cluster.gpus_per_server
    n0 = cal.world_size
    calibrated = _algorithms(topology(cluster, n0, cal.gpus_per_host), wanted)
    found: dict[tuple[str, str, str], list[int]] = {}
    for n in sorted(set(gpus)):
        if n <= g or n == n0 and g == cal.gpus_per_host:
            continue
        for algorithm, at in _algorithms(topology(cluster, n, g), wanted).items():
            unseen = [s for s in at if s not in calibrated.get(algorithm, [])]
            if unseen:
                ran = ", ".join(sorted(a for a, s in calibrated.items() if set(s) & set(unseen)))
                found.setdefault((algorithm, _span(unseen), ran), []).append(n)
    return [f"{OUTSIDE}: on {_counts(counts)} GPUs NCCL's tuner model runs {algorithm} at "
            f"{span}, where on the calibrated {n0} GPUs it ran {ran}: {algorithm} there is "
            "modelled, not measured" for (algorithm, span, ran), counts in found.items()]


def _counts(counts: list[int]) -> str:
    return ", ".join(str(n) for n in counts)


def reach_notes(cluster: Cluster, gpus: Sequence[int],
                sizes: Sequence[float] | None = None) -> list[str]:
    """One line per way the projection to `gpus` leaves what the calibration measured (see the
    module doc); none where it stays inside."""
    cal = cluster.network
    h0, g0, g = cal.hosts, cal.gpus_per_host, cluster.gpus_per_server
    notes: list[str] = []
    if cal.hosts < 2:
        return notes
    if g != g0:
        notes.append(f"{OUTSIDE}: {g} GPUs per server, calibrated on {g0}: inside a server, "
                     f"{cluster.nvlink.source}; across servers, the calibrated network as "
                     f"{g} GPUs' NICs carry it")
    if cluster.nic_scale != 1:
        carried = cluster.nics.carrying(g0, max(g, g0))
        notes.append(f"{OUTSIDE}: each server's traffic over {carried * cluster.nic_scale:g} "
                     f"NIC(s), calibrated over {carried:g}: the network's bandwidth x "
                     f"{cluster.nic_scale:g}, a rate the calibration never carried")
    hosts = [max(1, math.ceil(n / g)) for n in gpus]
    far = [h for h in hosts if h > CHECKED_HOST_FACTOR * h0]
    if far:
        notes.append(f"{OUTSIDE}: up to {max(far)} servers, {max(far) / h0:.0f}x the "
                     f"calibrated {h0}; real series checked projections up to "
                     f"{CHECKED_HOST_FACTOR}x (bench/projection_scales.py): beyond, the ring's "
                     "and tree's latencies are carried over more steps unchecked, and the "
                     f"calibrated bus bandwidth is assumed to hold. {FABRIC_AT_SCALE}")
    if any("NVIDIA" in device.upper() for device in cal.devices):  # NCCL ran it, not gloo
        notes += _algorithm_notes(cluster, gpus, [s for s in (sizes or SIZES) if s >= MIB])
    top = float(cal.curve.sizes[-1])
    if sizes is not None and max(sizes) > top:
        notes.append(f"{OUTSIDE}: sizes above {format_size(int(top))}, the largest calibrated: "
                     "the top regime's line, extrapolated")
    return notes


__all__ = ["CHECKED_HOST_FACTOR", "OUTSIDE", "reach_notes", "topology"]
