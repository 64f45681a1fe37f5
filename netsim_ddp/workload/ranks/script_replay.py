"""Compute replay for a user's script (a scale model's `netsim-ddp launch`): the script runs
unmodified, but the module it hands to DistributedDataParallel does not compute.

When the script constructs DDP, the wrapped module's `forward` is replaced on that instance:
it waits out the target's forward time and returns zeros shaped as the real forward's outputs,
joined to a chain of autograd functions (replay.ReleaseGradients), one per layer of the script's own
model (replay.model_layout: modules owning parameters, registration order), whose backward
waits for the layer's release time and returns its gradients (zeros). DDP's buckets are built
over the script's real parameters, so their count, sizes and order are the script's, and every
byte DDP, its comm hooks and the script's own collectives move is real. The release times
come from `[workload] compute` (or `compute_amp` when autocast is on during the forward) or a
`profile-compute` profile, split as for the built-in loop's replay (replay.replay_schedule).

The optimizer step runs for real (its state and the parameters it writes are real) and is held
to the target's `[workload] optimizer` time: the post-step hook waits until the step's
deadline; a host slower than that is recorded as late, as is a gradient released past its
deadline. The per-step lateness feeds the run's `fidelity:replay` check.

The output shapes come from the real module, once per input signature: on the meta device
(no compute), else (a forward that makes tensors of its own on the CPU) one real forward under
no_grad. Outputs are zeros, so whatever the script derives from them (loss values, accuracy)
is meaningless; the bytes and the times are what the scale model measures.

Refused, with the reason (ScriptReplayError, before anything is measured): a DDP module on a
GPU (replay runs on gloo, its model on the CPU), a second DDP model, FSDP, and a script whose
first optimizer step comes with no DDP model (its compute would be the CPU's, counted 1/k).
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils import _pytree as pytree

from netsim_ddp.precision.modes import get_mode
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.noise_draws import NoiseModel
from netsim_ddp.workload.contract.steps import ScriptSpec
from netsim_ddp.workload.contract.window import NODE_RANK_ENV
from netsim_ddp.workload.ranks.replay import (
    ReleaseGradients,
    ReplayClock,
    ReplaySchedule,
    configured_profile,
    model_layout,
    replay_schedule,
)


class ScriptReplayError(RuntimeError):
    """The script does something compute replay cannot stand in for: the message says what."""


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    leaves, spec = pytree.tree_flatten((args, kwargs))
    parts = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append(f"T{tuple(leaf.shape)}{leaf.dtype}")
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            parts.append(repr(leaf))
        else:
            parts.append(type(leaf).__name__)
    return "|".join(parts)


def _to_meta(value: Any) -> Any:
    return value.to("meta") if isinstance(value, torch.Tensor) else value


def output_structure(module: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
    """(leaves, spec) of what `forward(*args, **kwargs)` returns, tensors as meta tensors: on
    the meta device if the forward allows it, else one real forward without gradients."""
    try:
        state = {name: _to_meta(value) for name, value in
                 [*module.named_parameters(), *module.named_buffers()]}
        meta_args, meta_kwargs = pytree.tree_map(_to_meta, (args, kwargs))
        with torch.no_grad():
            out = torch.func.functional_call(module, state, meta_args, meta_kwargs)
    except Exception:  # a forward that makes CPU tensors of its own: run it once for real
        with torch.no_grad():
            out = forward(*args, **kwargs)
    leaves, spec = pytree.tree_flatten(out)
    return [_to_meta(leaf) for leaf in leaves], spec


@dataclass
class StepLateness:
    """How late the host kept the replay in the current step (host seconds; max of all)."""

    late_s: float = 0.0

    def note(self, late: float) -> None:
        self.late_s = max(self.late_s, late)


@dataclass
class ReplayedModule:
    """One DDP module's replayed compute: its clocks (fp32 and under autocast) and the output
    shapes it has returned."""

    module: nn.Module
    clocks: dict[bool, ReplayClock]  # autocast on? -> clock
    forward: Callable[..., Any]  # the module's real forward
    shapes: dict[str, tuple[list[Any], Any]] = field(default_factory=dict)
    params: list[nn.Parameter] = field(default_factory=list)
    groups: list[list[nn.Parameter]] = field(default_factory=list)
    last_clock: ReplayClock | None = None

    def replay_forward(self, *args: Any, **kwargs: Any) -> Any:
        clock = self.clocks[torch.is_autocast_enabled("cpu")]
        self.last_clock = clock
        clock.start_pass()
        key = _signature(args, kwargs)
        if key not in self.shapes:
            self.module.forward = self.forward  # type: ignore[method-assign]
            try:
                self.shapes[key] = output_structure(self.module, self.forward, args, kwargs)
            finally:
                self.module.forward = self.replay_forward  # type: ignore[method-assign]
            clock.start_pass()  # the shapes cost host time once: not the target's forward
        clock.forward()
        token = torch.zeros(1)
        for index, group in enumerate(self.groups):
            token = ReleaseGradients.apply(token, clock, index, *group)
        joint = token.reshape(())
        leaves, spec = self.shapes[key]
        out = []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                zeros = torch.zeros(leaf.shape, dtype=leaf.dtype)
                out.append(zeros + joint.to(leaf.dtype) if leaf.dtype.is_floating_point
                           else zeros)
            else:
                out.append(leaf)
        return pytree.tree_unflatten(out, spec)


@dataclass
class ScriptReplay:
    """Installed before the script runs: replaces the compute of the module the script hands
    to DDP, holds its optimizer step to the target's time, records lateness per step."""

    config: WorkloadConfig
    dilation: float
    rank: int
    model: ReplayedModule | None = None
    lateness: StepLateness = field(default_factory=StepLateness)
    iteration: int = 0
    _optimizer_started: float | None = None
    _backward_done: float = 0.0
    _schedules: dict[bool, ReplaySchedule] = field(default_factory=dict)

    @property
    def compute_source(self) -> str:
        return self.config.compute_source

    def attach(self, ddp: DistributedDataParallel) -> None:
        """DDP was just built around `ddp.module`: replace that module's compute."""
        module = ddp.module
        if self.model is not None:
            raise ScriptReplayError(
                "compute replay: the script builds a second DistributedDataParallel model; a "
                "scale model replays one model's compute per step (one [workload] compute); "
                "run such a script in real time (no compute/profile, dilation 1)")
        devices = {p.device.type for p in module.parameters()}
        if devices - {"cpu"}:
            raise ScriptReplayError(
                f"compute replay: the script's DDP model is on {sorted(devices - {'cpu'})}; "
                "replay runs on gloo with the model on the CPU (the GPU's time is replayed): "
                "let the script choose the CPU where no GPU is asked for (e.g. its --device "
                "option), or run it in real time without [workload] compute")
        layout = model_layout(module, type(module).__name__)
        if not layout.layers:
            raise ScriptReplayError("compute replay: the script's DDP model has no trainable "
                                    "parameters")
        owners = {id(p): p for p in module.parameters() if p.requires_grad}
        groups: list[list[nn.Parameter]] = []
        seen: set[int] = set()
        for _, sub in module.named_modules():
            group = [p for p in sub.parameters(recurse=False)
                     if p.requires_grad and id(p) in owners and id(p) not in seen]
            seen.update(id(p) for p in group)
            if group:
                groups.append(group)
        profile = configured_profile(self.config)
        clocks: dict[bool, ReplayClock] = {}
        noise = NoiseModel.load(self.config.noise)  # the same seeded stalls and speeds as replay
        node = int(os.environ.get(NODE_RANK_ENV, "0"))  # the harness hands each node its rank
        for autocast, mode in ((False, "fp32"), (True, "amp")):
            schedule = replay_schedule(self.config, get_mode(mode), layout, profile)
            self._schedules[autocast] = schedule
            clocks[autocast] = _LateClock(schedule, self.dilation, noise, self.rank, node,
                                          lateness=self.lateness)
        self.model = ReplayedModule(module, clocks, module.forward, groups=groups)
        module.forward = self.model.replay_forward  # type: ignore[method-assign]
        for clock in clocks.values():
            clock.begin_iteration(self.iteration)

    def require_model(self) -> None:
        """At the script's first step: a DDP model must be replayed by then."""
        if self.model is None:
            raise ScriptReplayError(
                "compute replay: the script made an optimizer step with no "
                "DistributedDataParallel model; the scale model replays the compute of the "
                "module handed to DDP, and without one the script's CPU compute would be "
                "measured (and counted 1/k): wrap the model in DDP, or run the script in real "
                "time (no [workload] compute/profile, no dilation)")

    def optimizer_started(self) -> None:
        self._optimizer_started = time.perf_counter()

    def backward_done(self) -> None:
        self._backward_done = time.perf_counter()

    def optimizer_done(self) -> None:
        """Hold the step to the target's optimizer time (x k x the step's noise). An optimizer
        whose step runs the forward and backward itself (a closure: Lightning) starts when the
        backward has returned."""
        if self._optimizer_started is None or self.model is None:
            return
        clock = self.model.last_clock or self.model.clocks[False]
        started = max(self._optimizer_started, self._backward_done)
        deadline = started + clock.host_seconds(clock.schedule.optimizer_s)
        self._optimizer_started = None
        now = time.perf_counter()
        if now < deadline:
            time.sleep(deadline - now)
        else:  # the host's optimizer took longer than the target's: on the critical path
            self.lateness.note(now - deadline)

    def take_step(self) -> tuple[float, float]:
        """(lateness, scheduled compute) of the step that just ended, host seconds; the next
        step's noise drawn."""
        late, self.lateness.late_s = self.lateness.late_s, 0.0
        scheduled = 0.0
        if self.model is not None:
            clock = self.model.last_clock or self.model.clocks[False]
            scheduled = clock.host_seconds(clock.schedule.compute_s + clock.schedule.optimizer_s)
        self.iteration += 1
        if self.model is not None:
            for clock in self.model.clocks.values():
                clock.begin_iteration(self.iteration)
        return late, scheduled

    def target_compute_s(self) -> float:
        """The fp32 schedule's forward + backward + optimizer, target seconds (no noise)."""
        schedule = self._schedules.get(False)
        return 0.0 if schedule is None else schedule.compute_s + schedule.optimizer_s


@dataclass
class _LateClock(ReplayClock):
    """A replay clock whose lateness is shared by the step (every pass, the optimizer)."""

    lateness: StepLateness = field(default_factory=StepLateness)

    def note_late(self, late_s: float) -> None:
        super().note_late(late_s)
        self.lateness.note(late_s)


def _refuse_fsdp(*_args: Any, **_kwargs: Any) -> Any:
    raise ScriptReplayError(
        "compute replay: the script shards its model with FSDP; a scale model replays the "
        "compute of a DistributedDataParallel model only (FSDP's gathers and reduce-scatters "
        "run inside its forward and backward, which replay does not run): run it in real time "
        "(no [workload] compute/profile, no dilation)")


def install(replay: ScriptReplay) -> None:
    """Wrap DDP's constructor (attach the replay) and refuse FSDP, process-wide."""
    init = DistributedDataParallel.__init__

    @functools.wraps(init)
    def replayed_init(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        replay.attach(self)

    DistributedDataParallel.__init__ = replayed_init  # type: ignore[method-assign]
    with contextlib.suppress(ImportError):
        import torch.distributed.fsdp as fsdp

        fsdp.fully_shard = _refuse_fsdp  # type: ignore[attr-defined, assignment]
        fsdp.FullyShardedDataParallel.__init__ = _refuse_fsdp  # type: ignore[method-assign]
    with contextlib.suppress(ImportError):
        import torch.distributed._composable.fsdp as composable

        composable.fully_shard = _refuse_fsdp  # type: ignore[attr-defined, assignment]
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    backward = torch.autograd.backward

    @functools.wraps(backward)
    def timed_backward(*args: Any, **kwargs: Any) -> Any:
        try:
            return backward(*args, **kwargs)
        finally:
            replay.backward_done()

    torch.autograd.backward = timed_backward  # Tensor.backward calls it too
    register_optimizer_step_pre_hook(lambda *_: replay.optimizer_started())
    register_optimizer_step_post_hook(lambda *_: replay.optimizer_done())


def replay_for(spec: ScriptSpec, rank: int) -> ScriptReplay | None:
    """The spec's compute replay, installed (None: the script computes for real)."""
    if spec.replay is None:
        return None
    replay = ScriptReplay(spec.replay, spec.dilation, rank)
    install(replay)
    return replay
