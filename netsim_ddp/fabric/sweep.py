"""`netsim-ddp clean`: remove what killed runs left behind, and nothing else.

A namespace is ours when its name matches `nsd<6 hex>-<role>`; it is litter when no live
process holds its run's lock. Live runs (another terminal, a parallel CI job) are left alone.
Removing a namespace removes everything in it: veths, the bridge, qdiscs.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass, field

from . import naming, netns, privilege


@dataclass
class SweepReport:
    removed: list[str] = field(default_factory=list)  # namespaces
    killed_processes: int = 0
    live_runs: dict[str, int | None] = field(default_factory=dict)  # run id -> owner pid


def sweep_stale(dry_run: bool = False) -> SweepReport:
    privilege.ensure_network_privilege()
    by_run: dict[str, list[str]] = defaultdict(list)
    for name in netns.list_names():
        parsed = naming.parse_netns_name(name)
        if parsed:
            by_run[parsed[0]].append(name)
    report = SweepReport()
    for run_id, names in sorted(by_run.items()):
        lock = naming.RunLock(run_id)
        if not lock.acquire(wait=False):
            report.live_runs[run_id] = lock.owner_pid()
            continue
        try:
            if not dry_run:
                report.killed_processes += netns.kill_processes_in(names)
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        netns.remove(name)
            report.removed.extend(names)
        finally:
            lock.release(remove=not dry_run)
    if not dry_run:
        _remove_orphan_locks(set(by_run))
    return report


def _remove_orphan_locks(seen: set[str]) -> None:
    """Locks of runs killed before they made a namespace."""
    for path in naming.lock_dir().glob(f"{naming.PREFIX}*.lock"):
        run_id = path.stem.removeprefix(naming.PREFIX)
        if run_id not in seen:
            lock = naming.RunLock(run_id)
            if lock.acquire(wait=False):
                lock.release(remove=True)
