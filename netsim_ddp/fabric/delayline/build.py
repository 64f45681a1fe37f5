"""Compile the forwarder's C source at first use, cached by a hash of source and flags.

The package ships C source, not a binary, so `pip install -e .` needs no build step and the
binary always matches the source next to it. A compile runs once per source version; parallel
runs compile into a temporary name and rename, so they never see a half-written binary.
"""

from __future__ import annotations

import hashlib
import os
import shutil
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
    """Path to the compiled forwarder, compiling it if this source version has no binary yet."""
    compiler = _compiler()
    name = f"nsd-delayline-{_digest(compiler)}"
    errors = []
    for directory in _cache_dirs():
        target = directory / name
        if os.access(target, os.X_OK):
            return target
        try:
            directory.mkdir(parents=True, exist_ok=True)
            return _compile(compiler, directory, target)
        except OSError as exc:  # not writable: try the next place
            errors.append(f"{directory}: {exc}")
    raise DelayLineBuildError(
        "no writable cache directory for the delay line: " + "; ".join(errors))


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
