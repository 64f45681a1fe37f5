"""Fixtures for the workload tests: fake nodes on loopback, and a process census."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class LoopbackNode:
    """A node that is just this host: popen is plain subprocess.Popen, address 127.0.0.1."""

    name: str
    address: str = "127.0.0.1"

    def popen(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(list(argv), **popen_kwargs)


def live_processes_mentioning(text: str) -> list[str]:
    """Command lines of live (non-zombie) processes whose argv contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.fixture(scope="session")
def factories_env() -> dict[str, str]:
    """Lets the ranks import tests/workload/workload_factories.py."""
    return {"PYTHONPATH": str(HERE)}


@pytest.fixture(scope="module")
def one_rank_group() -> Iterator[None]:
    """A gloo process group of one rank in this process, for DDP without launching ranks
    (torch is imported here, not at collection, so torch-free tests stay torch-free)."""
    import torch.distributed as dist

    if dist.is_initialized():  # pragma: no cover - another test left one behind
        pytest.fail("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    # DDP's constructor imports torch._dynamo (1-2 s, once per process): paid here, so no
    # test's own time includes it.
    import torch._dynamo  # noqa: F401
    yield
    dist.destroy_process_group()
