"""Names of the kernel objects a run creates, and the lock that says the run is alive.

Every namespace is `nsd<run id>-<role>`, so parallel runs never collide and `netsim-ddp clean`
can find what a killed run left. A run holds an flock on `<lock dir>/nsd<run id>.lock` for its
whole life; the kernel drops the lock when the process dies, however it dies, so a lock that can
be taken means the run is gone and its namespaces are litter.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

PREFIX = "nsd"
SWITCH_ROLE = "sw"
BRIDGE = "nsd-br"
NODE_IFNAME = "eth0"
_RUN_NAMESPACE = re.compile(rf"^{PREFIX}(?P<run_id>[0-9a-f]{{6}})-(?P<role>[A-Za-z0-9_.-]+)$")

_lock_dir = Path("/run/netsim-ddp")


def set_lock_dir(path: Path) -> None:
    global _lock_dir
    _lock_dir = Path(path)


def lock_dir() -> Path:
    return _lock_dir


def new_run_id() -> str:
    return secrets.token_hex(3)


def netns_name(run_id: str, role: str) -> str:
    return f"{PREFIX}{run_id}-{role}"


def switch_port(node: str) -> str:
    return f"nsd-{node}"


def parse_netns_name(name: str) -> tuple[str, str] | None:
    """(run id, role) of a namespace this project made, else None."""
    match = _RUN_NAMESPACE.match(name)
    return (match["run_id"], match["role"]) if match else None


@dataclass
class RunLock:
    """An exclusive flock that marks a run as alive."""

    run_id: str
    fd: int | None = None

    @property
    def path(self) -> Path:
        return _lock_dir / f"{PREFIX}{self.run_id}.lock"

    def acquire(self, wait: bool = True) -> bool:
        _lock_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
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
        if self.fd is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        os.close(self.fd)
        self.fd = None
