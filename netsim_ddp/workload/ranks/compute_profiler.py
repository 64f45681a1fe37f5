"""`netsim-ddp profile-compute`: time a scenario's model on one device, no network, and write
the per-layer profile compute replay reads (workload.launcher.compute_profile).

Each parameter's post-accumulate-grad hook marks when its gradient is ready (a CUDA event on a
GPU, perf_counter on a CPU); a layer is ready when its last parameter is. A layer's backward
time is the gap between its readiness and the previous layer's (the backward's start for the
first): exactly when DDP could hand its gradients to a bucket. Forward (with the loss),
backward and optimizer step are timed per step, so the profile carries the step-to-step
spread too. On a CPU host it measures the CPU (with the ranks' one thread each).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from netsim_ddp.precision.modes import get_mode
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.compute_profile import ComputeProfile, LayerTime
from netsim_ddp.workload.ranks.models import build_workload, count_params, make_batches
from netsim_ddp.workload.ranks.replay import model_layout

LEARNING_RATE = 1e-3


class _Timer:
    """Marks on the device's own clock: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if self.cuda:
            return float(start.elapsed_time(end)) / 1e3
        return float(end - start)

    @property
    def name(self) -> str:
        return "cuda events" if self.cuda else "perf_counter"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def profile_compute(config: WorkloadConfig, *, mode_name: str = "fp32", steps: int = 10,
                    warmup: int = 3, device: torch.device | None = None,
                    progress: Callable[[str], None] = lambda message: None) -> ComputeProfile:
    """Time `steps` training steps of the workload's model (after `warmup`) on `device`."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mode = get_mode(mode_name)
    workload = build_workload(config.model, config.params, config.seed)
    model = workload.model.to(device)
    layout = model_layout(model, config.model)
    layer_of: dict[int, int] = {}
    names = [layer.name for layer in layout.layers]
    for name, module in model.named_modules():
        if (name or "(root)") in names:
            for param in module.parameters(recurse=False):
                layer_of.setdefault(id(param), names.index(name or "(root)"))
    batches = [(x.to(device), y.to(device)) for x, y in
               make_batches(workload, config.batch_size, 4, config.seed, 0)]
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=0.9)
    scaler = mode.grad_scaler(device.type)
    timer = _Timer(device)
    ready: dict[int, Any] = {}

    def on_ready(param: torch.Tensor) -> None:
        ready[layer_of[id(param)]] = timer.mark()  # the layer's last parameter wins

    for param in model.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(on_ready)
    forward_s, backward_s, optimizer_s = [], [], []
    per_layer: list[list[float]] = [[] for _ in names]
    for step in range(warmup + steps):
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        ready.clear()
        start = timer.mark()
        with mode.autocast(device.type):
            loss = workload.loss_fn(model(inputs), targets)
        forward_end = timer.mark()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        backward_end = timer.mark()
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        step_end = timer.mark()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step < warmup:
            continue
        forward_s.append(timer.seconds(start, forward_end))
        backward_s.append(timer.seconds(forward_end, backward_end))
        optimizer_s.append(timer.seconds(backward_end, step_end))
        previous = forward_end
        for layer in sorted(ready, key=lambda i: timer.seconds(forward_end, ready[i])):
            per_layer[layer].append(max(timer.seconds(previous, ready[layer]), 0.0))
            previous = ready[layer]
        progress(f"step {step - warmup + 1}/{steps}: forward {forward_s[-1] * 1e3:.1f} ms, "
                 f"backward {backward_s[-1] * 1e3:.1f} ms")
    label = str(device) + (f" ({torch.cuda.get_device_name(device)})"
                           if device.type == "cuda" else "")
    return ComputeProfile(
        device=label, timer=timer.name, model=config.model, params=count_params(model),
        batch_size=config.batch_size, mode=mode_name, forward_s=forward_s,
        backward_s=backward_s, optimizer_s=optimizer_s,
        layers=[LayerTime(name=name, backward_s=_median(times) if times else 0.0)
                for name, times in zip(names, per_layer, strict=True)])
