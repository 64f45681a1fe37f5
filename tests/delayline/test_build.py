"""The cached forwarder binary runs (as root) only if nobody else could have planted it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from netsim_ddp.fabric.delayline import build
from netsim_ddp.fabric.namespaces import privilege

COMPILED = b"\x7fELF compiled here"
PLANTED = b"#!/bin/sh\necho planted\n"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> list[Path]:
    """Two cache directories, best first; compiling writes COMPILED (no compiler needed)."""
    dirs = [tmp_path / "first", tmp_path / "second"]
    for directory in dirs:
        directory.mkdir(mode=0o700)
    monkeypatch.setattr(build, "_cache_dirs", lambda: list(dirs))
    monkeypatch.setattr(build, "_compiler", lambda: "/usr/bin/cc")

    def compile_stub(compiler: str, directory: Path, target: Path) -> Path:
        tmp = directory / ".build-stub"
        tmp.write_bytes(COMPILED)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
        return target

    monkeypatch.setattr(build, "_compile", compile_stub)
    return dirs


def _binary_name() -> str:
    return f"nsd-delayline-{build._digest('/usr/bin/cc')}"


def _plant(directory: Path, mode: int) -> Path:
    path = directory / _binary_name()
    path.write_bytes(PLANTED)
    os.chmod(path, mode)
    return path


def test_own_safe_binary_is_reused(cache) -> None:
    planted = _plant(cache[0], 0o755)
    assert build.build_binary() == planted
    assert planted.read_bytes() == PLANTED  # trusted: not compiled again


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757], ids=["all", "group", "others"])
def test_binary_writable_by_others_is_compiled_afresh(cache, mode: int) -> None:
    planted = _plant(cache[0], mode)
    assert build.unsafe_reason(planted, is_dir=False)
    path = build.build_binary()
    assert path.read_bytes() == COMPILED
    assert build.unsafe_reason(path, is_dir=False) is None


def test_binary_owned_by_someone_else_is_compiled_afresh(cache) -> None:
    if not privilege.host_root():
        pytest.skip("giving a file to another user needs root")
    planted = _plant(cache[0], 0o755)
    os.chown(planted, 65534, 65534)
    assert "owned by uid 65534" in str(build.unsafe_reason(planted, is_dir=False))
    assert build.build_binary().read_bytes() == COMPILED


def test_symlinked_binary_is_not_followed(cache, tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(PLANTED)
    os.chmod(elsewhere, 0o755)
    (cache[0] / _binary_name()).symlink_to(elsewhere)
    assert build.build_binary().read_bytes() == COMPILED
    assert elsewhere.read_bytes() == PLANTED  # the link was replaced, its target untouched


def test_directory_writable_by_others_is_skipped(cache) -> None:
    os.chmod(cache[0], 0o777)
    _plant(cache[0], 0o755)
    path = build.build_binary()
    assert path.parent == cache[1] and path.read_bytes() == COMPILED


def test_no_safe_directory_refuses_with_reasons(cache) -> None:
    for directory in cache:
        os.chmod(directory, 0o777)
    with pytest.raises(build.DelayLineBuildError) as caught:
        build.build_binary()
    message = str(caught.value)
    assert "NETSIM_DDP_CACHE" in message
    assert all(f"{directory}: writable by group or others" in message for directory in cache)
