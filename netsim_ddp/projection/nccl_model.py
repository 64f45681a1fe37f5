"""NCCL's own cost model of one all-reduce, and its shape fitted to a user's nccl-tests run.

NCCL's tuner (src/graph/tuning.cc, `ncclTopoTuneModel`) gives every (algorithm, protocol) pair a
latency and a bus bandwidth from the topology, and runs each collective with the pair whose
time, latency + size / bandwidth, is the smallest. `nccl_prior` reproduces that model for an
all-reduce with the constants of NCCL's tuning.cc as of its 2026 master (commit 5067397c; older
releases differ in detail, e.g. no PAT, other per-channel caps):

- algorithms: ring, tree (NCCL's double binary tree over servers, a chain inside each) and,
  on NVSwitch servers with NVLink SHARP, NVLS tree; CollNet needs a SHARP-capable network
  plugin and is off by default, PAT serves only 1-GPU-per-server all-gathers/reduce-scatters.
- protocols: LL, LL128, Simple; NVLS only Simple.
- latency: a base per pair plus hardware latency per step: ring 2(n-1) steps of which 2(h-1)
  cross the network; tree 2 x ((g-1) NVLink hops + log2(h) network hops); NVLS tree one NVLink
  step plus 2 log2(h) network ones.
- bandwidth: the channels' bandwidth (inside a server for h <= 2, the network's beyond: what
  the NICs a server's GPUs drive carry), scaled per pair (LL 1/2 or 1/3.8, LL128 0.92 or
  120/128, tree 0.92 and capped per channel), then to algorithm bandwidth (ring n/2(n-1), tree
  and NVLS 1/2 or n/2(n-1)).

The prior knows no real cluster (its per-channel figures are NCCL's guesses, a cloud's
TCP-based NICs are ten times slower in latency than its tables); what it carries is the
*shape*: which pairs exist, in which order NCCL switches between them as the size grows, and how
each pair's latency and bandwidth move with GPUs per server, NICs and hosts.

The fit (`segment`). A measured nccl-tests curve is a sequence of *regimes*, one per pair NCCL
chose, each a straight line in time against size: t = latency + size / bandwidth. The sizes,
sorted, are split into contiguous regimes by dynamic programming (each regime's line fitted by
least squares on relative error, latency and 1/bandwidth non-negative, at least 3 sizes); the
number of regimes is the one with the smallest Bayesian information criterion at nccl-tests'
run-to-run noise (`NOISE`), so a new regime needs the evidence of several sizes that one line
cannot follow. `interpolate` predicts a size inside a regime by its line (bent through the
measurements next to it); one between two regimes, where NCCL switched, by the faster of the
two lines, as the tuner runs the faster pair. `label` names each regime by the pair NCCL's
prior picks for most of its sizes.

`calibrate.Curve` is this model; the error it reports is held out: each size predicted by the
model fitted on all the other sizes, never the in-sample residual.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALGORITHMS = ("tree", "ring", "nvls_tree")
PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc, ncclTunerConstantsDefaults (master 5067397c), in microseconds: baseLatencies and
# hwLatencies[NVLINK | NET] for the all-reduce algorithms above, per protocol (LL, LL128, Simple).
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls_tree": (0, 0, 0)}
NVLINK_LATENCY_US = {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls_tree": (0, 0, 25)}
NET_LATENCY_US = {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls_tree": (0, 0, 20.9)}
NET_OVERHEAD_US = 1.0  # getNetOverhead on Intel x86 (AMD 2.0); x3 for Simple
# Hopper's per-channel caps and LL ceilings (llMaxBws, perChMax*Bws; index N1/N2/N4 = hosts
# 1, 2, 3+), GB/s.
LL_MAX_BW = {1: 141.0, 2: 45.0, 3: 35.0}  # host CPUs: Intel column for multi-node
PER_CH_MAX_TREE_BW = {1: 38.7, 2: 41.4, 3: 36.0}
PER_CH_MAX_RING_LL128_BW = 36.7
PER_CH_MAX_TREE_LL128_BW = {1: 36.7, 2: 36.7, 3: 29.0}
PER_CH_MAX_NVLS_TREE_BW = {1: 0.0, 2: 57.7, 3: 45.5}
NVLS_EFFICIENCY = 0.85  # Hopper


@dataclass(frozen=True)
class Topology:
    """The shape of one nccl-tests job: what NCCL's tuner sees."""

    ranks: int
    hosts: int
    nics_in_use: float = 1.0  # NICs per server the job's GPUs drive
    nic_bytes_per_s: float = 50e9  # one NIC's line rate (400 Gbit/s)
    nvlink_busbw_bytes_per_s: float = 370e9  # one server's NVLink bus bandwidth
    nvls: bool = False  # NVLink SHARP (H100/H200 NVSwitch servers with the fabric manager)

    @property
    def gpus_per_host(self) -> int:
        return max(1, round(self.ranks / max(1, self.hosts)))

    def describe(self) -> str:
        return (f"{self.hosts} host(s) x {self.gpus_per_host} GPU(s), {self.nics_in_use:g} "
                f"NIC(s) in use per host at {self.nic_bytes_per_s * 8 / 1e9:g} Gbit/s")


@dataclass(frozen=True)
class Pair:
    """One (algorithm, protocol) of NCCL's tuner, with its modelled latency and bandwidth."""

    algorithm: str
    protocol: str
    latency_s: float
    algbw_bytes_per_s: float  # NCCL's bandwidth, already converted to algorithm bandwidth

    @property
    def name(self) -> str:
        return f"{self.algorithm}/{self.protocol}"

    def time_s(self, size: float) -> float:
        return self.latency_s + size / self.algbw_bytes_per_s


def _column(hosts: int) -> int:
    return min(hosts, 3)


def nccl_prior(topology: Topology) -> list[Pair]:
    """NCCL's tuner model of one all-reduce on this topology: every enabled pair (see the
    module doc; tuning.cc's formulas, channels folded into the NICs' and NVLink's totals)."""
    n, h, g = topology.ranks, topology.hosts, topology.gpus_per_host
    if n < 2:
        return []
    column = _column(h)
    steps = 2 * (n - 1)
    inter_steps = 0 if h == 1 else 2 * (h - 1)
    # Channels x their bandwidth: inside the server for h <= 2 (tuning.cc's bwIntra), the
    # network's for more hosts (bwInter: the NICs in use).
    network = topology.nics_in_use * topology.nic_bytes_per_s
    channels_bw = (topology.nvlink_busbw_bytes_per_s if h <= 2 or g == 1 and h == 1
                   else network) / 1e9
    channels = max(2, round(channels_bw / 25))  # NCCL's channels carry ~20-25 GB/s each
    pairs = []
    for algorithm in ALGORITHMS:
        if algorithm == "nvls_tree" and not (topology.nvls and h > 1 and g > 1):
            continue
        if algorithm == "tree" and h == 1 and g <= 2:
            continue  # a tree of 2 GPUs is a ring
        for p, protocol in enumerate(PROTOCOLS):
            if algorithm == "nvls_tree" and protocol != "Simple":
                continue
            bus = channels_bw
            if algorithm == "nvls_tree":
                intra = topology.nvlink_busbw_bytes_per_s / 1e9 * NVLS_EFFICIENCY * 2
                inter = network / 1e9 * (2 if h <= 2 else 1)
                bus = min(intra, inter, channels * PER_CH_MAX_NVLS_TREE_BW[column])
            if algorithm == "ring" and protocol == "LL":
                bus = min(LL_MAX_BW[column], bus * 0.5)
            if algorithm == "ring" and protocol == "LL128":
                bus = min(bus * 0.92, channels * PER_CH_MAX_RING_LL128_BW)
            if algorithm == "tree":
                bus = min(bus * 0.92, channels * PER_CH_MAX_TREE_BW[column])
                if protocol == "LL":
                    bus = min(bus / 3.8, LL_MAX_BW[column])
                if protocol == "LL128":
                    bus = min(bus * (7 / 9 if h == 1 else 120 / 128),
                              channels * PER_CH_MAX_TREE_LL128_BW[column])
            ratio = n / steps if algorithm in ("ring", "nvls_tree") else 0.5
            algbw = bus * ratio * 1e9
            intra = NVLINK_LATENCY_US[algorithm][p]
            inter = NET_LATENCY_US[algorithm][p] if g > 1 else NET_LATENCY_US["tree"][p]
            latency = BASE_LATENCY_US[algorithm][p]
            if algorithm == "ring":
                overhead = 0.0 if h == 1 else NET_OVERHEAD_US * (3 if protocol == "Simple" else 1)
                intra = max(intra, overhead)
                latency += (steps - inter_steps) * intra + inter_steps * inter
            elif algorithm == "tree":
                latency += 2 * ((g - 1) * intra + math.floor(math.log2(max(h, 1))) * inter)
            else:
                latency += intra + 2 * math.floor(math.log2(h)) * inter
            if algbw > 0:
                pairs.append(Pair(algorithm, protocol, latency * 1e-6, algbw))
    return pairs


def nccl_choice(topology: Topology, size: float) -> Pair:
    """The pair NCCL's tuner would run an all-reduce of `size` bytes with (its model's
    fastest)."""
    pairs = nccl_prior(topology)
    if not pairs:
        raise ValueError(f"{topology.ranks} rank(s): no all-reduce to run")
    return min(pairs, key=lambda pair: pair.time_s(size))


# -- the fit -----------------------------------------------------------------------------------

MIN_REGIME_SIZES = 3  # two sizes fix a line exactly; a third is the evidence it is one
NOISE = 0.02  # nccl-tests' run-to-run spread of one size's time: residuals below it are noise
MAX_REGIMES = 6  # NCCL's all-reduce has at most this many (algorithm, protocol) pairs in use


@dataclass(frozen=True)
class Regime:
    """Sizes NCCL ran with one pair: a line t = latency + size / bandwidth through them."""

    first: int  # index of its smallest size in the fitted sizes
    last: int  # index of its largest
    latency_s: float
    seconds_per_byte: float
    label: str = ""  # the pair NCCL's prior picks for most of its sizes, where a topology is known

    def time_s(self, size: float | np.ndarray) -> np.ndarray:
        return self.latency_s + np.asarray(size, dtype=float) * self.seconds_per_byte

    @property
    def algbw_bytes_per_s(self) -> float:
        return 1 / self.seconds_per_byte if self.seconds_per_byte > 0 else math.inf


def _line(sizes: np.ndarray, times: np.ndarray) -> tuple[float, float, float]:
    """(latency, seconds per byte, sum of squared relative residuals) of the line fitted on
    relative error, both parameters non-negative."""
    w = 1 / times
    a_col, b_col = w, sizes * w  # (latency * a_col + spb * b_col) ~ 1
    best: tuple[float, float, float] | None = None
    gram = np.array([[a_col @ a_col, a_col @ b_col], [a_col @ b_col, b_col @ b_col]])
    rhs = np.array([a_col.sum(), b_col.sum()])
    candidates = []
    if abs(np.linalg.det(gram)) > 1e-300 * max(1.0, float(gram.max()) ** 2):
        try:
            latency, spb = np.linalg.solve(gram, rhs)
            candidates.append((float(latency), float(spb)))
        except np.linalg.LinAlgError:
            pass
    candidates.append((float(rhs[0] / gram[0, 0]), 0.0))
    if gram[1, 1] > 0:
        candidates.append((0.0, float(rhs[1] / gram[1, 1])))
    for latency, spb in candidates:
        if latency < 0 or spb < 0:
            continue
        residual = latency * a_col + spb * b_col - 1
        cost = float(residual @ residual)
        if best is None or cost < best[2]:
            best = (latency, spb, cost)
    assert best is not None  # the latency-only line is always feasible
    return best


def segment(sizes: np.ndarray, times: np.ndarray,
            max_regimes: int = MAX_REGIMES) -> list[Regime]:
    """The regimes (see the module doc): the sizes split into contiguous runs by dynamic
    programming, the number of runs by the Bayesian information criterion."""
    m = len(sizes)
    if m < MIN_REGIME_SIZES:
        raise ValueError(f"{m} size(s): a regime needs {MIN_REGIME_SIZES}")
    cost = np.full((m, m), np.inf)
    lines: dict[tuple[int, int], tuple[float, float]] = {}
    for i in range(m):
        for j in range(i + MIN_REGIME_SIZES - 1, m):
            latency, spb, c = _line(sizes[i:j + 1], times[i:j + 1])
            cost[i, j], lines[(i, j)] = c, (latency, spb)
    top = min(max_regimes, m // MIN_REGIME_SIZES)
    # best[k][j]: the least cost of sizes 0..j in k+1 regimes; back[k][j]: where the last starts
    best = np.full((top, m), np.inf)
    back = np.zeros((top, m), dtype=int)
    best[0] = cost[0]
    for k in range(1, top):
        for j in range(m):
            for start in range(MIN_REGIME_SIZES * k, j - MIN_REGIME_SIZES + 2):
                value = best[k - 1][start - 1] + cost[start, j]
                if value < best[k][j]:
                    best[k][j], back[k][j] = value, start
    # The information criterion on the relative residuals: each regime costs 3 parameters
    # (latency, bandwidth, where it starts).
    scores = [best[k][m - 1] / NOISE**2 + 3 * (k + 1) * math.log(m)
              if math.isfinite(best[k][m - 1]) else math.inf for k in range(top)]
    k = int(np.argmin(scores))
    bounds, end = [], m - 1
    while k >= 0:
        start = int(back[k][end]) if k > 0 else 0
        bounds.append((start, end))
        end, k = start - 1, k - 1
    return [Regime(i, j, *lines[(i, j)]) for i, j in reversed(bounds)]


def interpolate(regimes: Sequence[Regime], sizes: np.ndarray, times: np.ndarray,
                size: float) -> float:
    """The fitted model's time at `size`, inside the fitted sizes (see the module doc): between
    two sizes of one regime its line, scaled by the two sizes' measured/line ratios
    interpolated in log size (the line through the measurements, bent as the regime's line
    bends); between two regimes the faster line (NCCL's tuner picks the faster pair), each
    scaled by its end size's ratio; never outside the two neighbours' times, so the model
    never falls as the size grows."""
    if not sizes[0] <= size <= sizes[-1]:
        raise ValueError(f"{size:g} B: outside the fitted sizes")
    j = int(np.searchsorted(sizes, size))
    if sizes[j] == size:
        return float(times[j])
    i = j - 1
    which = np.empty(len(sizes), dtype=int)
    for k, regime in enumerate(regimes):
        which[regime.first:regime.last + 1] = k
    below, above = regimes[which[i]], regimes[which[j]]
    ratio_i = times[i] / float(below.time_s(sizes[i]))
    ratio_j = times[j] / float(above.time_s(sizes[j]))
    if below is above:
        x = math.log(size / sizes[i]) / math.log(sizes[j] / sizes[i])
        time = float(below.time_s(size)) * ratio_i ** (1 - x) * ratio_j ** x
    else:
        time = min(float(below.time_s(size)) * ratio_i, float(above.time_s(size)) * ratio_j)
    return min(max(time, float(times[i])), float(times[j]))


def label(regimes: Sequence[Regime], sizes: np.ndarray,
          topology: Topology | None) -> list[Regime]:
    """The regimes, each named by the pair NCCL's prior chooses for most of its sizes."""
    if topology is None or topology.ranks < 2:
        return list(regimes)
    out = []
    for regime in regimes:
        names = [nccl_choice(topology, float(s)).name
                 for s in sizes[regime.first:regime.last + 1]]
        out.append(Regime(regime.first, regime.last, regime.latency_s, regime.seconds_per_byte,
                          max(set(names), key=names.count)))
    return out


__all__ = ["ALGORITHMS", "PROTOCOLS", "Pair", "Regime", "Topology", "label",
           "nccl_choice", "nccl_prior", "interpolate", "segment"]
