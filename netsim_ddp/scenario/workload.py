"""What to train and how: the typed, validated workload section of a scenario.

Importing this module does not import torch, so scenario files can be loaded and the JSON schema
exported on machines (and in processes) that never run a rank.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from netsim_ddp.precision.modes import MODES, WireDtype, get_mode, mode_names
from netsim_ddp.scenario.compute_noise import ComputeNoise
from netsim_ddp.scenario.layouts import generic_layout, layout_names, named_layout
from netsim_ddp.scenario.units import Count, Duration, Size

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
    # [link] busbw_from: float32 all-reduces at each of the job's bucket sizes too, after the
    # fidelity dtypes, for fidelity:busbw (projection.busbw_links).
    job_sizes: list[int] = Field(default_factory=list)


MAX_REPLAY_COMPUTE_S = 60.0  # a target step longer than a minute is a typo, not a GPU
GENERIC_LAYOUT = "generic"
DEFAULT_FORWARD_FRACTION = 1 / 3  # backward takes about twice the forward


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
            "- see netsim_ddp.workload.ranks.models."
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

    compute: Duration | None = Field(
        default=None, le=MAX_REPLAY_COMPUTE_S,
        description="Compute replay: the target accelerator's forward + backward time per "
        "step at the per-rank batch, e.g. '230ms'. The ranks then do not compute: each "
        "layer's gradient is released when the target would release it, while the buckets, "
        "collectives and wire bytes stay real. Omit with a `profile` to use its median.")
    compute_amp: Duration | None = Field(
        default=None, le=MAX_REPLAY_COMPUTE_S,
        description="Replay: forward + backward under autocast (modes amp, amp-fp16, amp-bf16); "
        "default: compute x amp_ratio.")
    amp_ratio: float = Field(
        default=1.0, gt=0, le=10,
        description="Replay: autocast compute time / fp32 compute time, when compute_amp is "
        "not given (1.0: the same time).")
    optimizer: Duration = Field(
        default=0.0, le=MAX_REPLAY_COMPUTE_S,
        description="Replay: the optimizer step's time, after the gradients are synced.")
    forward_fraction: float = Field(
        default=DEFAULT_FORWARD_FRACTION, ge=0, lt=1,
        description="Replay: the forward pass's share of `compute` (the rest is backward).")
    layout: str | None = Field(
        default=None,
        description="Replay: a shipped parameter layout (" + ", ".join(layout_names()) + "), "
        "which sets `params`; or 'generic' (`params` in equal layers). Default: the `model`'s "
        "own layout, built on torch's meta device (no weights).")
    profile: str | None = Field(
        default=None,
        description="Replay: a per-layer compute profile (JSON from `netsim-ddp "
        "profile-compute`) for the backward time of each layer; relative to the scenario "
        "file. Default: each layer's share of the parameters.")
    noise: ComputeNoise | None = Field(
        default=None, description="Replay: seeded per-rank, per-step compute variation.")

    @model_validator(mode="before")
    @classmethod
    def _params_from_layout(cls, data: object) -> object:
        if isinstance(data, dict) and isinstance(data.get("layout"), str) \
                and data["layout"] != GENERIC_LAYOUT:
            try:
                count = named_layout(data["layout"]).params
            except ValueError as exc:
                raise ValueError(f"layout: {exc}") from None
            if "params" in data and data["params"] != count:
                raise ValueError(f"params: layout {data['layout']!r} has {count} parameters; "
                                 "give one of params and layout, not both")
            data = {**data, "params": count}
        return data

    @model_validator(mode="after")
    def _replay_fields(self) -> WorkloadConfig:
        replay_only = [name for name in ("compute_amp", "layout", "noise")
                       if getattr(self, name) is not None]
        replay_only += [name for name, default in (("amp_ratio", 1.0), ("optimizer", 0.0),
                                                   ("forward_fraction", DEFAULT_FORWARD_FRACTION))
                        if getattr(self, name) != default]
        if not self.replayed and replay_only:
            raise ValueError(f"{replay_only[0]}: only used by compute replay; set workload."
                             "compute (e.g. '230ms') or workload.profile, or remove it")
        if self.compute_amp is not None and self.amp_ratio != 1.0:
            raise ValueError("amp_ratio: give compute_amp or amp_ratio, not both")
        if self.layout == GENERIC_LAYOUT:
            generic_layout(self.params)  # too few parameters is an error here, not in a rank
        return self

    @property
    def replayed(self) -> bool:
        """Whether the ranks replay compute instead of computing."""
        return self.compute is not None or self.profile is not None

    @property
    def compute_source(self) -> str:
        """How the compute was obtained, as results and tables say it."""
        if not self.replayed:
            return "real"
        return "replay (profile)" if self.profile is not None else "replay"

    def replay_compute_s(self, mode: str) -> float | None:
        """The target's forward + backward time in `mode` (None: from the profile, or not
        replayed)."""
        if self.compute is None:
            return None
        if not get_mode(mode).uses_autocast:
            return self.compute
        return self.compute_amp if self.compute_amp is not None else self.compute * self.amp_ratio

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
        if data.get("layout") is not None:
            raise ValueError("layout: a script's replayed compute uses the layout of the model "
                             "it hands to DDP (its own); remove layout")
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
        if self.replayed and self.backend == "nccl":
            raise ValueError("backend: a script's replayed compute runs on gloo with its model "
                             "on the CPU; set backend = 'gloo' (or 'auto')")
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
    dilation: float = Field(
        default=1.0, ge=1,
        description="Time dilation k of the emulated world: replayed compute sleeps k x the "
        "target's time (the links run at rate / k; the harness divides times by k).")
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
