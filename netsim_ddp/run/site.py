"""Where a run's nodes live: the interface the runner drives (the emulated fabric on this host,
or real hosts)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from netsim_ddp.workload import ModeResult, RankSpec

Progress = Callable[[str], None]


class Launcher(Protocol):
    """How a run's ranks are started: on the emulated nodes of a fabric (`run`), or one
    torchrun per real host (`netsim-ddp host`). Each rank reads its own NIC's counters at the
    measured window's edges, so the accounting is the same either way."""

    def __call__(self, spec: RankSpec, out_dir: Path, timeout_s: float, *,
                 profile: bool = False,
                 env: Mapping[str, str] | None = None,
                 watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]: ...
