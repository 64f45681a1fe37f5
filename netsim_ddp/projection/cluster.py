"""The calibrated cluster a projection runs on: two levels (NVLink inside a server, the network
between servers), the servers' NICs, and the all-reduce algorithms NCCL would pick on them.

The levels:

- the network: the calibration's multi-host all_reduce curve (`calibrate.Calibration`), at its
  world size n0 on h0 hosts of g0 GPUs. Read as a ring's (`NetworkLevel`): a latency L (the
  curve's time at 1 MiB, the smallest size NCCL moves with its bulk protocols, less what its
  bytes cost at the plateau; below 1 MiB the curve's own time), the same per ring step
  wherever the step goes (NCCL's per-step overhead in its data path outweighs the wire's
  latency), and a bandwidth part, the rest of the curve's time at each size; where the bus
  bandwidth dips from one size to the next (NCCL switching algorithm or protocol at a size
  that moves with the world size) the best bus bandwidth of a smaller size is kept.
- the NICs: `nics_per_server` N (default 1) NICs per server, each GPU driving the ones nearest
  it: g GPUs of a G-GPU server drive g x N / G of them (at least 1, at most N). The network's
  bandwidth is what the calibrated hosts' NICs carried; a server of g GPUs gets its NICs'
  share of it, g x N/G over g0 x N/G (G the larger of g and g0), not g / g0.
- NVLink (the intra-node level): g GPUs per server. Their reduce-scatter and all-gather times
  come, in this order, from a one-server nccl-tests run in the calibration files
  (reduce_scatter_perf / all_gather_perf curves; where only all_reduce_perf ran inside the
  server, half its time each, since a ring all-reduce is a reduce-scatter then an all-gather);
  else from `[sweep.projection] nvlink_busbw` and `nvlink_latency`, each defaulting to a typical
  H100 SXM server (`TYPICAL_NVLINK`): t = latency + (g-1)/g x S / busbw.
  g is `[sweep.projection] gpus_per_server`, else the one-server run's GPUs, else the
  calibration's GPUs per host (its rank lines name the hosts).

A 2-host calibration can mislead (`check_network`): NCCL's default on 2 hosts is a tree that
moves S through each server's NICs where a ring moves 2(n-1)/n x S, so its bus bandwidth can
exceed what any ring over those NICs reaches, and overstates what 3 or more hosts get. Where
the bus bandwidth is above its NICs x their line rate (`nic_bandwidth`, else typical for
the GPU, `TYPICAL_NICS`) it is flagged, with the remedy, and read as the tree it is: the ring's
bandwidth is the tree's algbw / 0.7 (NCCL's tree efficiency, `calibrate.TREE_EFFICIENCY`).

The algorithms for one all-reduce of S bytes on n GPUs, h = ceil(n/g) servers; per bucket the
fastest counts, as NCCL's tuner picks, and each projection row names it:

- `as calibrated`: n = n0 and g = g0: the curve's time, nothing else.
- `nvlink`: all n GPUs in one server (h = 1): the NVLink all-reduce alone.
- `ring`: one ring over all n GPUs: 2(n-1) steps at the calibration's latency per step, plus
  its bandwidth part at the same size times the bus factors' ratio 2(n-1)/n / 2(n0-1)/n0
  (NCCL picks protocol, channels and chunks by the message's size), never below the bandwidth
  plateau 2(n-1)/n x S / busbw. Best for big messages.
- `tree`: NCCL's double binary tree over the h servers (a chain inside each): the latency
  floor (the curve's time at the size, at most its time at 1 MiB) grows with
  log2(h)/log2(h0); its bandwidth is 0.7 x h/(2(h-1)) x the ring's bus bandwidth (NCCL's tree
  model). Best for small messages at scale.
- `hierarchical` (g > 1, g != g0: servers unlike the calibrated hosts): reduce-scatter inside
  each server over NVLink, an all-reduce across the h servers over the network (2(h-1) steps,
  2(h-1)/h x S through each server's NICs), all-gather inside each server over NVLink. With
  g = g0 the calibration measured what NCCL does on these servers (ring and tree, their
  NVLink hops included), so there is nothing to add.

Where g differs from g0, the flat ring and the tree are never faster than the NVLink all-reduce
of the same bytes (the server's GPUs are part of the ring or chain). With h >= h0 and no more
NICs carrying traffic than calibrated, no algorithm beats the calibrated time: more servers
never make one all-reduce faster. A calibration on one host measures no network and projects
nothing beyond one server. `bench/projection_scales.py` checks these projections against real
clusters measured at several scales.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from netsim_ddp.measure.document import ProjectionRecord
from netsim_ddp.projection.calibrate import (
    CALIBRATABLE_INTRA,
    ERROR_FROM_BYTES,
    TREE_EFFICIENCY,
    Calibration,
    CalibrationError,
    Curve,
    bus_factor,
    load,
)
from netsim_ddp.projection.costmodel import CALIBRATED_LABEL, CostModel, Projection
from netsim_ddp.projection.reach import reach_notes


@dataclass(frozen=True)
class TypicalNvlink:
    """What the NVLink level defaults to when neither a one-server calibration nor the
    [sweep.projection] fields give it, and which hardware that describes."""

    busbw_bytes_per_s: float = 370e9  # 18 NVLink 4 links x 20.6 GB/s, NCCL's SM90_NVLINK_BW
    latency_s: float = 10e-6  # NCCL's tuning model: ring base 6.6-8.4 us + NVLink hops 0.6-3.4 us
    hardware: str = ("an 8-GPU H100 SXM server (NVLink 4: 18 links x 20.6 GB/s = 370 GB/s bus "
                     "bandwidth, NCCL's own figure in src/graph/topo.h; 10 us per phase, NCCL's "
                     "tuning model's ring base latency plus NVLink hops, src/graph/tuning.cc)")


TYPICAL_NVLINK = TypicalNvlink()


@dataclass(frozen=True)
class NvlinkLevel:
    """The intra-node level of one server of `gpus` GPUs (see the module doc)."""

    gpus: int
    source: str
    busbw_bytes_per_s: float = TYPICAL_NVLINK.busbw_bytes_per_s
    latency_s: float = TYPICAL_NVLINK.latency_s
    reduce_scatter: Curve | None = None
    all_gather: Curve | None = None
    all_reduce: Curve | None = None  # a one-server all_reduce run, halved where RS/AG lack

    def _modelled(self, size: float) -> float:
        return self.latency_s + (self.gpus - 1) / self.gpus * size / self.busbw_bytes_per_s

    def reduce_scatter_s(self, size: float) -> float:
        """Reduce-scatter of a whole buffer of `size` bytes among the server's GPUs."""
        return self._phase(self.reduce_scatter, size)

    def all_gather_s(self, size: float) -> float:
        """All-gather into a whole buffer of `size` bytes among the server's GPUs."""
        return self._phase(self.all_gather, size)

    def all_reduce_s(self, size: float) -> float:
        if self.all_reduce is not None and self.gpus > 1:
            return self.all_reduce(size)
        return self.reduce_scatter_s(size) + self.all_gather_s(size)

    def _phase(self, curve: Curve | None, size: float) -> float:
        if self.gpus <= 1:
            return 0.0
        if curve is not None:
            return curve(size)
        if self.all_reduce is not None:
            return self.all_reduce(size) / 2
        return self._modelled(size)

    @property
    def measured(self) -> list[str]:
        return [name for name, curve in (("reduce_scatter", self.reduce_scatter),
                                         ("all_gather", self.all_gather),
                                         ("all_reduce", self.all_reduce)) if curve is not None]

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "source": self.source, "measured": self.measured,
                "busbw_bytes_per_s": None if self.measured else self.busbw_bytes_per_s,
                "latency_s": None if self.measured else self.latency_s}


@dataclass(frozen=True)
class TypicalNic:
    """The NIC a server with this GPU usually has, for checking a calibration against when
    `nic_bandwidth` is not given."""

    gpu: str  # matched in the rank lines' device names
    bits_per_s: float
    hardware: str


TYPICAL_NICS = (
    TypicalNic("H100", 400e9, "DGX/HGX H100 servers: one ConnectX-7 at 400 Gbit/s per GPU"),
    TypicalNic("H200", 400e9, "DGX/HGX H200 servers: one ConnectX-7 at 400 Gbit/s per GPU"),
    TypicalNic("H800", 400e9, "HGX H800 servers: one ConnectX-7 at 400 Gbit/s per GPU"),
    TypicalNic("B200", 400e9, "DGX B200 servers: one ConnectX-7 at 400 Gbit/s per GPU"),
    TypicalNic("A100", 200e9, "DGX A100 servers: one ConnectX-6 at 200 Gbit/s (HDR) per GPU"),
    TypicalNic("A800", 200e9, "A800 servers: one ConnectX-6 at 200 Gbit/s (HDR) per GPU"),
)


def typical_nic(devices: Sequence[str]) -> TypicalNic | None:
    """The typical NIC for the GPUs the rank lines name, if they are one kind this knows."""
    found = {nic for nic in TYPICAL_NICS for device in devices if nic.gpu in device.upper()}
    return found.pop() if len(found) == 1 else None


@dataclass(frozen=True)
class Nics:
    """The servers' NICs: how many, and (where known) each one's line rate. Each GPU drives the
    NICs nearest it (NCCL's default): a server's N NICs are shared among its G GPUs, so g GPUs
    in use drive g x N / G of them, at least one and at most N."""

    per_server: int = 1
    source: str = "default"
    bits_per_s: float | None = None
    rate_source: str = ""

    def carrying(self, gpus: int, server_gpus: int) -> float:
        """The NICs `gpus` GPUs of a `server_gpus`-GPU server drive."""
        return min(float(self.per_server),
                   max(1.0, gpus * self.per_server / max(gpus, server_gpus)))

    def as_dict(self) -> dict[str, Any]:
        return {"per_server": self.per_server, "source": self.source,
                "bits_per_s": self.bits_per_s, "rate_source": self.rate_source}


@dataclass(frozen=True)
class NetworkCheck:
    """Whether the calibration can be extrapolated honestly (see `check_network`)."""

    tree: bool = False  # a 2-host tree: read as one (`ring_scale`), flagged
    ring_scale: float = 1.0  # the ring's time per byte / the calibration's
    flags: tuple[str, ...] = ()  # cannot be extrapolated honestly: why, and the remedy
    notes: tuple[str, ...] = ()


def check_network(network: Calibration, nics: Nics,
                  server_gpus: int | None = None) -> NetworkCheck:
    """A multi-host all_reduce against what a ring over its NICs can reach: the NICs its g0
    GPUs per host drive (`Nics.carrying`; `server_gpus` GPUs in a server, default g0), at their
    line rate, carry at most that bus bandwidth. On 2 hosts NCCL's default tree moves S per
    server where a ring moves 2(n-1)/n x S, so a bus bandwidth above that is the tree's:
    flagged, and its ring read as algbw / TREE_EFFICIENCY. Unless nics_per_server is given, the
    bound is one NIC per GPU at the typical rate (what H100 servers have)."""
    n0, h0, g0 = network.world_size, network.hosts, network.gpus_per_host
    if h0 < 2 or network.collective != "all_reduce":
        return NetworkCheck()
    busbw = network.busbw_bytes_per_s
    tree_possible = h0 == 2 and g0 > 1
    if nics.bits_per_s is None:
        if not tree_possible:
            return NetworkCheck()
        return NetworkCheck(notes=(
            f"{network.label}: not checked for NCCL's 2-host tree (no NIC line rate for "
            f"{', '.join(network.devices) or 'these GPUs'}: set nic_bandwidth). NCCL's default "
            "on 2 hosts is a tree whose bus bandwidth no ring over the same NICs reaches; it "
            "overstates what more hosts get. A calibration with NCCL_ALGO=Ring or on 4+ hosts "
            "avoids it",))
    nic = nics.bits_per_s / 8
    given = nics.source != "default"
    in_use = nics.carrying(g0, server_gpus or g0)
    carrying = in_use if given else g0
    ceiling = carrying * nic
    typical = " typical" if nics.rate_source.startswith("typical") else ""
    rate = f"{nics.bits_per_s / 1e9:g} Gbit/s"
    if tree_possible and busbw > ceiling:
        scale = bus_factor("all_reduce", n0) * TREE_EFFICIENCY
        bound = (f"{carrying:g} NIC(s) x {rate}{typical}" if given
                 else f"{carrying:g} x {rate}{typical}, one NIC per GPU")
        flag = (f"FLAG {network.label}: its bus bandwidth on 2 hosts, {busbw / 1e9:.1f} GB/s, "
                f"is above what a ring over its NICs can reach ({bound}: "
                f"{ceiling / 1e9:.0f} GB/s): NCCL's tree (or NVLS tree) at work, which moves S "
                "through each server's NICs where a ring moves 2(n-1)/n x S; as measured it "
                "would project 3+ hosts ~30% fast. Projections read it as that tree (a ring of "
                f"{busbw / scale / 1e9:.0f} GB/s = its algbw / {TREE_EFFICIENCY}, NCCL's tree "
                "efficiency: an estimate). Remedy: rerun with NCCL_ALGO=Ring (mpirun -x "
                "NCCL_ALGO=Ring), or calibrate on 4 or more hosts")
        return NetworkCheck(tree=True, ring_scale=scale, flags=(flag,))
    notes = []
    if busbw > in_use * nic:
        notes.append(
            f"{network.label}: its bus bandwidth, {busbw / 1e9:.1f} GB/s, needs more than "
            f"{in_use:g} NIC(s) per server at {rate}{typical}: nics_per_server = "
            f"{nics.per_server} ({nics.source}) under-counts the servers' NICs; set it (H100 "
            "servers usually have one per GPU)"
            + ("; if it is right, NCCL ran its 2-host tree (rerun with NCCL_ALGO=Ring or on 4+ "
               "hosts)" if tree_possible else ""))
    return NetworkCheck(notes=tuple(notes))


@dataclass
class NetworkLevel:
    """The network calibration read as a ring: its latency and its bandwidth part at each size
    (see the module doc); `ring_scale` > 1 for a 2-host tree read as the ring it implies."""

    calibration: Calibration
    ring_scale: float = 1.0
    reference_size: float = field(init=False)
    latency_ref_s: float = field(init=False)

    def __post_init__(self) -> None:
        curve = self.calibration.curve
        bulk = curve.sizes[curve.sizes >= ERROR_FROM_BYTES]
        self.reference_size = float(bulk[0] if len(bulk) else curve.sizes[-1])
        plateau = self.calibration.busbw_bytes_per_s
        at_reference = curve(self.reference_size)
        # Never below the smallest size's time: a bulk protocol's latency is no less than the
        # smallest message's (on a slow link, 1 MiB's time is all bytes and hides it). A run
        # that starts at the reference size (-b 32M) has no small message to bound it by.
        smallest = float(curve.smoothed_s[0]) if curve.sizes[0] < self.reference_size else 0.0
        self.latency_ref_s = min(at_reference, max(
            smallest, at_reference - bus_factor(
                "all_reduce", self.calibration.world_size) * self.reference_size / plateau))

    @property
    def busbw_bytes_per_s(self) -> float:
        """The ring's bus bandwidth plateau on the calibrated hosts."""
        return self.calibration.busbw_bytes_per_s / self.ring_scale

    def latency_s(self, size: float) -> float:
        """The calibrated ring's latency at this size (its 2(n0-1) steps together)."""
        return min(self.calibration.curve(size), self.latency_ref_s)

    def step_s(self, size: float) -> float:
        return self.latency_s(size) / (2 * (self.calibration.world_size - 1))

    def floor_s(self, size: float) -> float:
        """The tree's latency floor on the calibrated hosts: the curve's time, at most its time
        at the reference size (1 MiB)."""
        curve = self.calibration.curve
        return min(curve(size), curve(self.reference_size))

    def bandwidth_s(self, size: float) -> float:
        """The calibrated ring's time less its latency: what the bytes cost, at the best bus
        bandwidth of this size or a smaller one."""
        curve = self.calibration.curve
        smaller = curve.sizes <= size
        best = curve(size)
        if smaller.any():
            best = min(best, float(np.min(curve.smoothed_s[smaller] * size
                                          / curve.sizes[smaller])))
        return max(0.0, best - self.latency_s(size)) * self.ring_scale

    def as_dict(self) -> dict[str, Any]:
        return {"latency_s": self.latency_ref_s, "latency_at_bytes": self.reference_size,
                "ring_busbw_bytes_per_s": self.busbw_bytes_per_s,
                "ring_scale": self.ring_scale}


@dataclass
class Cluster:
    """The network calibration, the servers' GPUs and their NVLink level."""

    network: Calibration
    gpus_per_server: int
    gpus_source: str
    nvlink: NvlinkLevel
    intra_calibrations: list[Calibration] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    nics: Nics = field(default_factory=Nics)
    check: NetworkCheck = field(default_factory=NetworkCheck)
    level: NetworkLevel = field(init=False)

    def __post_init__(self) -> None:
        self.level = NetworkLevel(self.network, self.check.ring_scale)

    @property
    def nic_scale(self) -> float:
        """The projected servers' network bandwidth over the calibrated hosts': the NICs that
        carry the traffic (`Nics.carrying`), the server's GPUs the larger of g and g0."""
        g, g0 = self.gpus_per_server, self.network.gpus_per_host
        return self.nics.carrying(g, max(g, g0)) / self.nics.carrying(g0, max(g, g0))

    @property
    def flags(self) -> list[str]:
        return list(self.check.flags)

    @classmethod
    def of(cls, network: Calibration) -> Cluster:
        """The calibration's own servers, NVLink at its typical defaults."""
        return build(network, [])

    def describe(self) -> list[str]:
        """The levels, in words, for the projection's assumptions."""
        g, nv, nics, g0 = self.gpus_per_server, self.nvlink, self.nics, self.network.gpus_per_host
        lines = [f"{g} GPU(s) per server ({self.gpus_source})"]
        source = ("default: set nics_per_server, H100 servers usually have one per GPU"
                  if nics.source == "default" else nics.source)
        carried = (f"{nics.per_server} NIC(s) per server ({source}); carrying the traffic: "
                   f"{nics.carrying(g0, max(g, g0)):g} on each calibrated host ({g0} GPUs), "
                   f"{nics.carrying(g, max(g, g0)):g} on each projected server ({g} GPUs)")
        if self.nic_scale != 1:
            carried += f": the network's bandwidth x {self.nic_scale:g}"
        if nics.bits_per_s is not None:
            carried += f"; {nics.bits_per_s / 1e9:g} Gbit/s each ({nics.rate_source})"
        lines.append(carried)
        if g > 1:
            if nv.measured:
                lines.append(f"NVLink inside a server: {', '.join(nv.measured)} as measured "
                             f"({nv.source})")
            else:
                lines.append(f"NVLink inside a server: {nv.busbw_bytes_per_s / 1e9:.0f} GB/s bus "
                             f"bandwidth, {nv.latency_s * 1e6:.1f} us per phase ({nv.source})")
        return [*self.check.flags, *lines, *self.check.notes, *self.network.dropped, *self.notes]

    def as_dict(self) -> dict[str, Any]:
        return {"gpus_per_server": self.gpus_per_server, "gpus_source": self.gpus_source,
                "nvlink": self.nvlink.as_dict(),
                "intra_calibrations": [c.as_dict() for c in self.intra_calibrations],
                "notes": [*self.check.notes, *self.notes], "nics": self.nics.as_dict(),
                "network": self.level.as_dict(), "flags": self.flags}


def _field(where: str, name: str) -> str:
    """A field as the user gave it: a command-line option (`where` "--calibration") or a
    [sweep.projection] field."""
    return f"--{name.replace('_', '-')}" if where.startswith("--") else f"{where}.{name}"


def nics_of(network: Calibration, *, nics_per_server: int | None = None,
            nic_bandwidth_bps: float | None = None, where: str = "sweep.projection") -> Nics:
    """The servers' NICs from the fields (`where` names them), the rate else typical for the
    calibration's GPUs."""
    count_field, rate_field = _field(where, "nics_per_server"), _field(where, "nic_bandwidth")
    if nics_per_server is not None and (isinstance(nics_per_server, bool)
                                        or not isinstance(nics_per_server, int)
                                        or nics_per_server < 1):
        raise CalibrationError(f"{count_field} = {nics_per_server!r}: give the NICs "
                               "in one server, a whole number of 1 or more (e.g. 8)")
    if nic_bandwidth_bps is not None and not (math.isfinite(nic_bandwidth_bps)
                                              and nic_bandwidth_bps > 0):
        raise CalibrationError(f"{rate_field} = {nic_bandwidth_bps!r}: give one NIC's "
                               "line rate, e.g. '400gbit'")
    count = Nics() if nics_per_server is None else Nics(
        nics_per_server, count_field)
    if nic_bandwidth_bps is not None:
        return Nics(count.per_server, count.source, float(nic_bandwidth_bps),
                    rate_field)
    typical = typical_nic(network.devices)
    if typical is None:
        return count
    return Nics(count.per_server, count.source, typical.bits_per_s,
                f"typical for {typical.gpu}: {typical.hardware}; set {rate_field} if yours "
                "differ")


def build(network: Calibration, others: Sequence[Calibration], *,
          gpus_per_server: int | None = None, nvlink_busbw_bps: float | None = None,
          nvlink_latency_s: float | None = None, nics_per_server: int | None = None,
          nic_bandwidth_bps: float | None = None, where: str = "sweep.projection") -> Cluster:
    """A Cluster from the network calibration, the other calibrations in the files (one-server
    runs give NVLink) and the [sweep.projection] fields (`where` names them in errors)."""
    nics = nics_of(network, nics_per_server=nics_per_server,
                   nic_bandwidth_bps=nic_bandwidth_bps, where=where)
    check = check_network(network, nics, max(network.gpus_per_host, gpus_per_server or 0))
    intra = [c for c in others if c.hosts == 1 and c.collective in CALIBRATABLE_INTRA]
    notes = [f"{c.label}: not used (" + (
                 f"the network is the largest all_reduce calibrated, {network.world_size} GPUs"
                 if c.collective == "all_reduce" else
                 "DDP all-reduces its gradients; this harness has no FSDP traffic that would "
                 "reduce-scatter or all-gather across servers") + ")"
             for c in others if c.hosts > 1 and c is not network]
    sizes = sorted({c.world_size for c in intra})
    if len(sizes) > 1:
        raise CalibrationError(f"one-server runs on {sizes} GPUs: give the one that matches "
                               "your servers")
    if gpus_per_server is not None:
        g, gpus_source = gpus_per_server, f"{where}.gpus_per_server"
        if intra and intra[0].world_size != g:
            raise CalibrationError(
                f"{where}.gpus_per_server = {g}, but the one-server calibration "
                f"({intra[0].sources[0]}) ran on {intra[0].world_size} GPUs: drop the field or "
                "calibrate a whole server")
    elif intra:
        g, gpus_source = intra[0].world_size, f"the one-server run, {intra[0].sources[0]}"
    else:
        g = network.gpus_per_host
        gpus_source = f"the calibration's rank lines ({network.hosts} hosts x {g})"
    given = [name for name, value in (("nvlink_busbw", nvlink_busbw_bps),
                                      ("nvlink_latency", nvlink_latency_s)) if value is not None]
    typical = [name for name in ("nvlink_busbw", "nvlink_latency") if name not in given]
    field_source = "; ".join([f"{where}.{name}" for name in given]
                             + ([f"typical for {TYPICAL_NVLINK.hardware}: "
                                 + " and ".join(typical)] if typical else []))
    busbw = (nvlink_busbw_bps / 8 if nvlink_busbw_bps is not None
             else TYPICAL_NVLINK.busbw_bytes_per_s)
    latency = nvlink_latency_s if nvlink_latency_s is not None else TYPICAL_NVLINK.latency_s
    curves = {c.collective: c.curve for c in intra}
    if not curves:
        nvlink = NvlinkLevel(g, field_source, busbw, latency)
        return Cluster(network, g, gpus_source, nvlink, intra, notes, nics, check)
    source = ", ".join(dict.fromkeys(s for c in intra for s in c.sources))
    nvlink = NvlinkLevel(g, f"measured: {source}", busbw, latency,
                         reduce_scatter=curves.get("reduce_scatter"),
                         all_gather=curves.get("all_gather"), all_reduce=curves.get("all_reduce"))
    # A phase the one-server run lacks (and no all_reduce to halve) comes from the fields.
    missing = [] if "all_reduce" in curves else [
        phase for phase in ("reduce_scatter", "all_gather") if phase not in curves]
    if missing:
        notes.append(f"{' and '.join(missing)} inside a server: not in the one-server run; "
                     f"{busbw / 1e9:.0f} GB/s bus bandwidth, {latency * 1e6:.1f} us per phase "
                     f"({field_source})")
    elif given:
        notes.append(f"{where}.nvlink_busbw/nvlink_latency not used: the one-server "
                     "calibration measured NVLink")
    return Cluster(network, g, gpus_source, nvlink, intra, notes, nics, check)


def load_cluster(paths: Sequence[str | Path], **fields: Any) -> Cluster:
    """The cluster a projection uses, from nccl-tests files: the multi-host all_reduce with the
    largest world size is the network; one-server runs give NVLink; the fields are `build`'s
    (gpus_per_server, nvlink_busbw_bps, nvlink_latency_s, nics_per_server, nic_bandwidth_bps,
    where)."""
    found = load(paths)
    networks = [c for c in found if c.collective == "all_reduce" and c.hosts > 1]
    if not networks:
        one_host = [c for c in found if c.collective == "all_reduce"]
        if one_host:
            raise CalibrationError(
                f"{one_host[0].sources[0]}: the calibration ran on one host: it measures "
                "NVLink/PCIe, not the network, so it cannot say what more hosts cost; calibrate "
                "on 2 or more hosts (a one-server run may sit next to it, for NVLink)")
        names = ", ".join(str(p) for p in paths)
        raise CalibrationError(f"{names}: no all_reduce run (DDP all-reduces its gradients; run "
                               "all_reduce_perf)")
    network = max(networks, key=lambda c: c.world_size)
    return build(network, [c for c in found if c is not network], **fields)


# -- one all-reduce ----------------------------------------------------------------------------

@dataclass(frozen=True)
class AllReduceTime:
    seconds: float
    algorithm: str
    servers: int
    nvlink_s: float = 0.0  # the hierarchical algorithm's NVLink phases
    network_s: float = 0.0  # the hierarchical algorithm's network phase


def allreduce_time(cluster: Cluster, gpus: int, size: float) -> AllReduceTime:
    """One all-reduce of `size` bytes on `gpus` GPUs (the module doc's algorithms)."""
    cal, g = cluster.network, cluster.gpus_per_server
    n0, h0, g0, n = cal.world_size, cal.hosts, cal.gpus_per_host, gpus
    h = max(1, math.ceil(n / g))
    measured = cal.curve(size)
    if n == n0 and g == g0:
        return AllReduceTime(measured, "as calibrated", h)
    nvlink_ar = cluster.nvlink.all_reduce_s(size) if g > 1 else 0.0
    if h == 1:
        return AllReduceTime(nvlink_ar, "nvlink", 1, nvlink_s=nvlink_ar)
    if h0 < 2:
        raise CalibrationError(
            f"{cal.sources[0]}: the calibration ran on one host: it measures NVLink/PCIe, not the "
            "network, so it cannot say what more hosts cost; calibrate on 2 or more hosts")
    level, scale = cluster.level, cluster.nic_scale
    busbw = scale * level.busbw_bytes_per_s  # what the projected servers' NICs carry
    step = level.step_s(size)  # one ring step's latency, wherever it goes
    # The calibrated ring's bytes at this size, per unit of bus factor, on these servers' NICs.
    per_bus = level.bandwidth_s(size) / bus_factor("all_reduce", n0) / scale

    def bandwidth(members: int) -> float:  # a ring over `members`: its bus factor's bytes
        factor = bus_factor("all_reduce", members)
        return max(factor * per_bus, factor * size / busbw)

    ring = 2 * (n - 1) * step + bandwidth(n)
    # Tree: latency grows with its depth over servers; bandwidth NCCL's tree model's.
    tree_share = 2 * (h - 1) / h / TREE_EFFICIENCY
    tree = (level.floor_s(size) * math.log2(h) / math.log2(max(h0, 2))
            + max(tree_share * per_bus, tree_share * size / busbw))
    if g != g0:  # the server's GPUs are in the ring or the chain
        ring, tree = max(ring, nvlink_ar), max(tree, nvlink_ar)
    options = [AllReduceTime(ring, "ring", h), AllReduceTime(tree, "tree", h)]
    if g > 1 and g != g0:
        network = 2 * (h - 1) * step + bandwidth(h)
        phases = cluster.nvlink.reduce_scatter_s(size) + cluster.nvlink.all_gather_s(size)
        options.append(AllReduceTime(phases + network, "hierarchical", h, nvlink_s=phases,
                                     network_s=network))
    best = min(options, key=lambda option: option.seconds)
    if scale <= 1 and h >= h0 and best.seconds < measured:
        best = AllReduceTime(measured, best.algorithm, h, best.nvlink_s, best.network_s)
    return best


def collective_time(cluster: Cluster | Calibration, gpus: int, size: float) -> tuple[float, str]:
    """(seconds, algorithm) of one all-reduce; a bare Calibration is its own servers."""
    if isinstance(cluster, Calibration):
        cluster = Cluster.of(cluster)
    found = allreduce_time(cluster, gpus, size)
    return found.seconds, found.algorithm


# -- the projection ----------------------------------------------------------------------------

def project_calibrated(cluster: Cluster | Calibration, *, overlap: float,
                       compute_s: Mapping[str, float], bytes_per_rank: Mapping[str, float],
                       buckets: Mapping[str, int], gpus: Sequence[int]) -> list[dict[str, object]]:
    """Projection rows (as costmodel.project writes them, plus `algorithm`, `servers`,
    `gpus_per_server`, and the hierarchical algorithm's `nvlink_s` and `network_s`): per mode,
    the all-reduce of each of its buckets (equal shares of its bytes) on the cluster."""
    if isinstance(cluster, Calibration):
        cluster = Cluster.of(cluster)
    rows: list[dict[str, object]] = []
    for mode, total in bytes_per_rank.items():
        k = max(1, int(buckets[mode]))
        for n in gpus:
            one = allreduce_time(cluster, n, total / k)
            allreduce = k * one.seconds
            exposed = max(0.0, allreduce - overlap * compute_s[mode])
            step = compute_s[mode] + exposed
            row: dict[str, object] = {
                "mode": mode, "gpus": n, "link_bps": 0.0, "step_s": step,
                "allreduce_s": allreduce, "exposed_comm_s": exposed,
                "efficiency": compute_s[mode] / step, "algorithm": one.algorithm,
                "servers": one.servers, "gpus_per_server": cluster.gpus_per_server}
            if one.algorithm in ("hierarchical", "nvlink"):
                row |= {"nvlink_s": k * one.nvlink_s, "network_s": k * one.network_s}
            rows.append(row)
    return rows


def calibrated_projection(cluster: Cluster | Calibration, model: CostModel, *,
                          compute_s: Mapping[str, float], bytes_per_rank: Mapping[str, float],
                          buckets: Mapping[str, int], gpus: Sequence[int]) -> Projection:
    """A costmodel.Projection whose all-reduce times come from the cluster's calibration;
    `model` gives the overlap (fitted here), the rest is as measured here."""
    if isinstance(cluster, Calibration):
        cluster = Cluster.of(cluster)
    rows = project_calibrated(cluster, overlap=model.overlap, compute_s=compute_s,
                              bytes_per_rank=bytes_per_rank, buckets=buckets, gpus=gpus)
    return Projection(model, dict(compute_s), dict(bytes_per_rank), dict(buckets),
                      rows=rows,  # type: ignore[arg-type]
                      label=CALIBRATED_LABEL, alpha_source=f"from {cluster.network.label}",
                      calibration={**cluster.network.as_dict(), "cluster": cluster.as_dict()},
                      notes=[*cluster.describe(), *reach_notes(
                          cluster, gpus, [total / max(1, int(buckets[mode]))
                                          for mode, total in bytes_per_rank.items()])])


def reproject(projection: ProjectionRecord, cluster: Cluster | Calibration) -> ProjectionRecord:
    """A projection from a results document, projected again on `cluster`: the same modes,
    compute, bytes, buckets, overlap and GPU counts."""
    gpus = sorted({row.gpus for row in projection.rows})
    model = projection.model
    return calibrated_projection(
        cluster, CostModel(alpha_s=model.alpha_s, bandwidth_efficiency=model.bandwidth_efficiency,
                           overlap=model.overlap),
        compute_s=projection.compute_s, bytes_per_rank=projection.bytes_per_rank,
        buckets=projection.buckets, gpus=gpus).to_record()


__all__ = ["TYPICAL_NICS", "TYPICAL_NVLINK", "AllReduceTime", "Cluster", "NetworkCheck",
           "NetworkLevel", "Nics", "NvlinkLevel", "allreduce_time", "build",
           "calibrated_projection", "check_network", "collective_time", "load_cluster", "nics_of",
           "project_calibrated", "reproject", "typical_nic"]
