"""Where a run's nodes live: the interface the runner drives. The emulated fabric on this host
(emulated_site.EmulatedSite), real hosts, one agent each (host_agent's site), and several machines
running one scale model (machine_agent's site) implement it. probe_and_train
drives any of them the same way, so every site gets the same probe, the same accounting and
the same checks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from netsim_ddp.fabric.background import BackgroundBytes
from netsim_ddp.fabric.schedule import LinkScheduler
from netsim_ddp.hostfacts.nccl import NODE_IFNAME
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


@dataclass
class RunOptions:
    """What the caller asked of one run, wherever its nodes live. `out`: the run's own folder."""

    out: Path
    profile: bool = False
    allow_untrusted: bool = False
    timeout_s: float | None = None
    progress: Progress = field(default=lambda message: None)


class NoTraffic(contextlib.AbstractContextManager):
    """A site without background flows: nothing to start, stop or watch."""

    def __exit__(self, *_exc) -> None:
        return None

    def stop(self) -> BackgroundBytes:
        return BackgroundBytes()

    def check(self) -> None:
        return None


class Site:
    """Where the nodes live. A site launches ranks on its nodes (`launch`: a Launcher), may
    start background flows (`traffic`: a context manager with stop() and check()), turns them
    into the launch's watchdog (`watch`, None while probing), and may apply [[link.schedule]]
    (`scheduler`: None where it cannot).

    `gated_probe`: its ranks may run the probe and wait for its verdict in the training launch
    itself (probing.ProbeGate); else the probe gets launches of its own.
    `transport_ifname`: the NIC(s) NCCL must use between nodes (comma-separated)."""

    gated_probe: bool = False
    transport_ifname: str = NODE_IFNAME

    def __init__(self, options: RunOptions):
        self.options = options

    def launch(self, spec: RankSpec, out_dir: Path, timeout_s: float, *,
               profile: bool = False, env: Mapping[str, str] | None = None,
               watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]:
        raise NotImplementedError

    def traffic(self, signals: Path) -> Any:
        return NoTraffic()

    def watch(self, traffic: Any) -> Callable[[], None] | None:
        return None

    def scheduler(self, signals: Path) -> LinkScheduler | None:
        """The scenario's [[link.schedule]] replayed in each measured window signalled in
        `signals`; None without one, or where this site cannot change its links."""
        return None
