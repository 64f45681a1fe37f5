"""The measured training loop: synced steps interleaved with compute-only steps.

Kept apart from the distributed setup (rank.py): it gets a DDP model, a mode and a barrier.

Each measured iteration runs the same micro-batches twice, in alternating order:
  synced:       a full optimizer step with DDP gradient sync (what training does);
  compute-only: the same step under `no_sync()`, then rolled back (parameters, optimizer and
                GradScaler state restored, untimed), so its local-only gradients never make the
                ranks' models diverge and the next synced step starts from the same state.
Both include the optimizer step, so their difference is the exposed communication only.
Interleaving makes both see the same CPU contention (other ranks, background traffic).
A barrier before each timed step lines the ranks up, so no rank's time includes waiting for
another rank that was still in its previous step.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.common.clock import job_clock
from netsim_ddp.precision.hooks import SentBytes
from netsim_ddp.precision.modes import Mode
from netsim_ddp.workload.contract.window import counters_grew
from netsim_ddp.workload.ranks.models import Batch, LossFn
from netsim_ddp.workload.ranks.timing import BucketTimer

SYNC_SPAN = "nsd.synced_step"  # profiler label around each measured synced step


@dataclass
class Trainer:
    ddp: DistributedDataParallel
    mode: Mode
    loss_fn: LossFn
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    device: torch.device

    def step(self, micro_batches: Sequence[Batch], sync: bool) -> torch.Tensor:
        """One optimizer step over the micro-batches; gradients sync on the last one if `sync`.

        Returns the mean loss over the micro-batches.
        """
        self.optimizer.zero_grad(set_to_none=True)
        last = len(micro_batches) - 1
        mean_loss = torch.zeros((), device=self.device)
        for index, (inputs, targets) in enumerate(micro_batches):
            skip_sync = index < last or not sync
            with self.ddp.no_sync() if skip_sync else contextlib.nullcontext():
                with self.mode.autocast(self.device.type):
                    loss = self.loss_fn(self.ddp(inputs), targets) / len(micro_batches)
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
                else:
                    loss.backward()  # type: ignore[no-untyped-call]
            mean_loss += loss.detach().float()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return mean_loss

    def begin_iteration(self, iteration: int) -> None:
        """Called before each iteration's pair of steps (compute replay draws its noise)."""

    def scheduled_compute_s(self, passes: int) -> float | None:
        """A compute-only step's known time, or None: measure it (replay knows its own)."""
        return None

    def late_s(self) -> float | None:
        """How late the last step's replay released a gradient (None: not replayed)."""
        return None

    @contextlib.contextmanager
    def rolled_back(self) -> Iterator[None]:
        """Restore model, optimizer and scaler state on exit (outside any timed region)."""
        saved_model = [t.detach().clone() for t in self.ddp.module.state_dict().values()]
        saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        saved_scaler = self.scaler.state_dict() if self.scaler is not None else None
        try:
            yield
        finally:
            with torch.no_grad():
                for tensor, saved in zip(
                    self.ddp.module.state_dict().values(), saved_model, strict=True
                ):
                    tensor.copy_(saved)
            self.optimizer.load_state_dict(saved_optimizer)
            if self.scaler is not None and saved_scaler is not None:
                self.scaler.load_state_dict(saved_scaler)


@dataclass
class Samples:
    iteration_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    sent_bytes: list[int] = field(default_factory=list)
    buckets: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    skipped_steps: int = 0
    # Per synced step: each bucket's (hand-off, completion), seconds from the step's start;
    # and when the step started (CLOCK_MONOTONIC, shared by every namespace of the host).
    bucket_intervals: list[list[tuple[float, float]]] = field(default_factory=list)
    started_monotonic: list[float] = field(default_factory=list)
    # Compute replay: per synced step, how late its latest gradient release was (host s).
    replay_late_s: list[float] = field(default_factory=list)
    # A node's local rank 0: per synced step, the node's TCP loss counters that grew in it.
    step_tcp_loss: list[dict[str, int]] = field(default_factory=list)


def param_digest(model: torch.nn.Module) -> str:
    """Hash of every parameter's bytes: equal on all ranks iff their models are identical."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _device_sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _scale_of(trainer: Trainer) -> float:
    return trainer.scaler.get_scale() if trainer.scaler is not None else 1.0


def measure(
    trainer: Trainer | Any,
    batches: Sequence[Batch],
    counter: SentBytes,
    *,
    warmup: int,
    iterations: int,
    grad_accumulation: int,
    barrier: Callable[[], None],
    around_measured: Callable[[], contextlib.AbstractContextManager[object]] = (
        contextlib.nullcontext
    ),
    timer: BucketTimer | None = None,
    step_evidence: Callable[[], dict[str, int]] | None = None,
) -> Samples:
    """Warm up, then time `iterations` synced and compute-only steps (see module docstring).
    `step_evidence` (a node's local rank 0) reads counters before and after each synced step,
    outside its timing; what grew is the step's network evidence (step_tcp_loss)."""
    samples = Samples()

    def micro_batches(iteration: int) -> list[Batch]:
        start = iteration * grad_accumulation
        return [batches[(start + j) % len(batches)] for j in range(grad_accumulation)]

    def timed(
        step_batches: list[Batch], sync: bool, label: str = "nsd.step"
    ) -> tuple[float, torch.Tensor]:
        barrier()
        counter.reset()
        _device_sync(trainer.device)
        evidence = step_evidence if sync else None
        before = evidence() if evidence is not None else {}
        with torch.profiler.record_function(label):
            if timer is not None:
                timer.start_step()
            started_monotonic = job_clock()  # compared across nodes
            start = time.perf_counter()
            loss = trainer.step(step_batches, sync)
            _device_sync(trainer.device)
            seconds = time.perf_counter() - start
            if sync:
                samples.started_monotonic.append(started_monotonic)
                if timer is not None:
                    samples.bucket_intervals.append(timer.intervals())
        if evidence is not None:
            after = evidence()
            samples.step_tcp_loss.append(counters_grew(before, after))
        return seconds, loss

    def compute_only(step_batches: list[Batch]) -> float:
        """The compute-only step's time: replay knows it (its schedule, noise included: the
        host's own overheads then count as communication, never as compute); else run it."""
        scheduled = trainer.scheduled_compute_s(len(step_batches))
        if scheduled is not None:
            return float(scheduled)
        with trainer.rolled_back():
            seconds, _ = timed(step_batches, False)
        if counter.buckets:  # compute-only must not have communicated
            raise RuntimeError(f"no_sync() step all-reduced {counter.buckets} buckets")
        return seconds

    for iteration in range(warmup):  # warms both paths: DDP rebuilds buckets after step one
        trainer.begin_iteration(iteration)
        timed(micro_batches(iteration), sync=True)
        compute_only(micro_batches(iteration))

    samples.started_monotonic.clear()  # the warm-up's synced steps are not measured
    samples.bucket_intervals.clear()
    samples.step_tcp_loss.clear()
    with around_measured():  # e.g. the profiler: measured iterations only
        for iteration in range(iterations):
            step_batches = micro_batches(warmup + iteration)
            trainer.begin_iteration(warmup + iteration)
            for sync in (True, False) if iteration % 2 == 0 else (False, True):
                if sync:
                    scale = _scale_of(trainer)
                    seconds, loss = timed(step_batches, True, f"{SYNC_SPAN}.{iteration}")
                    samples.iteration_s.append(seconds)
                    samples.sent_bytes.append(counter.bytes)
                    samples.buckets.append(counter.buckets)
                    samples.loss.append(float(loss))
                    # GradScaler lowers its scale exactly when it skips a step (inf/nan grads).
                    samples.skipped_steps += int(_scale_of(trainer) < scale)
                    late = trainer.late_s()
                    if late is not None:
                        samples.replay_late_s.append(late)
                else:
                    samples.compute_s.append(compute_only(step_batches))
    return samples
