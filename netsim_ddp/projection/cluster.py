"""The calibrated cluster a projection runs on: two levels (NVLink inside a server, the network
between servers), and the all-reduce algorithms NCCL would pick on them.

The levels:

- the network: the calibration's multi-host all_reduce curve (`calibrate.Calibration`), at its
  world size n0 on h0 hosts of g0 GPUs.
- NVLink (the intra-node level): g GPUs per server. Their reduce-scatter and all-gather times
  come, in this order, from a one-server nccl-tests run in the calibration files
  (reduce_scatter_perf / all_gather_perf curves; where only all_reduce_perf ran inside the
  server, half its time each, since a ring all-reduce is a reduce-scatter then an all-gather);
  else from `[sweep.projection] nvlink_busbw` and `nvlink_latency`, each defaulting to a typical
  H100 SXM server (`TYPICAL_NVLINK`): t = latency + (g-1)/g x S / busbw.
  g is `[sweep.projection] gpus_per_server`, else the one-server run's GPUs, else the
  calibration's GPUs per host (its rank lines name the hosts).

The algorithms for one all-reduce of S bytes on n GPUs, h = ceil(n/g) servers; per bucket the
fastest counts, as NCCL's tuner picks, and each projection row names it:

- `as calibrated`: n = n0 and g = g0: the curve's time, nothing else.
- `nvlink`: all n GPUs in one server (h = 1): the NVLink all-reduce alone.
- `ring`: one flat ring over all n GPUs: 2(n-1) steps of S/n bytes, each costing what one of the
  calibration's 2(n0-1) steps cost at the same chunk size, t = (n-1)/(n0-1) x t_cal(S n0/n),
  never below the bandwidth plateau 2(n-1)/n x S / busbw. Best for big messages.
- `tree`: NCCL's double binary tree over the h servers (a chain inside each): the latency floor
  (the smallest size's time) grows with log2(h)/log2(h0), what the size costs above the floor at
  the tree's bandwidth against the ring's (NCCL's tuning model, src/graph/tuning.cc: tree busbw
  x 0.92, algbw = busbw / 2). Best for small messages at scale.
- `hierarchical` (g > 1): reduce-scatter inside each server over NVLink, all-reduce across the h
  servers over the network (g rings in parallel, one per local GPU, S/g bytes each: together S
  through each server's NICs, as a ring over the h servers: (h-1)/(h0-1) x t_cal(S h0/h), never
  below 2(h-1)/h x S at the calibrated hosts' bandwidth), all-gather inside each server over
  NVLink. Its network phase has 2(h-1) steps where the flat ring has 2(n-1): it wins in the
  middle, where the ring's latency and the tree's bandwidth both cost.

Where g differs from g0, the flat ring and the tree are never faster than the NVLink all-reduce
of the same bytes (the server's GPUs are part of the ring or chain). With h >= h0, no algorithm
beats the calibrated time: more servers never make one all-reduce faster. The network curve
of a calibration with g0 > 1 includes its own servers' NVLink hops; the hierarchical network
phase uses it as it is, so it errs slow, not fast. A calibration on one host measures no network
and projects nothing beyond one server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netsim_ddp.measure.document import ProjectionRecord
from netsim_ddp.projection.calibrate import (
    CALIBRATABLE_INTRA,
    TREE_BANDWIDTH,
    Calibration,
    CalibrationError,
    Curve,
    bus_factor,
    load,
)
from netsim_ddp.projection.costmodel import CALIBRATED_LABEL, CostModel, Projection


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


@dataclass
class Cluster:
    """The network calibration, the servers' GPUs and their NVLink level."""

    network: Calibration
    gpus_per_server: int
    gpus_source: str
    nvlink: NvlinkLevel
    intra_calibrations: list[Calibration] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, network: Calibration) -> Cluster:
        """The calibration's own servers, NVLink at its typical defaults."""
        return build(network, [])

    def describe(self) -> list[str]:
        """The levels, in words, for the projection's assumptions."""
        g, nv = self.gpus_per_server, self.nvlink
        lines = [f"{g} GPU(s) per server ({self.gpus_source})"]
        if g > 1:
            if nv.measured:
                lines.append(f"NVLink inside a server: {', '.join(nv.measured)} as measured "
                             f"({nv.source})")
            else:
                lines.append(f"NVLink inside a server: {nv.busbw_bytes_per_s / 1e9:.0f} GB/s bus "
                             f"bandwidth, {nv.latency_s * 1e6:.1f} us per phase ({nv.source})")
        return lines + self.notes

    def as_dict(self) -> dict[str, Any]:
        return {"gpus_per_server": self.gpus_per_server, "gpus_source": self.gpus_source,
                "nvlink": self.nvlink.as_dict(),
                "intra_calibrations": [c.as_dict() for c in self.intra_calibrations],
                "notes": self.notes}


def build(network: Calibration, others: Sequence[Calibration], *,
          gpus_per_server: int | None = None, nvlink_busbw_bps: float | None = None,
          nvlink_latency_s: float | None = None, where: str = "sweep.projection") -> Cluster:
    """A Cluster from the network calibration, the other calibrations in the files (one-server
    runs give NVLink) and the [sweep.projection] fields (`where` names them in errors)."""
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
        return Cluster(network, g, gpus_source, nvlink, intra, notes)
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
    return Cluster(network, g, gpus_source, nvlink, intra, notes)


def load_cluster(paths: Sequence[str | Path], **fields: Any) -> Cluster:
    """The cluster a projection uses, from nccl-tests files: the multi-host all_reduce with the
    largest world size is the network; one-server runs give NVLink (see `build`)."""
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
    n0, h0, n = cal.world_size, cal.hosts, gpus
    h = max(1, math.ceil(n / g))
    measured = cal.curve(size)
    if n == n0 and g == cal.gpus_per_host:
        return AllReduceTime(measured, "as calibrated", h)
    nvlink_ar = cluster.nvlink.all_reduce_s(size) if g > 1 else 0.0
    if h == 1:
        return AllReduceTime(nvlink_ar, "nvlink", 1, nvlink_s=nvlink_ar)
    if h0 < 2:
        raise CalibrationError(
            f"{cal.sources[0]}: the calibration ran on one host: it measures NVLink/PCIe, not the "
            "network, so it cannot say what more hosts cost; calibrate on 2 or more hosts")
    # Ring: 2(n-1) steps, each moving S/n; a step costs what one of the calibration's steps
    # cost at the same chunk size, so latency grows with the steps and bandwidth holds.
    # Never above the bandwidth plateau, though: a shaper's burst or a protocol's sweet spot
    # can make one small chunk fast, not every step of a ring.
    ring = max((n - 1) / (n0 - 1) * cal.curve(size * n0 / n),
               bus_factor("all_reduce", n) * size / cal.busbw_bytes_per_s)
    # Tree: the latency floor grows with the tree's depth over servers, log2(h); the rest of
    # the calibrated time (what the size costs) at tree's bandwidth against the calibrated ring's.
    floor = float(cal.curve.smoothed_s[0])
    depth = math.log2(h) / math.log2(h0)
    penalty = (1 / bus_factor("all_reduce", n0)) / TREE_BANDWIDTH
    tree = floor * depth + penalty * max(0.0, measured - floor)
    if g != cal.gpus_per_host:  # the server's GPUs are in the ring or the chain
        ring, tree = max(ring, nvlink_ar), max(tree, nvlink_ar)
    options = [AllReduceTime(ring, "ring", h), AllReduceTime(tree, "tree", h)]
    if g > 1:
        host_busbw = bus_factor("all_reduce", h0) * cal.curve.tail_bytes_per_s
        network = max((h - 1) / (h0 - 1) * cal.curve(size * h0 / h),
                      bus_factor("all_reduce", h) * size / host_busbw)
        phases = cluster.nvlink.reduce_scatter_s(size) + cluster.nvlink.all_gather_s(size)
        options.append(AllReduceTime(phases + network, "hierarchical", h, nvlink_s=phases,
                                     network_s=network))
    best = min(options, key=lambda option: option.seconds)
    if h >= h0 and best.seconds < measured:  # more servers never make one all-reduce faster
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
                      notes=cluster.describe())


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


__all__ = ["TYPICAL_NVLINK", "AllReduceTime", "Cluster", "NvlinkLevel", "allreduce_time",
           "build", "calibrated_projection", "collective_time", "load_cluster",
           "project_calibrated", "reproject"]
