"""NIC cleanup, in one place: the NICs of killed `netsim-ddp host` agents restored as their
state files recorded them (or their records forgotten), their leftover processes killed, and
the lock files of records that are gone removed (`netsim-ddp clean`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.fabric.nic.checks import NicError
from netsim_ddp.fabric.nic.shaping import (
    JOB_ENV,
    STATE_PREFIX,
    NicState,
    lock_state,
    restore_nic,
    unlock_state,
)
from netsim_ddp.fabric.nic.tc_tree import TreeError
from netsim_ddp.fabric.teardown_signals import signals_deferred


@dataclass
class RestoredNic:
    ifname: str
    netns_inode: int
    pid: int
    # restored; gone (its namespace or NIC is gone: record dropped); failed (see error: the
    # NIC is left changed and its record kept); forgotten (--forget-nic); dry run: would-*
    outcome: str
    killed_processes: int = 0
    error: str | None = None

    @property
    def left_changed(self) -> bool:
        return self.outcome == "failed"


def _netns_by_inode(inode: int) -> Path | None:
    """A path that opens the namespace with this inode: ours, a named one, or init's."""
    candidates = [Path("/proc/thread-self/ns/net"), Path("/proc/1/ns/net")]
    candidates += [netns.path_of(name) for name in netns.list_names()]
    for path in candidates:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                return path
    return None


@contextlib.contextmanager
def _entered(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        netns.setns_checked(fd, str(path))
        try:
            yield
        finally:
            netns.setns_checked(home, "<home>")
    finally:
        os.close(fd)
        os.close(home)


def kill_job_processes(job: str, inode: int) -> int:
    """SIGKILL what a dead agent started (torchrun, ranks): they carry JOB_ENV=job."""
    marker = f"{JOB_ENV}={job}".encode()
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino != inode:
                continue
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), 9)
                killed += 1
    return killed


def recorded_nics() -> list[Path]:
    """The state files of `host` agents' NICs, live or dead (root's: only root may restore)."""
    return sorted(naming.lock_dir().glob(f"{STATE_PREFIX}*.json"))


def remove_orphan_locks(dry_run: bool = False) -> list[Path]:
    """Lock files whose NIC record is gone and that no agent holds (a record dropped or a test's
    host removed while its lock file stayed): removed, so `/run/netsim-ddp` does not fill up."""
    orphans = []
    for lock in sorted(naming.lock_dir().glob(f"{STATE_PREFIX}*.lock")):
        record = lock.with_suffix(".json")
        if record.exists():
            continue  # restore_stale_nics decides about it
        fd = lock_state(record, wait=False)
        if fd is None:
            continue  # an agent holds it: between taking its lock and writing its record
        if dry_run:
            os.close(fd)
        else:
            unlock_state(record, fd)
        orphans.append(lock)
    return orphans


def restore_stale_nics(dry_run: bool = False, forget: str | None = None) -> list[RestoredNic]:
    """Restore every NIC whose agent is gone (its lock is free), as its state file says.
    `forget`: drop the records of the NIC of that name instead, restoring nothing (after a
    person put the NIC right by hand)."""
    results = []
    for path in recorded_nics():
        fd = lock_state(path, wait=False)
        if fd is None:
            continue  # a live agent
        try:
            found = _restore_stale(path, dry_run, forget)
            if found is not None:
                results.append(found)
        finally:
            if path.exists():
                os.close(fd)
            else:
                unlock_state(path, fd)
    return results


def _restore_stale(path: Path, dry_run: bool, forget: str | None) -> RestoredNic | None:
    try:
        state = NicState.read(path)
    except (OSError, ValueError, KeyError, NicError) as exc:
        if forget is not None and path.name.endswith(f"-{forget}.json"):
            if not dry_run:
                path.unlink()
            return RestoredNic(forget, 0, 0, "would-forget" if dry_run else "forgotten")
        return RestoredNic(path.name, 0, 0, "failed", error=f"{path}: unreadable: {exc}")
    found = RestoredNic(state.ifname, state.netns_inode, state.pid, "failed")
    if forget is not None:
        if state.ifname != forget:
            return None  # another NIC's: left as it is
        found.outcome = "would-forget" if dry_run else "forgotten"
        if not dry_run:
            path.unlink()
        return found
    where = _netns_by_inode(state.netns_inode)
    try:
        if where is not None:
            with _entered(where):
                why = state.stranger()
        else:
            why = "its network namespace is gone"
        if why is not None:
            found.outcome, found.error = ("would-drop" if dry_run else "gone"), (
                f"{why}, and with it what the agent changed: nothing to restore")
            if not dry_run:
                path.unlink()
            return found
        if dry_run:
            found.outcome = "would-restore"
            return found
        assert where is not None
        with _entered(where), signals_deferred():
            found.killed_processes = kill_job_processes(state.job, state.netns_inode)
            with IPRoute() as ipr:
                restore_nic(ipr, state)
    except (NicError, NetlinkError, TreeError, OSError) as exc:
        found.error = f"{exc} (record kept: {path}; once the NIC is right again, " \
                      f"`netsim-ddp clean --forget-nic {state.ifname}` drops it)"
        return found
    path.unlink()
    found.outcome = "restored"
    return found


@dataclass
class NicCleanup:
    """What cleaning up NICs found. `nics`: killed agents' NICs restored (or their records
    dropped or forgotten); `orphan_locks`: lock files of records that are gone; `root_records`:
    records of root's agents that only root may judge (this process is not root)."""

    nics: list[RestoredNic]
    orphan_locks: list[Path]
    root_records: int = 0

    @property
    def left_changed(self) -> bool:
        return any(nic.left_changed for nic in self.nics)


def clean_nics(dry_run: bool = False, forget: str | None = None) -> NicCleanup:
    """Every NIC a killed `netsim-ddp host` agent left shaped, restored as recorded (`forget`:
    only drop the records of the NIC of that name, touching nothing else). Agents that shape
    NICs run as root: their state files are root's, and only root can tell whether an agent
    was killed and restore its NIC."""
    from netsim_ddp.fabric.namespaces.privilege import host_root

    if not host_root():
        return NicCleanup([], [], root_records=len(recorded_nics()))
    found = restore_stale_nics(dry_run=dry_run, forget=forget)
    orphans = remove_orphan_locks(dry_run=dry_run) if forget is None else []
    return NicCleanup(found, orphans)
