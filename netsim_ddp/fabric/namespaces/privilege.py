"""Root, or rootless through a user namespace.

As root, namespaces are named under /run/netns (so `ip netns` shows them) and the host's own
namespace is only ever read. Without root, the process moves itself into a new user, mount and
network namespace where it is root: everything it creates lives and dies inside, and names go to
a private directory. Its run locks go to the user's own shared folder (naming.user_lock_dir), so
`clean` and other runs of that user can tell its runs live or dead.

The kernel lets only a process with one thread into a new user namespace, and an import can start
threads unseen (numpy's OpenBLAS does). So the front ends call `prepare(restart=True)` first
thing: a process that still has one thread (the kernel's count, /proc/self/task) enters at once;
one that has more is started again, inside the namespace, from a fresh single-threaded
interpreter (userns.py), before it has done anything. A library user's script does the same with
`ensure_network_privilege(restart=True)` at its top; called later in a threaded process,
`ensure_network_privilege()` raises an error that names the threads and this fix.
"""

from __future__ import annotations

import atexit
import errno
import os
import pwd
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.namespaces import netns, userns

CAP_NET_ADMIN = 12
# Imported, these start native thread pools (OpenBLAS, OpenMP, their own): named in the error.
THREAD_STARTING_MODULES = ("numpy", "scipy", "torch", "matplotlib", "sklearn", "tensorflow",
                           "jax", "cupy", "numba")
_SETTINGS = {  # sysctl: (value that forbids unprivileged user namespaces, what to do)
    "user.max_user_namespaces": ("0", "set it above 0"),
    "kernel.unprivileged_userns_clone": ("0", "set it to 1"),
    "kernel.apparmor_restrict_unprivileged_userns": (
        "1", "AppArmor's restriction: set it to 0, or give this Python an AppArmor profile "
             "that allows userns"),
}
_PROC_SYS = Path("/proc/sys")
_mode: str | None = None
_refused: str | None = None  # the host's answer to a single-threaded try: it will not change


class PrivilegeError(RuntimeError):
    """Neither root nor a usable user namespace: nothing can be built."""


def mode() -> str | None:
    """'root', 'rootless', or None until `prepare` has decided (a process that was started
    inside its user namespace knows at once)."""
    if _mode is None:
        _adopt_inherited()
    return _mode


def host_root() -> bool:
    """Root of the host, not the root of a user namespace this process is in."""
    return os.geteuid() == 0 and mode() != "rootless"


def ensure_network_privilege(*, restart: bool = False) -> str:
    """Make sure this process may create namespaces; returns 'root' or 'rootless'.

    With `restart`, a process that already runs several threads is started again inside its
    user namespace (the same command line: call it before the script has done anything)."""
    reason = prepare(restart=restart)
    if reason is not None:
        raise PrivilegeError(reason)
    assert _mode is not None
    return _mode


def prepare(*, restart: bool = False) -> str | None:
    """Be root, or enter the user namespace now, while it can be done; None once done, else why
    not. Never raises: the front ends call it first thing and report the reason only where a
    network is needed (`ensure_network_privilege`)."""
    global _mode, _refused
    if _mode is not None or _adopt_inherited():
        return None
    if _refused is not None:
        return _refused
    if os.geteuid() == 0:
        _mode = "root"
        return None
    threads = userns.kernel_threads()
    if len(threads) > 1 and restart and _restartable():
        _restart()
    failed = userns.enter()
    if failed is None:
        _adopt_inherited()
        return None
    step, code = failed
    if len(threads) == 1 and code == errno.EINVAL:  # a thread may have started meanwhile
        threads = userns.kernel_threads()
    reason = refusal(step, code, threads)
    if len(threads) == 1:
        _refused = reason
    return reason


def _adopt_inherited() -> bool:
    """Take over what userns.enter (in this process, or before the exec that started this
    program) left in the environment; False if it left nothing that is ours."""
    global _mode, _refused
    kind, _, fields = os.environ.get(userns.ENV, "").partition(":")
    try:
        if kind == "ok":
            uid, _, inode = (int(field) for field in fields.split(":"))
            if inode == userns.user_namespace_inode():  # its children inherit it, and use it
                _private_names(uid)
                _mode = "rootless"
                return True
        elif kind == "error":
            step, code, pid = fields.split(":")
            if int(pid) == os.getpid():  # the exec that started this program was refused
                del os.environ[userns.ENV]
                _refused = refusal(step, int(code), threads=["(a fresh start)"])
    except ValueError:  # not written by userns.py: not ours
        pass
    return False


def _private_names(uid: int) -> None:
    private = Path(tempfile.mkdtemp(prefix="netsim-ddp-"))
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    (private / "netns").mkdir()
    netns.set_netns_dir(private / "netns", private=True)
    naming.set_lock_dir(naming.user_lock_dir(uid))
    # Inside, the user is uid 0, whose name is root's: keep the user's own name for what asks
    # for it (getpass.getuser(); pytest's tmp_path folder is named after it).
    if not any(os.environ.get(name) for name in ("LOGNAME", "USER", "LNAME", "USERNAME")):
        try:
            os.environ["LOGNAME"] = pwd.getpwuid(uid).pw_name
        except KeyError:
            pass  # a uid without a name: getpass falls back to the name of uid 0


def _restartable() -> bool:
    """Can this process be started again with its own command line? Not an interactive
    interpreter or a script read from stdin, nor an xdist worker (fed through its stdin)."""
    return (bool(getattr(sys, "orig_argv", None)) and sys.argv[0] not in ("", "-")
            and "PYTEST_XDIST_WORKER" not in os.environ)


def _restart() -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    argv = userns.restart_argv([sys.executable, *sys.orig_argv[1:]])
    os.execv(argv[0], argv)


def refusal(step: str, code: int, threads: list[str]) -> str:
    """Why this process could not enter a user namespace, and what to do, in one message."""
    if code == errno.EINVAL and step == "unshare" and len(threads) > 1:
        return _threads_reason(threads)
    answer = f"{step}: {errno.errorcode.get(code, code)}, {os.strerror(code)}"
    if code == errno.EINVAL and step == "unshare":
        return (f"not root, and this kernel has no user namespaces ({answer}; it was built "
                "without CONFIG_USER_NS): run as root")
    blocking = [f"{name} = {value} ({fix})" for name, value, fix in _blocking_settings()]
    if blocking:
        return (f"not root, and this host refuses unprivileged user namespaces ({answer}): "
                f"{'; '.join(blocking)}; or run as root")
    if code == errno.ENOSPC:
        return (f"not root, and this user has used up its user namespaces ({answer}): raise "
                "user.max_user_namespaces, end processes that hold some, or run as root")
    return (f"not root, and this host refuses unprivileged user namespaces ({answer}), though "
            f"none of {', '.join(_SETTINGS)} forbids them: a seccomp filter or a security "
            "policy (a container runtime's) may; allow them there, or run as root")


def _blocking_settings() -> list[tuple[str, str, str]]:
    found = []
    for name, (forbidding, fix) in _SETTINGS.items():
        try:
            value = _PROC_SYS.joinpath(*name.split(".")).read_text().strip()
        except OSError:  # this kernel has no such setting
            continue
        if value == forbidding:
            found.append((name, value, fix))
    return found


def _threads_reason(threads: list[str]) -> str:
    python = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    native = len(threads) - 1 - len(python)
    loaded = [name for name in THREAD_STARTING_MODULES if name in sys.modules]
    whose = []
    if python:
        whose.append(f"{len(python)} started from Python ({', '.join(python)})")
    if native > 0:
        whose.append(f"{native} started by C libraries"
                     + (f" (imported: {', '.join(loaded)}; numpy's OpenBLAS, torch and OpenMP "
                        "start thread pools at import)" if loaded else ""))
    blocking = [f"{name} = {value} ({fix})" for name, value, fix in _blocking_settings()]
    host = (f"this host forbids them too: {'; '.join(blocking)}" if blocking
            else "none of this host's settings forbids them")
    return (f"not root, and this process had {len(threads)} threads when it had to enter its "
            f"user namespace: {'; '.join(whose) or 'gone since'}. The kernel refuses a user "
            f"namespace to a process with more than one thread (unshare: EINVAL); {host}. "
            "Enter before anything starts a thread: call "
            "netsim_ddp.fabric.ensure_network_privilege(restart=True) first thing in your "
            "script (if threads run already, it starts the script again inside the namespace), "
            "or run as root")


def has_net_admin() -> bool:
    """May this process administer the network namespace it is in (CAP_NET_ADMIN)?"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    return False
