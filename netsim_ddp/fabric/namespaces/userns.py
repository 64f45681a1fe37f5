"""Entering a user namespace, from a process that has only one thread.

The kernel refuses `unshare(CLONE_NEWUSER)` to a process with more than one thread (EINVAL),
and threads come from imports nobody sees: numpy's OpenBLAS starts its pool when numpy is
imported, torch its own. So a process that is already threaded cannot enter; it is started
again instead, through this file run as a script:

    python -I -S .../userns.py PROGRAM ARG...

A fresh interpreter, isolated and without `site` (nothing imported that could start a thread),
unshares a user, mount and network namespace, maps the user to root in it, and executes
PROGRAM ARG... there (the same pid, the same environment, the same open files). ENV tells the
program what happened, and the program (privilege.py) takes it from there.

Standard library only: this file runs before anything else is importable.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
PR_SET_DUMPABLE = 4
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

# "ok:<uid>:<gid>:<user namespace inode>" once in; "error:<step>:<errno>:<pid>" if refused.
ENV = "NETSIM_DDP_USERNS"

libc = ctypes.CDLL(None, use_errno=True)  # tests/tier_guard.py wraps it, as netns.libc


def kernel_threads() -> list[str]:
    """The names of this process's threads, as the kernel counts them (Python's own count,
    threading.active_count(), misses every thread a C library starts)."""
    names = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:  # it ended meanwhile
            continue
    return names


def user_namespace_inode() -> int:
    return os.stat("/proc/self/ns/user").st_ino


def enter() -> tuple[str, int] | None:
    """Move this process into a new user, mount and network namespace where its user is root.
    None once in; else the step that failed and its errno."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET) != 0:
        return "unshare", ctypes.get_errno()
    # A process that changed its uids (su, setpriv) is not dumpable, which makes its own
    # /proc/self files root's; being dumpable again lets it write its id maps.
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    except OSError as exc:
        return "id maps", exc.errno or errno.EPERM
    # Our mounts must not propagate back to the host's mount namespace.
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return "private mounts", ctypes.get_errno()
    try:
        _loopback_up()
    except OSError as exc:
        return "loopback", exc.errno or errno.EPERM
    os.environ[ENV] = f"ok:{uid}:{gid}:{user_namespace_inode()}"
    return None


def _loopback_up() -> None:
    """The new network namespace's `lo` is down; up, the process's own localhost works as
    before (ranks on loopback, local services of tests) without reaching the host's."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def restart_argv(argv: list[str]) -> list[str]:
    """The command line that starts `argv` again inside a new user namespace."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), *argv]


def main(argv: list[str]) -> None:
    failed = enter()
    if failed is not None:  # the program says why, through its usual errors
        step, code = failed
        os.environ[ENV] = f"error:{step}:{code}:{os.getpid()}"
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
