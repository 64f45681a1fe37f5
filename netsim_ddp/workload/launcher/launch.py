"""Start the ranks: one torchrun (torch.distributed.run) per emulated node, static rendezvous.

Every node runs `torchrun --nnodes N --nproc-per-node R --node-rank i --master-addr ADDR
--master-port PORT --rdzv-backend static`: the classic fixed multi-node launch, no etcd and no
c10d rendezvous server; node 0's torchrun hosts the TCP store on ADDR:PORT. For gloo ranks the
node runs the same options through agent.py, torchrun's agent that forks its ranks from itself
with torch imported (torchrun_module).

`launch` owns every process it starts: each torchrun leads its own process group, and on
failure or timeout the group is stopped, every descendant (torchrun puts its workers in their own
sessions, so killpg alone would orphan them) is killed, and `launch` returns only once they are
gone. Then it raises `WorkloadError` with the failing rank's stderr.

No torch import here: the harness process never needs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from netsim_ddp.scenario.workload import RankSpec
from netsim_ddp.workload.contract.mode_result import ModeResult, read_result, result_path
from netsim_ddp.workload.contract.window import NODE_RANK_ENV

RANK_MODULE = "netsim_ddp.workload.ranks.rank"
FORKING_TORCHRUN = "netsim_ddp.workload.ranks.forking_torchrun"
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding netsim_ddp/
TAIL_LINES = 40
KILL_WAIT_S = 10.0


class LaunchNode(Protocol):
    """What launch needs of a node: fabric nodes run argv inside their network namespace."""

    @property
    def name(self) -> str: ...

    @property
    def address(self) -> str: ...

    def popen(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]: ...


class WorkloadError(RuntimeError):
    """The ranks failed or timed out; the message carries the failing rank's stderr."""


def free_port() -> int:
    """A TCP port nobody listens on now (bind port 0 and let the kernel pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def torchrun_module(spec: RankSpec) -> str:
    """What each node runs as `python -P -m MODULE TORCHRUN-OPTIONS`: the agent that forks its
    ranks (agent.py) for gloo ranks on the CPU, else torchrun itself, since a CUDA context does
    not survive a fork ('auto' may mean CUDA)."""
    return FORKING_TORCHRUN if spec.workload.backend == "gloo" else "torch.distributed.run"


def torchrun_argv(
    *,
    nnodes: int,
    nproc_per_node: int,
    spec_path: Path | str,
    out_dir: Path | str,
    log_dir: Path | str,
    node_rank: int = 0,
    master_addr: str = "",
    master_port: int = 0,
    rendezvous: Sequence[str] | None = None,
    profile_dir: Path | str | None = None,
    python: str = sys.executable,
    agent: str = "torch.distributed.run",
    entry: Sequence[str] | None = None,
) -> list[str]:
    """The command line for one node's torchrun (or the forking one: torchrun_module), the one
    place it is built. The nodes meet at node 0's master_addr:master_port (static rendezvous),
    or through `rendezvous` (c10d_rendezvous: a real host's agent). `entry`: what torchrun
    starts on each rank instead of the built-in loop (spec_path and out_dir unused)."""
    meet = list(rendezvous) if rendezvous is not None else [
        "--node-rank", str(node_rank),
        "--master-addr", master_addr,
        "--master-port", str(master_port),
        "--rdzv-backend", "static",
    ]  # fmt: skip
    argv = [
        python, "-P", "-m", agent,  # -P: never import from the cwd
        "--nnodes", str(nnodes),
        "--nproc-per-node", str(nproc_per_node),
        *meet,
        "--max-restarts", "0",  # a failed rank is a failed run, never a silent retry
        "--log-dir", str(log_dir),
        "--tee", "3",  # per-rank stdout/stderr files, and a copy on torchrun's own output
    ]  # fmt: skip
    if entry is not None:
        return argv + list(entry)
    argv += ["-m", RANK_MODULE, "--spec", str(spec_path), "--out", str(out_dir)]
    if profile_dir is not None:
        argv += ["--profile", str(profile_dir)]
    return argv


def c10d_rendezvous(endpoint: str, rdzv_id: str, join_timeout_s: float,
                    local_addr: str) -> list[str]:
    """torchrun's rendezvous through a store another process hosts (`is_host=false`): the
    multi-host agents' phases. `local_addr`: rank 0's becomes MASTER_ADDR, so the shaped NIC."""
    return ["--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint,
            "--rdzv-id", rdzv_id,
            "--rdzv-conf", f"is_host=false,join_timeout={int(join_timeout_s)}",
            "--local-addr", local_addr]  # fmt: skip


def rank_env(socket_ifname: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for torchrun and its ranks: ours, then `extra`, then what the ranks need."""
    env = {**os.environ, **(extra or {})}
    # The ranks must import this package whatever their working directory is.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env["OMP_NUM_THREADS"] = "1"  # ranks share the host's cores; torchrun would set it anyway
    env["PYTHONUNBUFFERED"] = "1"  # so a crashing rank's last words reach the log
    # torchrun starts the ranks with `python -m`: never import from the working directory (a
    # json.py where someone runs `sudo netsim-ddp run` would run as root in every rank).
    env["PYTHONSAFEPATH"] = "1"
    if socket_ifname is not None:
        env["GLOO_SOCKET_IFNAME"] = socket_ifname
    return env


def launch(
    nodes: Sequence[LaunchNode],
    spec: RankSpec,
    out_dir: Path | str,
    timeout_s: float,
    *,
    ranks_per_node: int = 1,
    socket_ifname: str | None = "eth0",
    master_port: int | None = None,
    profile: bool = False,
    env: Mapping[str, str] | None = None,
    watchdog: Callable[[], None] | None = None,
    node_env: Sequence[Mapping[str, str]] | None = None,
) -> dict[str, ModeResult]:
    """Run `spec` on `nodes` (node 0 is the master) and return {mode: result}.

    `env` goes to every node; `node_env[i]`, if given, to node i's ranks on top of it (its
    GPUs, its NCCL host id).

    Raises WorkloadError if a torchrun exits non-zero, the timeout passes, or a result is missing;
    by then every process it started is gone. Logs stay under out_dir/logs/.
    `watchdog` is called about every 0.1 s while the ranks run: whatever it raises (a helper the
    run depends on died) ends the launch at once, ranks killed, and propagates.
    """
    if not nodes:
        raise ValueError("launch needs at least one node")
    out = Path(out_dir).resolve()
    if out.is_dir() and any(out.iterdir()):  # an earlier run's results or error files
        raise ValueError(f"launch needs a fresh folder of its own, and {out} is not empty: an "
                         "earlier run's results and error files would pass for this run's")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(spec.model_dump_json(indent=1))
    port = master_port if master_port is not None else free_port()
    argvs = [
        torchrun_argv(
            nnodes=len(nodes),
            nproc_per_node=ranks_per_node,
            node_rank=node_rank,
            master_addr=nodes[0].address,
            master_port=port,
            spec_path=spec_path,
            out_dir=out,
            log_dir=logs / node.name,
            profile_dir=out if profile else None,
            agent=torchrun_module(spec),
        )
        for node_rank, node in enumerate(nodes)
    ]
    run_nodes(nodes, argvs, logs, rank_env(socket_ifname, env), timeout_s, watchdog=watchdog,
              node_env=node_env)
    return read_results(out, spec, logs)


def run_nodes(
    nodes: Sequence[LaunchNode],
    argvs: Sequence[Sequence[str]],
    logs: Path,
    child_env: Mapping[str, str],
    timeout_s: float,
    *,
    watchdog: Callable[[], None] | None = None,
    node_env: Sequence[Mapping[str, str]] | None = None,
    describe_timeout: Callable[[], str] | None = None,
    node_ranks: Sequence[int] | None = None,
) -> None:
    """Start argvs[i] on nodes[i] and wait for all of them (see `launch`); raises
    WorkloadError, every process gone, if one fails or the timeout passes.
    `describe_timeout()` adds to a timeout's report (e.g. the ranks' last log lines).
    `node_ranks[i]`: nodes[i]'s rank in the job (default i; a machine's share of a larger job
    starts elsewhere)."""
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        stack.callback(kill_all, procs)  # runs however we leave: success, failure, Ctrl-C
        for node_rank, (node, argv) in enumerate(zip(nodes, argvs, strict=True)):
            # A file, not a pipe: nobody reads while waiting, and a full pipe would block it.
            output = stack.enter_context(open(logs / f"{node.name}.torchrun.log", "wb"))
            procs.append(
                node.popen(
                    list(argv),
                    env={**child_env, **(node_env[node_rank] if node_env else {}),
                         NODE_RANK_ENV: str(node_ranks[node_rank] if node_ranks else node_rank)},
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # own process group, so we can stop it whole
                )
            )
        failed, timed_out = _wait_all(procs, timeout_s, watchdog)
    # Reports are written only now: every process is gone, so the logs are complete.
    if timed_out:
        raise WorkloadError(
            f"workload timed out after {timeout_s:g}s; still running: "
            + ", ".join(nodes[i].name for i in timed_out)
            + "\n"
            + (describe_timeout() if describe_timeout is not None
               else failure_report(nodes, logs, failed))
        )
    if failed:
        raise WorkloadError(failure_report(nodes, logs, failed))


def _wait_all(
    procs: Sequence[subprocess.Popen[bytes]],
    timeout_s: float,
    watchdog: Callable[[], None] | None = None,
) -> tuple[list[int], list[int]]:
    """Wait until all exit 0, one fails, or the timeout passes.

    Returns (indices that exited non-zero, in the order seen; indices still running if timed out).
    """
    deadline = time.monotonic() + timeout_s
    failed: list[int] = []
    while True:
        codes = [proc.poll() for proc in procs]
        failed += [i for i, code in enumerate(codes) if code not in (None, 0) and i not in failed]
        if failed:
            return failed, []
        if all(code == 0 for code in codes):
            return [], []
        if watchdog is not None:
            watchdog()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return [], [i for i, code in enumerate(codes) if code is None]
        running = next(proc for proc, code in zip(procs, codes, strict=True) if code is None)
        # Block on one running torchrun, but wake often enough to see the others fail.
        with contextlib.suppress(subprocess.TimeoutExpired):
            running.wait(timeout=min(0.1, remaining))


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a log file (empty if it cannot be read), for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def rank_errors(logs: Path, node: LaunchNode) -> list[tuple[int, str, Path]]:
    """(timestamp, message, rank log dir) from the error files torchrun's @record writes."""
    found = []
    for path in (logs / node.name).rglob("error.json"):
        try:
            message = json.loads(path.read_text())["message"]
            found.append((int(message["extraInfo"]["timestamp"]), message["message"], path.parent))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written by a killed rank: its stderr.log still speaks
    return found


def looks_like_echo(failure: str) -> bool:
    """A rank that failed only because a peer went away (not a cause of its own)."""
    echoes = ("closed by peer", "reset by peer", "Broken pipe", "Connection refused",
              "SIGTERM", "Signals.SIGKILL", "Socket Timeout", "timed out")
    return any(echo in failure for echo in echoes)


def failure_report(nodes: Sequence[LaunchNode], logs: Path, failed: Sequence[int]) -> str:
    """Which rank failed first and the tail of its stderr; else every node's output.

    When one rank dies, ranks on other nodes fail soon after ("connection closed by peer"),
    so the root cause is an error of its own before any echo of a peer's, then the earliest
    error file (as torchrun does for its own workers); ties (whole seconds) go to the node
    whose torchrun exited first.
    """
    order = {index: position for position, index in enumerate(failed)}
    errors = sorted(
        (looks_like_echo(message), stamp, order.get(index, len(nodes)), index, message, rank_dir)
        for index, node in enumerate(nodes)
        for stamp, message, rank_dir in rank_errors(logs, node)
    )
    if errors:
        *_, index, message, rank_dir = errors[0]
        others = "".join(f"\nalso failed: node {nodes[e[3]].name}: {e[4]}" for e in errors[1:])
        return (
            f"node {nodes[index].name} failed first: {message}{others}\n"
            f"{rank_dir / 'stderr.log'}:\n{log_tail(rank_dir / 'stderr.log')}"
        )
    # No Python exception recorded (killed, segfault, hung): show what each node said.
    reports = []
    for index, node in enumerate(nodes):
        status = "exited non-zero" if index in order else "no error recorded"
        stderrs = [p for p in sorted((logs / node.name).rglob("stderr.log")) if p.stat().st_size]
        tails = [f"{p}:\n{log_tail(p)}" for p in stderrs] or [
            f"{logs / f'{node.name}.torchrun.log'}:\n{log_tail(logs / f'{node.name}.torchrun.log')}"
        ]
        reports.append(f"--- node {node.name} ({status}) ---\n" + "\n".join(tails))
    return "\n".join(reports)


def read_results(out: Path, spec: RankSpec, logs: Path) -> dict[str, ModeResult]:
    results: dict[str, ModeResult] = {}
    for mode in spec.selected_modes():
        path = result_path(out, mode)
        if not path.exists():
            raise WorkloadError(f"all ranks exited 0 but {path} is missing; logs in {logs}")
        results[mode] = read_result(path)
    return results


# --- process cleanup -----------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _descendants(pid: int) -> list[int]:
    children = _children_map()
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped


def _signal(pid: int, sig: signal.Signals, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pid, sig) if group else os.kill(pid, sig)


def kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Kill each still-running torchrun, its process group and all its descendants; wait."""
    own_group = os.getpgrp()
    doomed: list[int] = []
    for proc in procs:
        try:
            if proc.poll() is not None:
                continue
            leads_group = os.getpgid(proc.pid) == proc.pid and proc.pid != own_group
        except ProcessLookupError:  # exited between the two calls
            continue
        # Freeze first so torchrun cannot start or restart workers while we collect them.
        _signal(proc.pid, signal.SIGSTOP, group=leads_group)
        family = [proc.pid, *_descendants(proc.pid)]
        for pid in family:
            _signal(pid, signal.SIGKILL)
        if leads_group:
            _signal(proc.pid, signal.SIGKILL, group=True)
        doomed += family
    for proc in procs:
        if proc.poll() is None:
            proc.wait(timeout=KILL_WAIT_S)
    deadline = time.monotonic() + KILL_WAIT_S
    while any(_alive(pid) for pid in doomed):  # reaped by init once torchrun is gone
        if time.monotonic() > deadline:
            raise WorkloadError(f"processes survived SIGKILL: {[p for p in doomed if _alive(p)]}")
        time.sleep(0.01)
