"""What to train and how: the typed, validated workload section of a scenario.

Importing this module does not import torch, so scenario files can be loaded and the JSON schema
exported on machines (and in processes) that never run a rank.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from netsim_ddp.precision.modes import MODES, WireDtype, mode_names
from netsim_ddp.scenario.units import Count, Size

BUILTIN_MODELS = ("mlp", "transformer")
# "package.module:factory": dotted module path, a colon, one attribute name.
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


DEFAULT_MODES = ("fp32", "amp", "amp-fp16")
DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's own default bucket_cap_mb=25 (MiB)


class AllreduceProbe(BaseModel):
    """Asked for in a RankSpec: all-reduce `size_bytes` of float32, and as many elements of each
    other dtype in `dtypes`, `iterations` times each."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size_bytes: int = Field(gt=0)
    dtypes: list[WireDtype] = Field(default=["float32"], min_length=1)
    iterations: int = Field(3, gt=0)
    warmup: int = Field(1, ge=0)


class WorkloadConfig(BaseModel):
    """The training job every rank runs, identical across modes so modes compare fairly."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    model: str = Field(
        default="mlp",
        description=(
            "Model to train: built-in 'mlp' or 'transformer' (synthetic, sized by `params`), or "
            "'package.module:factory' for your own; factory(params) returns (model, make_batch) "
            "- see netsim_ddp.workload.models."
        ),
    )
    params: Count = Field(
        gt=0,
        description="Parameter count, e.g. '30M' or 16800000. Built-in models land within 2%.",
    )
    batch_size: int = Field(default=32, gt=0, description="Samples per rank per micro-batch.")
    iterations: int = Field(
        default=20, gt=0, description="Measured iterations (optimizer steps) per mode."
    )
    warmup: int = Field(
        default=3, ge=0, description="Unmeasured iterations before measuring, per mode."
    )
    seed: int = Field(
        default=0,
        description="Seeds model init and synthetic data; rank r draws data from seed + r.",
    )
    bucket_size: Size = Field(
        default=DEFAULT_BUCKET_BYTES,
        gt=0,
        description="DDP gradient bucket size in bytes, e.g. '25MiB' (DDP's default).",
    )
    grad_accumulation: int = Field(
        default=1,
        ge=1,
        description="Micro-batches per optimizer step; gradients sync on the last one only "
        "(the others run under DDP no_sync()).",
    )
    modes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_MODES),
        min_length=1,
        description="Precision modes to run and compare: "
        + ", ".join(f"'{name}' ({mode.summary})" for name, mode in MODES.items()),
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto",
        description="torch.distributed backend. 'auto' picks nccl when CUDA GPUs and NCCL are "
        "there for every rank (one GPU each, or shared with share_gpus), else gloo; 'nccl' on a "
        "host without them is refused, naming what is missing.",
    )
    share_gpus: bool = Field(
        default=False,
        description="Let ranks of different nodes share a GPU when the host has fewer GPUs than "
        "ranks (node i, local rank r -> GPU (i x ranks_per_node + r) mod GPUs). Shared compute "
        "changes the compute time; the results say so.",
    )

    @field_validator("model")
    @classmethod
    def _model_form(cls, value: str) -> str:
        if value in BUILTIN_MODELS or _FACTORY.match(value):
            return value
        raise ValueError(
            f"unknown model {value!r}: use one of {', '.join(BUILTIN_MODELS)} or "
            "'package.module:factory'"
        )

    @field_validator("modes")
    @classmethod
    def _known_unique_modes(cls, value: list[str]) -> list[str]:
        unknown = [name for name in value if name not in MODES]
        if unknown:
            raise ValueError(
                f"unknown mode(s) {', '.join(map(repr, unknown))}; valid modes: "
                + ", ".join(mode_names())
            )
        duplicates = sorted({name for name in value if value.count(name) > 1})
        if duplicates:
            raise ValueError(f"mode(s) listed twice: {', '.join(duplicates)}")
        return value


class RankSpec(BaseModel):
    """What one torchrun invocation runs: the workload plus which of its modes, in order.

    Written to SPEC.json by `launch` and read by every rank.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: WorkloadConfig
    modes: list[str] | None = Field(
        default=None,
        description="Subset of workload.modes to run in this invocation; None runs them all.",
    )
    allreduce_probe: AllreduceProbe | None = Field(
        default=None,
        description="Time a bare all-reduce of this size before the modes (fidelity, busbw).",
    )
    probe_gated: bool = Field(
        default=False,
        description="The probe inside the training launch: after each attempt wait for the "
        "harness's verdict (collective.VERDICT_FILE) before probing again or training.",
    )
    collective_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Process-group timeout; a rank stuck in a collective fails after this.",
    )

    @field_validator("modes")
    @classmethod
    def _modes_known(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            WorkloadConfig._known_unique_modes(value)
        return value

    def selected_modes(self) -> list[str]:
        return list(self.modes) if self.modes is not None else list(self.workload.modes)
