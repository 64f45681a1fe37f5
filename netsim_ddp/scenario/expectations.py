"""Claims a scenario makes about its run (`[[expect]]`), and the metric names they use.

Pure data and parsing: the scenario validates its claims with this module at load time; the
verdicts (verdicts.gate) measure them against a run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from netsim_ddp.common.metrics import SPREAD_STATISTICS, STATISTICS
from netsim_ddp.common.tails import TAIL_STATISTICS

SERIES = ("iteration_s", "comm_s", "compute_s", "scaling_efficiency", "collective_s")
SCALARS = ("wire_bytes_per_iteration",)
HIGHER_IS_BETTER = ("scaling_efficiency",)
# Measured from the built-in loop's compute-only steps: a user's script has none.
NEEDS_COMPUTE = ("comm_s", "compute_s", "scaling_efficiency")
DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class MetricName:
    """`comm_s.median`, `iteration_s.p95`, `scaling_efficiency.median`, or a scalar such as
    `wire_bytes_per_iteration`. A series name alone means its median."""

    series: str
    stat: str | None  # None for scalars

    @classmethod
    def parse(cls, text: str) -> Self:
        name, _, stat = text.partition(".")
        if name in SCALARS and not stat:
            return cls(name, None)
        if name in SERIES:
            stat = stat or "median"
            if stat not in STATISTICS:
                raise ValueError(f"unknown statistic {stat!r} in {text!r}; use one of "
                                 f"{', '.join(STATISTICS)}")
            return cls(name, stat)
        raise ValueError(f"unknown metric {text!r}; use SERIES.STATISTIC with SERIES one of "
                         f"{', '.join(SERIES)} and STATISTIC one of {', '.join(STATISTICS)}, "
                         f"or one of {', '.join(SCALARS)}")

    @classmethod
    def parse_option(cls, text: str) -> Self:
        """As given on a command line: also a statistic alone, `median`, for the iteration
        time's."""
        return cls.parse(f"iteration_s.{text}" if text in STATISTICS else text)

    def __str__(self) -> str:
        return self.series if self.stat is None else f"{self.series}.{self.stat}"

    @property
    def is_spread(self) -> bool:
        return self.stat in SPREAD_STATISTICS

    @property
    def is_tail(self) -> bool:
        """p99, cv, slow_share: tested by a bootstrap of the statistic itself."""
        return self.stat in TAIL_STATISTICS


class Expectation(BaseModel):
    """A claim about a run: a bound on one mode's metric, absolute or relative to another mode.

        [[expect]]
        metric = "comm_s.median"
        mode = "amp-fp16"
        vs = "fp32"
        max_ratio = 0.8        # amp-fp16's median comm time <= 0.8 x fp32's, significantly
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    metric: str = Field(description="SERIES.STATISTIC (e.g. comm_s.median, collective_s.std, "
                        "iteration_s.p95, iteration_s.p99, iteration_s.cv, "
                        "iteration_s.slow_share, scaling_efficiency.median) or "
                        "wire_bytes_per_iteration.")
    mode: str = Field(description="The mode the claim is about.")
    vs: str | None = Field(None, description="The mode it is compared with (for ratios).")
    max_ratio: float | None = Field(None, gt=0, description="mode <= max_ratio x vs.")
    min_ratio: float | None = Field(None, gt=0, description="mode >= min_ratio x vs.")
    max: float | None = Field(None, description="mode <= max (seconds, bytes or a fraction).")
    min: float | None = Field(None, description="mode >= min.")
    alpha: float = Field(DEFAULT_ALPHA, gt=0, lt=1, description="Significance level.")

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        MetricName.parse(value)
        return value

    @model_validator(mode="after")
    def _bounds(self) -> Expectation:
        ratios = self.max_ratio is not None or self.min_ratio is not None
        absolute = self.max is not None or self.min is not None
        if not ratios and not absolute:
            raise ValueError("give a bound: max_ratio or min_ratio (with vs), or max or min")
        if ratios and self.vs is None:
            raise ValueError("max_ratio and min_ratio compare with another mode: set vs")
        if absolute and self.vs is not None:
            raise ValueError("max and min are absolute bounds; with vs, use max_ratio/min_ratio")
        if self.vs == self.mode:
            raise ValueError("vs must be another mode")
        return self

    @property
    def name(self) -> str:
        against = f"/{self.vs}" if self.vs else ""
        return f"expect:{self.metric}:{self.mode}{against}"
