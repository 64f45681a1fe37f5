"""A per-layer compute profile: what `netsim-ddp profile-compute` writes and compute replay
reads. No torch here (the harness validates scenarios that name one without importing it).

Backward time per layer is the time between the moment the previous layer's gradients were all
accumulated and the moment this layer's were: exactly what replay needs, since that is when DDP
may hand the layer's gradients to a bucket.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

PROFILE_VERSION = 1


class LayerTime(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    backward_s: float = Field(ge=0, description="Median backward time of this layer alone.")


class ComputeProfile(BaseModel):
    """Medians over the measured steps of one model on one device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = PROFILE_VERSION
    device: str = Field(description="What was timed, e.g. 'cuda:0 (NVIDIA H200)' or 'cpu'.")
    timer: str = Field(description="cuda events or perf_counter.")
    model: str
    params: int
    batch_size: int
    mode: str = Field(description="The precision mode the steps ran in.")
    forward_s: list[float] = Field(description="Per measured step: the forward and the loss.")
    backward_s: list[float] = Field(description="Per measured step: the backward.")
    optimizer_s: list[float] = Field(description="Per measured step: the optimizer step.")
    layers: list[LayerTime] = Field(description="Modules owning parameters, in registration "
                                    "order, with their median backward time.")

    @property
    def step_s(self) -> list[float]:
        """Forward + backward per step."""
        return [f + b for f, b in zip(self.forward_s, self.backward_s, strict=True)]

    @property
    def compute_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def forward_fraction(self) -> float:
        return statistics.median(self.forward_s) / self.compute_s

    @property
    def spread(self) -> float:
        """Step-to-step coefficient of variation of forward + backward."""
        steps = self.step_s
        return statistics.stdev(steps) / statistics.mean(steps) if len(steps) > 1 else 0.0


def read_profile(path: str | Path) -> ComputeProfile:
    path = Path(path)
    try:
        return ComputeProfile.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"compute profile {path}: no such file (make one with `netsim-ddp "
                         "profile-compute SCENARIO --out FILE`)") from None
    except ValueError as exc:
        raise ValueError(f"compute profile {path}: not a profile-compute file: {exc}") from None
