"""Root, or rootless through a user namespace.

As root, namespaces are named under /run/netns (so `ip netns` shows them) and the host's own
namespace is only ever read. Without root, the process moves itself into a new user, mount and
network namespace where it is root: everything it creates lives and dies inside, and names go to
a private directory. Its run locks go to the user's own shared folder (naming.user_lock_dir), so
`clean` and other runs of that user can tell its runs live or dead. This must happen while the
process has one thread (a kernel rule for CLONE_NEWUSER), so the CLI and the pytest plugin call
it first thing.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import tempfile
import threading
from pathlib import Path

from . import naming, netns

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_PRIVATE = 1 << 18
PR_SET_DUMPABLE = 4
_mode: str | None = None


class PrivilegeError(RuntimeError):
    """Neither root nor a usable user namespace: nothing can be built."""


def mode() -> str | None:
    """'root', 'rootless', or None before `ensure_network_privilege` ran."""
    return _mode


def ensure_network_privilege() -> str:
    """Make sure this process may create namespaces; returns 'root' or 'rootless'."""
    global _mode
    if _mode is not None:
        return _mode
    if os.geteuid() == 0:
        _mode = "root"
        return _mode
    if threading.active_count() > 1:
        raise PrivilegeError(
            "not root, and a rootless run must enter its user namespace before any thread "
            "starts; call netsim_ddp.fabric.privilege.ensure_network_privilege() at start-up, "
            "or run as root"
        )
    _enter_user_namespace()
    _mode = "rootless"
    return _mode


def _enter_user_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    if netns.libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | netns.CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise PrivilegeError(
            f"not root, and this host refuses unprivileged user namespaces ({os.strerror(code)}); "
            "run as root, or allow them (sysctl user.max_user_namespaces > 0, "
            "kernel.unprivileged_userns_clone = 1, or the AppArmor userns restriction off)"
        )
    # A process that changed its uids (su, setpriv) is not dumpable, which makes its own
    # /proc/self files root's; being dumpable again lets it write its id maps.
    netns.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    # Our mounts must not propagate back to the host's mount namespace.
    if netns.libc.mount(b"none", b"/", None, netns.MS_REC | MS_PRIVATE, None) != 0:
        raise PrivilegeError(f"cannot make mounts private: {os.strerror(ctypes.get_errno())}")
    private = Path(tempfile.mkdtemp(prefix="netsim-ddp-"))
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    (private / "netns").mkdir()
    netns.set_netns_dir(private / "netns", private=True)
    naming.set_lock_dir(naming.user_lock_dir(uid))
