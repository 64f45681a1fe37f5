"""Start a user's script on the emulated nodes, one torchrun launch per variant, and fold what
its ranks recorded (steps.ScriptRankRecord) into the same ModeResult the built-in loop writes.

Each variant gets a fresh launch (a script runs as `__main__` once per process): torchrun on
every node with the scenario's ranks per node, static rendezvous on node 0's emulated address,
the environment `launch` gives the built-in loop plus the variant's own. The ranks run
`script_rank` (the hooks, then the script); their output goes to per-rank log files under
OUT/VARIANT/logs/NODE/. No torch import here.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples, ScriptRun, combine
from netsim_ddp.workload.contract.steps import (
    SPEC_ENV,
    ScriptRankRecord,
    ScriptSpec,
    record_path,
)
from netsim_ddp.workload.launcher.launch import (
    FORKING_TORCHRUN,
    LaunchNode,
    WorkloadError,
    free_port,
    log_tail,
    rank_env,
    run_nodes,
    torchrun_argv,
)
from netsim_ddp.workload.launcher.resolve import resolve_command

SCRIPT_MODULE = "netsim_ddp.workload.ranks.script_rank"
LAST_LINES = 5  # of each rank's output, when a script hangs
# A scale model stands for GPU ranks, where frameworks run distributed; on CPU ranks some run
# each rank alone unless told to use the CPU (Accelerate and transformers' Trainer: what
# `accelerate launch --cpu` sets). A variant's own env may still override it.
TARGET_LOOKALIKE_ENV = {"ACCELERATE_USE_CPU": "true"}


def launch_script(
    nodes: Sequence[LaunchNode],
    workload: WorkloadConfig,
    out_dir: Path | str,
    timeout_s: float,
    *,
    ranks_per_node: int = 1,
    base_dir: Path | None = None,
    socket_ifname: str | None = "eth0",
    env: Mapping[str, str] | None = None,
    watchdog: Callable[[], None] | None = None,
    node_env: Sequence[Mapping[str, str]] | None = None,
    runs: Sequence[str] | None = None,
    dilation: float = 1.0,
) -> dict[str, ModeResult]:
    """Run each variant (`runs`: their names; default all) of the workload's command and
    return {variant: result}. `timeout_s` holds for each variant's launch. Raises
    WorkloadError as `launch` does, with the failing rank's error (the script's traceback, or
    the harness's: too few steps, none) or, on a timeout, every rank's last output lines."""
    assert workload.command is not None, "launch_script runs a workload with a command"
    if not nodes:
        raise ValueError("launch_script needs at least one node")
    command = resolve_command(workload.command, base_dir)
    out = Path(out_dir).resolve()
    results = {}
    for name in runs if runs is not None else workload.modes:
        variant = workload.variant_named(name)
        folder = out / name
        if folder.exists() and any(folder.iterdir()):
            raise ValueError(f"launch_script needs a fresh folder, and {folder} is not empty")
        logs = folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        spec = ScriptSpec(run=name, warmup=workload.warmup, iterations=workload.iterations,
                          steps=workload.steps, after_measured=workload.after_measured,
                          out=str(folder), barrier_timeout_s=timeout_s, dilation=dilation,
                          replay=workload if workload.replayed else None)
        spec_path = folder / "script-spec.json"
        spec_path.write_text(spec.model_dump_json(indent=1))
        port = free_port()
        agent = FORKING_TORCHRUN if workload.backend == "gloo" else "torch.distributed.run"
        argvs = [torchrun_argv(nnodes=len(nodes), nproc_per_node=ranks_per_node,
                               node_rank=index, master_addr=nodes[0].address, master_port=port,
                               spec_path=spec_path, out_dir=folder, log_dir=logs / node.name,
                               python=sys.executable, agent=agent,
                               entry=["-m", SCRIPT_MODULE, *command, *variant.args])
                 for index, node in enumerate(nodes)]
        child_env = rank_env(socket_ifname, {**(env or {}),
                                             **(TARGET_LOOKALIKE_ENV if workload.replayed else {}),
                                             **variant.env, SPEC_ENV: str(spec_path)})
        try:
            run_nodes(nodes, argvs, logs, child_env, timeout_s, watchdog=watchdog,
                      node_env=node_env,
                      describe_timeout=functools.partial(last_lines, nodes, logs))
        except WorkloadError as exc:
            if "timed out" in str(exc):  # its report holds every rank's last lines already
                raise
            # What the script printed says why, often more than its traceback does.
            raise WorkloadError(f"{name}: {exc}\n{last_lines(nodes, logs, 'stdout.log')}"
                                ) from None
        records = read_records(folder, len(nodes) * ranks_per_node, logs)
        results[name] = combine_script(
            records, run=name, command=command, variant_args=variant.args,
            variant_env=variant.env, workload=workload,
            local_world_size=ranks_per_node, socket_ifname=socket_ifname, dilation=dilation)
    return results


def last_lines(nodes: Sequence[LaunchNode], logs: Path, files: str = "std*.log",
               lines: int = LAST_LINES) -> str:
    """Every rank's last lines of output (stdout, then stderr): where a hung script was."""
    parts = []
    for node in nodes:
        for path in sorted((logs / node.name).rglob(files)):
            text = log_tail(path, lines)
            rank = path.parent.name  # torchrun's per-rank folder: attempt_0/<local rank>
            parts.append(f"--- {node.name} local rank {rank} {path.name} ---\n"
                         + (text or "(nothing)"))
    return "the ranks' last lines:\n" + "\n".join(parts) if parts else "no rank wrote output"


def read_records(folder: Path, world_size: int, logs: Path) -> list[ScriptRankRecord]:
    missing = [rank for rank in range(world_size) if not record_path(folder, rank).exists()]
    if missing:
        raise WorkloadError(f"every rank exited 0 but ranks {missing} wrote no steps file in "
                            f"{folder}; logs in {logs}")
    return [ScriptRankRecord.model_validate_json(record_path(folder, rank).read_text())
            for rank in range(world_size)]


def step_wire_bytes(records: Sequence[ScriptRankRecord]) -> list[int] | None:
    """Per measured step, what all nodes' links sent (node leaders' readings, summed)."""
    series = [r.step_link_bytes for r in records if r.local_rank == 0]
    if not series or any(s is None for s in series):
        return None
    return [sum(column) for column in zip(*[s for s in series if s is not None], strict=True)]


def combine_script(records: Sequence[ScriptRankRecord], *, run: str, command: list[str],
                   variant_args: list[str], variant_env: dict[str, str],
                   workload: WorkloadConfig, local_world_size: int,
                   socket_ifname: str | None, dilation: float = 1.0) -> ModeResult:
    """Every rank's record -> one ModeResult (iteration = slowest rank's step, as for the
    built-in loop; no compute-only steps, so no compute or exposed comm)."""
    samples = [RankSamples(
        rank=r.rank, local_rank=r.local_rank, hostname=r.hostname, iteration_s=r.step_s,
        compute_s=[], comm_s=[], sent_bytes=r.hook_bytes, buckets=[], wire_dtypes=[],
        loss=[], skipped_steps=0, param_digest="", link_marks=r.link_marks,
        started_monotonic=r.started_monotonic, bucket_intervals=r.bucket_intervals,
        replay_late_s=r.replay_late_s, step_tcp_loss=r.step_tcp_loss)
        for r in records]
    counts = {len(r.step_s) for r in records}
    if counts != {workload.iterations}:
        raise WorkloadError(f"{run}: ranks measured {sorted(counts)} steps, not "
                            f"{workload.iterations}")
    return combine(
        samples, mode=run, model=" ".join(command), params=max(r.ddp_params for r in records),
        params_requested=workload.params, world_size=len(records),
        local_world_size=local_world_size, backend=workload.backend, device="cpu"
        if workload.backend == "gloo" else "cuda", socket_ifname=socket_ifname, batch_size=0,
        grad_accumulation=1, bucket_size=0, warmup=workload.warmup,
        iterations=workload.iterations, profiled=False, dilation=dilation,
        compute_source=workload.compute_source,
        script=ScriptRun(command=command, variant_args=variant_args, variant_env=variant_env,
                         steps=records[0].steps, ddp_models=max(r.ddp_models for r in records),
                         comm_hooks=sorted({h for r in records for h in r.comm_hooks}),
                         optimizers=sorted({o for r in records for o in r.optimizers}),
                         step_wire_bytes=step_wire_bytes(records),
                         replay_compute_s=records[0].replay_compute_s,
                         framework_adjusted=sorted({n for r in records
                                                    for n in r.framework_adjusted}),
                         framework_differs=sorted({n for r in records
                                                   for n in r.framework_differs})))
