"""What a rank runs for a user's script: install the harness's hooks, then run the script as
torchrun would have run it.

    python -m netsim_ddp.workload.ranks.script_rank SCRIPT ARGS...       (torchrun train.py ARGS)
    python -m netsim_ddp.workload.ranks.script_rank -m MODULE ARGS...    (torchrun -m MODULE ARGS)

The script runs as `__main__` with `sys.argv` as torchrun gives it (the script path and its
arguments; for `-m`, the module's file and its arguments), its folder (or, for `-m`, the working
directory) first on `sys.path`. Before it starts, this module installs, process-wide:
- torch's global optimizer post-step hook: each `optimizer.step()` ends a step (steps.py);
- around `DistributedDataParallel`: the script's comm hook, if it registers one, is wrapped by
  the harness's timing (timing.BucketTimer, outermost, so its own compression is inside the
  interval); a DDP model whose script registers none gets torch's default all-reduce hook,
  timed the same way, at its first forward (a Python hook: the same arithmetic as DDP's built-in
  C++ all-reduce);
- the `netsim_ddp.step()` marker;
- in a scale model with replayed compute, script_replay: the module the script hands to DDP
  stops computing and releases its gradients on the target's schedule.
What it measures is in the file each rank writes (steps.ScriptRankRecord); the spec it follows
comes in the file NETSIM_DDP_SCRIPT_SPEC names (steps.ScriptSpec).
"""

import os
import runpy
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined]  # missing from stubs
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

from netsim_ddp.common.signal_files import SIGNAL_DIR_ENV, signal_file
from netsim_ddp.workload.contract import steps
from netsim_ddp.workload.contract.window import leads_node, step_loss_reader
from netsim_ddp.workload.ranks import framework_paths
from netsim_ddp.workload.ranks.rank import flush_all
from netsim_ddp.workload.ranks.script_replay import replay_for
from netsim_ddp.workload.ranks.timing import BucketTimer


class DdpProbe:
    """Every DDP model the script builds: its comm hook timed and its bucket bytes counted."""

    def __init__(self) -> None:
        self.models: list[tuple[Any, BucketTimer]] = []  # weak enough: models live all run
        self.hook_bytes = 0
        self.hooks: list[str] = []

    def timer(self, ddp: DistributedDataParallel) -> BucketTimer:
        for model, timer in self.models:
            if model is ddp:
                return timer
        timer = BucketTimer(torch.device("cpu") if not torch.cuda.is_available()
                            else next(ddp.module.parameters()).device)
        timer.start_step()
        self.models.append((ddp, timer))
        return timer

    def counted(self, ddp: DistributedDataParallel, hook: Any) -> Any:
        """`hook`, its buckets counted and timed."""
        timed = self.timer(ddp).wrap(hook)

        def counted_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
            buffer = bucket.buffer()
            self.hook_bytes += buffer.numel() * buffer.element_size()
            return timed(state, bucket)

        return counted_hook

    def describe(self, record: steps.ScriptRankRecord) -> None:
        record.ddp_models = len(self.models)
        record.ddp_params = sum(p.numel() for model, _ in self.models
                                for p in model.module.parameters())
        record.comm_hooks = list(self.hooks)

    def take_step(self) -> tuple[int, list[tuple[float, float]] | None]:
        """(bucket bytes, bucket intervals) since the last call; a new step starts now."""
        sent, self.hook_bytes = self.hook_bytes, 0
        if not self.models:
            return sent, None
        intervals: list[tuple[float, float]] = []
        for _, timer in self.models:
            if timer.cuda:
                torch.cuda.synchronize()
            intervals += timer.intervals()
            timer.start_step()
        return sent, intervals


def install_ddp_probe(probe: DdpProbe) -> None:
    """Wrap DDP so that every model's comm hook is timed (see the module docstring)."""
    register = DistributedDataParallel.register_comm_hook
    builtin = DistributedDataParallel._register_builtin_comm_hook
    forward = DistributedDataParallel.forward
    hooked: set[int] = set()

    def register_builtin_comm_hook(self: DistributedDataParallel, hook_type: Any) -> None:
        hooked.add(id(self))  # a C++ hook: runs untimed (collective_s then missing)
        probe.hooks.append(str(hook_type))
        builtin(self, hook_type)

    def register_comm_hook(self: DistributedDataParallel, state: object, hook: Any) -> None:
        hooked.add(id(self))
        probe.hooks.append(getattr(hook, "__qualname__", type(hook).__name__))
        register(self, state, probe.counted(self, hook))

    def timed_forward(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> Any:
        # The script registered no hook (through us or before we were installed): time
        # torch's default all-reduce.
        if id(self) not in hooked and not getattr(self, "_comm_hooks", None):
            hooked.add(id(self))
            register(self, self.process_group, probe.counted(self, allreduce_hook))
        return forward(self, *args, **kwargs)

    DistributedDataParallel.register_comm_hook = register_comm_hook  # type: ignore[method-assign]
    DistributedDataParallel.forward = timed_forward  # type: ignore[method-assign]
    DistributedDataParallel._register_builtin_comm_hook = (  # type: ignore[method-assign]
        register_builtin_comm_hook)


def _edges(spec: steps.ScriptSpec, rank: int, local_rank: int, world: int) -> steps.Edges:
    """Barrier over torchrun's TCP store; node leaders read their link and signal."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timedelta(seconds=spec.barrier_timeout_s))
    counter = None
    if leads_node(local_rank):
        from netsim_ddp.fabric.counters.own_link import LinkCounter

        counter = LinkCounter()
    signals = os.environ.get(SIGNAL_DIR_ENV)

    def signal(edge: str) -> None:
        if signals and local_rank == 0:
            signal_file(signals, edge, spec.run).touch()

    return steps.Edges(
        barrier=lambda name: steps.store_barrier(store, name, world, spec.barrier_timeout_s),
        read_link=counter.read if counter is not None else None,
        signal=signal, read_loss=step_loss_reader(local_rank))


def run_user(argv: list[str]) -> None:
    """Run the script (or `-m` module) as __main__, with argv as torchrun would give it."""
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]  # run_module puts the module's file in argv[0]
        sys.path.insert(0, os.getcwd())  # as `python -m` does
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).resolve().parent))  # as `python script.py` does
        runpy.run_path(script, run_name="__main__")


@record  # torchrun then reports this rank's traceback (the script's own, or ours) as the cause
def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        raise SystemExit("usage: python -m netsim_ddp.workload.ranks.script_rank SCRIPT|-m MODULE "
                         "ARGS...")
    spec_path = os.environ.get(steps.SPEC_ENV)
    if not spec_path:
        raise SystemExit(f"{steps.SPEC_ENV} is not set: the harness starts this module")
    spec = steps.ScriptSpec.model_validate_json(Path(spec_path).read_text())
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    probe = DdpProbe()
    replay = replay_for(spec, rank)  # before the recorder's hooks: it ends the optimizer step
    recorder = steps.StepRecorder(
        spec=spec,
        record=steps.ScriptRankRecord(rank=rank, local_rank=local_rank,
                                      hostname=socket.gethostname(), boundaries=0),
        edges=_edges(spec, rank, local_rank, world),
        collectives=probe, replay=replay)
    install_ddp_probe(probe)
    framework_paths.install(recorder.record.framework_adjusted,
                            recorder.record.framework_differs, target_like=replay is not None)
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs:
                                      recorder.optimizer_stepped(optimizer))
    steps.install(recorder)
    try:
        run_user(argv)
    except steps.MeasuredEnough:
        pass  # every rank stops at the same step, after the window's closing barrier
    except SystemExit as exc:  # the script's own sys.exit: 0 is a normal end
        if exc.code not in (None, 0):
            raise
    if not recorder.written or spec.after_measured == "finish":
        recorder.finish()  # raises unless every step was made
        recorder.write()


def forked_main(argv: list[str]) -> None:
    """A rank forked from netsim_ddp.workload.ranks.forking_torchrun (torch imported already)."""
    main(argv)
    flush_all()


if __name__ == "__main__":
    main()
    flush_all()
    os._exit(0)  # as rank.py: no C++ static destructors after a finished run
