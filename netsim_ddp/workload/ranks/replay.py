"""Compute replay: a model that does not compute, whose backward releases each layer's gradient
when the target accelerator would.

The model has the target's real parameter layout (scenario.layouts, or the user's model built
on torch's meta device), so DDP builds the same buckets; its forward waits out the target's
forward time, and its backward walks the layers in reverse, waiting for each layer's release
time before returning that layer's gradients. DDP's hooks then fill the buckets and hand them
to the backend while later layers still "compute": the overlap of backward and all-reduce is
the target's, and the gradients, buckets, collectives and wire bytes are real.

Host costs kept off the critical path (they would otherwise add to every step):
- release times are deadlines from the step's start, not sleeps one after another, so the
  host's own work between releases is absorbed instead of accumulated;
- the gradients returned are a zero scalar expanded to each shape (no allocation), added in
  place to DDP's bucket views (gradient_as_bucket_view, never set to None between steps);
- the parameters live in one private anonymous mapping that is never written: every page reads
  as the kernel's shared zero page, so 16 ranks of a 138M-parameter model cost no parameter
  memory; only DDP's buckets are real;
- no optimizer runs: its time is replayed after the gradients are synced.

The dilation k multiplies every replayed time (see scenario.dilation). How late the host
released gradients against the schedule is recorded per step: a run whose host could not keep
the schedule fails its check (run.runner.replay_checks).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.precision.modes import Mode
from netsim_ddp.scenario.compute_noise import ComputeNoise
from netsim_ddp.scenario.layouts import Layer, Layout, generic_layout, named_layout
from netsim_ddp.scenario.workload import GENERIC_LAYOUT, WorkloadConfig
from netsim_ddp.workload.contract.compute_profile import ComputeProfile, read_profile
from netsim_ddp.workload.contract.noise_draws import NoiseModel, light_factor
from netsim_ddp.workload.ranks.models import Batch, build_workload


def model_layout(model: nn.Module, name: str) -> Layout:
    """The layout of a model: modules owning parameters, in registration order (tied
    parameters once), as tools/make_layouts.py writes the shipped ones."""
    seen: set[int] = set()
    layers = []
    for module_name, module in model.named_modules():
        shapes = []
        for param in module.parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            shapes.append(tuple(param.shape))
        if shapes:
            layers.append(Layer(module_name or "(root)", tuple(shapes)))
    return Layout(name, f"{name}, built on the meta device", tuple(layers))


def replay_layout(config: WorkloadConfig) -> Layout:
    """The layout a replay of `config` uses: the named one ('generic': `params` in equal
    layers), else the model's own, built on the meta device (shapes only, no weights)."""
    if config.layout == GENERIC_LAYOUT:
        return generic_layout(config.params)
    if config.layout is not None:
        return named_layout(config.layout)
    try:
        with torch.device("meta"):
            workload = build_workload(config.model, config.params, config.seed)
    except Exception as exc:  # a factory that cannot build on meta: say so
        raise ValueError(f"workload.model {config.model!r} cannot be built on the meta device "
                         f"for replay ({exc}); set workload.layout ('generic' or a shipped "
                         "one)") from exc
    return model_layout(workload.model, config.model)


def configured_profile(config: WorkloadConfig) -> ComputeProfile | None:
    """The compute profile the workload names (workload.profile), read; None without one."""
    if config.profile is None:
        return None
    return read_profile(Path(config.profile))


@dataclass(frozen=True)
class ReplaySchedule:
    """Target times of one forward + backward: the forward, then each layer's backward in
    release order (last layer first), then the optimizer step."""

    forward_s: float
    backward_s: tuple[float, ...]  # per layer, in the layout's (registration) order
    optimizer_s: float

    @property
    def compute_s(self) -> float:
        return self.forward_s + sum(self.backward_s)

    def release_offsets(self) -> list[float]:
        """Per layer (registration order): when its gradients are due, from the pass's start."""
        offsets = [0.0] * len(self.backward_s)
        at = self.forward_s
        for index in reversed(range(len(self.backward_s))):
            at += self.backward_s[index]
            offsets[index] = at
        return offsets


def replay_schedule(config: WorkloadConfig, mode: Mode, layout: Layout,
                    profile: ComputeProfile | None = None) -> ReplaySchedule:
    """The schedule of one mode: compute split into forward and per-layer backward (by the
    profile's per-layer times, else by each layer's share of the parameters)."""
    compute = config.replay_compute_s(mode.name)
    forward_fraction = config.forward_fraction
    shares = layout.shares
    if profile is not None:
        names = [layer.name for layer in layout.layers]
        profiled = [layer.name for layer in profile.layers]
        if names != profiled:
            missing = sorted(set(names) ^ set(profiled))[:5]
            raise ValueError(f"compute profile of {profile.model!r} does not match the layout "
                             f"{layout.name!r} ({len(profiled)} vs {len(names)} layers; differ: "
                             f"{', '.join(missing) or 'order'}); profile the same model")
        total = sum(layer.backward_s for layer in profile.layers)
        if total > 0:
            shares = [layer.backward_s / total for layer in profile.layers]
        forward_fraction = profile.forward_fraction
        if compute is None:
            compute = profile.compute_s
            if mode.uses_autocast and config.compute_amp is not None:
                compute = config.compute_amp
            elif mode.uses_autocast and profile.mode == "fp32":
                compute *= config.amp_ratio
    if compute is None:
        raise ValueError("replay needs workload.compute or workload.profile")
    backward = compute * (1 - forward_fraction)
    optimizer = config.optimizer
    if profile is not None and optimizer == 0 and profile.optimizer_s:
        optimizer = sorted(profile.optimizer_s)[len(profile.optimizer_s) // 2]
    return ReplaySchedule(compute * forward_fraction,
                          tuple(backward * share for share in shares), optimizer)


def noise_factor(noise: ComputeNoise | None, rank: int, iteration: int) -> float:
    """The light step-time multiplier of `rank` in `iteration` (workload.compute_noise)."""
    return light_factor(noise, rank, iteration)


@dataclass
class ReplayClock:
    """The replay's schedule in host time for one rank: k x target, x the step's noise."""

    schedule: ReplaySchedule
    dilation: float
    noise: NoiseModel
    rank: int
    node: int = 0
    factor: float = 1.0
    stall_s: float = 0.0  # target seconds before this step's first forward
    _shift_s: float = 0.0  # the stall, not yet served (the step's first pass serves it)
    _pass_shift_s: float = 0.0  # the stall of the current pass
    started: float = 0.0
    late_s: float = 0.0  # the latest release of the current step, against its deadline
    _offsets: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._offsets = self.schedule.release_offsets()

    def begin_iteration(self, iteration: int) -> None:
        drawn = self.noise.step(self.rank, self.node, iteration)
        self.factor, self.stall_s, self._shift_s = drawn.factor, drawn.stall_s, drawn.stall_s
        self.late_s = 0.0

    def start_pass(self) -> None:
        self.started = time.perf_counter()
        self._pass_shift_s, self._shift_s = self._shift_s, 0.0

    def host_seconds(self, seconds: float) -> float:
        """Target seconds of compute as this host waits them: x the dilation and the noise."""
        return seconds * self.dilation * self.factor

    def _wait_until(self, offset_s: float) -> None:
        deadline = self.started + self.host_seconds(offset_s) + self._pass_shift_s * self.dilation
        now = time.perf_counter()
        if now < deadline:
            time.sleep(deadline - now)
        else:
            self.note_late(now - deadline)

    def note_late(self, late_s: float) -> None:
        self.late_s = max(self.late_s, late_s)

    def forward(self) -> None:
        self._wait_until(self.schedule.forward_s)

    def release(self, layer: int) -> None:
        self._wait_until(self._offsets[layer])

    def optimizer(self) -> None:
        if self.schedule.optimizer_s > 0:
            time.sleep(self.host_seconds(self.schedule.optimizer_s))

    def step_s(self, passes: int) -> float:
        """Host seconds one step is scheduled to take: `passes` forward + backward passes
        (micro-batches) and the optimizer."""
        return (self.host_seconds(passes * self.schedule.compute_s + self.schedule.optimizer_s)
                + self.stall_s * self.dilation)


class ReleaseGradients(torch.autograd.Function):
    """Identity on a token; its backward waits for the layer's release time, then returns the
    layer's gradients (zeros, expanded: no memory)."""

    @staticmethod
    def forward(ctx, token, clock, layer, *params):  # type: ignore[no-untyped-def, override]
        ctx.clock, ctx.layer = clock, layer
        ctx.shapes = [param.shape for param in params]
        return token.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        ctx.clock.release(ctx.layer)
        zero = grad.new_zeros(())
        return (grad, None, None, *(zero.expand(shape) for shape in ctx.shapes))


def _zero_page_parameters(layout: Layout) -> tuple[mmap.mmap, list[list[nn.Parameter]]]:
    """Every parameter of the layout as a view of one private anonymous mapping that nothing
    writes: reads map the kernel's zero page, so the parameters take no memory."""
    total = max(layout.params, 1)
    buffer = mmap.mmap(-1, total * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    flat = torch.frombuffer(buffer, dtype=torch.float32, count=total)
    groups, offset = [], 0
    for layer in layout.layers:
        group = []
        for shape in layer.shapes:
            count = math.prod(shape)
            group.append(nn.Parameter(flat[offset:offset + count].view(shape)))
            offset += count
        groups.append(group)
    return buffer, groups


class ReplayModel(nn.Module):
    """The layout's parameters and a forward whose backward replays the schedule."""

    def __init__(self, layout: Layout, clock: ReplayClock):
        super().__init__()
        self.layout = layout
        self.clock = clock
        self._buffer, groups = _zero_page_parameters(layout)
        self.layers = nn.ModuleList()
        for group in groups:
            holder = nn.Module()
            holder.params = nn.ParameterList(group)
            self.layers.append(holder)

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        self.clock.forward()
        for index, holder in enumerate(self.layers):
            params: nn.ParameterList = holder.params  # type: ignore[assignment]
            token = ReleaseGradients.apply(token, self.clock, index, *params)
        return token


def replay_batches(count: int) -> list[Batch]:
    token = torch.zeros(1)
    return [(token, token) for _ in range(count)]


@dataclass
class ReplayTrainer:
    """Trainer's interface (workload.ranks.loop) for a replayed model: no autocast, no scaler, no
    optimizer (its time is replayed), nothing to roll back (no parameter ever changes)."""

    ddp: DistributedDataParallel
    mode: Mode
    clock: ReplayClock
    device: torch.device = torch.device("cpu")
    scaler: None = None

    def begin_iteration(self, iteration: int) -> None:
        self.clock.begin_iteration(iteration)

    def scheduled_compute_s(self, passes: int) -> float:
        return self.clock.step_s(passes)

    def late_s(self) -> float:
        return self.clock.late_s

    def step(self, micro_batches: Sequence[Batch], sync: bool) -> torch.Tensor:
        last = len(micro_batches) - 1
        for index, (inputs, _) in enumerate(micro_batches):
            with self.ddp.no_sync() if index < last or not sync else contextlib.nullcontext():
                self.clock.start_pass()
                self.ddp(inputs).sum().backward()  # type: ignore[no-untyped-call]
        self.clock.optimizer()
        return torch.zeros(())

    @contextlib.contextmanager
    def rolled_back(self) -> Iterator[None]:
        yield


def build_replay(config: WorkloadConfig, mode: Mode, dilation: float,
                 rank: int, node: int = 0) -> tuple[ReplayModel, ReplayClock]:
    layout = replay_layout(config)
    schedule = replay_schedule(config, mode, layout, configured_profile(config))
    clock = ReplayClock(schedule, dilation, NoiseModel.load(config.noise), rank, node)
    return ReplayModel(layout, clock), clock


__all__ = ["ReplayClock", "ReplayModel", "ReplaySchedule", "ReplayTrainer", "build_replay",
           "model_layout", "noise_factor", "replay_batches", "replay_layout", "replay_schedule"]
