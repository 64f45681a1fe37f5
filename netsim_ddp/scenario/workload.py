"""What to train and how: the typed, validated workload section of a scenario.

Importing this module does not import torch, so scenario files can be loaded and the JSON schema
exported on machines (and in processes) that never run a rank.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from netsim_ddp.precision.modes import MODES, WireDtype, mode_names
from netsim_ddp.scenario.units import Count, Size

BUILTIN_MODELS = ("mlp", "transformer")
# "package.module:factory": dotted module path, a colon, one attribute name.
_FACTORY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


DEFAULT_MODES = ("fp32", "amp", "amp-fp16")
SCRIPT_RUN = "script"  # the one run of a script without [[workload.variant]]
# What a script's parameter count is taken to be when the scenario does not say: it only sizes
# the all-reduce probe and the default timeout (the harness counts the real one from DDP).
SCRIPT_PARAMS_ESTIMATE = 10_000_000
_VARIANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,39}$")


class Variant(BaseModel):
    """One way to run a user's script (`[[workload.variant]]`): its extra arguments and
    environment. Variants stand where modes stand for the built-in loop (tables, `[[expect]]`
    claims, baselines, history): a claim names a variant as `mode`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(description="What results, tables and claims call this run, e.g. 'amp'.")
    args: list[str] = Field(default_factory=list,
                            description="Appended to the command's arguments.")
    env: dict[str, str] = Field(default_factory=dict,
                                description="Set in every rank's environment.")

    @field_validator("name")
    @classmethod
    def _name_form(cls, value: str) -> str:
        if not _VARIANT_NAME.match(value):
            raise ValueError(f"variant name {value!r}: use 1-40 of a-z, 0-9, '_', '.', '-', "
                             "starting with a letter or digit (it names files and columns)")
        return value
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

    command: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Your own training script instead of the built-in loop: ['train.py', "
        "'--epochs', '1'] or ['-m', 'pkg.module', ...], started by torchrun on every node "
        "(a relative script path is taken from the scenario file's folder). A step is one "
        "optimizer.step(), or one netsim_ddp.step() where the script calls it. See "
        "docs/scripts.md.",
    )
    variant: list[Variant] = Field(
        default_factory=list,
        description="Runs of the command to compare ([[workload.variant]]: name, args, env); "
        "none: one run named 'script'.",
    )
    after_measured: Literal["stop", "finish"] = Field(
        default="stop",
        description="A script, once its warm-up and measured steps are done: 'stop' it there "
        "(every rank at the same step), or let it 'finish' on its own.",
    )
    steps: Literal["auto", "optimizer", "marker"] = Field(
        default="auto",
        description="What counts as a script's step: every optimizer.step() ('optimizer'), or "
        "every netsim_ddp.step() call ('marker': several optimizers, or none); 'auto': "
        "optimizer steps until the script first calls netsim_ddp.step(), which must come "
        "before the measured window opens (during the warm-up).",
    )
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
        description="Parameter count, e.g. '30M' or 16800000. Built-in models land within 2%. "
        "With a command: an estimate (default 10M) that sizes the all-reduce probe only.",
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

    @model_validator(mode="before")
    @classmethod
    def _script_runs(cls, data: Any) -> Any:
        """A script's runs are its variants: `modes` is filled from them, and what only the
        built-in loop reads (model, batch size, ...) may not be set."""
        if not isinstance(data, dict) or data.get("command") is None:
            return data
        variants = data.get("variant") or []
        names = [v.get("name") if isinstance(v, dict) else getattr(v, "name", None)
                 for v in variants]
        runs = [n for n in names if isinstance(n, str)] or [SCRIPT_RUN]
        # A written-out config (RankSpec.json, model_dump) holds every field: only a value
        # other than the default is a setting of the built-in loop.
        loop_only = [key for key in ("model", "batch_size", "bucket_size", "grad_accumulation",
                                     "modes", "share_gpus")
                     if key in data and data[key] != (runs if key == "modes" else
                                                      cls.model_fields[key].get_default(
                                                          call_default_factory=True))]
        if loop_only:
            raise ValueError(
                f"{', '.join(loop_only)}: the built-in loop's settings, not a script's (a "
                "script sets its own model, batch and DDP options); compare runs of a script "
                "with [[workload.variant]] (name, args, env) instead of modes")
        return {**data, "params": data.get("params", SCRIPT_PARAMS_ESTIMATE), "modes": runs}

    @model_validator(mode="after")
    def _script_checks(self) -> WorkloadConfig:
        if self.command is None:
            if self.steps != "auto" or self.after_measured != "stop":
                raise ValueError("steps and after_measured apply to a script: set command")
            if self.variant:
                raise ValueError("variant: runs of a script; set command (or use modes for the "
                                 "built-in loop)")
            return self
        if self.command[0] == "-m" and len(self.command) < 2:
            raise ValueError("command: '-m' needs a module name after it")
        if self.warmup < 1:
            raise ValueError("warmup: a script's first step includes its start-up and has no "
                             "step before it to start from: use warmup >= 1")
        names = [variant.name for variant in self.variant]
        if duplicates := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"variant name(s) given twice: {', '.join(duplicates)}")
        return self

    @property
    def is_script(self) -> bool:
        """True when the ranks run the user's command instead of the built-in loop."""
        return self.command is not None

    def variant_named(self, name: str) -> Variant:
        """The variant a run (mode) name stands for; the plain run of a script without any."""
        for variant in self.variant:
            if variant.name == name:
                return variant
        if not self.variant and name == SCRIPT_RUN:
            return Variant(name=SCRIPT_RUN)
        raise KeyError(f"no variant named {name!r}")

    @field_validator("modes")
    @classmethod
    def _modes_field(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("command") is not None:
            return value  # variant names, checked with the variants
        return cls._known_unique_modes(value)

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
    def _modes_known(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        workload = info.data.get("workload")
        if value is None or workload is None:
            return value
        if workload.is_script:
            if unknown := [m for m in value if m not in workload.modes]:
                raise ValueError(f"{unknown} are not runs of this workload ({workload.modes})")
            return value
        return WorkloadConfig._known_unique_modes(value)

    def selected_modes(self) -> list[str]:
        return list(self.modes) if self.modes is not None else list(self.workload.modes)
