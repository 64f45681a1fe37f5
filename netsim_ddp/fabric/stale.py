"""`netsim-ddp clean`: remove what killed runs left behind, and nothing else.

What a run leaves when it is SIGKILLed: as root, its named network namespaces under /run/netns
(its processes die with it: see lifetime.py) and its lock file; rootless, only its lock file
(its namespaces live and die inside its own user namespace). Processes that carry a run's id
(naming.RUN_ID_ENV) are swept too, in case any outlived their run all the same.

A run is dead when nobody holds its lock (naming.RunLock). Liveness is proved, never guessed:
a dead run's things are removed only while `clean` itself holds that run's lock, so a run cannot
come alive meanwhile, and lock files are unlinked only under their flock, which every run
re-checks after taking it (see naming.py). `--dry-run` only looks: it opens existing lock files
read-only and creates nothing.

Rootless, `clean` cannot touch root's namespaces: it sweeps its user's own runs (lock files,
processes) and lists root's dead runs for `sudo netsim-ddp clean`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.namespaces import netns, privilege

HOST_NETNS_DIR = Path("/run/netns")


@dataclass
class StaleRunsReport:
    removed: list[str] = field(default_factory=list)  # namespaces (dry run: would remove)
    killed_processes: int = 0  # (dry run: would kill)
    removed_locks: list[str] = field(default_factory=list)  # run ids whose lock file went
    live_runs: dict[str, int | None] = field(default_factory=dict)  # run id -> owner pid
    root_litter: list[str] = field(default_factory=list)  # rootless: root's, left for sudo

    @property
    def harmful(self) -> bool:
        """Did dead runs leave namespaces or processes (root's included), which can load or
        confuse the next run? (A lock file alone is harmless.)"""
        return bool(self.removed or self.killed_processes or self.root_litter)

    def describe(self) -> str:
        """One line on what dead runs left (for the warning at the start of a run)."""
        parts = []
        if self.removed:
            parts.append(f"{len(self.removed)} network namespaces")
        if self.killed_processes:
            parts.append(f"{self.killed_processes} processes")
        if self.removed_locks and not parts:
            parts.append(f"{len(self.removed_locks)} lock files")
        line = f"killed runs left {' and '.join(parts)} on this host" if parts else ""
        if self.root_litter:
            line += ("; " if line else "") + (
                f"root's killed runs left {len(self.root_litter)} network namespaces "
                "(`sudo netsim-ddp clean` removes them)")
        return line


def clean_stale_runs(dry_run: bool = False) -> StaleRunsReport:
    """Remove (or with `dry_run`, list) what dead runs left; live runs are left alone."""
    root = _is_root()
    lock_dir = naming.ROOT_LOCK_DIR if root else _user_lock_dir()
    namespaces = _namespaces_by_run() if root else {}
    processes = _marked_processes()
    runs = set(namespaces) | set(processes) | _locked_run_ids(lock_dir)
    report = StaleRunsReport()
    for run_id in sorted(runs):
        names, pids = namespaces.get(run_id, []), processes.get(run_id, [])
        if dry_run:
            if naming.is_live(run_id, lock_dir):
                report.live_runs[run_id] = naming.RunLock(run_id, directory=lock_dir).owner_pid()
            else:
                report.removed += names
                report.killed_processes += len(pids) + _count_in(names)
                report.removed_locks += [run_id] if _has_lock_file(run_id, lock_dir) else []
            continue
        lock = naming.RunLock(run_id, directory=lock_dir)
        had_lock_file = _has_lock_file(run_id, lock_dir)
        if not lock.acquire(wait=False):
            report.live_runs[run_id] = lock.owner_pid()
            continue
        try:  # the run is dead, and cannot come alive while we hold its lock
            report.killed_processes += _kill(pids) + netns.kill_processes_in(names)
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    netns.remove(name)
            report.removed += names
        finally:
            lock.release(remove=True)  # its lock file is litter too
        report.removed_locks += [run_id] if had_lock_file else []
    if not root:
        report.root_litter = [name for run_id, names in _namespaces_by_run().items()
                              if not naming.is_live(run_id, naming.ROOT_LOCK_DIR)
                              for name in names]
    return report


def _is_root() -> bool:
    return privilege.host_root()


def _user_lock_dir() -> Path:
    # Inside its user namespace a rootless process is uid 0; its lock folder was set on entry.
    if privilege.mode() == "rootless":
        return naming.lock_dir()
    return naming.user_lock_dir(os.getuid())


def _namespaces_by_run() -> dict[str, list[str]]:
    by_run: dict[str, list[str]] = defaultdict(list)
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.scandir(HOST_NETNS_DIR), key=lambda e: e.name):
            if parsed := naming.parse_netns_name(entry.name):
                by_run[parsed[0]].append(entry.name)
    return dict(by_run)


def _locked_run_ids(lock_dir: Path) -> set[str]:
    found = set()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(lock_dir):
            if run_id := naming.parse_lock_name(entry.name):
                found.add(run_id)
    return found


def _has_lock_file(run_id: str, lock_dir: Path) -> bool:
    return naming.RunLock(run_id, directory=lock_dir).path.exists()


def _marked_processes() -> dict[str, list[int]]:
    """Our own processes (same uid) that carry a run's id in their environment."""
    marker = f"{naming.RUN_ID_ENV}=".encode()
    by_run: dict[str, list[int]] = defaultdict(list)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        for variable in variables:
            if variable.startswith(marker):
                run_id = variable[len(marker):].decode(errors="replace")
                if naming.is_run_id(run_id):
                    by_run[run_id].append(int(entry.name))
    return dict(by_run)


def _count_in(names: list[str]) -> int:
    return sum(len(pids) for pids in netns.pids_in(names).values()) if names else 0


def _kill(pids: list[int]) -> int:
    killed = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
