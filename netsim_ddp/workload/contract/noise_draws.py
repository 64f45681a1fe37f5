"""Draws of the compute noise a replayed rank meets in one step (scenario.compute_noise).

Pure functions of (seed, rank, node, step): every mode and every run of a scenario meets the
same draws, a rank needs nothing from the others, and the harness (or a test) can draw what a
rank drew without running one. No torch here.

A step's compute is the schedule's times x `factor`, plus `stall_s` (target seconds) before
its forward: a stall delays every gradient release of that step by the same time.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from netsim_ddp.scenario.compute_noise import ComputeNoise, ComputeTrace, GpuSpeed, Stalls
from netsim_ddp.workload.contract.compute_profile import read_profile

NOISE_FLOOR = 0.05  # a normal draw is truncated here: no step takes (almost) no time


@dataclass(frozen=True)
class StepNoise:
    """What one rank's step meets: its compute x factor, then + stall_s (target seconds)."""

    factor: float = 1.0
    stall_s: float = 0.0


def light_factor(noise: ComputeNoise | None, rank: int, iteration: int) -> float:
    """The light step-to-step multiplier: mean 1, coefficient of variation noise.spread."""
    if noise is None or noise.spread == 0:
        return 1.0
    draw = random.Random(f"{noise.seed}:{rank}:{iteration}")
    if noise.distribution == "normal":
        return max(NOISE_FLOOR, draw.gauss(1.0, noise.spread))
    sigma = math.sqrt(math.log1p(noise.spread**2))  # lognormal with mean 1 and this cv
    return draw.lognormvariate(-sigma**2 / 2, sigma)


def stall_s(stalls: Stalls | None, seed: int, rank: int, iteration: int) -> float:
    """The stall of `rank` in step `iteration` (target seconds; 0.0: none)."""
    if stalls is None or stalls.probability == 0:
        return 0.0
    draw = random.Random(f"{seed}:stall:{rank}:{iteration}")
    if draw.random() >= stalls.probability:
        return 0.0
    if stalls.distribution == "pareto":
        seconds = stalls.scale * draw.paretovariate(stalls.shape)
    else:
        seconds = stalls.scale * draw.lognormvariate(0.0, stalls.shape)
    return min(seconds, stalls.max)


def gpu_factor(speed: GpuSpeed | None, seed: int, rank: int) -> float:
    """`rank`'s fixed step-time multiplier for the whole run (>= 1: slower than the fastest)."""
    if speed is None:
        return 1.0
    draw = random.Random(f"{seed}:gpu:{rank}")
    if draw.random() < speed.outlier_probability:
        return 1.0 + speed.outlier_slowdown
    sigma = speed.spread * math.sqrt(math.pi / 2)  # |normal(0, sigma)| has mean `spread`
    return 1.0 + min(abs(draw.gauss(0.0, sigma)), speed.max)


def episode_factor(noise: ComputeNoise | None, node: int, iteration: int) -> float:
    """The slowdown of `node` in step `iteration` from every episode covering it."""
    factor = 1.0
    for episode in noise.episode if noise is not None else ():
        if (episode.node is None or episode.node == node) and \
                episode.at <= iteration < episode.at + episode.steps:
            factor *= 1.0 + episode.slowdown
    return factor


_SEPARATORS = re.compile(r"[,\s;]+")


def read_trace(path: Path | str) -> list[list[float]]:
    """A trace file's columns (seconds; every column as long as the others): a text table, or
    a profile-compute JSON (one column: its steps' forward + backward). Errors name the file,
    the line and the fix."""
    path = Path(path)
    if path.suffix == ".json":  # `profile-compute --steps 500 --out F.json`: its steps
        try:
            return [read_profile(path).step_s]
        except ValueError as exc:
            raise ValueError(f"workload.noise.trace.file: {exc}") from None
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"workload.noise.trace.file: cannot read {path} ({exc.strerror}); "
                         "give a CSV of per-step compute times, relative to the scenario "
                         "file") from None
    rows: list[list[float]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        cells = [cell for cell in _SEPARATORS.split(line) if cell]
        try:
            row = [float(cell) for cell in cells]
        except ValueError:
            if not rows:
                continue  # a header line
            raise ValueError(f"workload.noise.trace.file: {path}:{number}: {line!r} is not "
                             "numbers; one step per line, seconds, one column per rank") from None
        if any(not math.isfinite(value) or value <= 0 for value in row):
            raise ValueError(f"workload.noise.trace.file: {path}:{number}: step times must be "
                             "positive seconds")
        if rows and len(row) != len(rows[0]):
            raise ValueError(f"workload.noise.trace.file: {path}:{number}: {len(row)} columns "
                             f"where the first row has {len(rows[0])}; give every rank's "
                             "column on every line")
        rows.append(row)
    if not rows:
        raise ValueError(f"workload.noise.trace.file: {path} holds no step times")
    return [list(column) for column in zip(*rows, strict=True)]


def trace_factor(trace: ComputeTrace | None, columns: Sequence[Sequence[float]], seed: int,
                 rank: int, iteration: int) -> float:
    """Step `iteration`'s trace value over the trace's mean (see ComputeTrace)."""
    if trace is None or not columns:
        return 1.0
    values = [value for column in columns for value in column]
    mean = sum(values) / len(values)
    if trace.columns == "sampled":
        return random.Random(f"{seed}:trace:{rank}:{iteration}").choice(values) / mean
    column = columns[rank % len(columns)]
    return column[iteration % len(column)] / mean


@dataclass(frozen=True)
class NoiseModel:
    """Every kind of noise of one scenario; `columns`: the trace's, read once (read_trace)."""

    noise: ComputeNoise | None
    columns: tuple[tuple[float, ...], ...] = ()

    @classmethod
    def load(cls, noise: ComputeNoise | None) -> NoiseModel:
        """The model, reading the trace file (an absolute path by now: the runner resolved it)."""
        if noise is None or noise.trace is None:
            return cls(noise)
        return cls(noise, tuple(tuple(column) for column in read_trace(noise.trace.file)))

    def step(self, rank: int, node: int, iteration: int) -> StepNoise:
        noise = self.noise
        if noise is None:
            return StepNoise()
        factor = (light_factor(noise, rank, iteration) * gpu_factor(noise.gpu_speed, noise.seed,
                                                                    rank)
                  * episode_factor(noise, node, iteration)
                  * trace_factor(noise.trace, self.columns, noise.seed, rank, iteration))
        return StepNoise(factor, stall_s(noise.stalls, noise.seed, rank, iteration))

    def compute_s(self, compute_s: float, rank: int, node: int, iteration: int) -> float:
        """One rank's step time (target seconds) for a step of `compute_s` without noise."""
        drawn = self.step(rank, node, iteration)
        return compute_s * drawn.factor + drawn.stall_s


def resolved_trace(noise: ComputeNoise | None, base: Path) -> ComputeNoise | None:
    """noise with its trace file as an absolute path (relative ones from `base`, the scenario
    file's folder), checked readable now rather than in every rank."""
    if noise is None or noise.trace is None:
        return noise
    path = Path(noise.trace.file)
    if not path.is_absolute():
        path = (base / path).resolve()
    read_trace(path)
    return noise.model_copy(update={"trace": noise.trace.model_copy(update={"file": str(path)})})


__all__ = ["NOISE_FLOOR", "NoiseModel", "StepNoise", "episode_factor", "gpu_factor",
           "light_factor", "read_trace", "resolved_trace", "stall_s", "trace_factor"]
