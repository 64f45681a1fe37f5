"""Names of the kernel objects a run creates, and the lock that says the run is alive.

Every namespace is `nsd<run id>-<role>`, so parallel runs never collide and `netsim-ddp clean`
can find what a killed run left. A run holds an flock on `<lock dir>/nsd<run id>.lock` for its
whole life; the kernel drops the lock when the process dies, however it dies, so a lock that can
be taken means the run is gone and its namespaces are litter.

The lock file may be unlinked by whoever holds its flock (the run at its end, `clean` sweeping a
dead run's lock). So whoever takes a lock re-checks, once it holds the flock, that the path still
names the file it locked (same device and inode), and starts over if not: a lock taken on a file
that was unlinked meanwhile proves nothing, since the next comer creates a new file and locks that.

Rootless runs keep their locks in a folder of their own user's, shared by that user's runs and
`clean` (`<tmp>/netsim-ddp-<uid>`), not in their private mount namespace: else no other process
could tell whether they live.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from netsim_ddp.fabric.errors import FabricError

PREFIX = "nsd"
SWITCH_ROLE = "sw"
BRIDGE = "nsd-br"
NODE_IFNAME = "eth0"
_RUN_NAMESPACE = re.compile(rf"^{PREFIX}(?P<run_id>[0-9a-f]{{6}})-(?P<role>[A-Za-z0-9_.-]+)$")
_RUN_LOCK = re.compile(rf"^{PREFIX}(?P<run_id>[0-9a-f]{{6}})\.lock$")
_RUN_ID = re.compile(r"^[0-9a-f]{6}$")

ROOT_LOCK_DIR = Path("/run/netsim-ddp")
RUN_ID_ENV = "NETSIM_DDP_RUN_ID"  # in the environment of every process a run starts
_lock_dir = ROOT_LOCK_DIR
# Called between a lock file's open and its flock: tests use it to interleave a race exactly.
_between_open_and_flock: Callable[[], None] = lambda: None  # noqa: E731


class LockDirError(FabricError):
    """The folder for run locks is not safely ours (someone else's, a symlink, writable by all)."""


def set_lock_dir(path: Path) -> None:
    global _lock_dir
    _lock_dir = Path(path)


def lock_dir() -> Path:
    return _lock_dir


def user_lock_dir(uid: int) -> Path:
    """Where a rootless user's runs keep their locks: private to the user, shared by its runs."""
    return Path(tempfile.gettempdir()) / f"netsim-ddp-{uid}"


def ensure_lock_dir(path: Path) -> None:
    """Create the lock folder, or check that the existing one is safely ours.

    In a world-writable /tmp someone else could have made it first (or a symlink to elsewhere):
    then their files would decide which of our runs count as live."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o755 if path == ROOT_LOCK_DIR else 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise LockDirError(
            f"{path} holds netsim-ddp's run locks but is not a folder of this user's that only "
            "it can write (someone else's, a symlink, or group/world-writable); remove it")


def new_run_id() -> str:
    return secrets.token_hex(3)


def netns_name(run_id: str, role: str) -> str:
    return f"{PREFIX}{run_id}-{role}"


def switch_port(node: str) -> str:
    return f"nsd-{node}"


# Racks' objects, in the switch's namespace: a '.' no node name may hold, so no switch port
# (nsd-<node>) can take their names.
def rack_bridge(rack: int) -> str:
    return f"nsd.r{rack}"


def uplink(rack: int, end: str) -> str:
    """One end of rack `rack`'s uplink: "u" in the rack's bridge, "d" in the spine's."""
    return f"nsd.{end}{rack}"


def parse_netns_name(name: str) -> tuple[str, str] | None:
    """(run id, role) of a namespace this project made, else None."""
    match = _RUN_NAMESPACE.match(name)
    return (match["run_id"], match["role"]) if match else None


def parse_lock_name(name: str) -> str | None:
    """The run id of a lock file's name, else None."""
    match = _RUN_LOCK.match(name)
    return match["run_id"] if match else None


def is_run_id(text: str) -> bool:
    return bool(_RUN_ID.match(text))


@dataclass
class RunLock:
    """An exclusive flock that marks a run as alive."""

    run_id: str
    fd: int | None = None
    directory: Path | None = None  # default: the lock folder of this process's mode

    @property
    def path(self) -> Path:
        return (self.directory or _lock_dir) / f"{PREFIX}{self.run_id}.lock"

    def acquire(self, wait: bool = True) -> bool:
        """Take the lock (creating its file); False if another process holds it and not `wait`."""
        ensure_lock_dir(self.path.parent)
        fd = flock_current(self.path, os.O_RDWR | os.O_CREAT, wait)
        if fd is None:
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def owner_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(self.path.read_text().strip())
        return None

    def release(self, remove: bool = True) -> None:
        """Unlink the file (while still holding the flock, so nobody can be fooled by it), then
        drop the lock."""
        if self.fd is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self.fd)
        self.fd = None


def is_live(run_id: str, directory: Path | None = None) -> bool:
    """Does a live process hold this run's lock? Writes nothing: no file, no folder.

    No lock file means no live run: a live run's file cannot vanish, since only the holder of
    its flock unlinks it, and a run that finds its file gone before it holds the flock makes a
    new one (see the module's docstring)."""
    path = RunLock(run_id, directory=directory).path
    try:
        fd = flock_current(path, os.O_RDONLY, wait=False)
    except FileNotFoundError:
        return False
    if fd is None:
        return True
    os.close(fd)  # we held it for an instant: nobody does, so the run is gone
    return False


def flock_current(path: Path, flags: int, wait: bool) -> int | None:
    """An fd of `path` holding its flock, re-checked to still be the file at `path`; None if
    someone else holds it and not `wait`. FileNotFoundError only without O_CREAT."""
    while True:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        try:
            _between_open_and_flock()
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        held = os.fstat(fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            current = None
        if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # unlinked (or replaced) between our open and our flock: start over
        if current is None and not flags & os.O_CREAT:
            raise FileNotFoundError(path)
