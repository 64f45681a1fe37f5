"""A cost model of one DDP step, fitted to measured points, and projections from it.

The model (README words: compute, comm, ring all-reduce, scaling efficiency):

    allreduce(n, S, k)  = 2(n-1)/n x S / (eff x link)  +  2(n-1) x k x alpha
    exposed comm        = max(0, allreduce - overlap x compute)
    step                = compute + exposed comm
    scaling efficiency  = compute / step

n is the world size (ranks in the ring), S the bytes one rank hands to all-reduce per step (what
the comm hook sends: FP32 gradients, or half of them with a 16-bit hook), k the all-reduce calls
(DDP buckets) per step, link the slowest link's rate. Three parameters are fitted:

- `alpha_s`: the per-hop latency of one ring step (2(n-1) hops per bucket): the network's
  round trips plus the collective library's per-message overhead.
- `bandwidth_efficiency`: the fraction of the link rate the all-reduce achieves (headers, TCP,
  the library): effective bandwidth B = eff x link. Kept as a fraction so the model carries over
  to other link rates in a projection.
- `overlap`: the fraction of the compute-only step during which communication can run hidden
  (backward overlapping the bucket all-reduces). 0 = nothing hides; 1 = all of compute can.

The fit. Where communication is exposed (every multi-rank point on a network-bound host),
step - compute = a x (1/eff) + b x alpha - compute x overlap with a = 2(n-1)/n x S x 8 / link and
b = 2(n-1) x k: *linear* in (1/eff, alpha, overlap). So the fit is a bounded linear least
squares (`scipy.optimize.lsq_linear`, eff <= 1, alpha >= 0, 0 <= overlap <= 1) on relative
residuals (each row divided by its measured step, so the fit minimises the relative error the
held-out check reports), then one bounded nonlinear refinement with the max(0, .) in place
(`scipy.optimize.least_squares`), which only matters when some points hide all their
communication. Single-rank points carry no information on the network (their all-reduce is
zero) and are left out of the fit; they are still predicted (step = compute).

Identifiability: alpha and overlap both add a near-constant to each point's exposed comm unless
the points vary the hop count 2(n-1)k and the compute time; `FitResult.condition` reports the
condition number of the (scaled) design matrix so a sweep that cannot separate them says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from netsim_ddp.common.metrics import median_interval, ring_factor
from netsim_ddp.measure.document import FitRecord, HeldOutCheckRecord, ProjectionRecord

MIN_EFFICIENCY = 1e-3  # bounds of the fit; eff above 1 would beat the wire
MAX_ALPHA_S = 10.0
PROJECTION_LABEL = ("PROJECTION: computed from a cost model fitted on this host's measurements, "
                    "not measured")
CALIBRATED_LABEL = ("PROJECTION: all-reduce times from the calibration's nccl-tests measurements, "
                    "compute, bytes and overlap from this host's; not measured")
# Past this many times the largest measured world size, the fitted per-hop latency (this host's
# gloo and kernel stack) drives the projection, so it is shown next to a typical NCCL one.
HOST_ALPHA_REACH = 8
# A typical per-hop latency of NCCL over TCP/Ethernet: NCCL's own tuning model counts a network
# hop at 2.7-14 us by protocol (src/graph/tuning.cc, hwLat NET), for InfiniBand/RoCE; TCP sockets
# add the kernel's stack. An assumption for comparison, not a measurement.
TYPICAL_ETHERNET_ALPHA_S = 20e-6


@dataclass(frozen=True)
class StepPoint:
    """One measured (or to-be-predicted) configuration of one mode."""

    mode: str
    world_size: int
    link_bps: float  # the slowest link's rate, bits/s
    bytes_per_rank: float  # S: bytes one rank hands to all-reduce per step
    buckets: int  # all-reduce calls per step
    compute_s: float  # compute-only step time
    step_s: float | None = None  # measured step time; None for a pure prediction
    label: str = ""
    step_samples: tuple[float, ...] = ()  # the measured step times step_s is the median of

    @property
    def efficiency(self) -> float:
        """Scaling efficiency as measured: compute-only time / step time."""
        if self.step_s is None:
            raise ValueError(f"{self.mode} at {self.world_size} ranks: a prediction, not measured")
        return self.compute_s / self.step_s

    @property
    def bandwidth_term(self) -> float:
        """2(n-1)/n x S / link, seconds at 100% link efficiency."""
        return ring_factor(self.world_size) * self.bytes_per_rank * 8 / self.link_bps

    @property
    def hops(self) -> int:
        """Latency-bound ring steps per step: 2(n-1) per bucket."""
        return 2 * (self.world_size - 1) * self.buckets if self.world_size > 1 else 0


@dataclass(frozen=True)
class CostModel:
    alpha_s: float
    bandwidth_efficiency: float
    overlap: float

    def allreduce_s(self, point: StepPoint) -> float:
        if point.world_size <= 1:
            return 0.0
        return point.bandwidth_term / self.bandwidth_efficiency + point.hops * self.alpha_s

    def exposed_comm_s(self, point: StepPoint) -> float:
        return max(0.0, self.allreduce_s(point) - self.overlap * point.compute_s)

    def step_s(self, point: StepPoint) -> float:
        return point.compute_s + self.exposed_comm_s(point)

    def efficiency(self, point: StepPoint) -> float:
        return point.compute_s / self.step_s(point)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass
class FitResult:
    model: CostModel
    points: list[StepPoint]  # the points the fit used
    relative_residuals: list[float]  # (predicted - measured) / measured, per fitted point
    condition: float  # of the column-scaled design matrix; large = parameters not separable
    method: str

    @property
    def rms_relative_error(self) -> float:
        if not self.relative_residuals:
            return 0.0
        return math.sqrt(sum(r * r for r in self.relative_residuals) / len(self.relative_residuals))

    @property
    def identifiable(self) -> bool:
        return len(self.points) >= 3 and self.condition < 1e3

    def to_record(self) -> FitRecord:
        return FitRecord.model_validate({
            "model": self.model.as_dict(),
            "method": self.method,
            "fitted_points": [_point_dict(p) for p in self.points],
            "relative_residuals": self.relative_residuals,
            "rms_relative_error": self.rms_relative_error,
            "condition": self.condition,
            "identifiable": self.identifiable,
        }, strict=False)


class FitError(ValueError):
    """Too few points with communication to fit the model."""


def fit(points: Iterable[StepPoint]) -> FitResult:
    """Fit alpha, bandwidth efficiency and overlap to measured points (see the module doc)."""
    from scipy.optimize import least_squares, lsq_linear

    usable = [p for p in points if p.world_size > 1 and p.step_s is not None]
    if len(usable) < 2:
        raise FitError(f"{len(usable)} measured multi-rank point(s): the fit needs at least 2 "
                       "(better 3 or more, varying world size and bytes)")
    measured = np.array([p.step_s for p in usable], dtype=float)
    compute = np.array([p.compute_s for p in usable], dtype=float)
    design = np.column_stack([
        [p.bandwidth_term for p in usable],  # x 1/eff
        [p.hops for p in usable],  # x alpha
        -compute,  # x overlap
    ]) / measured[:, None]
    target = (measured - compute) / measured
    lower = np.array([1.0, 0.0, 0.0])
    upper = np.array([1 / MIN_EFFICIENCY, MAX_ALPHA_S, 1.0])
    linear = lsq_linear(design, target, bounds=(lower, upper), method="bvls")
    # The condition number of the design with unit-norm columns: scale-free, so it says whether
    # the points separate the parameters, not whether seconds and bytes differ in magnitude.
    norms = np.linalg.norm(design, axis=0)
    norms[norms == 0] = 1.0
    singular = np.linalg.svd(design / norms, compute_uv=False)
    condition = (float(singular[0] / singular[-1])
                 if len(singular) == design.shape[1] and singular[-1] > 0 else float("inf"))

    def residuals(x: np.ndarray) -> np.ndarray:
        # design @ x x measured = allreduce - overlap x compute, in seconds
        comm = np.maximum(0.0, design @ x * measured)
        return (compute + comm - measured) / measured

    start = np.clip(linear.x, lower + 1e-12, upper - 1e-12)
    refined = least_squares(residuals, start, bounds=(lower, upper), method="trf",
                            x_scale="jac")
    if 2 * refined.cost <= float(np.sum(residuals(linear.x) ** 2)):
        x, method = refined.x, "lsq_linear + least_squares refinement"
    else:
        x, method = linear.x, "lsq_linear"
    model = CostModel(alpha_s=float(x[1]), bandwidth_efficiency=float(1 / x[0]),
                      overlap=float(x[2]))
    relative = [float(r) for r in residuals(x)]
    return FitResult(model, usable, relative, condition, method)


@dataclass
class HeldOutResult:
    """Fit on some points, predict the others, and how far off the predictions were.

    A held-out point is *missed* when the prediction is off by more than the target and also
    lies outside the 95% interval of the measured median widened by the target: a few noisy
    steps (a neighbour on a shared host) must not fail the model, as the baseline gate flags a
    regression only when it is over the tolerance and significant. Points without samples are
    judged on the error alone."""

    fit: FitResult
    held_out: list[StepPoint]
    predicted_s: list[float]
    target: float = 0.15

    @property
    def errors(self) -> list[float]:
        """(predicted - measured) / measured, per held-out point."""
        return [(pred - p.step_s) / p.step_s
                for p, pred in zip(self.held_out, self.predicted_s, strict=True)
                if p.step_s is not None]

    @property
    def intervals(self) -> list[tuple[float, float]]:
        """The 95% interval of each held-out point's measured median step."""
        return [median_interval(p.step_samples) if p.step_samples else (p.step_s, p.step_s)
                for p in self.held_out if p.step_s is not None]

    @property
    def misses(self) -> list[bool]:
        """Per held-out point: off by more than the target, beyond the measurements' noise."""
        t = self.target
        return [abs(error) > t and not low * (1 - t) <= pred <= high * (1 + t)
                for error, pred, (low, high) in zip(self.errors, self.predicted_s,
                                                    self.intervals, strict=True)]

    @property
    def max_abs_error(self) -> float:
        return max((abs(e) for e in self.errors), default=0.0)

    @property
    def within_target(self) -> bool:
        """Every point predicted within the target, noise or not."""
        return self.max_abs_error <= self.target

    @property
    def met(self) -> bool:
        """No point missed (see the class doc): the verdict a sweep is judged by."""
        return not any(self.misses)

    @property
    def verdict(self) -> str:
        """Words for reports: ok, within the noise, or MISSED."""
        if self.within_target:
            return "ok"
        return "outside the target, within the measurements' noise" if self.met else "MISSED"

    def errors_by_mode(self) -> dict[str, float]:
        """The worst error of each mode over its held-out points."""
        worst: dict[str, float] = {}
        for point, error in zip(self.held_out, self.errors, strict=True):
            if abs(error) >= abs(worst.get(point.mode, 0.0)):
                worst[point.mode] = error
        return worst

    def to_record(self) -> HeldOutCheckRecord:
        return HeldOutCheckRecord.model_validate({
            "fit": self.fit.to_record(),
            "held_out": [{**_point_dict(p), "predicted_s": pred, "error": err,
                          "measured_interval_s": list(interval), "missed": missed,
                          "predicted_efficiency": p.compute_s / pred,
                          "measured_efficiency": (p.compute_s / p.step_s if p.step_s else None)}
                         for p, pred, err, interval, missed in zip(
                             self.held_out, self.predicted_s, self.errors, self.intervals,
                             self.misses, strict=True)],
            "errors_by_mode": self.errors_by_mode(),
            "max_abs_error": self.max_abs_error,
            "target": self.target,
            "within_target": self.within_target,
            "met": self.met,
            "verdict": self.verdict,
        }, strict=False)


def check_held_out(train: Sequence[StepPoint], held_out: Sequence[StepPoint],
            target: float = 0.15) -> HeldOutResult:
    fitted = fit(train)
    return HeldOutResult(fitted, list(held_out), [fitted.model.step_s(p) for p in held_out],
                         target)


@dataclass
class Projection:
    model: CostModel
    compute_s: dict[str, float]  # per mode, the per-GPU compute-only step
    bytes_per_rank: dict[str, float]
    buckets: dict[str, int]
    rows: list[dict[str, float | int | str]] = field(default_factory=list)
    label: str = PROJECTION_LABEL
    alpha_source: str = ("as fitted here (gloo over emulated links on a CPU host, its "
                         "per-message overheads included)")
    calibration: dict[str, object] | None = None  # Calibration.as_dict(), when one is used
    typical_alpha_s: float | None = None  # shown next to the fitted alpha (HOST_ALPHA_REACH)
    notes: list[str] = field(default_factory=list)

    def assumptions(self) -> list[str]:
        m = self.model
        if self.calibration is not None:
            return calibrated_assumptions(self.calibration, m.overlap)
        return [
            "one GPU per link, all links at the given rate, one flat ring all-reduce over all "
            "GPUs (no hierarchy, no NVLink inside a server, no tree or in-network reduction)",
            f"per-hop latency alpha = {m.alpha_s * 1e3:.3f} ms {self.alpha_source}; 2(n-1) "
            "hops per bucket, so at 1024 GPUs the latency term can dominate",
            f"the all-reduce reaches {m.bandwidth_efficiency:.0%} of the link rate, the fraction "
            "measured here, assumed to hold at 10-100 Gbit/s (real NICs and NCCL differ)",
            f"overlap = {m.overlap:.2f} of the compute step can hide communication, as fitted",
            "compute per GPU does not change with the number of GPUs (weak scaling, the same "
            "per-GPU batch)",
            "bytes per step and buckets per mode as measured (the comm hook's bytes, DDP buckets)",
        ]

    def efficiency(self, mode: str, gpus: int, link_bps: float) -> float:
        for row in self.rows:
            if row["mode"] == mode and row["gpus"] == gpus and row["link_bps"] == link_bps:
                return float(row["efficiency"])
        raise KeyError((mode, gpus, link_bps))

    def to_record(self) -> ProjectionRecord:
        return ProjectionRecord.model_validate(
            {"label": self.label, "model": self.model.as_dict(),
             "assumptions": self.assumptions(), "alpha_source": self.alpha_source,
             "compute_s": self.compute_s, "bytes_per_rank": self.bytes_per_rank,
             "buckets": self.buckets, "calibration": self.calibration,
             "typical_alpha_s": self.typical_alpha_s, "notes": self.notes, "rows": self.rows},
            strict=False)


def calibrated_assumptions(calibration: Mapping[str, object], overlap: float) -> list[str]:
    world, hosts = calibration["world_size"], calibration["hosts"]
    busbw = float(calibration["busbw_bytes_per_s"])  # type: ignore[arg-type]
    return [
        f"all-reduce time per bucket from the calibration ({calibration['collective']} on "
        f"{world} GPUs, {hosts} hosts; nccl-tests in-place times), interpolated in size only at "
        f"{world} GPUs",
        f"beyond {world} GPUs: its latency per ring step (at 1 MiB) carried over the steps of "
        f"each algorithm (ring 2(n-1) over the GPUs, tree log2 of the servers, hierarchical "
        f"2(h-1) over the h servers), its bytes at the bus bandwidth it measured at the same "
        f"size, never past the plateau {busbw * 8 / 1e9:.1f} Gbit/s, times the NICs that "
        "carry them over the calibrated hosts' (tree at 0.7 x h/2(h-1) of it, NCCL's model); "
        "per bucket the fastest algorithm, named in each row",
        "the servers' GPUs, NICs and NVLink as the notes say, each with where it comes from; "
        "a calibration that cannot be extrapolated as measured (NCCL's 2-host tree) is "
        "flagged first",
        "DDP buckets as measured here, each an equal share of the mode's bytes",
        f"overlap = {overlap:.2f} of the compute step can hide communication, as fitted here",
        "compute per GPU does not change with the number of GPUs (weak scaling)",
    ]


def project(model: CostModel, *, compute_s: Mapping[str, float] | float,
            bytes_per_rank: Mapping[str, float], buckets: Mapping[str, int],
            gpus: Sequence[int] = (16, 64, 256, 1024),
            link_bps: Sequence[float] = (10e9, 25e9, 100e9),
            alpha_s: float | None = None, typical_alpha_s: float | None = None,
            typical_beyond: int = 0, latency_bound_beyond: int | None = None) -> Projection:
    """Scaling efficiency of each mode at each GPU count and link rate, from the model;
    `alpha_s` replaces the fitted per-hop latency with the target cluster's; `typical_alpha_s`
    adds, to each row past `typical_beyond` GPUs, the step and efficiency with that per-hop
    latency instead (the side-by-side a projection far past the measured sizes shows); and to
    each row past `latency_bound_beyond` GPUs whose all-reduce is more latency than bandwidth
    (there the fitted per-hop latency, not the link, decides the number)."""
    fitted_alpha = model.alpha_s
    if alpha_s is not None:
        model = replace(model, alpha_s=float(alpha_s))
    modes = list(bytes_per_rank)
    compute = ({mode: float(compute_s) for mode in modes} if isinstance(compute_s, int | float)
               else {mode: float(compute_s[mode]) for mode in modes})
    projection = Projection(model, compute, dict(bytes_per_rank),
                            {mode: int(buckets[mode]) for mode in modes})
    if alpha_s is not None:
        projection.alpha_source = (f"as given for the target cluster (fitted here: "
                                   f"{fitted_alpha * 1e3:.3f} ms)")
    for mode in modes:
        for rate in link_bps:
            for n in gpus:
                point = StepPoint(mode, n, rate, bytes_per_rank[mode], int(buckets[mode]),
                                  compute[mode])
                step = model.step_s(point)
                row: dict[str, float | int | str] = {
                    "mode": mode, "gpus": n, "link_bps": rate, "step_s": step,
                    "allreduce_s": model.allreduce_s(point),
                    "exposed_comm_s": model.exposed_comm_s(point),
                    "efficiency": compute[mode] / step, "algorithm": "flat ring",
                }
                latency_bound = (latency_bound_beyond is not None and n > latency_bound_beyond
                                 and point.hops * model.alpha_s
                                 > point.bandwidth_term / model.bandwidth_efficiency)
                if typical_alpha_s is not None and (n > typical_beyond or latency_bound):
                    typical = replace(model, alpha_s=typical_alpha_s).step_s(point)
                    row |= {"step_s_typical_alpha": typical,
                            "efficiency_typical_alpha": compute[mode] / typical}
                projection.rows.append(row)
    if typical_alpha_s is not None and any("step_s_typical_alpha" in r for r in projection.rows):
        projection.typical_alpha_s = typical_alpha_s
        projection.alpha_source = (
            f"as fitted here: THIS HOST'S STACK (gloo, the kernel's TCP over veths on a CPU "
            f"host), not a cluster's; each row also shows a typical NCCL-over-Ethernet "
            f"{typical_alpha_s * 1e6:.0f} us per hop")
    return projection


def _point_dict(point: StepPoint) -> dict[str, object]:
    return asdict(point)
