"""A collective's time against message size, calibrated from nccl-tests output, and a DDP
projection from it.

The curve. nccl-tests measures the whole range: latency-bound small messages, the protocol
changes in the middle (LL -> LL128 -> Simple, tree -> ring), the bandwidth plateau. A single
alpha-beta line t = a + S/B cannot follow that (it misses the middle several times over; the
table reports that line's worst error next to the curve's), and an interpolant between the
measured sizes cannot know where NCCL switches. So the curve is NCCL's own shape
(`nccl_model`): a sequence of regimes, one per (algorithm, protocol) NCCL ran, each a latency
and a bandwidth (a line in time against size), split where the measurements say; between two
regimes the faster one, as NCCL's tuner picks. Around it:

- rows the fit leaves out, each named with its file and line (`Calibration.left_out`; `calibrate`
  prints them, projections carry them in their notes): a row whose nccl-tests check failed
  (`#wrong` > 0 on the time used: a broken all-reduce's time is not its cost), and a size slower
  than a larger size by more than `INVERSION` (25%, far above nccl-tests' ~2% run-to-run
  spread): not what its bytes cost but a slow path NCCL's tuner or the network plugin took at
  that size (CSCS Alps: 1 MiB at 7x the time of 2 MiB). Left in, the isotonic step below would
  spread it over its neighbours and make both wrong. An inverted size's measured time is kept
  (`measured_points`) for comparing projections with what was measured.
- the times are first made non-decreasing in size (an isotonic regression,
  scipy.optimize.isotonic_regression): a larger message never takes less time, and noise at
  the latency floor must not make the curve dip.
- inside the measured sizes: `nccl_model.interpolate` (the regime's line, bent through the
  measurements next to it, never outside its neighbours' times).
- above the largest size: the top regime's line, t(Smax) + (S - Smax) / B, B its bandwidth
  (the bandwidth plateau when the run reached it).
- below the smallest size: the bottom regime's line through t(Smin) (on a run from 8 B, the
  latency floor).

Its error is reported held out: each size predicted by the curve fitted without it (regimes
split and fitted again), the only honest number (the curve passes through the measured points,
so its in-sample error says nothing).

The projection from a calibration (the network level, NVLink inside a server, the ring, tree
and hierarchical all-reduce) is `cluster.py`'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from netsim_ddp.projection.nccl_model import Regime, Topology, interpolate, label, segment
from netsim_ddp.projection.nccl_tests import NcclParseError, NcclTestRun, parse_file, parse_text

MIB = 2**20
ERROR_FROM_BYTES = MIB  # the 10% promise holds from 1 MiB up; smaller sizes are reported too
# NCCL's tree all-reduce (its NVLS tree, src/graph/tuning.cc): a double binary tree over h
# servers moves 2(h-1)/h x S through each server's NICs (S on 2 servers, where a ring moves
# 2(n-1)/n x S), at 0.7 of the rate a ring gets from them: algbw = 0.7 x h/(2(h-1)) x busbw.
TREE_EFFICIENCY = 0.7
# A size slower than some larger size by more than this (nccl-tests' run-to-run noise is ~2%)
# is not what its bytes cost: NCCL's tuner or the network plugin took a slow path there.
INVERSION = 0.25
# What a one-server run can calibrate: the NVLink phases of a hierarchical all-reduce.
CALIBRATABLE_INTRA = ("all_reduce", "reduce_scatter", "all_gather")


class CalibrationError(ValueError):
    """A calibration that cannot be fitted or used; the message is one line."""


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw."""
    n = world_size
    if n <= 1:
        return 1.0
    return 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n


@dataclass
class Curve:
    """Time (s) of one collective against size (bytes), see the module doc."""

    sizes: np.ndarray
    measured_s: np.ndarray
    smoothed_s: np.ndarray = field(init=False)
    regimes: list[Regime] = field(init=False)
    tail_bytes_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        from scipy.optimize import isotonic_regression

        order = np.argsort(self.sizes)
        self.sizes = np.asarray(self.sizes, dtype=float)[order]
        self.measured_s = np.asarray(self.measured_s, dtype=float)[order]
        if len(self.sizes) < 3:
            raise CalibrationError(f"{len(self.sizes)} sizes measured: a curve needs 3 or more "
                                   "(run nccl-tests with -b 8 -e 8G -f 2)")
        self.smoothed_s = np.exp(isotonic_regression(np.log(self.measured_s)).x)
        self.regimes = segment(self.sizes, self.smoothed_s)
        top = self.regimes[-1]
        # A flat top regime (noise at the top) extrapolates at the largest size's algbw.
        self.tail_bytes_per_s = float(top.algbw_bytes_per_s if top.seconds_per_byte > 0
                                      else self.sizes[-1] / self.smoothed_s[-1])

    def time_s(self, size: float | np.ndarray) -> np.ndarray:
        s = np.atleast_1d(np.asarray(size, dtype=float))
        low, high = self.sizes[0], self.sizes[-1]
        inside = np.array([interpolate(self.regimes, self.sizes, self.smoothed_s, x)
                           for x in np.clip(s, low, high)])
        tail = self.smoothed_s[-1] + (s - high) / self.tail_bytes_per_s
        bottom = self.regimes[0]  # below: its line through the smallest size
        head = self.smoothed_s[0] * bottom.time_s(s) / bottom.time_s(low)
        return np.where(s > high, tail, np.where(s < low, head, inside))

    def __call__(self, size: float) -> float:
        return float(self.time_s(size)[0])

    def held_out_s(self) -> np.ndarray:
        """Each size predicted by the curve fitted on all the other sizes (NaN with fewer
        than 4 sizes: the others would be too few for a curve)."""
        out = np.full(len(self.sizes), math.nan)
        if len(self.sizes) < 4:
            return out
        for i in range(len(self.sizes)):
            keep = np.arange(len(self.sizes)) != i
            out[i] = Curve(self.sizes[keep], self.measured_s[keep])(self.sizes[i])
        return out


def alpha_beta_line(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """(alpha s, bytes/s) of the single line t = alpha + S/B fitted on relative error: what
    the curve is compared against."""
    from scipy.optimize import lsq_linear

    design = np.column_stack([1 / times, sizes / times])
    fitted = lsq_linear(design, np.ones(len(times)), bounds=(0, np.inf))
    alpha, inverse_bandwidth = fitted.x
    return float(alpha), float(1 / inverse_bandwidth) if inverse_bandwidth > 0 else math.inf


@dataclass(frozen=True)
class LeftOut:
    """A row the fit leaves out: its size, its time (None where nccl-tests' check failed: not
    a cost at all) and why, in words."""

    size: int
    time_s: float | None
    note: str


@dataclass
class Calibration:
    """One collective at one world size, from one or more nccl-tests runs."""

    collective: str
    world_size: int
    hosts: int
    gpus_per_host: int
    devices: list[str]
    sources: list[str]
    curve: Curve
    left_out: list[LeftOut] = field(default_factory=list)  # rows the fit does not use

    @property
    def dropped(self) -> list[str]:
        return [row.note for row in self.left_out]

    def measured_points(self) -> tuple[np.ndarray, np.ndarray]:
        """(sizes, times) of every row whose check passed, fitted or inverted: what a
        projection is compared with."""
        kept = [row for row in self.left_out if row.time_s is not None]
        sizes = np.append(self.curve.sizes, [row.size for row in kept])
        times = np.append(self.curve.measured_s, [row.time_s for row in kept])
        order = np.argsort(sizes)
        return sizes[order], times[order]

    @property
    def label(self) -> str:
        return (f"{self.collective} on {self.world_size} GPUs ({self.hosts} hosts x "
                f"{self.gpus_per_host}), from {', '.join(self.sources)}")

    @property
    def busbw_bytes_per_s(self) -> float:
        """The bus bandwidth plateau: busbw at the slope of the largest sizes (not the largest
        busbw printed: a shaper's burst lets a mid-size message beat the link)."""
        return bus_factor(self.collective, self.world_size) * self.curve.tail_bytes_per_s

    def table(self) -> list[dict[str, Any]]:
        modelled = self.curve.time_s(self.curve.sizes)
        held = self.curve.held_out_s()
        return [{"size": int(size), "measured_s": float(t), "modelled_s": float(m),
                 "error": float((m - t) / t),
                 "held_out_s": None if math.isnan(h) else float(h),
                 "held_out_error": None if math.isnan(h) else float((h - t) / t)}
                for size, t, m, h in zip(self.curve.sizes, self.curve.measured_s, modelled, held,
                                         strict=True)]

    def as_dict(self) -> dict[str, Any]:
        rows = self.table()
        big = [row for row in rows if row["size"] >= ERROR_FROM_BYTES]
        alpha, bandwidth = alpha_beta_line(self.curve.sizes, self.curve.measured_s)
        line = alpha + self.curve.sizes / bandwidth
        line_errors = np.abs(line - self.curve.measured_s) / self.curve.measured_s
        return {
            "collective": self.collective, "world_size": self.world_size, "hosts": self.hosts,
            "gpus_per_host": self.gpus_per_host, "devices": self.devices,
            "sources": self.sources,
            "left_out": [{"size": row.size, "time_s": row.time_s, "note": row.note}
                         for row in self.left_out],
            "method": ("NCCL-shaped regimes (one latency + bandwidth line per algorithm/protocol "
                       "NCCL ran, the faster at a switch), isotonic first, the top regime's "
                       "line above the largest size"),
            "busbw_bytes_per_s": self.busbw_bytes_per_s,
            "tail_algbw_bytes_per_s": self.curve.tail_bytes_per_s,
            "sizes": rows,
            "max_abs_error_from_1MiB": max((abs(r["error"]) for r in big), default=None),
            "max_abs_held_out_error_from_1MiB": max(
                (abs(r["held_out_error"]) for r in big if r["held_out_error"] is not None),
                default=None),
            "alpha_beta_line": {"alpha_s": alpha, "algbw_bytes_per_s": bandwidth,
                                "max_abs_error": float(line_errors.max())},
        }


IN_SAMPLE = ("modelled_s", "error")  # per size: the model through the point, ~0 by construction


def held_out_document(calibration: Calibration) -> dict[str, Any]:
    """`Calibration.as_dict` as `calibrate --json` writes it: held-out errors only (the
    in-sample ones are ~0 by construction and would read as a claim), the regimes added."""
    document = calibration.as_dict()
    document.pop("max_abs_error_from_1MiB", None)
    document["sizes"] = [{k: v for k, v in row.items() if k not in IN_SAMPLE}
                         for row in document["sizes"]]
    curve = calibration.curve
    document["regimes"] = [{"from_size": int(curve.sizes[r.first]),
                            "to_size": int(curve.sizes[r.last]), "latency_s": r.latency_s,
                            "algbw_bytes_per_s": (r.algbw_bytes_per_s
                                                  if r.seconds_per_byte > 0 else None)}
                           for r in curve.regimes]
    return document


def regime_lines(calibration: Calibration) -> list[str]:
    """The fitted regimes in words: sizes, latency, bus bandwidth, and for an NCCL run the pair
    NCCL's tuner model picks there (one NIC per GPU at 400 Gbit/s assumed: an estimate,
    NCCL_ALGO/NCCL_PROTO or a tuner plugin change it)."""
    curve = calibration.curve
    nccl = any("NVIDIA" in device.upper() for device in calibration.devices)
    topology = (Topology(calibration.world_size, calibration.hosts,
                         float(calibration.gpus_per_host)) if nccl else None)
    factor = bus_factor(calibration.collective, calibration.world_size)
    lines = []
    for regime in label(curve.regimes, curve.sizes, topology):
        low, high = int(curve.sizes[regime.first]), int(curve.sizes[regime.last])
        busbw = (f"{factor * regime.algbw_bytes_per_s / 1e9:.1f} GB/s" if regime.seconds_per_byte
                 > 0 else "latency only")
        named = f" (NCCL's tuner model: {regime.label})" if regime.label else ""
        lines.append(f"regime {_size(low)}-{_size(high)}: latency "
                     f"{regime.latency_s * 1e6:.1f} us, busbw {busbw}{named}")
    return lines


def _size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def calibrations(runs: Iterable[NcclTestRun]) -> list[Calibration]:
    """One calibration per (collective, world size, hosts); several runs of the same kind
    (repeats, or -b/-e ranges split over runs) are merged, a size measured twice by its
    median."""
    groups: dict[tuple[str, int, int], list[NcclTestRun]] = {}
    for run in runs:
        assert run.collective is not None  # parse checks it
        groups.setdefault((run.collective, run.world_size, len(run.hosts)), []).append(run)
    out = []
    for (collective, world, hosts), group in groups.items():
        by_size: dict[int, list[float]] = {}
        left_out = []
        where: dict[int, str] = {}  # each size's first row, for naming it
        for run in group:
            for row in run.rows:
                where.setdefault(row.size, f"{run.source}:{row.line}" if row.line else run.source)
                if row.wrong:
                    left_out.append(LeftOut(row.size, None, (
                        f"{where[row.size]}: {_size(row.size)} left out: #wrong {row.wrong} "
                        "(nccl-tests' check failed: a broken all-reduce's time is not its cost; "
                        "rerun to measure it)")))
                elif row.size > 0:
                    by_size.setdefault(row.size, []).append(row.time_s)
        if any(t <= 0 for times in by_size.values() for t in times):
            raise CalibrationError(f"{group[0].where}: a time of 0 us: the clock resolution "
                                   "hides these sizes; drop them or rerun")
        sizes = np.array(sorted(by_size), dtype=float)
        times = np.array([float(np.median(by_size[int(s)])) for s in sizes])
        slow = inverted(times)
        left_out += [LeftOut(int(sizes[i]), float(times[i]),
                             _inversion_note(where[int(sizes[i])], sizes, times, int(i)))
                     for i in np.flatnonzero(slow)]
        try:
            curve = Curve(sizes[~slow], times[~slow])
        except CalibrationError as exc:
            raise CalibrationError(f"{group[0].where}: {exc}") from None
        devices = sorted({rank.device_name for run in group for rank in run.ranks})
        out.append(Calibration(collective, world, hosts, group[0].gpus_per_host, devices,
                               list(dict.fromkeys(run.where for run in group)), curve, left_out))
    return out


def inverted(times: np.ndarray) -> np.ndarray:
    """Which of the times (sizes ascending) exceed (1 + INVERSION) x a larger size's time."""
    later = np.append(np.minimum.accumulate(times[::-1])[::-1][1:], np.inf)
    return np.asarray(times > (1 + INVERSION) * later)


def _inversion_note(where: str, sizes: np.ndarray, times: np.ndarray, i: int) -> str:
    j = i + 1 + int(np.argmin(times[i + 1:]))
    return (f"{where}: {_size(int(sizes[i]))} left out of the fit: {times[i] * 1e6:.0f} us, "
            f"{times[i] / times[j]:.1f}x the time of {_size(int(sizes[j]))}, so not what its "
            "bytes cost (NCCL's tuner or the network plugin took a slow path at this size). On "
            "this cluster a bucket of this size costs what was measured: keep DDP's buckets off "
            "it (bucket_cap_mb), or re-measure with NCCL_PROTO/NCCL_ALGO set")


def projection_use(calibration: Calibration, calibratable: Sequence[str]) -> str:
    """What a projection does with this calibration, in one line."""
    kind = calibration.collective
    if calibration.hosts > 1 and kind == "all_reduce":
        return ("projections: the network level (ring and tree; the hierarchical network "
                "phase on servers unlike its hosts)")
    if calibration.hosts == 1 and kind in CALIBRATABLE_INTRA:
        return (f"projections: the NVLink level inside a server of {calibration.world_size} "
                f"GPUs ({'half of it per phase' if kind == 'all_reduce' else 'its phase'} of "
                "the hierarchical all-reduce)")
    fitted = "fitted" if kind in calibratable else "fitted anyway"
    return (f"{kind} on {calibration.hosts} hosts: {fitted}, not used by projections (DDP "
            "all-reduces its gradients; a one-server run gives NVLink, a multi-host all_reduce "
            "the network)")


def load(paths: Sequence[str | Path], collective: str | None = None) -> list[Calibration]:
    """Parse and fit the files; `collective` names runs the files do not name themselves."""
    runs: list[NcclTestRun] = []
    for path in paths:
        try:
            runs += parse_file(path)
        except NcclParseError as exc:
            if collective is None or "which collective" not in str(exc):
                raise
            runs += _named(path, collective)
    return calibrations(runs)


def _named(path: str | Path, collective: str) -> list[NcclTestRun]:
    text = Path(path).read_text(errors="replace")
    return parse_text(f"# Collective test starting: {collective}_perf\n" + text, str(path))


def load_allreduce(path: str | Path) -> Calibration:
    """The all-reduce calibration a projection uses: the largest world size in the file."""
    found = [c for c in load([path]) if c.collective == "all_reduce"]
    if not found:
        raise CalibrationError(f"{path}: no all_reduce run (DDP all-reduces its gradients; run "
                               "all_reduce_perf)")
    return max(found, key=lambda c: c.world_size)
