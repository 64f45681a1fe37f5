"""The [sweep] table of a scenario file: which points to run, the held-out check, and what to
project to. No torch, no runner: `spec.py` can import it for its `sweep` field."""

from __future__ import annotations

from itertools import product
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
)

from netsim_ddp.scenario import units
from netsim_ddp.scenario.units import Count, Duration

AXES = ("nodes", "ranks_per_node", "rate", "params")

# A swept rate is checked against tbf's ceiling when its point's scenario is validated; a
# projected link is never built, so the ceiling does not apply to it.
Rate = Annotated[units.Rate, Field(gt=0)]
ProjectedRate = Rate


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ProjectionConfig(_Strict):
    gpus: list[int] = Field(default_factory=lambda: [16, 64, 256, 1024], min_length=1,
                            description="World sizes to project to (one GPU per link).")
    rates: list[ProjectedRate] = Field(default_factory=lambda: [10e9, 25e9, 100e9], min_length=1,
                              description="Link rates to project to, e.g. '10gbit'.")
    compute: Duration | dict[str, Duration] | None = Field(
        None, description="Per-GPU compute-only step time (one value, or one per mode); "
        "default: the compute-only time measured in the sweep.")
    params: Count | None = Field(
        None, description="Model size to project; default: the largest swept model. Bytes "
        "per mode scale from the measured bytes per parameter.")
    alpha: Duration | None = Field(
        None, description="Per-hop latency of the target cluster's all-reduce (e.g. '20us'); "
        "default: the alpha fitted here, which carries this host's gloo overheads.")
    calibration: str | list[str] | None = Field(
        None, description="nccl-tests output from the target cluster (text as printed, or its "
        "-J JSON), one file or a list, relative to the scenario file: all_reduce_perf on 2 or "
        "more servers (the network), and optionally a run inside one server (all_reduce_perf, "
        "reduce_scatter_perf, all_gather_perf: NVLink). The projection's all-reduce times come "
        "from it instead of the alpha and link efficiency fitted here (see `netsim-ddp "
        "calibrate`); `rates` and `alpha` then do not apply.")
    gpus_per_server: int | None = Field(
        None, ge=1, description="GPUs in one server of the projected cluster; default: the "
        "one-server calibration's GPUs, else the calibration's GPUs per host (its rank lines).")
    nvlink_busbw: ProjectedRate | None = Field(
        None, description="Bus bandwidth of a reduce-scatter or all-gather inside one server "
        "(e.g. '370GB/s'); default: a one-server calibration's curves, else 370 GB/s, an H100 "
        "SXM server (NVLink 4, 18 links x 20.6 GB/s).")
    nics_per_server: int | None = Field(
        None, ge=1, description="NICs in one server of the calibrated (and projected) cluster; "
        "each GPU drives the one nearest it, so min(GPUs per server, NICs) carry a server's "
        "traffic: a calibration with fewer GPUs per host than the projected servers scales its "
        "network by the NICs, not the GPUs. Default 1 (H100 servers usually have one per GPU: "
        "set it). Every projection says which it used.")
    nic_bandwidth: ProjectedRate | None = Field(
        None, description="One NIC's line rate (e.g. '400gbit'): a 2-host calibration whose bus "
        "bandwidth is above what a ring over its NICs reaches ran NCCL's tree and is flagged; "
        "default: typical for the calibration's GPUs (H100/H200/B200: 400 Gbit/s, A100: 200).")
    nvlink_latency: Duration | None = Field(
        None, description="Latency of one reduce-scatter or all-gather inside a server (e.g. "
        "'10us'); default: a one-server calibration's curves, else 10 us (NCCL's tuning model).")

    @field_validator("calibration")
    @classmethod
    def _files(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and (not value or any(not path for path in value)):
            raise ValueError("name one or more files")
        if value == "":
            raise ValueError("name a file")
        return value

    def calibration_files(self) -> list[str]:
        if self.calibration is None:
            return []
        return [self.calibration] if isinstance(self.calibration, str) else list(self.calibration)

    def cluster_fields(self) -> dict[str, Any]:
        """The fields `cluster.build` takes, as given (None = from the calibration/default)."""
        return {"gpus_per_server": self.gpus_per_server, "nvlink_busbw_bps": self.nvlink_busbw,
                "nvlink_latency_s": self.nvlink_latency, "nics_per_server": self.nics_per_server,
                "nic_bandwidth_bps": self.nic_bandwidth}

    @field_serializer("compute", when_used="json")
    def _compute_with_unit(self, value: float | dict[str, float] | None) -> object:
        if isinstance(value, dict):
            return {mode: f"{seconds!r}s" for mode, seconds in value.items()}
        return None if value is None else f"{value!r}s"

    @field_validator("gpus")
    @classmethod
    def _at_least_two(cls, value: list[int]) -> list[int]:
        if any(n < 2 for n in value):
            raise ValueError("project to 2 or more GPUs")
        return value


class SweepConfig(_Strict):
    """Which points to run: the cross product of the axes given."""

    nodes: list[int] | None = Field(None, min_length=1, description="Node counts, e.g. [1, 2, 4].")
    ranks_per_node: list[int] | None = Field(None, min_length=1)
    rate: list[Rate] | None = Field(None, min_length=1, description="Link rates.")
    params: list[Count] | None = Field(None, min_length=1, description="Model sizes.")
    # `holdout`, its earlier spelling, still reads: scenario files outlive renames.
    held_out: Literal["largest", "none"] = Field(
        "largest", validation_alias=AliasChoices("held_out", "holdout"),
        description="'largest': fit on the other points and predict the points with the largest "
        "world size (then the largest model); 'none': no held-out check.")
    target_error: float = Field(0.15, gt=0, description="Held-out |error| the model must meet.")
    projection: ProjectionConfig = Field(default_factory=ProjectionConfig)

    @field_validator("nodes", "ranks_per_node")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(v < 1 for v in value):
            raise ValueError("must be 1 or more")
        return value

    def axes(self) -> dict[str, list[Any]]:
        return {axis: list(getattr(self, axis)) for axis in AXES if getattr(self, axis)}

    def points(self) -> list[dict[str, Any]]:
        axes = self.axes()
        if not axes:
            raise ValueError("sweep: name at least one of nodes, ranks_per_node, rate, params")
        return [dict(zip(axes, values, strict=True)) for values in product(*axes.values())]
