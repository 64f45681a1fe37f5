"""The compute noise real GPUs have, as scenario fields under `[workload.noise]`.

Light per-step noise (`spread`) makes the slowest of N ranks vary LESS as N grows; spread grows
with the GPU count only through rare, large events (docs/jitter.md). These fields add them to a
compute replay, each seeded so every mode and every run meets the same draws:

- `[workload.noise.stalls]`: with `probability` per rank and step, a heavy-tailed pause;
- `[workload.noise.gpu_speed]`: each rank's fixed speed, drawn once per run;
- `[[workload.noise.episode]]`: a node slowed by a fraction for a stretch of steps;
- `[workload.noise.trace]`: measured per-step compute times from a file.

Episodes count steps, not seconds (unlike the link schedule): a faster mode reaches a given
second at a later step, and every mode must meet the same slow steps to compare fairly.
No torch here: scenario files load without it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from netsim_ddp.scenario.units import Duration

MAX_STALL_S = 60.0  # a stall longer than a minute is a hang, not noise


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Stalls(_Strict):
    """Rare pauses of one rank's step (a page fault storm, a GC pause, an ECC retry, a slow
    data-loader batch): each rank and step stalls with `probability`, for a heavy-tailed time."""

    probability: float = Field(
        ge=0, le=1, description="Chance that a given rank's step stalls, e.g. 0.01.")
    distribution: Literal["pareto", "lognormal"] = Field(
        "pareto", description="pareto: `scale` is the shortest stall, `shape` the tail index "
        "(smaller: heavier; 1.5 typical); lognormal: `scale` is the median, `shape` sigma.")
    scale: Duration = Field(
        gt=0, le=MAX_STALL_S, description="Target time, e.g. '50ms' (see distribution).")
    shape: float = Field(1.5, gt=0, le=20, description="Pareto tail index or lognormal sigma.")
    max: Duration = Field(
        10.0, gt=0, le=MAX_STALL_S, description="The longest stall drawn (a heavy tail must "
        "stop somewhere; a draw beyond is cut here).")

    @model_validator(mode="after")
    def _max_above_scale(self) -> Stalls:
        if self.max < self.scale:
            raise ValueError(f"max ({self.max:g}s) is below scale ({self.scale:g}s): raise max")
        return self


class GpuSpeed(_Strict):
    """Identical GPUs run at different speeds (power and thermal limits): about 8% apart on
    average, up to 22%, with occasional 1.5x outliers (Sinha et al., "Not All GPUs Are Created
    Equal", SC'22). Each rank's slowdown is drawn once per run: 1 + |normal| with mean `spread`,
    cut at `max`; with `outlier_probability` the rank is an outlier instead."""

    spread: float = Field(0.08, ge=0, le=1, description="Mean slowdown against the fastest "
                          "possible GPU, e.g. 0.08.")
    max: float = Field(0.22, ge=0, le=10, description="The largest ordinary slowdown.")
    outlier_probability: float = Field(0.0, ge=0, le=1, description="Chance that a rank's GPU "
                                       "is an outlier, e.g. 0.02.")
    outlier_slowdown: float = Field(0.5, ge=0, le=10, description="An outlier's slowdown "
                                    "(0.5: 1.5x the step time).")


class SlowEpisode(_Strict):
    """A node slowed for a stretch of the run (thermal throttling, a noisy neighbour on the
    host, CPU contention), as Alibaba's Falcon (ATC'25) saw them: every rank of the node takes
    `slowdown` longer per step from step `at` for `steps` steps."""

    at: int = Field(ge=0, description="First slowed step, counted from the first warm-up step "
                    "(step = warm-up + measured iteration), the same in every mode.")
    steps: int = Field(gt=0, description="How many steps it lasts.")
    node: int | None = Field(None, ge=0, description="Node index (0-based); default: every "
                             "node.")
    slowdown: float = Field(gt=0, le=10, description="Fraction added to each step's compute, "
                            "e.g. 0.3: 1.3x.")


class ComputeTrace(_Strict):
    """Measured per-step compute times (e.g. one rank's steps from `profile-compute` on the
    user's GPU, or a cluster's logs), replayed as the shape of the noise: each step's factor is
    the trace's value over the trace's mean, so `workload.compute` keeps setting the level."""

    file: str = Field(description="CSV or whitespace-separated text, relative to the scenario "
                      "file: one number (seconds) per line and column; a header line is "
                      "skipped; '#' starts a comment. Or a `profile-compute` JSON (.json): "
                      "one column, its steps' forward + backward.")
    columns: Literal["per-rank", "sampled"] = Field(
        "per-rank", description="per-rank: rank r replays column r mod columns, row by row "
        "(the trace's ranks, in order); sampled: each rank draws its rows at random (seeded) "
        "from all values (a one-rank trace shared by many ranks).")


class ComputeNoise(_Strict):
    """Step-to-step variation of the replayed compute: each rank's step time is multiplied by a
    factor drawn from this distribution (mean 1, coefficient of variation `spread`), seeded by
    (seed, rank, iteration), so every mode and every run of the scenario meets the same draws;
    then by its GPU's speed, any slow episode and trace; then any stall is added."""

    distribution: Literal["normal", "lognormal"] = Field(
        "lognormal", description="lognormal (never below zero, a right tail as real steps have) "
        "or normal (truncated at 5% of the mean).")
    spread: float = Field(
        0.02, ge=0, le=1, description="Coefficient of variation of the step time, e.g. 0.02; "
        "a profile's own step-to-step spread is a good value.")
    seed: int = Field(0, description="Seeds the draws (with the rank and the iteration).")
    stalls: Stalls | None = Field(None, description="Rare heavy-tailed pauses per rank and "
                                  "step.")
    gpu_speed: GpuSpeed | None = Field(None, description="Each rank's fixed speed, drawn once.")
    episode: list[SlowEpisode] = Field(default_factory=list, description="Nodes slowed for a "
                                       "stretch of steps ([[workload.noise.episode]]).")
    trace: ComputeTrace | None = Field(None, description="Measured per-step compute times.")


def check_episode_nodes(noise: ComputeNoise | None, nodes: int) -> None:
    """Every episode names a node the topology has."""
    for i, episode in enumerate(noise.episode if noise is not None else ()):
        if episode.node is not None and episode.node >= nodes:
            raise ValueError(f"workload.noise.episode.{i}.node: {episode.node} but the topology "
                             f"has {nodes} nodes (0..{nodes - 1}); name one of them, or leave "
                             "node out for every node")


__all__ = ["ComputeNoise", "ComputeTrace", "GpuSpeed", "SlowEpisode", "Stalls",
           "check_episode_nodes"]
