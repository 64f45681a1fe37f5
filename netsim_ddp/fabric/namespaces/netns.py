"""Named network namespaces, made and entered from this process without forking.

pyroute2's `netns.create` and `IPRoute(netns=...)` fork a helper process for every call (about
8 ms and 14 ms each here). Namespaces are per thread in Linux, so the calling thread can instead
unshare into a fresh namespace, bind-mount it under a name, open whatever sockets it needs there
(they stay bound to it) and switch back: no fork, no helper.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
from collections.abc import Iterator
from pathlib import Path

CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_BIND = 0x1000
MS_SHARED = 1 << 20
MNT_DETACH = 2

libc = ctypes.CDLL(None, use_errno=True)  # also used by privilege.py

# Where named namespaces live; a rootless run points this at a private directory.
_netns_dir = Path("/run/netns")
_dir_ready = False  # made a shared mount point yet?


def netns_dir() -> Path:
    return _netns_dir


def set_netns_dir(path: Path, private: bool = False) -> None:
    """Name namespaces under `path`. A private directory (a rootless run's own mount
    namespace) needs no shared mount point, and could not be removed at exit with one."""
    global _netns_dir, _dir_ready
    _netns_dir = Path(path)
    _dir_ready = private


def path_of(name: str) -> Path:
    return _netns_dir / name


def _check(result: int, what: str, name: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what} failed for network namespace {name!r}: {os.strerror(code)}")


def setns_checked(fd: int, name: str) -> None:
    """Enter the network namespace `fd` (this thread only); OSError naming `name` if refused."""
    _check(libc.setns(fd, CLONE_NEWNET), "setns", name)


def _ensure_dir_shared() -> None:
    """Make the namespace directory a shared mount point, as `ip netns add` does.

    Without it, a namespace bound here would stay pinned in mount namespaces that copied
    the directory before the bind mount was removed.
    """
    directory = bytes(_netns_dir)
    _netns_dir.mkdir(parents=True, exist_ok=True)
    if libc.mount(b"", directory, b"none", MS_SHARED | MS_REC, None) == 0:
        return
    _check(libc.mount(directory, directory, b"none", MS_BIND | MS_REC, None),
           "bind mount of the namespace directory", str(_netns_dir))
    _check(libc.mount(b"", directory, b"none", MS_SHARED | MS_REC, None),
           "shared mount of the namespace directory", str(_netns_dir))


def create(name: str) -> None:
    """Create the named namespace; the calling thread stays in its own."""
    global _dir_ready
    if not _dir_ready:
        _ensure_dir_shared()
        _dir_ready = True
    target = path_of(name)
    os.close(os.open(target, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o444))
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _check(libc.unshare(CLONE_NEWNET), "unshare", name)
        try:
            _check(libc.mount(b"/proc/thread-self/ns/net", bytes(target), b"none", MS_BIND, None),
                   "bind mount", name)
        finally:
            setns_checked(home, "<home>")
    except BaseException:
        with contextlib.suppress(OSError):
            target.unlink()
        raise
    finally:
        os.close(home)


def remove(name: str) -> None:
    """Unbind and delete the name; the kernel frees the namespace once nothing holds it."""
    target = path_of(name)
    if libc.umount2(bytes(target), MNT_DETACH) != 0 and ctypes.get_errno() not in (
        errno.EINVAL, errno.ENOENT
    ):
        _check(-1, "umount", name)
    with contextlib.suppress(FileNotFoundError):
        target.unlink()


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the block with the calling thread inside the named namespace.

    Sockets created and processes started in the block belong to that namespace.
    """
    fd = os.open(path_of(name), os.O_RDONLY)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        setns_checked(fd, name)
        try:
            yield
        finally:
            setns_checked(home, "<home>")
    finally:
        os.close(fd)
        os.close(home)


def list_names() -> list[str]:
    try:
        return sorted(entry.name for entry in os.scandir(_netns_dir))
    except FileNotFoundError:
        return []


def _inode(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def pids_in(names: list[str]) -> dict[str, list[int]]:
    """Processes (by pid) whose network namespace is one of the named ones."""
    wanted = {ino: name for name in names if (ino := _inode(path_of(name))) is not None}
    found: dict[str, list[int]] = {name: [] for name in names}
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            inode = _inode(f"/proc/{entry.name}/ns/net")
            name = wanted.get(inode) if inode is not None else None
            if name is not None:
                found[name].append(int(entry.name))
    return found


def kill_processes_in(names: list[str]) -> int:
    """SIGKILL every process living in the named namespaces; returns how many."""
    killed = 0
    for pids in pids_in(names).values():
        for pid in pids:
            if pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
    return killed
