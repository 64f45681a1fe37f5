"""Compile the forwarder's C source at first use, cached by a hash of source and flags.

The package ships C source, not a binary, so `pip install -e .` needs no build step and the
binary always matches the source next to it. A compile runs once per source version; parallel
runs compile into a temporary name and rename, so they never see a half-written binary.

The binary runs as root (SCHED_FIFO, raw sockets), so a cached one is run only when nobody else
could have put it there: it is a regular file owned by the current user and not writable by
group or others, in a directory owned by the current user (or root) that group and others
cannot write either. A cache directory that fails is skipped; an unsafe binary in a safe
directory is compiled afresh over.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("forwarder.c")
CFLAGS = ("-O2", "-Wall", "-Wextra", "-std=gnu11")
LIBS = ("-lm",)
_CACHE_ENV = "NETSIM_DDP_CACHE"


class DelayLineBuildError(RuntimeError):
    """The forwarder cannot be compiled here; the message says what is missing."""


def _compiler() -> str:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and (path := shutil.which(candidate)):
            return path
    raise DelayLineBuildError(
        "the userspace delay line is compiled from C at first use and needs a C compiler: "
        "install gcc (or set CC), e.g. `apt-get install gcc`"
    )


def _cache_dirs() -> list[Path]:
    """Where to keep the binary, best first: $NETSIM_DDP_CACHE, ~/.cache, next to the source."""
    dirs = []
    if env := os.environ.get(_CACHE_ENV):
        dirs.append(Path(env))
    dirs.append(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "netsim-ddp")
    dirs.append(SOURCE.parent / "_build")
    return dirs


def _digest(compiler: str) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join((compiler, *CFLAGS, *LIBS)).encode())
    return h.hexdigest()[:16]


def build_binary() -> Path:
    """Path to the compiled forwarder, compiling it if this source version has no binary yet
    (or only one this user cannot trust)."""
    compiler = _compiler()
    name = f"nsd-delayline-{_digest(compiler)}"
    errors = []
    for directory in _cache_dirs():
        target = directory / name
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if problem := unsafe_reason(directory, is_dir=True):
                errors.append(f"{directory}: {problem}")
                continue
            if os.path.lexists(target) and unsafe_reason(target, is_dir=False) is None \
                    and os.access(target, os.X_OK):
                return target
            return _compile(compiler, directory, target)
        except OSError as exc:  # not writable: try the next place
            errors.append(f"{directory}: {exc}")
    raise DelayLineBuildError(
        "no safe, writable cache directory for the delay line (set NETSIM_DDP_CACHE to a "
        "directory only you can write): " + "; ".join(errors))


def unsafe_reason(path: Path, *, is_dir: bool) -> str | None:
    """Why a binary at (or in) `path` could have been planted by someone else; None if not.

    A file must be a regular file (not a link) owned by this user; a directory may also
    belong to root. Neither may be writable by group or others."""
    info = os.stat(path) if is_dir else os.lstat(path)
    uid = os.geteuid()
    owners = (uid, 0) if is_dir else (uid,)
    if not is_dir and not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid not in owners:
        return f"owned by uid {info.st_uid}, not by the current user (uid {uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _compile(compiler: str, directory: Path, target: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=".build-", dir=directory)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *CFLAGS, "-o", tmp, str(SOURCE), *LIBS],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise DelayLineBuildError(
                f"compiling {SOURCE} with {compiler} failed:\n{result.stderr.strip()}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
