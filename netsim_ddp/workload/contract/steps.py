"""A user's script, measured step by step: where its steps end, and what each one cost.

A step ends at every `optimizer.step()` (torch's global optimizer hook) or, where that is wrong
(several optimizers, none), at every `netsim_ddp.step()` the script calls. Boundary k ends step
k; step k (k >= 2) lasts from boundary k-1 to boundary k on this rank. The script's first
`warmup` steps are not measured (the first one holds its start-up), the next `iterations` are.

The measured window's two edges (boundaries `warmup` and `warmup + iterations`) are the only
places the harness makes the ranks wait for each other: a barrier over torchrun's own TCP store
(never the script's process group, whose collectives the script orders), then each node's local
rank 0 reads its link counters and drops the background flows' signal file (window.py does the
same for the built-in loop). The window's wire bytes are therefore as exact as the built-in
loop's. Inside the window there is no barrier: at every boundary local rank 0 reads its link
counters as it passes, so a step's bytes are what the node sent between its own two boundaries,
and a collective still draining at a boundary counts in the next step. Those per-step bytes sum
to the window's exactly on each node.

This module does not import torch: the recorder gets its clock, barrier, link counter and
collective timers from the entry module (script_rank.py), so its logic is tested without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from netsim_ddp.common.clock import job_clock
from netsim_ddp.common.files import write_whole
from netsim_ddp.common.signal_files import END, START
from netsim_ddp.fabric.counters.tcp_counters import tcp_mark
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.mode_result import ScriptFacts
from netsim_ddp.workload.contract.window import counters_grew

SPEC_ENV = "NETSIM_DDP_SCRIPT_SPEC"  # the ScriptSpec file the entry module reads
OPTIMIZER, MARKER = "optimizer", "marker"


class ScriptSpec(BaseModel):
    """What the harness tells every rank of one run (one variant) of a script."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run: str = Field(description="The variant's name: the mode results and signals carry.")
    warmup: int = Field(ge=1)
    iterations: int = Field(gt=0)
    steps: Literal["auto", "optimizer", "marker"]
    after_measured: Literal["stop", "finish"]
    out: str = Field(description="Folder for each rank's steps-rankR.json.")
    barrier_timeout_s: float = Field(gt=0)
    dilation: float = Field(1.0, ge=1, description="Time dilation k of a scale model.")
    replay: WorkloadConfig | None = Field(
        default=None, description="A scale model's compute replay (its compute settings): "
        "the module the script hands to DDP does not compute (script_replay).")

    @property
    def needed(self) -> int:
        return self.warmup + self.iterations


class ScriptRankRecord(ScriptFacts):
    """One rank's steps, as it writes them (out/steps-rankR.json)."""

    rank: int
    local_rank: int
    hostname: str
    boundaries: int = Field(description="Step boundaries seen in all (warm-up included).")
    step_s: list[float] = Field(default_factory=list, description="Measured steps' durations.")
    started_monotonic: list[float] = Field(default_factory=list)
    hook_bytes: list[int] = Field(
        default_factory=list,
        description="Per measured step, gradient bytes DDP handed to its comm hook (before "
        "any compression the script's hook applies); 0 without DDP.")
    bucket_intervals: list[list[tuple[float, float]]] | None = None
    step_link_bytes: list[int] | None = Field(
        default=None, description="Local rank 0 of a node: what its link sent in each step.")
    step_tcp_loss: list[dict[str, int]] | None = Field(
        default=None, description="Local rank 0 of a node: the node's TCP loss counters that "
        "grew in each step (fabric.tcp_counters.LOSS_EVIDENCE), by how much.")
    link_marks: list[dict[str, float]] | None = None
    ddp_models: int = 0
    ddp_params: int = Field(0, description="Parameters of the script's DDP models.")
    comm_hooks: list[str] = Field(default_factory=list,
                                  description="The script's own comm hooks, by name.")
    optimizers: list[str] = Field(default_factory=list,
                                  description="Classes of the optimizers that stepped.")
    steps: str = Field("optimizer", description="What ended its steps: optimizer or marker.")
    replay_late_s: list[float] | None = Field(
        default=None, description="Compute replay: per measured step, how late (host "
        "seconds) the host released a gradient or ended an optimizer step against the target's "
        "schedule.")


def record_path(out: Path | str, rank: int) -> Path:
    return Path(out) / f"steps-rank{rank}.json"


class MeasuredEnough(BaseException):
    """Raised at the step that closes the window when the script is to stop there: a
    BaseException, so the script's own `except Exception` does not swallow it."""


class StepError(RuntimeError):
    """The script cannot be measured as it runs (it steps several optimizers, mixes
    markers and optimizer steps): the message says what to change."""


class CollectiveTimes(Protocol):
    """What the recorder needs of the DDP timing (script_rank.DdpProbe)."""

    def take_step(self) -> tuple[int, list[tuple[float, float]] | None]: ...

    def describe(self, record: ScriptRankRecord) -> None:
        """Add what it saw of the script's DDP (models, hooks) to the record."""


class ReplaySteps(Protocol):
    """What the recorder needs of a script's compute replay (script_replay.ScriptReplay)."""

    def require_model(self) -> None:
        """Raise unless a model is replayed by the script's first step."""

    def take_step(self) -> tuple[float, float]:
        """(lateness, scheduled compute) of the step that ended, host seconds."""
        ...

    def target_compute_s(self) -> float: ...


@dataclass
class Edges:
    """What happens at the window's edges: a barrier of all ranks, then (where this rank
    leads its node) the link counters and the background flows' signal file."""

    barrier: Callable[[str], None]
    read_link: Callable[[], Any] | None  # -> LinkMark | None; None: not a node's leader
    signal: Callable[[str], None]  # edge name -> drop the file (node leader only)
    # -> the node's TCP loss counters (window.step_loss_reader); None: not a node's leader
    read_loss: Callable[[], dict[str, int]] | None = None


@dataclass
class StepRecorder:
    spec: ScriptSpec
    record: ScriptRankRecord
    edges: Edges
    collectives: CollectiveTimes
    clock: Callable[[], float] = time.perf_counter
    replay: ReplaySteps | None = None
    _last: float = 0.0
    _last_job: float = 0.0
    _last_link: int | None = None
    _last_loss: dict[str, int] = field(default_factory=dict)
    _optimizer_ids: dict[int, str] = field(default_factory=dict)
    written: bool = False

    @property
    def boundaries(self) -> int:
        return self.record.boundaries

    def __post_init__(self) -> None:
        self.record.steps = MARKER if self.spec.steps == MARKER else OPTIMIZER

    def optimizer_stepped(self, optimizer: object) -> None:
        """torch's global post-step hook calls this after every optimizer.step()."""
        key = id(optimizer)
        if key not in self._optimizer_ids:
            self._optimizer_ids[key] = type(optimizer).__name__
            self.record.optimizers = list(self._optimizer_ids.values())
        if self.record.steps != OPTIMIZER:
            return
        # With steps = 'auto' a netsim_ddp.step() may still come (after this step's
        # optimizers): only a window about to open on optimizer steps needs one optimizer.
        if len(self._optimizer_ids) > 1 and (self.spec.steps == OPTIMIZER or
                                             self.record.boundaries + 1 >= self.spec.warmup):
            raise StepError(
                "steps are counted per optimizer.step(), and this script steps "
                f"{len(self._optimizer_ids)} optimizers ({', '.join(self.record.optimizers)}): "
                "call netsim_ddp.step() where a training step ends (and set [workload] steps "
                "= \"marker\", or netsim-ddp launch --steps marker)")
        self._boundary()

    def marked(self) -> None:
        """netsim_ddp.step() calls this."""
        if self.record.steps != MARKER:
            if self.spec.steps == OPTIMIZER or self.record.boundaries >= self.spec.warmup:
                raise StepError(
                    "the script calls netsim_ddp.step(), but its steps were counted per "
                    f"optimizer.step() ({self.record.boundaries} so far, steps = "
                    f"\"{self.spec.steps}\"): set [workload] steps = \"marker\" (netsim-ddp "
                    "launch --steps marker), or remove the call")
            # steps = 'auto': the first marker decides, before the window opened; this call
            # ends step 1, and optimizer steps no longer count.
            self.record.steps = MARKER
            self.record.boundaries = 0
        self._boundary()

    def _boundary(self) -> None:
        now = self.clock()
        self.record.boundaries += 1
        k, spec = self.record.boundaries, self.spec
        late = None
        if self.replay is not None:
            if k == 1:
                self.replay.require_model()
            late, _ = self.replay.take_step()
        if k < spec.warmup or k > spec.needed:
            return
        if k == spec.warmup:
            mark = self._edge(START)
            self.collectives.take_step()  # the warm-up's last step: not measured
            self._last, self._last_job = self.clock(), job_clock()
            self._last_link = int(mark.sent_bytes) if mark is not None else None
            self._last_loss = self.edges.read_loss() if self.edges.read_loss is not None else {}
            return
        self.record.step_s.append(now - self._last)
        self.record.started_monotonic.append(self._last_job)
        hook_bytes, intervals = self.collectives.take_step()
        self.record.hook_bytes.append(hook_bytes)
        if late is not None:
            self.record.replay_late_s = [*(self.record.replay_late_s or []), late]
        if intervals is not None:
            self.record.bucket_intervals = [*(self.record.bucket_intervals or []), intervals]
        sent = self._link_bytes()
        if sent is not None and self._last_link is not None:
            self.record.step_link_bytes = [*(self.record.step_link_bytes or []),
                                           sent - self._last_link]
        self._last_link = sent
        if self.edges.read_loss is not None:  # a node's leader: the step's losses too
            loss = self.edges.read_loss()
            self.record.step_tcp_loss = [*(self.record.step_tcp_loss or []),
                                         counters_grew(self._last_loss, loss)]
            self._last_loss = loss
        self._last, self._last_job = self.clock(), job_clock()
        if k == spec.needed:
            self._edge(END)
            self.write()
            if spec.after_measured == "stop":
                raise MeasuredEnough

    def _link_bytes(self) -> int | None:
        if self.edges.read_link is None:
            return None
        mark = self.edges.read_link()
        return int(mark.sent_bytes) if mark is not None else None

    def _edge(self, name: str) -> Any:
        """The barrier, then this node's link mark (returned; None if not read)."""
        self.edges.barrier(f"{self.spec.run}/{name}")
        mark = self.edges.read_link() if self.edges.read_link is not None else None
        if mark is not None:
            self.record.link_marks = [*(self.record.link_marks or []), {
                "monotonic_s": mark.monotonic_s, "sent_bytes": mark.sent_bytes,
                "sent_packets": mark.sent_packets, **tcp_mark()}]
        self.edges.signal(name)
        return mark

    def write(self) -> None:
        self.collectives.describe(self.record)
        if self.replay is not None:
            self.record.replay_compute_s = self.replay.target_compute_s()
        write_whole(record_path(self.spec.out, self.record.rank),
                    self.record.model_dump_json())
        self.written = True

    def finish(self) -> None:
        """The script has returned: it must have made every step the scenario measures."""
        if self.record.boundaries >= self.spec.needed:
            return
        if self.record.boundaries == 0:
            looked_for = {
                OPTIMIZER: "optimizer.step() (torch.optim's global step hook saw none)",
                MARKER: "netsim_ddp.step() call",
                "auto": "optimizer.step() (torch.optim's global step hook saw none) and no "
                        "netsim_ddp.step() call"}[self.spec.steps]
            raise StepError(f"the script made no step: it ended without any {looked_for}"
                            + ("; a script that steps without a torch optimizer marks its "
                               "steps with netsim_ddp.step()" if self.spec.steps != MARKER
                               else ""))
        raise StepError(
            f"the script ended after {self.record.boundaries} steps, but the scenario measures "
            f"{self.spec.warmup} warm-up + {self.spec.iterations} steps = {self.spec.needed}: "
            "give it more steps (its own arguments) or lower warmup/iterations")


def store_barrier(store: Any, name: str, world_size: int, timeout_s: float) -> None:
    """Every rank waits here until all `world_size` have arrived (a c10d Store: add, set,
    wait), away from the script's process group."""
    from datetime import timedelta

    arrived = store.add(f"nsd/barrier/{name}/arrived", 1)
    if arrived == world_size:
        store.set(f"nsd/barrier/{name}/open", "1")
    store.wait([f"nsd/barrier/{name}/open"], timedelta(seconds=timeout_s))


# --- the marker scripts call --------------------------------------------------------------

_recorder: StepRecorder | None = None


def install(recorder: StepRecorder | None) -> None:
    global _recorder
    _recorder = recorder


def step() -> None:
    """Mark the end of a training step (netsim_ddp.step()). Outside netsim-ddp it does nothing,
    so a script can keep the call."""
    if _recorder is not None:
        _recorder.marked()
